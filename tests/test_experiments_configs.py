"""The shipped configs: every one resolves (known keys, registered models, accepted
hyperparameters), paper configs default to a short ``budget`` and their ``[paper]`` numbers name
groups the config can produce; on a GPU, every paper config runs end to end on synthetic data
files in the real formats (CIFAR-10/100 pickles, CIFAR-10-C arrays)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch

from experiments.cli import main
from experiments.config import load_config
from experiments.runner import plan_runs, validate

ROOT = Path(__file__).resolve().parents[1]
# the configs of `python -m experiments run` (configs/ also holds other tools' files)
NAMES = ("digits_sam_vs_sgd", "bsam_cifar10_resnet20", "fsam_cifar10_wrn28_10", "fsam_cifar10_label_noise",
         "flat_bnn_cifar10_preresnet164", "gtracer_cifar100_label_noise", "vsam_cifar10_wrn")  # fmt: skip
CONFIGS = [ROOT / "configs" / f"{name}.toml" for name in NAMES]
PAPER = CONFIGS[1:]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_resolves_and_its_paper_numbers_name_its_groups(path):
    cfg = load_config(path)
    runs = plan_runs(cfg)
    validate(runs)  # optimizers, hyperparameter names, models, measures
    assert cfg["name"] == path.stem
    if path in PAPER:
        assert cfg["budget"] < 1.0 and cfg["paper"]["source"]
        methods = {m["name"] for m in cfg["methods"]}
        swept = {k.split(".")[-1] for k in cfg["sweep"]}
        raw = tomllib.loads(path.read_text())["paper"]
        numbers = {k: v for k, v in raw.items() if isinstance(v, dict)}
        assert numbers, "a paper config carries at least one of the paper's numbers"
        for metric, table in numbers.items():
            for label in table:
                variant, _, method = label.rpartition("/")
                assert method in methods, (metric, label)
                assert not variant or variant.split("=")[0] in swept, (metric, label)
            assert set(raw.get("percent", [])) <= set(numbers) | {"accuracy"}


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_config_header_lists_what_differs_from_the_authors_run(path):
    """Each paper config says, in its header, what a full run still does differently from the
    authors' (issue 22): a "Differences from the authors' run:" block of at least two items."""
    lines = path.read_text().splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if line.startswith("name = "))]
    assert "# Differences from the authors' run:" in header, path.name
    start = header.index("# Differences from the authors' run:") + 1
    items = [line for line in header[start:] if line.startswith("#   - ")]
    assert len(items) >= 2, (path.name, items)
    assert all(len(line) > 20 for line in items), items


def _synthetic_cifar(root: Path) -> dict[str, Path]:
    """Tiny CIFAR-10 / CIFAR-100 pickles and CIFAR-10-C arrays in the distributions' formats."""
    rng = np.random.default_rng(0)
    dirs = {k: root / k for k in ("cifar10", "cifar100", "cifar10c")}
    for d in dirs.values():
        d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (40, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, 40).tolist(),
        }
        (dirs["cifar10"] / name).write_bytes(pickle.dumps(batch))
    for name, n in (("train", 200), ("test", 100)):
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"fine_labels": rng.integers(0, 100, n).tolist(),
            b"coarse_labels": rng.integers(0, 20, n).tolist(),
        }
        (dirs["cifar100"] / name).write_bytes(pickle.dumps(batch))
    np.save(dirs["cifar10c"] / "labels.npy", np.tile(rng.integers(0, 10, 20), 5))
    for c in ("gaussian_noise", "snow"):
        np.save(dirs["cifar10c"] / f"{c}.npy", rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8))
    return dirs


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_config_runs_on_synthetic_data_on_a_gpu(path, tmp_path):
    dirs = _synthetic_cifar(tmp_path)
    data = "cifar100" if "cifar100" in load_config(path)["data"]["name"] else "cifar10"
    overrides = [
        f"out_dir={tmp_path / 'runs'}",
        "seeds=[0]",
        "budget=0.01",
        f"data.name={data}:{dirs[data]}",
        "device=cuda",
        "evaluation.sharpness_subset=32",
        "progress=false",
        f"evaluation.corruptions=cifar10c:{dirs['cifar10c']}"
        if "flat_bnn" in path.stem
        else "evaluation.corruptions=''",
        'evaluation.corruption_names=["gaussian_noise", "snow"]',
    ]
    if path.stem.startswith("bsam"):
        overrides.append("precision=fp16")  # the loss scaler with bSAM's m = 8 sub-batches on CUDA
    assert main(["run", str(path), *overrides]) == 0
    cfg = load_config(path, overrides)
    for run in plan_runs(cfg):
        metrics = json.loads((run.run_dir / "metrics.json").read_text())
        assert 0.0 <= metrics["accuracy"] <= 1.0 and np.isfinite(metrics["nll"])
        assert np.isfinite(metrics["sharpness_lambda_max"])
        env = json.loads((run.run_dir / "environment.json").read_text())
        assert env["device"].startswith("cuda") and env["device_name"] == torch.cuda.get_device_name(0)
        if "flat_bnn" in path.stem:
            assert "c10c_noise_accuracy" in metrics and "bma_accuracy" in metrics
    assert main(["table", str(tmp_path / "runs"), "--plot", str(tmp_path / "t.png")]) == 0
