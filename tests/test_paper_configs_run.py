"""Every config of docs/papers.md runs its budget version end to end on the CPU, on tiny files in the
real formats of its data (tests/synthetic_files.py): each method of the config trains and is
evaluated, and every run writes finite metrics; the table of a sweep is drawn.

What the CPU version leaves out, for time: the sharpness measures other than the adversarial
robustness curve of Fisher-SAM Fig. 4 (at its smallest and largest radius); batches of 16 examples;
float32 for the ResNet-34 of Fig. 4 (FLOAT32_ON_CPU); budget 0.01 or less, so that a run has at most
2 epochs (PyramidNet's 900 epochs would keep 9 at 0.01); 2 posterior samples, MC-Dropout passes and
ensemble members; CIFAR-10-C severities 1 and 5; the check on a growing loss (random labels and two
steps say nothing about it; a NaN still fails); every sweep at one value, the config's own network
or else the first (each value is built and checked on the meta device by tests/test_papers_page.py);
image sets at 32 px (the ViTs with 32-px position embeddings); ResNet-18/34, PreResNet-164, WRN-28-k,
PyramidNet-272 and ResNet-152 at a small depth of their family (SHRUNK); a user checkpoint replaced
by the seeded model's own weights written to a file; a tiny BERT for bert-base-uncased.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch

from experiments.cli import main
from experiments.config import load_config
from experiments.runner import plan_runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_papers  # noqa: E402
import synthetic_files  # noqa: E402

CONFIGS = sorted(
    {c for p in make_papers.inventories() for item in p["items"] for c in item.get("configs", [])}
)


#: the deepest networks at a small depth / width of their own family (same classes, same keyword
#: arguments otherwise): at full size they cost minutes per run on two CPU cores; their full-size
#: forward passes are tested in tests/test_model_zoo_papers.py and the zoo's tests
SHRUNK = {
    "resnet18": {"depth": 10},  # the configs' own ResNet-18 / ResNet-34: blocks of the same kind
    "resnet34": {"depth": 10},
    "preresnet164": {"depth": 20},
    "wrn28-10": {"depth": 10, "widen_factor": 2},
    "wrn28-2": {"depth": 10},
    "pyramidnet272": {"depth": 20, "alpha": 48},
    "resnet152-imagenet": {"depth": 50},
}


def _toml(value) -> str:
    return json.dumps(value)  # a JSON string / number / list / table of strings is TOML too


#: configs whose mixed precision runs in float32 here: bfloat16 autocast convolutions on a CPU without
#: native bfloat16 took 15x the float32 time for ResNet-34 (110 s vs 7 s per step of 16 images);
#: the other mixed-precision configs keep theirs, and tests/test_experiments_amp.py tests bf16 / fp16
FLOAT32_ON_CPU = {"fsam_fig4_adversarial"}


def _budget(cfg: dict) -> float:
    """0.01, or less where a run of the config has more than 200 epochs (the config's or a method's
    own ``epochs``): at most 2 epochs after the budget (experiments.budget rounds up)."""
    epochs = max(cfg["train"]["epochs"], *(m["epochs"] for m in cfg["methods"]))
    return min(0.01, (2 - 1e-9) / epochs)


def _overrides(name: str, tmp: Path) -> list[str]:
    cfg = load_config(ROOT / "configs" / f"{name}.toml")
    rng = np.random.default_rng(0)
    spec = cfg["data"]["name"]
    prefix = spec.split(":")[0]
    data_dir = synthetic_files.WRITERS[prefix](tmp / "data" / prefix, rng)
    out = [
        f"out_dir={tmp / 'runs'}",
        f"seeds=[{cfg['seeds'][0]}]",
        f"budget={_budget(cfg)!r}",
        f"data.name={prefix}:{data_dir}",
        "device=cpu",
        "progress=false",
        "train.batch_size=16",
        "evaluation.batch_size=64",
        "evaluation.bma_samples=2",
        "evaluation.sharpness_subset=16",
        "train.divergence_factor=0",  # a loss that grows within 2 steps on random labels is no fault
    ]
    if name in FLOAT32_ON_CPU:
        out.append('precision="float32"')
    for m in cfg["methods"]:  # fewer posterior samples and ensemble members, same code paths
        for table, key in (("swag", "samples"), ("mc_dropout", "samples"), ("ensemble", "members")):
            if m[table]:
                out.append(f"methods.{m['name']}.{table}.{key}=2")
    kept = [m for m in cfg["evaluation"]["sharpness"] if m == "perturbation_robustness"]
    out.append(f"evaluation.sharpness={_toml(kept)}")
    alphas = cfg["evaluation"]["sharpness_options"].get("perturbation_robustness", {}).get("alphas")
    if kept and alphas:  # the curve at its smallest and largest radius (Fig. 4 has 12)
        out.append(f"evaluation.sharpness_options.perturbation_robustness.alphas=[{alphas[0]}, {alphas[-1]}]")
    if cfg["sweep"]:  # one value: the config's own network where the sweep lists it, else the first
        chosen = {k: cfg["model"]["name"] if k == "model.name" and cfg["model"]["name"] in v else v[0]
                  for k, v in cfg["sweep"].items()}  # fmt: skip
        if "data.name" in chosen:  # a swept data set read from the files written above
            chosen["data.name"] = f"{chosen['data.name'].split(':')[0]}:{data_dir}"
        first = ", ".join(f"{_toml(k)} = [{_toml(v)}]" for k, v in chosen.items())
        out.append(f"sweep={{{first}}}")
    if cfg["evaluation"]["corruptions"]:
        c10c = synthetic_files.cifar10c(tmp / "data" / "cifar10c", rng)
        out += [
            f"evaluation.corruptions=cifar10c:{c10c}",
            'evaluation.corruption_names=["gaussian_noise", "snow"]',
            "evaluation.severities=[1, 5]",
        ]
    if cfg["evaluation"]["ood"] and cfg["evaluation"]["ood"] != "gaussian-noise":
        ood = cfg["evaluation"]["ood"].split(":")[0]
        ood_dir = synthetic_files.WRITERS[ood](tmp / "data" / f"ood-{ood}", rng)
        out.append(f"evaluation.ood={ood}:{ood_dir}")
    if prefix in ("imagefolder", "imagenet", "stanford-cars", "oxford-flowers", "tinyimagenet"):
        out.append("data.kwargs.size=32")
    model = cfg["model"]
    name_run = chosen["model.name"] if "model.name" in cfg["sweep"] else model["name"]
    for key, value in SHRUNK.get(name_run, {}).items():
        out.append(f"model.kwargs.{key}={value}")
    if model["name"] in ("vit-b16", "deit-b"):
        out.append("model.kwargs.image_size=32")
    if model["name"] == "hf-classifier":
        bert = synthetic_files.tiny_bert(tmp / "bert")
        out += [f"model.kwargs.path={bert}", f"data.kwargs.tokenizer={bert}"]
    if model["checkpoint"]:
        out += [f"model.checkpoint={_checkpoint(name, out, tmp)}", 'model.checkpoint_sha256=""']
    return out


def _checkpoint(name: str, overrides: list[str], tmp: Path) -> Path:
    """The seeded model of the run, saved as the state dict a user's checkpoint would be."""
    from experiments.train import build_model

    cfg = load_config(ROOT / "configs" / f"{name}.toml", [*overrides, 'model.checkpoint=""'])
    model = build_model(cfg, 12345, torch.float32, torch.device("cpu"), initial_weights=False)
    path = tmp / "checkpoint.pt"
    torch.save(model.state_dict(), path)
    return path


