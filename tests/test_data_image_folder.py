"""Image-folder data sets (landscape.data.image_folder, the imagefolder / tinyimagenet / imagenet /
stanford-cars / oxford-flowers specs) on tiny real PNG / JPEG files written with Pillow.

References: pixel values by numpy slicing of the written arrays (crop-only cases, exact for PNG),
Pillow's own decode + resize of the same file (resampled cases, JPEG), the ImageNet statistics
written out by hand, torch.randperm for the seeded subset, and for the end-to-end run
scikit-learn's top_k_accuracy_score on the saved model's logits.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from landscape.data import DATA_SPECS, image_folder_index, load_dataset, load_image_folder

MEAN = np.array([0.485, 0.456, 0.406]).reshape(3, 1, 1)  # torchvision's ImageNet statistics
STD = np.array([0.229, 0.224, 0.225]).reshape(3, 1, 1)
# created in this order, sorted by code point: "Mango" < "apple" < "zebra"
CLASSES = ("zebra", "apple", "Mango")


def _rgb(seed: int, h: int = 10, w: int = 14) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _class_tree(root: Path, splits=("train", "test"), per_class: int = 2, ext: str = "png") -> dict:
    """``root/<split>/<class>/<k>.<ext>`` with random 10 x 14 images; returns path -> array."""
    arrays = {}
    for s_i, split in enumerate(splits):
        for c_i, cls in enumerate(CLASSES):
            (root / split / cls).mkdir(parents=True)
            for k in range(per_class):
                a = _rgb(100 * s_i + 10 * c_i + k)
                path = root / split / cls / f"{k}.{ext}"
                Image.fromarray(a).save(path, quality=95) if ext == "jpg" else Image.fromarray(a).save(path)
                arrays[path] = a
    return arrays


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose IHDR announces ``width x height`` but holds no pixel data (nothing to decode)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))


def test_class_folders_labels_order_and_cropped_pixels(tmp_path):
    arrays = _class_tree(tmp_path)
    (tmp_path / "train" / "apple" / "README.txt").write_text("not an image")
    (tmp_path / "train" / "apple" / ".DS_Store").write_bytes(b"\0")
    index = image_folder_index(tmp_path, "train")
    assert index.classes == ("Mango", "apple", "zebra")
    assert index.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert index.skipped == {".txt": 1}
    # size 10 = the shorter side: no resampling, the centre crop is columns 2..11 of 14
    x, y = load_image_folder(tmp_path, "test", size=10, normalize=False, dtype=torch.float64)
    assert x.shape == (6, 3, 10, 10) and y.tolist() == [0, 0, 1, 1, 2, 2]
    for i, (cls, k) in enumerate((c, k) for c in ("Mango", "apple", "zebra") for k in range(2)):
        ref = arrays[tmp_path / "test" / cls / f"{k}.png"].transpose(2, 0, 1)[:, :, 2:12] / 255.0
        np.testing.assert_array_equal(x[i].numpy(), ref)
    # normalize=True: the ImageNet statistics
    xn, _ = load_image_folder(tmp_path, "test", size=10, dtype=torch.float64)
    np.testing.assert_allclose(xn.numpy(), (x.numpy() - MEAN) / STD, rtol=0, atol=1e-12)


def test_resize_modes_match_pillow_reference(tmp_path):
    arrays = _class_tree(tmp_path, splits=("train",), per_class=1)
    path = tmp_path / "train" / "Mango" / "0.png"
    im = Image.fromarray(arrays[path])
    # shorter side 10 -> 6: 14 * 6 / 10 = 8.4 -> 8 wide; centre crop left = round((8 - 6) / 2) = 1
    ref_crop = np.asarray(im.resize((8, 6), Image.Resampling.BILINEAR))[:, 1:7].transpose(2, 0, 1)
    ref_direct = np.asarray(im.resize((6, 6), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    for resize, ref in (("shorter_crop", ref_crop), ("direct", ref_direct)):
        x, _ = load_image_folder(
            tmp_path, "train", size=6, resize=resize, normalize=False, dtype=torch.float64
        )
        np.testing.assert_array_equal(np.rint(x[0].numpy() * 255), ref)
    # a constant image stays constant under any resize (closed form)
    Image.new("RGB", (9, 23), (200, 10, 77)).save(path)
    x, _ = load_image_folder(tmp_path, "train", size=5, normalize=False, dtype=torch.float64)
    np.testing.assert_array_equal(
        np.rint(x[0].numpy() * 255), np.broadcast_to([[[200]], [[10]], [[77]]], (3, 5, 5))
    )


def test_jpeg_grey_palette_and_workers(tmp_path):
    _class_tree(tmp_path, splits=("train",), ext="jpg")
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    Image.fromarray(grey, mode="L").save(tmp_path / "train" / "apple" / "g.png")
    pal = Image.fromarray(grey, mode="L").convert("P")
    pal.save(tmp_path / "train" / "zebra" / "p.bmp")
    x, y = load_image_folder(tmp_path, "train", size=8, resize="direct", normalize=False, dtype=torch.float64)
    files = image_folder_index(tmp_path, "train").files
    assert [f.name for f in files] == ["0.jpg", "1.jpg", "0.jpg", "1.jpg", "g.png", "0.jpg", "1.jpg", "p.bmp"]
    assert y.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    # grey -> three equal channels holding the grey values (exact: no resampling at 8 x 8)
    np.testing.assert_array_equal(np.rint(x[4].numpy() * 255), np.broadcast_to(grey, (3, 8, 8)))
    ref = np.asarray(pal.convert("RGB")).transpose(2, 0, 1)
    np.testing.assert_array_equal(np.rint(x[7].numpy() * 255), ref)
    # JPEG: Pillow's decode of the same file, resized by Pillow
    ref = np.asarray(Image.open(files[0]).convert("RGB").resize((8, 8), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(np.rint(x[0].numpy() * 255), ref.transpose(2, 0, 1))
    x2, y2 = load_image_folder(
        tmp_path, "train", size=8, resize="direct", normalize=False, dtype=torch.float64, workers=3
    )
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_limit_is_a_seeded_subset_in_class_order(tmp_path):
    _class_tree(tmp_path, splits=("train",), per_class=4)
    full_x, full_y = load_image_folder(tmp_path, "train", size=4)
    x, y = load_image_folder(tmp_path, "train", size=4, limit=5, seed=3)
    keep = torch.randperm(12, generator=torch.Generator().manual_seed(3))[:5].sort().values
    assert torch.equal(x, full_x[keep]) and torch.equal(y, full_y[keep])


def test_splits_test_falls_back_to_val_and_class_mismatch(tmp_path):
    _class_tree(tmp_path, splits=("train", "val"))
    xv, yv = load_image_folder(tmp_path, "val", size=4)
    xt, yt = load_image_folder(tmp_path, "test", size=4)  # no test/: val/
    assert torch.equal(xv, xt) and torch.equal(yv, yt)
    with pytest.raises(ValueError, match="split must be one of"):
        load_image_folder(tmp_path, "all", size=4)
    (tmp_path / "val" / "kiwi").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "val" / "kiwi" / "k.png")
    with pytest.raises(ValueError, match=r"differ from those of .*only in the other: \['kiwi'\]"):
        load_image_folder(tmp_path, "val", size=4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_image_folder(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="no split directory 'train'"):
        load_image_folder(tmp_path / "val", "train")


def _tiny_imagenet(root: Path) -> dict:
    """The official Tiny ImageNet layout in miniature: 3 wnids, 2 training images each."""
    wnids = ["n02", "n01", "n03"]
    root.mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    arrays = {}
    for i, w in enumerate(wnids):
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        (root / "train" / w / f"{w}_boxes.txt").write_text(f"{w}_0.JPEG\t0\t0\t8\t8\n")
        for k in range(2):
            Image.fromarray(_rgb(10 * i + k, 8, 8)).save(d / f"{w}_{k}.JPEG", format="JPEG", quality=95)
    (root / "val" / "images").mkdir(parents=True)
    (root / "test" / "images").mkdir(parents=True)
    lines = []
    for j, w in enumerate(["n03", "n01", "n02", "n01"]):
        a = _rgb(50 + j, 8, 8)
        Image.fromarray(a).save(root / "val" / "images" / f"val_{j}.JPEG", format="JPEG", quality=95)
        arrays[f"val_{j}.JPEG"] = a
        lines.append(f"val_{j}.JPEG\t{w}\t0\t0\t8\t8")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    Image.fromarray(_rgb(99, 8, 8)).save(root / "test" / "images" / "test_0.JPEG", format="JPEG")
    return arrays


def test_tiny_imagenet_official_layout(tmp_path, monkeypatch, capsys):
    base = tmp_path / "tiny-imagenet-200"
    _tiny_imagenet(base)
    monkeypatch.setenv("SHARPSCAPE_DATA", str(tmp_path))  # found in its usual sub-directory
    x_tr, y_tr = load_dataset("tinyimagenet", "train", size=8, normalize=False, dtype=torch.float64)
    assert y_tr.tolist() == [0, 0, 1, 1, 2, 2]  # sorted wnids n01, n02, n03
    assert "skipped 3 non-image files" in capsys.readouterr().out  # the three _boxes.txt
    index = image_folder_index(base, "test", dataset="tinyimagenet")  # test/images has no labels: val
    assert index.layout == "tinyimagenet-val" and index.classes == ("n01", "n02", "n03")
    assert [f.name for f in index.files] == ["val_1.JPEG", "val_3.JPEG", "val_2.JPEG", "val_0.JPEG"]
    x, y = load_dataset(f"tiny-imagenet:{base}", "test", size=8, normalize=False, dtype=torch.float64)
    assert x.shape == (4, 3, 8, 8) and y.tolist() == [0, 0, 1, 2]
    ref = np.asarray(Image.open(base / "val" / "images" / "val_2.JPEG").convert("RGB")).transpose(2, 0, 1)
    np.testing.assert_array_equal(np.rint(x[2].numpy() * 255), ref)  # 8 x 8 at size 8: no resampling
    # an annotation naming a class without a training folder
    with open(base / "val" / "val_annotations.txt", "a") as fh:
        fh.write("val_0.JPEG\tn99\t0\t0\t8\t8\n")
    with pytest.raises(ValueError, match=r"line 5: class 'n99' is not among the 3 class folders"):
        load_dataset(f"tinyimagenet:{base}", "val", size=8)


def test_refusals_bomb_formats_symlinks_empty(tmp_path):
    _class_tree(tmp_path / "data", splits=("train",), per_class=1)
    root = tmp_path / "data"
    # header announcing 20000 x 20000 pixels: Pillow's own bomb guard, before any decoding
    _png_header_only(root / "train" / "apple" / "bomb.png", 20000, 20000)
    with pytest.raises(ValueError, match="bomb.png.*decompression bomb"):
        load_image_folder(root, "train", size=4)
    # 5000 x 4000 = 2e7 pixels: under Pillow's limit, refused by max_pixels
    _png_header_only(root / "train" / "apple" / "bomb.png", 5000, 4000)
    with pytest.raises(ValueError, match=r"5000 x 4000 = 20000000 pixels, above max_pixels=1000000"):
        load_image_folder(root, "train", size=4, max_pixels=1_000_000)
    # a GIF named .png: formats are detected from the content and GIF is not allowed
    Image.new("RGB", (4, 4)).save(root / "train" / "apple" / "bomb.png", format="GIF")
    with pytest.raises(ValueError, match="bomb.png is not a JPEG/PNG/BMP/WEBP image"):
        load_image_folder(root, "train", size=4)
    # 16-bit PNG: refused (Pillow's RGB conversion would clip it at 255)
    Image.fromarray(np.full((4, 4), 4000, dtype=np.uint16)).save(root / "train" / "apple" / "bomb.png")
    with pytest.raises(ValueError, match="bomb.png has I;16 pixels"):
        load_image_folder(root, "train", size=4)
    (root / "train" / "apple" / "bomb.png").unlink()
    # a link inside the data directory is read; one leading outside is refused
    os.symlink(root / "train" / "zebra" / "0.png", root / "train" / "apple" / "inside.png")
    assert len(load_image_folder(root, "train", size=4)[1]) == 4
    Image.new("RGB", (4, 4)).save(tmp_path / "secret.png")
    os.symlink(tmp_path / "secret.png", root / "train" / "apple" / "escape.png")
    with pytest.raises(ValueError, match="escape.png is a symbolic link to .*outside the data directory"):
        load_image_folder(root, "train", size=4)
    (root / "train" / "apple" / "escape.png").unlink()
    os.symlink(tmp_path, root / "train" / "outside")
    with pytest.raises(ValueError, match="outside is a symbolic link .*outside the data directory"):
        image_folder_index(root, "train")
    (root / "train" / "outside").unlink()
    (root / "train" / "empty").mkdir()
    with pytest.raises(ValueError, match="class folder .*empty holds no"):
        image_folder_index(root, "train")


def test_memory_refused_before_decoding(tmp_path):
    _class_tree(tmp_path, splits=("train",), per_class=2)
    (tmp_path / "train" / "apple" / "broken.png").write_bytes(b"\x89PNG broken")  # would fail to decode
    # 7 images x 3 x 10 x 10 x (1 + 4) bytes = 10500 bytes; limit 5000 fits 5000 // 1500 = 3 images
    with pytest.raises(ValueError, match=r"7 images at size=10 .* max_bytes=5000 .*limit=3 fits") as err:
        load_image_folder(tmp_path, "train", size=10, max_bytes=5000)
    assert "nothing was decoded" in str(err.value)
    with pytest.raises(ValueError, match="ImageNet at 224 px does not fit in memory: its 1,281,167"):
        load_dataset(f"imagenet:{tmp_path}", "train", max_bytes=10**6)
    with pytest.raises(ValueError, match="broken.png"):  # under the limit, the broken file is decoded
        load_image_folder(tmp_path, "train", size=10)


def test_specs_and_presets(tmp_path):
    for spec in (
        "imagefolder[:DIR]",
        "tinyimagenet[:DIR]",
        "imagenet[:DIR]",
        "stanford-cars[:DIR]",
        "oxford-flowers[:DIR]",
    ):
        assert spec in DATA_SPECS
    _class_tree(tmp_path, splits=("train",), per_class=1)
    path = tmp_path / "train" / "Mango" / "0.png"
    Image.fromarray(_rgb(7, 30, 50)).save(path)
    im = Image.open(path)
    # stanford-cars: direct 224; oxford-flowers / imagenet: shorter side 224 then centre crop
    cars, _ = load_dataset(f"stanford-cars:{tmp_path}", "train", normalize=False, dtype=torch.float64)
    ref = np.asarray(im.resize((224, 224), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    np.testing.assert_array_equal(np.rint(cars[0].numpy() * 255), ref)
    flowers, _ = load_dataset(f"flowers102:{tmp_path}", "train", normalize=False, dtype=torch.float64)
    big = np.asarray(im.resize((int(224 * 50 / 30), 224), Image.Resampling.BILINEAR))  # 373 x 224
    left = round((373 - 224) / 2)  # 74.5 -> 74 (round half to even, as torchvision)
    np.testing.assert_array_equal(
        np.rint(flowers[0].numpy() * 255), big[:, left : left + 224].transpose(2, 0, 1)
    )


def test_end_to_end_run_reports_top5(tmp_path):
    from sklearn.metrics import top_k_accuracy_score

    from experiments.checkpoint import read_checkpoint
    from experiments.cli import main
    from landscape.models import model_factory

    data = tmp_path / "imgs"
    for split, n in (("train", 6), ("test", 4)):
        for c in range(7):
            d = data / split / f"class{c}"
            d.mkdir(parents=True)
            for k in range(n):
                Image.fromarray(_rgb(1000 * c + 10 * k + (split == "test"), 20, 20)).save(d / f"{k}.png")
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(
        f"""name = "imgfolder_top5"
