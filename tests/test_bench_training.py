"""``benchmarks/bench_training.py``: a ``--quick`` run with one round records every row, its ratios
are those of the recorded medians and the targets are decided on them; the one-file SAM anchor is a
true SAM (its step equals ``optimizers.SAM``'s in float64)."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks import bench_training as bt
from landscape.io import read_json
from optimizers import SAM
from optimizers.perturbation import make_closure

REL = 1e-12


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_quick_run_records_every_row_with_ratios_of_its_medians(tmp_path):
    argv = ["--quick", "--rounds", "1", "--steps", "1", "--warmup", "0", "--threads", "1"]
    path = bt.main([*argv, "--out", str(tmp_path), "--name", "smoke"])
    assert path == tmp_path / "smoke.json"
    data = read_json(path)
    assert {"benchmark", "when", "machine", "config", "rows", "summary"} <= set(data)
    assert data["machine"]["torch_threads"] == 1 and data["machine"]["cpu_count"] >= 1
    cfg = data["config"]
    spe = 1438 // 256  # the digits training split (80 % of 1797), full batches of 256
    assert (cfg["batch_size"], cfg["steps_per_epoch"], cfg["timed_steps_per_round"]) == (256, spe, spe)
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == set(bt.RUNNER_METHODS) | set(bt.PLAIN)
    for key, r in rows.items():
        assert "error" not in r, (key, r.get("error"))
        assert len(r["step_ms_runs"]) == 1 and r["step_ms"] == statistics.median(r["step_ms_runs"]) > 0
        assert r["steps_per_s"] == pytest.approx(1e3 / r["step_ms"], rel=REL)
        assert r["epoch_ms"] == pytest.approx(spe * r["step_ms"], rel=REL)
        # every ratio recomputed from the recorded medians
        assert r["x_minimal_sgd"] == pytest.approx(r["step_ms"] / rows["minimal-sgd"]["step_ms"], rel=REL)
        assert r["x_runner_sgd"] == pytest.approx(r["step_ms"] / rows["sgd"]["step_ms"], rel=REL)
    sgd_epoch = rows["sgd"]["epoch_ms"] / rows["minimal-sgd"]["epoch_ms"]
    assert rows["sgd"]["epoch_x_minimal_sgd"] == pytest.approx(sgd_epoch, rel=REL)
    for fam in ("sam", "bsam"):
        m8, loop, m1 = rows[f"{fam}-m8"], rows[f"{fam}-m8-loop"], rows[fam]
        assert m8["x_m1"] == pytest.approx(m8["step_ms"] / m1["step_ms"], rel=REL)
        assert m8["batched_x_loop"] == pytest.approx(m8["step_ms"] / loop["step_ms"], rel=REL)
        assert (m8["m"], m8["m_sharpness"]) == (8, "batched")
        assert (loop["m"], loop["m_sharpness"]) == (8, "sequential: batched_m=False")
        assert m1["m_sharpness"] is None
    for key, eager in bt.COMPILED.items():  # torch.compile rows against their eager rows
        assert rows[key]["x_eager"] == pytest.approx(rows[key]["step_ms"] / rows[eager]["step_ms"], rel=REL)
        assert rows[key]["config"] == rows[eager]["config"] and rows[key]["variant"].endswith("compiled")
    assert rows["sam"]["x_one_file_sam"] == pytest.approx(
        rows["sam"]["step_ms"] / rows["one-file-sam"]["step_ms"], rel=REL
    )
    assert (rows["sam"]["optimizer"], rows["bsam"]["optimizer"], rows["swag"]["optimizer"]) == (
        "SAM",
        "BayesianSAM",
        "SWAG",
    )
    # the targets: decided on the ratio of the two rows' medians
    targets = {t["target"]: t for t in data["summary"]["targets"]}
    vogn = f"vogn_per_mc_sample_le_{bt.VOGN_TARGETS['mlp']:g}x_sgd_mlp"  # issue 41: per MC sample
    assert set(targets) == {name for name, *_, kind in bt.TARGETS if kind == "cpu"} | {vogn}
    for t in targets.values():
        num, den = rows[t["numerator"]][t["of"]], rows[t["denominator"]][t["of"]]
        per = rows["vogn"]["mc_samples"] if t["target"] == vogn else 1
        assert t["ratio"] == pytest.approx(num / den / per, rel=REL)
        assert t["pass"] is (num / den / per <= t["limit"])
    r = rows["vogn"]
    assert r["mc_samples"] == 5 and r["per_example"]["method"] == "layers"  # one backward per sample
    assert r["step_ms_per_mc_sample"] == pytest.approx(r["step_ms"] / 5, rel=REL)
    sgd = rows["sgd"]["step_ms"]
    assert r["per_mc_sample_x_runner_sgd"] == pytest.approx(r["step_ms"] / 5 / sgd, rel=REL)
    assert targets["sam_m1_le_2.05x_sgd"]["ratio"] == pytest.approx(rows["sam"]["x_runner_sgd"], rel=REL)
    assert data["summary"]["all_pass"] is all(t["pass"] for t in targets.values())


def _cnn_bn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4)
    )


@pytest.mark.parametrize("kind", ["mlp", "cnn_bn"])
def test_one_file_sam_step_equals_optimizers_sam_in_float64(kind):
    torch.manual_seed(3)
    model = (
        nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)) if kind == "mlp" else _cnn_bn()
    ).double()
    twin, plain = copy.deepcopy(model), copy.deepcopy(model)
    hyper = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
    base = torch.optim.SGD(model.parameters(), **hyper)
    ref = SAM(twin.parameters(), torch.optim.SGD, rho=0.2, model=twin, **hyper)
    sgd = torch.optim.SGD(plain.parameters(), **hyper)
    gen = torch.Generator().manual_seed(4)
    shape = (16, 6) if kind == "mlp" else (16, 1, 4, 4)
    for _ in range(2):  # the second step also goes through the momentum buffers
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 4, (16,), generator=gen)
        loss = bt.one_file_sam_step(model, base, x, y, rho=0.2)
        ref_loss = ref.step(make_closure(ref, twin, nn.CrossEntropyLoss(), x, y))
        bt.minimal_sgd_step(plain, sgd, x, y)
        torch.testing.assert_close(loss, ref_loss, atol=1e-14, rtol=0)
        for a, b in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
        for a, b in zip(model.buffers(), twin.buffers()):  # BatchNorm statistics of the pass at w only
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # a SAM step, not SGD's: the ascent moved the weights far beyond the tolerance
    with torch.no_grad():
        gap = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), plain.parameters()))
    assert gap > 1e-4


def test_benchmarks_page_training_table_is_the_committed_json():
    """The training table and target ratios of the benchmarks page (``docs/benchmarks.md``) are the
    numbers of ``benchmarks/results/training_mlp_cpu.json`` (rounded to 2 decimals), not hand-copied
    ones."""
    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "benchmarks" / "results" / "training_mlp_cpu.json").read_text())
    readme = " ".join((root / "docs" / "benchmarks.md").read_text().split())  # line breaks do not matter
    rows = {(r["method"], r["variant"]): r for r in data["rows"]}

    def x(method: str, variant: str) -> str:
        return f"{rows[(method, variant)]['x_runner_sgd']:.2f}"

    expected = [
        f"| SGD, minimal hand-written loop | {x('SGD', 'minimal loop')} |",
        f"| SAM, one-file two-pass | {x('SAM', 'one-file, m=1')} |",
        f"| SAM m=1 | {x('SAM', 'm=1')} |",
        f"| SAM m=8 batched / loop | {x('SAM', 'm=8 batched')} / {x('SAM', 'm=8 loop')} |",
        f"| ASAM / Fisher-SAM / IVON | {x('ASAM', 'm=1')} / {x('Fisher-SAM', 'm=1')} / {x('IVON', '')} |",
        f"| bSAM m=1 | {x('bSAM', 'm=1')} |",
        f"| bSAM m=8 batched / loop | {x('bSAM', 'm=8 batched')} / {x('bSAM', 'm=8 loop')} |",
        f"| SWAG | {x('SWAG', 'rank 20, every epoch')} |",
        f"| VOGN (5 samples, per-example gradients) | {x('VOGN', 'mc_samples=5')} |",
        f'| SGD / SAM / bSAM with `train.compile = "default"` | {x("SGD", "compiled")} / '
        f"{x('SAM', 'm=1 compiled')} / {x('bSAM', 'm=1 compiled')} |",
    ]
    for line in expected:
        assert line in readme, line
    targets = {t["target"]: t for t in data["summary"]["targets"]}
    assert f"SAM m=8 costs {targets['sam_m8_le_2.0x_sam_m1']['ratio']:.2f}× SAM m=1" in readme
    assert f"bSAM m=1 is {targets['bsam_m1_le_2.2x_sgd']['ratio']:.2f}× SGD" in readme
    assert f"epoch {targets['runner_sgd_epoch_le_1.10x_minimal_loop']['ratio']:.2f}× the minimal" in readme
    names = {
        "sam_m8_le_2.0x_sam_m1": "SAM m=8 ≤ 2× SAM m=1",
        "sam_m1_le_2.05x_sgd": "SAM m=1 ≤ 2.05× SGD",
        "bsam_m1_le_2.2x_sgd": "bSAM m=1 ≤ 2.2× SGD",
        "runner_sgd_epoch_le_1.10x_minimal_loop": "runner epoch ≤ 1.10× the minimal loop",
    }
    met = [names[n] for n in names if targets[n]["pass"]]
    missed = [names[n] for n in names if not targets[n]["pass"]]

    def verdict(items: list[str], word: str) -> str:
        return f"{' and '.join(items)} {'is' if len(items) == 1 else 'are'} {word}"

    words = ", ".join(verdict(i, w) for i, w in ((met, "met"), (missed, "not")) if i)
    assert f"Issue 25's CPU targets in this run: {words}:" in readme
    assert f"SAM m=1 is {targets['sam_m1_le_2.05x_sgd']['ratio']:.2f}× SGD" in readme
    batched = rows[("SAM", "m=8 batched")]["batched_x_loop"]
    assert f"the batched sub-batches {batched:.2f}× the loop's time" in readme
    eager = " / ".join(
        f"{rows[(method, variant)]['x_eager']:.2f}"
        for method, variant in (("SGD", "compiled"), ("SAM", "m=1 compiled"), ("bSAM", "m=1 compiled"))
    )
    assert f"(`x_eager` in the JSON: {eager})" in readme


def test_cifar_like_files_are_what_the_cifar10_loader_reads(tmp_path):
    """``benchmarks/make_cifar_like.py`` writes the real python-version pickle format: the loader
    returns exactly the written pixels and labels, train (five batches) and test."""
    import pickle

    import numpy as np

    from benchmarks.make_cifar_like import main
    from landscape.data import load_cifar10

    assert main([str(tmp_path), "--per-batch", "3", "--seed", "1"]) == 0
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(tmp_path / name, "rb") as fh:
            batches.append(pickle.load(fh))
    x, y = load_cifar10(tmp_path, "train", normalize=False, dtype=torch.float64)
    pixels = np.concatenate([b[b"data"] for b in batches[:5]]).reshape(15, 3, 32, 32) / 255.0
    assert torch.equal(x, torch.as_tensor(pixels))
    assert y.tolist() == sum((b[b"labels"] for b in batches[:5]), [])
    xt, yt = load_cifar10(tmp_path, "test", normalize=False, dtype=torch.float64)
    assert xt.shape == (3, 3, 32, 32) and yt.tolist() == batches[5][b"labels"]
    assert main([str(tmp_path / "bad"), "--per-batch", "0"]) == 2