#: the 86-million-parameter transformers (DeiT-B, ViT-B/16): about 5 min per config on two CPU cores,
#: most of it in the optimizers' and checkpoints' passes over the weights; they run where CUDA is
TRANSFORMERS = ("fsam_t2_imagenet_deit_b", "fsam_t3_vit_cifar100", "fsam_t3_vit_cars", "fsam_t3_vit_flowers")
PARAMS = [pytest.param(c, marks=pytest.mark.gpu) if c in TRANSFORMERS else c for c in CONFIGS]


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", PARAMS)
def test_paper_config_budget_run_on_synthetic_files(name, tmp_path):
    overrides = _overrides(name, tmp_path)
    status = main(["run", str(ROOT / "configs" / f"{name}.toml"), *overrides])
    assert status == 0, status
    cfg = load_config(ROOT / "configs" / f"{name}.toml", overrides)
    runs = plan_runs(cfg)
    assert {r.method for r in runs} == {m["name"] for m in cfg["methods"]}
    for run in runs:
        metrics = json.loads((run.run_dir / "metrics.json").read_text())
        assert 0.0 <= metrics["accuracy"] <= 1.0 and math.isfinite(metrics["nll"]), run.run_dir
        if "perturbation_robustness" in cfg["evaluation"]["sharpness"]:
            curve = json.loads((run.run_dir / "results.json").read_text())["details"]["sharpness"]["rows"]
            assert any("extra" in row for row in curve.values())
    paper = tomllib.loads((ROOT / "configs" / f"{name}.toml").read_text()).get("paper", {})
    assert paper.get("source")
    assert main(["table", str(tmp_path / "runs"), "--plot", str(tmp_path / "table.png")]) == 0
    assert (tmp_path / "table.png").stat().st_size > 0
