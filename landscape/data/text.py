"""SuperGLUE text classification (BoolQ, WiC, RTE) from local ``.jsonl`` files, tokenised by a
tokenizer from a local directory: :func:`load_superglue`.

G-TRACER (Table 3) fine-tunes BERT-base-uncased on BoolQ, WiC and RTE of SuperGLUE (Wang et al.
2019). The files are SuperGLUE's own download (``BoolQ.zip``, ``WiC.zip``, ``RTE.zip`` from
https://super.gluebenchmark.com/tasks): one JSON object a line in ``train.jsonl``, ``val.jsonl`` and
``test.jsonl``. Each task becomes a sentence pair (segment A, segment B) and a class label:

* ``boolq``: ``question`` / ``passage``, ``label`` ``false`` -> 0, ``true`` -> 1;
* ``wic``: ``"{word}: {sentence1}"`` / ``sentence2``, ``label`` ``false`` -> 0, ``true`` -> 1. The
  target word is put in front of the first sentence, since a classifier over the pooled ``[CLS]``
  state has no other way to learn which word is asked about; the character offsets ``start1``,
  ``end1``, ``start2``, ``end2`` are checked to lie inside their sentences but not encoded (they
  serve span-pooling heads such as jiant's, not a sequence classifier);
* ``rte``: ``premise`` / ``hypothesis``, ``label`` ``"entailment"`` -> 0, ``"not_entailment"`` -> 1.

The label numbers are those of the Hugging Face ``super_glue`` data set (``ClassLabel`` names
``False``/``True`` and ``entailment``/``not_entailment``).

Splits: SuperGLUE hides the labels of ``test.jsonl`` (the leaderboard scores it), so **``val`` is
the test split** of every run (``data.test_split = "val"``), as in the papers that report SuperGLUE
development-set accuracy; asking for ``test`` on label-less files raises an error that says so.

Inputs: one ``int64`` tensor ``[N, 3, L]`` holding, per example, ``input_ids``, ``attention_mask``
and ``token_type_ids`` (the runner hands a model one tensor; :mod:`landscape.models.text` splits it
again). Each pair is encoded by the tokenizer itself (``tokenizer(a, b, truncation="longest_first",
padding="max_length", max_length=L)``: ``[CLS] A [SEP] B [SEP]`` for BERT, the longer segment cut
first). ``max_length`` defaults to 128, the ``max_seq_length`` default of BERT's
``run_classifier.py`` and of Hugging Face's ``run_glue.py`` (the G-TRACER paper does not state one).

Reading: plain :mod:`json` lines, not the Hugging Face ``datasets`` library. ``datasets`` is not a
dependency of this project (nor installed with the benchmark peers), it would only wrap the same
``json.loads`` per line, and its cache directory would keep a second copy of the data; decided once,
so the loader behaves the same on every machine.

Tokenizer: ``transformers.AutoTokenizer.from_pretrained(DIR, local_files_only=True)`` on a local
directory (``tokenizer.json`` or a WordPiece vocabulary file: no code or pickle is read); nothing is
downloaded.
``tokenizer=`` names it; without it the directory in ``$SHARPSCAPE_TEXT_MODEL`` (the model's
checkpoint directory, which holds its tokenizer) is used. ``transformers`` is optional: install it
with ``pip install transformers --no-deps`` plus ``tokenizers`` (``benchmarks/install_peers.sh``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from landscape.data.common import Batch, check_limit, data_root, locate

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "TEXT_MODEL_ENV",
    "TEXT_SPLITS",
    "TEXT_TASKS",
    "encode_pairs",
    "load_superglue",
    "load_tokenizer",
    "read_jsonl",
]

TEXT_TASKS = ("boolq", "wic", "rte")
TEXT_SPLITS = ("train", "val", "test")
DEFAULT_MAX_LENGTH = 128
#: The environment variable naming the default tokenizer directory (the model's checkpoint).
TEXT_MODEL_ENV = "SHARPSCAPE_TEXT_MODEL"

#: Files of which a tokenizer directory holds at least one (``save_pretrained`` writes them).
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model",
)  # fmt: skip

_INSTALL = (
    "install it without letting pip choose torch: pip install transformers --no-deps && pip install "
    "tokenizers safetensors huggingface-hub pyyaml regex (see benchmarks/install_peers.sh)"
)


def _text(rec: dict[str, Any], key: str, where: str) -> str:
    v = rec.get(key)
    if not isinstance(v, str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {v!r}")
    return v


def _bool_label(value: Any, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    raise ValueError(f"{where}: label must be true or false (SuperGLUE's format), got {value!r}")


def _rte_label(value: Any, where: str) -> int:
    names = {"entailment": 0, "not_entailment": 1}
    if value not in names:
        raise ValueError(f"{where}: label must be 'entailment' or 'not_entailment', got {value!r}")
    return names[value]


def _boolq_pair(rec: dict[str, Any], where: str) -> tuple[str, str]:
    return _text(rec, "question", where), _text(rec, "passage", where)


def _wic_pair(rec: dict[str, Any], where: str) -> tuple[str, str]:
    word = _text(rec, "word", where)
    s1, s2 = _text(rec, "sentence1", where), _text(rec, "sentence2", where)
    for k, s in (("1", s1), ("2", s2)):
        start, end = rec.get(f"start{k}"), rec.get(f"end{k}")
        if start is None and end is None:
            continue
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end))
        if not ok or not 0 <= start < end <= len(s):
            raise ValueError(
                f"{where}: start{k}={start!r}, end{k}={end!r} is not a character span of "
                f"sentence{k} ({len(s)} characters)"
            )
    return f"{word}: {s1}", s2


def _rte_pair(rec: dict[str, Any], where: str) -> tuple[str, str]:
    return _text(rec, "premise", where), _text(rec, "hypothesis", where)


@dataclass(frozen=True)
class _Task:
    title: str  # SuperGLUE's name (its zip file and folder)
    pair: Callable[[dict[str, Any], str], tuple[str, str]]
    label: Callable[[Any, str], int]


_TASKS = {
    "boolq": _Task("BoolQ", _boolq_pair, _bool_label),
    "wic": _Task("WiC", _wic_pair, _bool_label),
    "rte": _Task("RTE", _rte_pair, _rte_label),
}


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file, one a line (blank lines skipped); a line that is not a
    JSON object raises ``ValueError`` naming the file and line."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}, line {i}: not a JSON object ({exc.msg}); expected JSON lines"
                ) from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}, line {i}: expected a JSON object, got {type(rec).__name__}")
            out.append(rec)
    return out


def _directory(what: str | os.PathLike) -> Path:
    path = Path(what).expanduser()
    if not path.is_dir():
        problem = "is a file, not a directory" if path.exists() else "does not exist"
        raise FileNotFoundError(
            f"tokenizer directory {path} {problem}; nothing is downloaded: save the tokenizer there "
            "(tokenizer.save_pretrained(DIR)) or point tokenizer= at the model's checkpoint directory"
        )
    return path


def load_tokenizer(directory: str | os.PathLike | None = None) -> Any:
    """``AutoTokenizer.from_pretrained(directory, local_files_only=True)``; ``None``: the directory
    in ``$SHARPSCAPE_TEXT_MODEL``.

    Raises:
        ValueError: no directory given or the directory holds no tokenizer.
        FileNotFoundError: the directory does not exist.
        ImportError: ``transformers`` is not installed.
    """
    source = ""
    if directory is None or directory == "":
        directory = os.environ.get(TEXT_MODEL_ENV, "")
        if not directory:
            raise ValueError(
                "text data needs a tokenizer: pass tokenizer=/path/to/model (data.kwargs.tokenizer in a "
                f"config, the directory of the model's checkpoint) or set {TEXT_MODEL_ENV} to that directory"
            )
        source = f" (from {TEXT_MODEL_ENV})"
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"tokenizer must be a directory path, got {type(directory).__name__}")
    path = _directory(directory)
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ValueError(
            f"{path}{source} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save one there "
            "with tokenizer.save_pretrained(DIR), or point tokenizer= at the model's checkpoint directory"
        )
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ImportError(f"text data needs the transformers package ({exc}); {_INSTALL}") from None
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"no tokenizer could be read from {path}{source} ({' '.join(str(exc).split())[:300]}); it needs "
            "tokenizer.json or vocab.txt (+ tokenizer_config.json), as tokenizer.save_pretrained(DIR) writes"
        ) from None


def encode_pairs(tokenizer: Any, first: list[str], second: list[str], max_length: int) -> torch.Tensor:
    """``int64 [N, 3, max_length]``: ``input_ids``, ``attention_mask``, ``token_type_ids`` of the
    pairs as the tokenizer encodes them (longest segment truncated first, padded to ``max_length``;
    ``token_type_ids`` zero for tokenizers without segments)."""
    if len(first) != len(second):
        raise ValueError(f"encode_pairs: {len(first)} first and {len(second)} second segments")
    if getattr(tokenizer, "pad_token", None) is None:
        raise ValueError(
            "the tokenizer has no padding token, so the pairs cannot be padded to max_length; use a "
            "tokenizer with one (BERT's [PAD]) or set tokenizer.pad_token before saving it"
        )
    enc = tokenizer(
        first,
        second,
        truncation="longest_first",
        padding="max_length",
        max_length=max_length,
        return_attention_mask=True,
        return_token_type_ids=True,
        return_tensors="pt",
    )
    ids = enc["input_ids"]
    types = enc.get("token_type_ids")
    types = torch.zeros_like(ids) if types is None else types
    return torch.stack([ids, enc["attention_mask"], types], dim=1).to(torch.int64)


def _check_max_length(max_length: Any, tokenizer: Any) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 8:
        raise ValueError(f"max_length must be an int >= 8 (tokens per pair), got {max_length!r}")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 1_000_000 and max_length > limit:
        raise ValueError(
            f"max_length={max_length} exceeds the tokenizer's model_max_length={limit} (the model's "
            f"position embeddings); use max_length <= {limit}"
        )
    return max_length


def load_superglue(
    task: str,
    root: str | os.PathLike | None = None,
    split: str = "train",
    *,
    tokenizer: str | os.PathLike | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    limit: int | None = None,
    dtype: torch.dtype | None = None,
) -> Batch:
    """``(inputs int64 [N, 3, max_length], labels int64 [N])`` of a SuperGLUE task (module docstring).

    Args:
        task: ``"boolq"``, ``"wic"`` or ``"rte"``.
        root: the directory holding ``train.jsonl`` / ``val.jsonl`` / ``test.jsonl``, or a directory
            above it with a ``BoolQ`` / ``WiC`` / ``RTE`` folder (SuperGLUE's zips); ``None``:
            ``$SHARPSCAPE_DATA``.
        split: ``"train"``, ``"val"`` (the test split of a run: SuperGLUE's test labels are hidden)
            or ``"test"`` (only for files that hold labels).
        tokenizer: the local tokenizer directory (``None``: ``$SHARPSCAPE_TEXT_MODEL``).
        max_length: tokens per pair after padding / truncation.
        limit: keep the first examples.
        dtype: accepted for the runner's ``precision = "float64"`` (which asks every loader for
            float64 inputs) and ignored: token ids stay ``int64``.
    """
    key = str(task).lower()
    if key not in _TASKS:
        raise ValueError(f"unknown SuperGLUE task {task!r}; use one of {TEXT_TASKS}")
    spec = _TASKS[key]
    split = {"validation": "val", "dev": "val"}.get(split, split)
    if split not in TEXT_SPLITS:
        raise ValueError(
            f"{spec.title}: split must be one of {TEXT_SPLITS} (SuperGLUE's files), got {split!r}; "
            "'val' is the test split (the test labels are hidden)"
        )
    check_limit(limit)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")
    base = data_root(root, spec.title)
    where = locate(base, (spec.title, key, f"SuperGLUE/{spec.title}"), ("train.jsonl", "val.jsonl"))
    path = where / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{spec.title}: {path} not found; expected SuperGLUE's train.jsonl, val.jsonl, test.jsonl in "
            f"{base} or {base / spec.title} (from {spec.title}.zip, https://super.gluebenchmark.com/tasks)"
        )
    records = read_jsonl(path)
    if limit is not None:
        records = records[:limit]
    if not records:
        raise ValueError(f"{path} holds no examples")
    if not any("label" in r for r in records):
        hint = (
            "; SuperGLUE hides the test labels: use split 'val' as the test split "
            '(data.test_split = "val" in a config)'
            if split == "test"
            else ""
        )
        raise ValueError(f"{path} holds no labels{hint}")
    first, second, labels = [], [], []
    for i, rec in enumerate(records, 1):
        at = f"{path}, example {i}"
        if "label" not in rec:
            raise ValueError(f"{at}: no label (every example of a labelled split needs one)")
        a, b = spec.pair(rec, at)
        first.append(a)
        second.append(b)
        labels.append(spec.label(rec["label"], at))
    tok = load_tokenizer(tokenizer)
    x = encode_pairs(tok, first, second, _check_max_length(max_length, tok))
    return x, torch.tensor(labels, dtype=torch.int64)
