"""A Hugging Face sequence classifier from a local directory as a model of the zoo:
:class:`HFClassifier` (registered as ``hf-classifier``).

G-TRACER (Table 3) fine-tunes the Hugging Face ``bert-base-uncased`` checkpoint on SuperGLUE tasks.
:func:`hf_classifier` loads ``transformers.AutoModelForSequenceClassification.from_pretrained(path,
num_labels=num_classes, local_files_only=True, use_safetensors=True)``: nothing is downloaded, and
only ``model.safetensors`` (or its sharded index) is read. A directory holding only
``pytorch_model.bin`` is refused, although transformers 4.57 reads such files with
``torch.load(weights_only=True)`` (``transformers.modeling_utils.load_state_dict``): the package is
an optional, unpinned peer, older releases unpickle the file, and ``use_safetensors=True`` makes
every release refuse it. Convert once with ``AutoModelForSequenceClassification.from_pretrained(DIR)
.save_pretrained(DIR, safe_serialization=True)`` on a transformers that loads with
``weights_only=True``.

The wrapper takes the one input tensor the runner passes, ``int64 [N, 3, L]`` (``input_ids``,
``attention_mask``, ``token_type_ids``, as :func:`landscape.data.text.load_superglue` builds it;
``[N, 2, L]`` without segment ids) and returns the logits ``[N, num_classes]``.

* Seeding: a classification head missing from the checkpoint (a ``BertModel`` checkpoint such as
  ``bert-base-uncased``) is initialised by transformers from torch's global generator, which
  :func:`landscape.models.model_factory` forks and seeds: the same ``seed`` gives the same head.
* Dropout: BERT's ``nn.Dropout`` modules (hidden 0.1, attention 0.1 in ``bert-base``) follow
  ``train()`` / ``eval()`` like the zoo's other dropout layers; ``from_pretrained`` returns its
  model in eval mode, the wrapper puts it in training mode like every freshly built zoo model.
* Attention: ``attn_implementation="eager"`` by default, the explicit softmax attention whose
  double backward (exact Hessian-vector products, :mod:`landscape.curvature`) every backend has;
  ``"sdpa"`` is faster on a GPU for plain training.
* ``device="meta"`` (``model_factory(..., device="meta")``, the runner's shape check) builds the
  architecture from ``config.json`` without reading the weights.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["HFClassifier", "hf_classifier"]

_INSTALL = (
    "install it without letting pip choose torch: pip install transformers --no-deps && pip install "
    "tokenizers safetensors huggingface-hub pyyaml regex (see benchmarks/install_peers.sh)"
)


def _checkpoint_dir(path: Any) -> Path:
    """The checkpoint directory, checked: ``config.json`` and safetensors weights."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(
            f"hf-classifier: path must be the checkpoint directory (model.kwargs.path), got {path!r}"
        )
    where = Path(path).expanduser()
    if not where.is_dir():
        problem = "is a file, not a directory" if where.exists() else "does not exist"
        raise FileNotFoundError(
            f"hf-classifier: checkpoint directory {where} {problem}; nothing is downloaded: save the "
            "model there with model.save_pretrained(DIR, safe_serialization=True)"
        )
    if not (where / "config.json").is_file():
        raise ValueError(
            f"hf-classifier: {where} has no config.json, so it is not a Hugging Face checkpoint; "
            "point model.kwargs.path at the directory save_pretrained wrote"
        )
    safetensors = any(where.glob("*.safetensors")) or any(where.glob("*.safetensors.index.json"))
    if not safetensors:
        pickles = sorted(p.name for p in where.glob("*.bin"))
        found = f"only {', '.join(pickles)} (pickle files)" if pickles else "no weights"
        raise ValueError(
            f"hf-classifier: {where} holds {found}; only safetensors weights are read (a .bin file is a "
            "pickle, which can run code). Convert it once: AutoModelForSequenceClassification."
            "from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True) (transformers >= 4.50 "
            "reads .bin files with torch.load(weights_only=True))"
        )
    return where


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"hf-classifier needs the transformers package ({exc}); {_INSTALL}") from None
    return transformers


class HFClassifier(nn.Module):
    """``x int64 [N, 3, L] -> logits [N, C]`` of a Hugging Face sequence classifier (module docstring).

    Args:
        model: a ``transformers`` ``*ForSequenceClassification`` module.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.takes_token_types = "token_type_ids" in params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point() or x.is_complex():
            raise TypeError(
                f"hf-classifier takes integer token ids [N, 3, L] (input_ids, attention_mask, "
                f"token_type_ids), as the boolq / wic / rte data give; got {x.dtype} inputs"
            )
        if x.dim() != 3 or x.shape[1] not in (2, 3):
            raise ValueError(
                "hf-classifier takes inputs [N, 3, L] (input_ids, attention_mask, token_type_ids) or "
                f"[N, 2, L] (no token types), got shape {tuple(x.shape)}"
            )
        kwargs = {"input_ids": x[:, 0], "attention_mask": x[:, 1]}
        if x.shape[1] == 3 and self.takes_token_types:
            kwargs["token_type_ids"] = x[:, 2]
        return self.model(**kwargs, return_dict=True).logits


def hf_classifier(
    path: str | os.PathLike, num_classes: int = 2, attn_implementation: str = "eager"
) -> HFClassifier:
    """:class:`HFClassifier` around ``AutoModelForSequenceClassification`` loaded from the local
    directory ``path`` with ``num_classes`` outputs (module docstring: safetensors only, nothing
    downloaded; on the ``meta`` device the architecture alone, from ``config.json``).

    Raises:
        ImportError: ``transformers`` is not installed (the message says how to install it).
        FileNotFoundError: ``path`` does not exist.
        ValueError: no ``config.json``, no safetensors weights (e.g. ``.bin`` only), or transformers
            refused the checkpoint.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"hf-classifier: num_classes must be an int >= 2, got {num_classes!r}")
    where = _checkpoint_dir(path)
    tf = _transformers()
    auto = tf.AutoModelForSequenceClassification
    try:
        if torch.get_default_device().type == "meta":  # shapes only: no weights read
            config = tf.AutoConfig.from_pretrained(str(where), local_files_only=True, num_labels=num_classes)
            model = auto.from_config(config, attn_implementation=attn_implementation)
        else:
            model = auto.from_pretrained(
                str(where),
                num_labels=num_classes,
                local_files_only=True,
                use_safetensors=True,
                attn_implementation=attn_implementation,
            )
    except (OSError, KeyError) as exc:
        raise ValueError(
            f"hf-classifier: transformers could not load {where}: {' '.join(str(exc).split())[:400]}"
        ) from None
    model.train()  # from_pretrained returns eval mode; zoo models start in training mode
    return HFClassifier(model)
