"""Image data sets laid out as class folders (ImageNet, Tiny ImageNet, Stanford Cars, Oxford
Flowers, or any ``DIR/<split>/<class>/<image>`` tree), decoded with Pillow into in-memory tensors.

Layout (the one of ``torchvision.datasets.ImageFolder``)::

    DIR/train/<class>/.../<image>      DIR/val/<class>/.../<image>   (or DIR/test/<class>/...)

Classes are the sub-directories of the split directory sorted by name (code point order, as
torchvision sorts them); class ``i`` of that order gets label ``i``. The test / validation split
must hold the same classes as ``train`` (else a ``ValueError`` lists the differences). Images may
sit anywhere below their class folder (Tiny ImageNet's ``train/<wnid>/images/*.JPEG`` is this
layout). Tiny ImageNet's official validation layout, ``val/images/*.JPEG`` with the annotation
file val/val_annotations.txt (lines ``FILE<TAB>WNID<TAB>...``), is read as well, the labels being
the positions of the wnids among the training classes. Split ``"test"`` reads ``DIR/test`` when
it holds class folders, else ``DIR/val`` (ImageNet's and Tiny ImageNet's labelled held-out split;
Tiny ImageNet's ``test/images`` has no labels).

Files are untrusted input, read safely:

* only JPEG, PNG, BMP and WebP are decoded (``PIL.Image.open(..., formats=...)``, the format
  detected from the content, not the name); files with other extensions are skipped and counted
  in a note; a file with an image extension that does not decode raises ``ValueError`` naming it;
* decompression bombs: the pixel count in the header is checked against ``max_pixels`` before
  any pixel is decoded (Pillow's own guard, ``Image.MAX_IMAGE_PIXELS``, stays in force too);
* symbolic links are followed only while they stay inside the data directory; one that leads
  outside raises ``ValueError`` (a data directory cannot make the loader read other files);
* the size of the decoded tensors (``N x 3 x size x size`` bytes as uint8 plus the same in the
  output ``dtype``) is checked against ``max_bytes`` before anything is decoded.

Preprocessing, per data set (:data:`IMAGE_FOLDER_DATASETS`): images are converted to RGB (alpha
dropped, palette and grey expanded), then either ``resize="shorter_crop"`` (shorter side resized
to ``size``, then the centre ``size x size`` crop: torchvision's ``Resize(size)`` followed by
``CenterCrop(size)``, the standard ImageNet evaluation transform) or ``resize="direct"`` (the whole
image resized to ``size x size``, aspect ratio not kept), with Pillow's bilinear filter
(antialiased when shrinking). Defaults: ImageNet and Oxford Flowers ``shorter_crop`` at 224 px
(objects centred); Stanford Cars ``direct`` at 224 px (cars fill wide images, a centre crop cuts
off their ends); Tiny ImageNet ``direct`` at 64 px (its images are 64 x 64 already: no resampling);
a generic ``imagefolder`` ``shorter_crop`` at 64 px. Random crops and flips of training are left to
the augmentation of the runner (:mod:`landscape.data.transforms`).

Values are scaled to [0, 1] and, with ``normalize=True``, standardised with the ImageNet
statistics of :data:`landscape.data.common.CHANNEL_STATS` (the usual choice for natural photos and
for fine-tuning ImageNet-pretrained networks, as Fisher-SAM's Tables 2 and 3 do; Kim et al., ICML
2022, Sec. 5).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import Batch, check_dtype, check_limit, data_root, resolve_stats, to_inputs

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGE_FOLDER_DATASETS",
    "IMAGE_FOLDER_SPLITS",
    "IMAGE_FORMATS",
    "MAX_PIXELS",
    "RESIZE_MODES",
    "ImageFolderIndex",
    "ImageFolderPreset",
    "image_folder_index",
    "image_tensor_bytes",
    "load_image_folder",
]

#: Pillow format names that are decoded; anything else is refused.
IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "WEBP")
#: File name endings (compared in lower case) taken for images; other files are skipped.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
#: Largest image (width x height) decoded by default: Pillow's own ``Image.MAX_IMAGE_PIXELS``
#: default (a 3-channel 8-bit image of about 256 MiB).
MAX_PIXELS = 89_478_485
RESIZE_MODES = ("shorter_crop", "direct")
IMAGE_FOLDER_SPLITS = ("train", "val", "test")
TINYIMAGENET_ANNOTATIONS = "val_annotations.txt"
#: ILSVRC-2012 training images (Russakovsky et al., IJCV 2015), for the memory message.
IMAGENET_TRAIN_IMAGES = 1_281_167
CACHE_FORMAT = "image-folder-cache-1"


@dataclass(frozen=True)
class ImageFolderPreset:
    """Defaults of one image-folder data set: its name in messages, image size, resize mode, the
    statistics ``normalize=True`` means and the sub-directories of ``$SHARPSCAPE_DATA`` searched."""

    what: str
    size: int
    resize: str
    stats: str
    subdirs: tuple[str, ...]


IMAGE_FOLDER_DATASETS: dict[str, ImageFolderPreset] = {
    "imagefolder": ImageFolderPreset("image folder", 64, "shorter_crop", "imagenet", ()),
    "tinyimagenet": ImageFolderPreset(
        "Tiny ImageNet", 64, "direct", "imagenet", ("tiny-imagenet-200", "tinyimagenet", "tiny-imagenet")
    ),
    "imagenet": ImageFolderPreset("ImageNet", 224, "shorter_crop", "imagenet", ("imagenet", "ILSVRC2012")),
    "stanford-cars": ImageFolderPreset(
        "Stanford Cars", 224, "direct", "imagenet", ("stanford-cars", "stanford_cars", "cars")
    ),
    "oxford-flowers": ImageFolderPreset(
        "Oxford Flowers", 224, "shorter_crop", "imagenet", ("oxford-flowers", "flowers102", "flowers")
    ),
}


@dataclass(frozen=True)
class ImageFolderIndex:
    """The files of one split of an image folder, found without decoding anything.

    ``classes[labels[i]]`` is the class of ``files[i]``; ``skipped`` counts the non-image files
    by extension; ``layout`` is ``"class-folders"`` or ``"tinyimagenet-val"``.
    """

    directory: Path
    classes: tuple[str, ...]
    files: tuple[Path, ...]
    labels: np.ndarray
    skipped: dict[str, int]
    layout: str


# ------------------------------------------------------------------------------- finding files


def _inside(path: Path, root: Path, what: str) -> Path:
    """``path`` resolved; ``ValueError`` when it (through a symbolic link) leaves ``root``."""
    real = Path(os.path.realpath(path))
    if real != root and not real.is_relative_to(root):
        raise ValueError(
            f"{what}: {path} is a symbolic link to {real}, outside the data directory {root}; links "
            "may only point inside it (copy the files in, or point root at a directory holding both)"
        )
    return real


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _class_dirs(split_dir: Path, root: Path, what: str) -> list[str]:
    names = []
    for entry in sorted(os.scandir(split_dir), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir():  # is_dir follows links
            continue
        _inside(Path(entry.path), root, what)
        names.append(entry.name)
    return names


def _walk_images(top: Path, root: Path, what: str, skipped: Counter) -> list[Path]:
    """Image files below ``top`` in sorted order, following links that stay inside ``root``
    (each real directory visited once, so link cycles end)."""
    found: list[Path] = []
    seen: set[Path] = set()
    stack = [top]
    while stack:
        d = stack.pop()
        real = _inside(d, root, what)
        if real in seen:
            continue
        seen.add(real)
        subdirs = []
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if entry.is_dir():
                subdirs.append(path)
            elif _is_image_name(entry.name):
                _inside(path, root, what)
                if path.is_file():
                    found.append(path)
                else:
                    skipped["(broken link)"] += 1
            else:
                skipped[Path(entry.name).suffix.lower() or "(no extension)"] += 1
        stack.extend(reversed(subdirs))
    return found


def _split_dir(base: Path, split: str, what: str) -> Path:
    """The directory of ``split``: ``train``, ``val``, or ``test`` (``val`` when ``test`` is absent
    or unlabelled)."""
    candidates = {"train": ("train",), "val": ("val",), "test": ("test", "val")}[split]
    for name in candidates:
        d = base / name
        if not d.is_dir():
            continue
        if name == "test" and _unlabelled(d):
            continue
        return d
    raise FileNotFoundError(
        f"{what}: no split directory {' or '.join(repr(c) for c in candidates)} in {base} holding "
        f"labelled images; expected {base}/{candidates[0]}/<class>/<image> (class folders; Tiny "
        f"ImageNet's val/images + val/{TINYIMAGENET_ANNOTATIONS} is read too)"
    )


def _unlabelled(d: Path) -> bool:
    """Tiny ImageNet's ``test/images`` (no class folders, no annotations)."""
    subdirs = [e.name for e in os.scandir(d) if e.is_dir() and not e.name.startswith(".")]
    return subdirs == ["images"] and not (d / TINYIMAGENET_ANNOTATIONS).is_file()


