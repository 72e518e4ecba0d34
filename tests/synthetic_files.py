"""Tiny data sets written in the real formats of the loaders (``landscape.data``), so that every paper
config's budget run goes through the same readers a full run uses: CIFAR-10/100 python pickles,
CIFAR-10-C ``.npy`` arrays and MNIST / Fashion-MNIST IDX files, with uniformly random pixels and
labels from a seeded generator."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, arr: np.ndarray) -> None:
    """LeCun's IDX format: magic ``00 00 08 ndim``, big-endian int32 sizes, unsigned bytes."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", s) for s in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


def cifar10(root: Path, rng: np.random.Generator, n: int = 40) -> Path:
    """``data_batch_1..5`` and ``test_batch`` of ``n`` images each (labels 0..9)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, n).tolist(),
        }
        (root / name).write_bytes(pickle.dumps(batch))
    return root


def cifar100(root: Path, rng: np.random.Generator, n_train: int = 200, n_test: int = 100) -> Path:
    """``train`` and ``test`` with fine (0..99) and coarse (0..19) labels."""
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"fine_labels": rng.integers(0, 100, n).tolist(),
            b"coarse_labels": rng.integers(0, 20, n).tolist(),
        }
        (root / name).write_bytes(pickle.dumps(batch))
    return root


def cifar10c(
    root: Path, rng: np.random.Generator, corruptions=("gaussian_noise", "snow"), n: int = 20
) -> Path:
    """``labels.npy`` and one ``<corruption>.npy`` of 5 severities x ``n`` images each."""
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "labels.npy", np.tile(rng.integers(0, 10, n), 5))
    for c in corruptions:
        np.save(root / f"{c}.npy", rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8))
    return root


def mnist(root: Path, rng: np.random.Generator, n_train: int = 120, n_test: int = 100) -> Path:
    """The four IDX files of MNIST (and of Fashion-MNIST, which uses the same names)."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    return root


def _image(rng: np.random.Generator, size: int):
    from PIL import Image

    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def image_folder(
    root: Path,
    rng: np.random.Generator,
    *,
    classes: int = 5,
    per_class: int = 4,
    size: int = 32,
    splits=("train", "val"),
) -> Path:
    """``<split>/<class>/<k>.png``: the class-folder layout of ImageNet, Stanford Cars and Oxford
    Flowers as image-folder data sets expect them."""
    for split in splits:
        for c in range(classes):
            d = root / split / f"class{c:03d}"
            d.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                _image(rng, size).save(d / f"{k}.png")
    return root


def tiny_imagenet(root: Path, rng: np.random.Generator, *, classes: int = 4, per_class: int = 6) -> Path:
    """The official Tiny ImageNet layout: ``train/<wnid>/images/*.JPEG`` (+ boxes), ``val/images`` with
    val/val_annotations.txt, wnids.txt; 64 x 64 JPEGs."""
    wnids = [f"n{1000 + c:08d}" for c in range(classes)]
    root.mkdir(parents=True, exist_ok=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        (root / "train" / w / f"{w}_boxes.txt").write_text(f"{w}_0.JPEG\t0\t0\t63\t63\n")
        for k in range(per_class):
            _image(rng, 64).save(d / f"{w}_{k}.JPEG", format="JPEG", quality=90)
    (root / "val" / "images").mkdir(parents=True)
    lines = []
    for j in range(2 * classes):
        w = wnids[j % classes]
        _image(rng, 64).save(root / "val" / "images" / f"val_{j}.JPEG", format="JPEG", quality=90)
        lines.append(f"val_{j}.JPEG\t{w}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return root


_WORDS = "the cat sat on a mat dog is not ran it was did bank river money run fast slow word".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", "?", "."] + _WORDS


def _sentence(rng: np.random.Generator, n: int = 6) -> str:
    return " ".join(rng.choice(_WORDS, n)) + "."


def superglue(root: Path, rng: np.random.Generator, n_train: int = 12, n_val: int = 8) -> Path:
    """``BoolQ/``, ``WiC/``, ``RTE/`` with ``train.jsonl`` and ``val.jsonl`` in SuperGLUE's fields."""
    import json

    def row(task: str, i: int) -> dict:
        if task == "BoolQ":
            question, passage = _sentence(rng, 4)[:-1], _sentence(rng, 12)
            return {"question": question, "passage": passage, "label": bool(i % 2), "idx": i}
        if task == "WiC":
            s1, s2 = _sentence(rng), _sentence(rng)
            word = s1.split()[0]
            return {"word": word, "sentence1": s1, "sentence2": s2, "label": bool(i % 2), "idx": i,
                    "start1": 0, "end1": len(word), "start2": 0, "end2": len(s2.split()[0])}  # fmt: skip
        label = "entailment" if i % 2 else "not_entailment"
        return {"premise": _sentence(rng, 8), "hypothesis": _sentence(rng, 4), "label": label, "idx": i}

    for task in ("BoolQ", "WiC", "RTE"):
        (root / task).mkdir(parents=True, exist_ok=True)
        for split, n in (("train", n_train), ("val", n_val)):
            rows = [row(task, i) for i in range(n)]
            (root / task / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def tiny_bert_config(vocab: list[str] = VOCAB, num_labels: int = 2, **overrides):
    """A one-layer BERT's configuration (hidden size 8, two heads) over ``vocab``."""
    import transformers

    settings = dict(
        vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=128, num_labels=num_labels,
    )  # fmt: skip
    return transformers.BertConfig(**{**settings, **overrides})


def tiny_bert(root: Path, seed: int = 0, vocab: list[str] = VOCAB, **overrides) -> Path:
    """A :func:`tiny_bert_config` BERT with a WordPiece tokenizer over ``vocab``, saved as a local
    Hugging Face directory (safetensors), like a user's ``bert-base-uncased`` download."""
    import torch
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(root / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(root)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.BertForSequenceClassification(tiny_bert_config(vocab, **overrides))
        model.save_pretrained(root, safe_serialization=True)
    return root


#: data spec prefix -> writer of a tiny set in that format (image folders at 32 px)
WRITERS = {
    "cifar10": cifar10,
    "cifar100": cifar100,
    "mnist": mnist,
    "fashion-mnist": mnist,
    "tinyimagenet": tiny_imagenet,
    "imagefolder": image_folder,
    "imagenet": image_folder,
    "stanford-cars": image_folder,
    "oxford-flowers": image_folder,
    "boolq": superglue,
    "wic": superglue,
    "rte": superglue,
}