seeds = [0]
device = "cpu"
threads = 1
out_dir = "{tmp_path / "runs"}"

[data]
name = "imagefolder:{data}"
kwargs = {{ size = 16 }}

[model]
name = "lenet5"
kwargs = {{ in_channels = 3, input_size = 16, num_classes = 7 }}

[train]
epochs = 2
batch_size = 16
lr = 0.05

[[methods]]
name = "sgd"
optimizer = "sgd"

[evaluation]
metrics = ["accuracy", "top5_accuracy"]
sharpness = []
"""
    )
    assert main(["run", str(cfg), "--no-progress"]) == 0
    run = tmp_path / "runs" / "imgfolder_top5" / "sgd" / "seed0"
    row = json.loads((run / "metrics.json").read_text())
    model = model_factory("lenet5", in_channels=3, input_size=16, num_classes=7)
    model.load_state_dict(read_checkpoint(run / "checkpoint.pt")["model"])
    x, y = load_dataset(f"imagefolder:{data}", "test", size=16)
    with torch.no_grad():
        logits = model.eval()(x).double()
    assert row["top5_accuracy"] == pytest.approx(
        top_k_accuracy_score(y.numpy(), logits.numpy(), k=5, labels=range(7)), abs=1e-12
    )
    assert row["accuracy"] == pytest.approx(float((logits.argmax(1) == y).double().mean()), abs=1e-12)
    # an unknown metric name is refused before training
    bad = cfg.read_text().replace('"top5_accuracy"]', '"top3_accuracy"]').replace("imgfolder_top5", "bad")
    cfg.write_text(bad)
    with pytest.raises(SystemExit):
        main(["run", str(cfg), "--no-progress"])
    assert not (tmp_path / "runs" / "bad").exists()


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_cache_outside_the_data_directory(tmp_path, capsys):
    data, cache = tmp_path / "data", tmp_path / "cache"
    arrays = _class_tree(data, splits=("train",), per_class=2)
    before = _listing(data)
    x0, y0 = load_image_folder(data, "train", size=10, cache_dir=cache)
    (entry,) = cache.glob("*.npz")
    assert _listing(data) == before  # nothing written into the data directory
    with np.load(entry, allow_pickle=False) as z:  # the cache holds the uint8 crops (numpy slicing)
        ref = np.stack([arrays[f].transpose(2, 0, 1)[:, :, 2:12] for f in image_folder_index(data).files])
        np.testing.assert_array_equal(z["images"], ref)
        assert z["labels"].tolist() == y0.tolist()
    # a second load reads the cache: the same tensors even with the images gone unreadable
    stamp = {f: f.stat() for f in data.rglob("*.png")}
    for f, st in stamp.items():
        f.write_bytes(b"\x89PNG broken".ljust(st.st_size, b"\0"))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    x1, y1 = load_image_folder(data, "train", size=10, cache_dir=cache)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)
    # a changed file (new size or modification time) misses the cache
    Image.fromarray(arrays[data / "train" / "Mango" / "0.png"]).save(data / "train" / "Mango" / "0.png")
    with pytest.raises(ValueError, match="1.png is not a JPEG/PNG"):  # decoded again: the broken files
        load_image_folder(data, "train", size=10, cache_dir=cache)
    # a damaged cache entry is ignored with a note
    for f in data.rglob("*.png"):
        f.unlink()
    _class_tree(tmp_path / "data2", splits=("train",), per_class=2)
    load_image_folder(tmp_path / "data2", "train", size=10, cache_dir=cache)
    newest = max(cache.glob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
    good = newest.read_bytes()
    for damaged in (b"not an npz", good[: len(good) // 2]):  # foreign bytes; a truncated zip archive
        newest.write_bytes(damaged)
        x2, _ = load_image_folder(tmp_path / "data2", "train", size=10, cache_dir=cache)
        assert torch.equal(x2, x0) and "ignoring the unreadable image cache" in capsys.readouterr().out
    with pytest.raises(ValueError, match="lies inside the data directory"):
        load_image_folder(tmp_path / "data2", "train", size=10, cache_dir=tmp_path / "data2" / "cache")