def _tinyimagenet_val(
    split_dir: Path, root: Path, what: str, train_classes: list[str] | None
) -> tuple[list[str], list[Path], list[int], Counter]:
    ann = split_dir / TINYIMAGENET_ANNOTATIONS
    _inside(ann, root, what)
    if train_classes is None:
        raise FileNotFoundError(
            f"{what}: {ann} names classes by wnid, whose labels come from the class folders of "
            f"train/; no {split_dir.parent / 'train'} directory found"
        )
    index = {c: i for i, c in enumerate(train_classes)}
    images = split_dir / "images"
    files, labels, skipped = [], [], Counter()
    for n, line in enumerate(ann.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        name = fields[0].strip()
        wnid = fields[1].strip() if len(fields) > 1 else ""
        if not name or "/" in name or "\\" in name or name in (".", "..") or not wnid:
            raise ValueError(
                f"{ann}, line {n}: expected 'FILE<TAB>WNID<TAB>...' with a plain file name, got {line!r}"
            )
        if wnid not in index:
            raise ValueError(
                f"{ann}, line {n}: class {wnid!r} is not among the {len(index)} class folders of train/; "
                "the train and validation classes must agree"
            )
        path = images / name
        if not _is_image_name(name):
            skipped[Path(name).suffix.lower() or "(no extension)"] += 1
            continue
        _inside(path, root, what)
        if not path.is_file():
            raise FileNotFoundError(f"{ann}, line {n}: {path} does not exist")
        files.append(path)
        labels.append(index[wnid])
    order = sorted(range(len(files)), key=lambda i: (labels[i], files[i].name))
    return list(train_classes), [files[i] for i in order], [labels[i] for i in order], skipped


def _class_difference(a: Sequence[str], b: Sequence[str]) -> str:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    return f"only in train: {only_a[:5]}{' ...' if len(only_a) > 5 else ''}; only in the other: " + (
        f"{only_b[:5]}{' ...' if len(only_b) > 5 else ''}"
    )


def _find_base(root: str | os.PathLike | None, preset: ImageFolderPreset) -> Path:
    base = data_root(root, preset.what)
    for cand in (base, *(base / s for s in preset.subdirs)):
        if any((cand / s).is_dir() for s in IMAGE_FOLDER_SPLITS):
            return cand
    return base


def image_folder_index(
    root: str | os.PathLike | None = None, split: str = "train", *, dataset: str = "imagefolder"
) -> ImageFolderIndex:
    """The classes and image files of ``split`` (see the module docstring), nothing decoded.

    Raises:
        FileNotFoundError: no data directory or no directory for ``split``.
        ValueError: a link leads outside the data directory, a class folder holds no image, the
            split's classes differ from ``train``'s, or Tiny ImageNet's annotations are malformed.
    """
    preset = _preset(dataset)
    if split not in IMAGE_FOLDER_SPLITS:
        raise ValueError(f"split must be one of {IMAGE_FOLDER_SPLITS}, got {split!r}")
    what = preset.what
    base = _find_base(root, preset)
    real_root = Path(os.path.realpath(base))
    split_dir = _split_dir(base, split, what)
    _inside(split_dir, real_root, what)
    train_dir = base / "train"
    train_classes = _class_dirs(train_dir, real_root, what) if train_dir.is_dir() else None
    if (split_dir / TINYIMAGENET_ANNOTATIONS).is_file() and (split_dir / "images").is_dir():
        classes, files, labels, skipped = _tinyimagenet_val(split_dir, real_root, what, train_classes)
        layout = "tinyimagenet-val"
    else:
        classes = _class_dirs(split_dir, real_root, what)
        if not classes:
            raise ValueError(
                f"{what}: {split_dir} holds no class folders; expected {split_dir}/<class>/<image>"
            )
        if train_classes is not None and classes != train_classes:
            raise ValueError(
                f"{what}: the classes of {split_dir} ({len(classes)}) differ from those of "
                f"{train_dir} ({len(train_classes)}) ({_class_difference(train_classes, classes)}); "
                "labels would not mean the same class in both: give both splits the same class folders"
            )
        files, labels, skipped = [], [], Counter()
        for label, name in enumerate(classes):
            found = _walk_images(split_dir / name, real_root, what, skipped)
            if not found:
                raise ValueError(
                    f"{what}: class folder {split_dir / name} holds no {'/'.join(IMAGE_FORMATS)} image "
                    f"(extensions {', '.join(IMAGE_EXTENSIONS)}); remove the folder or add its images"
                )
            files.extend(found)
            labels.extend([label] * len(found))
        layout = "class-folders"
    for entry in os.scandir(split_dir):  # loose files beside the class folders
        if entry.is_file() and not entry.name.startswith(".") and entry.name != TINYIMAGENET_ANNOTATIONS:
            skipped[Path(entry.name).suffix.lower() or "(no extension)"] += 1
    return ImageFolderIndex(
        split_dir, tuple(classes), tuple(files), np.asarray(labels, dtype=np.int64), dict(skipped), layout
    )


# ------------------------------------------------------------------------------------ decoding


def _preset(dataset: str) -> ImageFolderPreset:
    if dataset not in IMAGE_FOLDER_DATASETS:
        raise ValueError(f"dataset must be one of {tuple(IMAGE_FOLDER_DATASETS)}, got {dataset!r}")
    return IMAGE_FOLDER_DATASETS[dataset]


def _pillow():
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        raise ImportError("image folders are decoded with Pillow: pip install pillow") from None
    return Image, UnidentifiedImageError


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """``(width, height)`` with the shorter side ``size`` and the longer one scaled and truncated,
    as torchvision's ``Resize(size)`` computes it (``int(size * long / short)``)."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def centre_box(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """The ``(left, top, right, bottom)`` of the centre ``size x size`` crop, offsets rounded as
    torchvision's ``center_crop`` does (``int(round((w - size) / 2))``)."""
    left, top = int(round((width - size) / 2.0)), int(round((height - size) / 2.0))
    return left, top, left + size, top + size


class _Refused(ValueError):
    """An image refused by the loader's own checks (passed through the decoding errors' handler)."""


def _decode(path: Path, size: int, resize: str, max_pixels: int, what: str) -> np.ndarray:
    """One image -> uint8 ``[3, size, size]``."""
    image_mod, unidentified = _pillow()
    try:
        with open(path, "rb") as fh, image_mod.open(fh, formats=IMAGE_FORMATS) as im:
            w, h = im.size
            if w * h > max_pixels:
                raise _Refused(
                    f"{what}: {path} is {w} x {h} = {w * h} pixels, above max_pixels={max_pixels} "
                    "(a decompression bomb guard, checked before decoding); remove the file or raise "
                    "max_pixels= if the image is genuine"
                )
            if im.mode.startswith(("I", "F")):  # Pillow's convert would clip 16-bit values at 255
                raise _Refused(
                    f"{what}: {path} has {im.mode} pixels (16-bit or 32-bit); only 8-bit images are read: "
                    "convert it to 8-bit RGB"
                )
            rgb = im.convert("RGB")
    except _Refused:
        raise
    except unidentified:
        raise ValueError(
            f"{what}: {path} is not a {'/'.join(IMAGE_FORMATS)} image (its content, whatever its name "
            "says); remove or replace it"
        ) from None
    except image_mod.DecompressionBombError as exc:
        raise ValueError(
            f"{what}: {path} refused as a decompression bomb by Pillow ({exc}); remove the file"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(
            f"{what}: cannot decode {path} ({type(exc).__name__}: {exc}); remove or replace it"
        ) from None
    bilinear = image_mod.Resampling.BILINEAR
    if resize == "direct":
        if rgb.size != (size, size):
            rgb = rgb.resize((size, size), bilinear)
    else:
        target = resized_size(*rgb.size, size)
        if rgb.size != target:
            rgb = rgb.resize(target, bilinear)
        if rgb.size != (size, size):
            rgb = rgb.crop(centre_box(*rgb.size, size))
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def image_tensor_bytes(n: int, size: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of ``n`` decoded images: uint8 plus ``dtype`` copies of ``n x 3 x size x size``."""
    return n * 3 * size * size * (1 + torch.empty((), dtype=dtype).element_size())


def _memory_limit() -> tuple[int, str]:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 8 * 2**30, "8 GiB, the default where the machine's memory is unknown"
    return total // 2, "half of this machine's memory"


def _check_memory(
    n: int, size: int, dtype: torch.dtype, max_bytes: int | None, what: str, split: str
) -> None:
    """``ValueError`` (before decoding) when :func:`image_tensor_bytes` exceeds ``max_bytes``."""
    need = image_tensor_bytes(n, size, dtype)
    max_bytes, why = _memory_limit() if max_bytes is None else (max_bytes, "given")
    if need <= max_bytes:
        return
    fit = max(1, max_bytes // image_tensor_bytes(1, size, dtype))
    small = next(
        (s for s in (128, 64, 32) if s < size and image_tensor_bytes(n, s, dtype) <= max_bytes), None
    )
    hint = f"a smaller size= (size={small} fits)" if small else "a smaller size="
    extra = ""
    if what == "ImageNet":
        full = image_tensor_bytes(IMAGENET_TRAIN_IMAGES, size, dtype)
        extra = (
            f" ImageNet at {size} px does not fit in memory: its {IMAGENET_TRAIN_IMAGES:,} training images "
            f"take {full / 2**30:,.0f} GiB; data sets here are in-memory tensors, so use a downsampled "
            "ImageNet (size=32 or size=64, as Chrabaszcz et al. 2017) or a subset (limit=)."
        )
    raise ValueError(
        f"{what} split {split!r}: {n} images at size={size} take {need / 2**30:.2f} GiB "
        f"({n} x 3 x {size} x {size} bytes as uint8 plus as {dtype}), above max_bytes={max_bytes} "
        f"({why}); nothing was decoded. Pass {hint}, keep a random subset with limit= (limit={fit} "
        f"fits), or raise max_bytes= if the machine has the memory.{extra}"
    )


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _decode_all(
    files: Sequence[Path],
    size: int,
    resize: str,
    max_pixels: int,
    what: str,
    split: str,
    workers: int,
    progress: bool,
) -> np.ndarray:
    """uint8 ``[N, 3, size, size]`` of ``files``, decoded by ``workers`` threads (each image into
    its own slot, so the result does not depend on ``workers``)."""
    images = np.empty((len(files), 3, size, size), dtype=np.uint8)

    def decode(i: int) -> None:
        images[i] = _decode(files[i], size, resize, max_pixels, what)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(files), desc=f"{what} {split}", unit="img")
    pool = ThreadPoolExecutor(workers) if workers > 1 else None
    try:
        for _ in pool.map(decode, range(len(files))) if pool else map(decode, range(len(files))):
            if bar is not None:
                bar.update()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    return images


def _cache_path(
    cache_dir: str | os.PathLike, index: ImageFolderIndex, files: Sequence[Path], settings: dict, what: str
) -> Path:
    """``cache_dir/<sha256>.npz``; the digest covers every file's path, size and modification time,
    the labels and the decoding settings, so a changed file or setting is a different entry."""
    cache = Path(os.path.realpath(Path(cache_dir).expanduser()))
    data = Path(os.path.realpath(index.directory.parent))
    if cache == data or cache.is_relative_to(data):
        raise ValueError(
            f"{what}: cache_dir={cache_dir} lies inside the data directory {data}; the loader writes "
            "nothing there: choose a cache directory elsewhere"
        )
    h = hashlib.sha256(f"{CACHE_FORMAT};{json.dumps(settings, sort_keys=True)};".encode())
    h.update(f"{index.directory};{index.classes};".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f};{st.st_size};{st.st_mtime_ns}\n".encode())
    return cache / f"{h.hexdigest()}.npz"


def _read_cache(path: Path, n: int, size: int, labels: np.ndarray) -> np.ndarray | None:
    """The cached images, or ``None`` (with a note) when the file is absent or not what it should be
    (read with ``allow_pickle=False``: arrays only)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            images, cached = z["images"], z["labels"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        print(
            f"note: ignoring the unreadable image cache {path} ({type(exc).__name__}); decoding again",
            flush=True,
        )
        return None
    if images.dtype != np.uint8 or images.shape != (n, 3, size, size) or not np.array_equal(cached, labels):
        print(
            f"note: ignoring the image cache {path}: it does not hold these images; decoding again",
            flush=True,
        )
        return None
    return images


def _write_cache(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, images=images, labels=labels)
    os.replace(tmp, path)


def load_image_folder(
    root: str | os.PathLike | None = None,
    split: str = "train",
    *,
    dataset: str = "imagefolder",
    size: int | None = None,
    resize: str | None = None,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
    seed: int = 0,
    max_bytes: int | None = None,
    max_pixels: int = MAX_PIXELS,
    workers: int = 1,
    progress: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> Batch:
    """Decode one split of an image folder into ``(inputs [N, 3, size, size], labels [N])``.

    Args:
        root: the data directory (default ``$SHARPSCAPE_DATA``, or its sub-directory named in the
            preset, e.g. ``tiny-imagenet-200``), holding ``train/``, ``val/`` and / or ``test/``.
        split: ``"train"``, ``"val"`` or ``"test"`` (``test/``, else ``val/``).
        dataset: the preset of :data:`IMAGE_FOLDER_DATASETS` giving the defaults of ``size``,
            ``resize`` and the statistics of ``normalize=True``.
        size: side of the square images (preset default when ``None``).
        resize: ``"shorter_crop"`` or ``"direct"`` (module docstring; preset default when ``None``).
        dtype: floating dtype of the inputs.
        normalize: ``True``: the preset's statistics (ImageNet's); ``False``: values in [0, 1]; a
            statistics name or ``(mean, std)`` (:func:`landscape.data.common.resolve_stats`).
        limit: keep this many images, drawn uniformly without replacement (seeded by ``seed``) and
            kept in class order, so that a subset covers every class (the files of a class folder
            come together, so "the first ``limit``" would miss most classes).
        max_bytes: refuse, before decoding, when the uint8 images plus the ``dtype`` tensor take
            more bytes (default: half the machine's memory).
        max_pixels: refuse an image whose header announces more pixels (decompression bombs).
        workers: threads decoding in parallel (Pillow releases the GIL while decoding).
        progress: a tqdm bar over the images.
        cache_dir: a directory (outside the data directory: nothing is ever written there) where
            the decoded uint8 images are kept as ``<sha256>.npz`` (read back with
            ``allow_pickle=False``) and found again while no file, label or setting changed.

    The class list is :func:`image_folder_index`'s ``classes``; a note reports skipped files.
    """
    preset = _preset(dataset)
    size = _check_positive_int("size", preset.size if size is None else size)
    resize = preset.resize if resize is None else resize
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    check_dtype(dtype)
    check_limit(limit)
    _check_positive_int("max_pixels", max_pixels)
    _check_positive_int("workers", workers)
    if max_bytes is not None:
        _check_positive_int("max_bytes", max_bytes)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    stats = resolve_stats(normalize, preset.stats, 3)
    index = image_folder_index(root, split, dataset=dataset)
    files, labels = index.files, index.labels
    if index.skipped:
        kinds = ", ".join(f"{k} x{v}" for k, v in sorted(index.skipped.items()))
        print(  # landscape.cli_common.note's form (importing it here would close an import cycle)
            f"note: {preset.what} {split}: skipped {sum(index.skipped.values())} non-image files in "
            f"{index.directory} ({kinds})",
            flush=True,
        )
    if limit is not None and limit < len(files):
        keep = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed))[:limit].sort().values
        files = tuple(files[i] for i in keep.tolist())
        labels = labels[keep.numpy()]
    n = len(files)
    _check_memory(n, size, dtype, max_bytes, preset.what, split)
    settings = {"size": size, "resize": resize, "max_pixels": max_pixels}
    cache = None if cache_dir is None else _cache_path(cache_dir, index, files, settings, preset.what)
    images = None if cache is None else _read_cache(cache, n, size, labels)
    if images is None:
        images = _decode_all(files, size, resize, max_pixels, preset.what, split, workers, progress)
        if cache is not None:
            _write_cache(cache, images, labels)
    out = torch.empty((n, 3, size, size), dtype=dtype)
    chunk = max(1, 2**24 // (3 * size * size))  # float64 scratch of to_inputs: ~128 MiB at a time
    for i in range(0, n, chunk):
        out[i : i + chunk] = to_inputs(images[i : i + chunk], stats, dtype)
    return out, torch.as_tensor(labels, dtype=torch.int64)
