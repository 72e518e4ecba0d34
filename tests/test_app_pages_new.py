"""Dashboard pages 5-7 (Experiments, Curvature monitor, Paths between minima) under streamlit's
AppTest, with defaults and changed widgets; the numbers on the pages checked against the library
calls that produce them (experiments.table, CurvatureMonitor.history, PathResult, Objective.loss)."""

from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import experiments_groups as eg  # noqa: E402
from dashboard import experiments_view as ev  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from landscape import metrics as lm  # noqa: E402


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: a plain list, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return arr.reshape(v["shape"]) if "shape" in v else arr
    return np.asarray([math.nan if e is None else e for e in v], dtype=float)


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _frame(at: AppTest, i: int = 0):
    return at.dataframe[i].value


# ------------------------------------------------------------------------------ experiments

EXP = "digits_sam_vs_sgd"
PALETTE = {"sgd": "#bcbd22", "sam": "#d62728", "bsam": "#1f77b4"}


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """A tiny grid (3 methods x 2 seeds, 1 epoch, 5 % of the data) written by the runner's CLI."""
    from experiments.cli import main

    out = tmp_path_factory.mktemp("runs")
    status = main(
        [
            "run",
            str(ROOT / "configs" / "digits_sam_vs_sgd.toml"),
            "train.epochs=1",
            "seeds=[0,1]",
            "budget=0.05",
            "evaluation.sharpness=[]",
            f"out_dir={out}",
            "--no-progress",
        ]
    )
    assert status == 0
    return out


def _experiments_page(root: Path) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "5_Experiments.py"), default_timeout=120)
    at.run()
    at.text_input(key="exp_root").set_value(str(root)).run()
    return at


def _key(name: str, root: Path, *extra) -> str:
    """The page's key of a widget that belongs to the directory ``root`` (and ``extra``)."""
    return eg.state_key(name, str(root), *extra)


def _cli_table(capsys, *runs: Path, fmt: str = "markdown") -> str:
    """What ``python -m experiments table RUNS --format FMT`` prints."""
    from experiments.cli import main

    capsys.readouterr()
    assert main(["table", *map(str, runs), "--format", fmt]) == 0
    return capsys.readouterr().out


def _markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of a Markdown table printed by ``python -m experiments table``, by column name."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    head, *rows = ([c.strip() for c in ln.strip("|").split(" | ")] for ln in lines)
    return [dict(zip(head, r)) for r in rows]


def _assert_cells_equal_cli(df, cli: list[dict[str, str]]) -> None:
    """Every cell the page shows (method, seeds, diverged, "mean ± std" per metric) is the cell
    ``python -m experiments table`` prints for that row and column."""
    assert len(df) == len(cli)
    for col in df.columns:
        assert [str(v) for v in df[col]] == [r[col] for r in cli], col


def _metric_cell(run_dirs: list[Path], metric: str) -> str:
    """mean ± sample std (ddof = 1) of ``metric`` in the runs' metrics.json, 4 and 2 digits."""
    vals = [json.loads((d / "metrics.json").read_text())[metric] for d in run_dirs]
    return f"{np.mean(vals):.4g} ± {np.std(vals, ddof=1):.2g}"


def _record_downloads(monkeypatch) -> dict[str, bytes]:
    """file id -> bytes of every file the page hands to a download button (AppTest's media store)."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    files: dict[str, bytes] = {}
    load = MemoryMediaFileStorage.load_and_get_id

    def recording(self, data, mimetype, kind, filename=None):
        file_id = load(self, data, mimetype, kind, filename)
        files[file_id] = data
        return file_id

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", recording)
    return files


def _download(at: AppTest, files: dict[str, bytes], label: str) -> bytes:
    button = next(b for b in at.get("download_button") if b.proto.label == label)
    return files[Path(button.proto.url).stem]


def test_experiments_table_equals_experiments_table(run_root, capsys, monkeypatch):
    files = _record_downloads(monkeypatch)
    at = _experiments_page(run_root)
    _no_errors(at)
    assert len(at.multiselect(key=_key("exp_runs", run_root, [EXP])).value) == 6
    assert [h.value for h in at.subheader][0] == f"Experiment {EXP}"
    # the table: the rows and cells `python -m experiments table <out_dir>/<name>` prints, the
    # README's metrics by default
    df = _frame(at, 0)
    cli = _markdown_rows(_cli_table(capsys, run_root / EXP))
    readme = ["accuracy", "nll", "ece", "brier", "auroc_misclassification"]
    assert list(df.columns)[:7] == ["method", "seeds", *readme] and len(df.columns) == 8
    _assert_cells_equal_cli(df, cli)
    assert list(df["method"]) == ["bsam", "sam", "sgd"] and list(df["seeds"]) == [2, 2, 2]
    for i, method in enumerate(df["method"]):
        seeds = [run_root / EXP / method / f"seed{s}" for s in (0, 1)]
        for m in ("accuracy", "nll", "ece", "brier"):
            assert df[m].iloc[i] == _metric_cell(seeds, m)
    # its CSV: every metric, as `python -m experiments table --format csv` writes it
    csv_file = _download(at, files, f"download the table of {EXP} (CSV)")
    assert csv_file.decode() == _cli_table(capsys, run_root / EXP, fmt="csv")
    # the training curves: one line per run, its y the log.jsonl values, coloured by method
    charts = _charts(at)
    loss = next(c for c in charts if c["layout"]["yaxis"]["title"]["text"] == "train_loss")
    assert len(loss["data"]) == 6
    for tr in loss["data"]:
        run = run_root / tr["meta"]["run"]
        logged = [json.loads(line)["train_loss"] for line in (run / "log.jsonl").read_text().splitlines()]
        assert _arr(tr["y"]).tolist() == logged
        assert tr["name"] == run.parent.name  # one experiment: the legend names the method alone
    styles = {tr["meta"]["method"]: (tr["line"]["color"], tr["line"]["dash"]) for tr in loss["data"]}
    assert styles == {m: (c, "solid") for m, c in PALETTE.items()}
    # the reliability rows: the recomputed ECE equals the ECE the runner recorded
    rel = _frame(at, 1)
    assert list(rel["run"]) == [f"{EXP}/{m}/seed0" for m in ("bsam", "sam", "sgd")]  # one run per row
    for _, row in rel.iterrows():
        assert row["ECE (recomputed)"] == pytest.approx(row["ECE (metrics.json)"], rel=1e-12)


def test_experiments_changed_widgets(run_root, capsys):
    at = _experiments_page(run_root)
    runs_key = _key("exp_runs", run_root, [EXP])
    sgd_only = [o for o in at.multiselect(key=runs_key).options if "/sgd/" in o]
    assert len(sgd_only) == 2
    at.multiselect(key=runs_key).set_value(sgd_only).run()
    _no_errors(at)
    df = _frame(at, 0)
    assert list(df["method"]) == ["sgd"] and list(df["seeds"]) == [2]
    assert df["accuracy"].iloc[0] == _metric_cell([run_root / o for o in sgd_only], "accuracy")
    _assert_cells_equal_cli(df, _markdown_rows(_cli_table(capsys, *(run_root / o for o in sgd_only))))
    # the metrics selector: the columns shown are the chosen metrics, in the chosen order
    metrics = at.multiselect(key=_key("exp_metrics", run_root))
    everything = list(metrics.options)
    metrics.set_value(["nll"]).run()
    _no_errors(at)
    assert list(_frame(at, 0).columns) == ["method", "seeds", "nll"]
    at.multiselect(key=_key("exp_metrics", run_root)).set_value(everything).run()
    df = _frame(at, 0)
    cli = _markdown_rows(_cli_table(capsys, *(run_root / o for o in sgd_only)))
    assert list(df.columns) == list(cli[0])  # all metrics: every column of the command's table
    _assert_cells_equal_cli(df, cli)
    # other curves: one chart per chosen key, y the log.jsonl values
    at.multiselect(key=_key("exp_curves", run_root)).set_value(["test_nll", "lr"]).run()
    _no_errors(at)
    charts = {c["layout"]["yaxis"]["title"]["text"]: c for c in _charts(at)}
    assert {"test_nll", "lr"} <= set(charts) and "train_loss" not in charts
    for tr in charts["lr"]["data"]:
        logged = (run_root / tr["meta"]["run"] / "log.jsonl").read_text().splitlines()
        assert _arr(tr["y"]).tolist() == [json.loads(line)["lr"] for line in logged]
    # 10 bins: the diagram's ECE is the 10-bin ECE of the run's rebuilt model
    rel_key = _key("exp_reliability", run_root, sgd_only)
    assert at.multiselect(key=rel_key).value == [f"{EXP}/sgd/seed0"]
    at.select_slider(key="exp_bins").set_value(10).run()
    _no_errors(at)
    probs, targets, _ = ev.run_probs(run_root / EXP / "sgd" / "seed0")
    rows = _frame(at, 1)
    assert list(rows["run"]) == [f"{EXP}/sgd/seed0"]
    assert rows["ECE (recomputed)"].iloc[0] == pytest.approx(lm.ece(probs, targets, n_bins=10), rel=1e-12)
    at.multiselect(key=rel_key).set_value([]).run()
    _no_errors(at)
    assert len(at.dataframe) == 1  # no reliability rows
    at.multiselect(key=runs_key).set_value([]).run()
    _no_errors(at)
    assert any("Choose at least one run" in i.value for i in at.info)


def test_experiments_another_directory_selects_all_its_runs(run_root, tmp_path, capsys):
    """Changing the directory does not carry the previous directory's run selection over (which
    would leave nothing selected): the new directory's runs all start selected, none of the old."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(run_root / EXP / "sgd", other / "sgd")
    at = _experiments_page(run_root)
    old_keys = [_key("exp_runs", run_root, [EXP]), _key("exp_experiments", run_root)]
    at.multiselect(key=old_keys[0]).set_value(at.multiselect(key=old_keys[0]).options[:1]).run()
    _no_errors(at)
    at.text_input(key="exp_root").set_value(str(other)).run()
    _no_errors(at)
    assert not set(old_keys) & {m.key for m in at.multiselect}  # the old directory's widgets are gone
    # "other" is itself the experiment (its runs are other/sgd/seed<k>)
    assert at.multiselect(key=_key("exp_experiments", other)).value == ["other"]
    runs = at.multiselect(key=_key("exp_runs", other, ["other"]))
    assert runs.value == runs.options == ["sgd/seed0", "sgd/seed1"]
    shown = [x for m in at.multiselect for x in [*m.options, *m.value]]
    assert not any(EXP in x for x in shown)
    df = _frame(at, 0)
    assert list(df["method"]) == ["sgd"]
    assert df["accuracy"].iloc[0] == _metric_cell([other / o for o in runs.value], "accuracy")
    _assert_cells_equal_cli(df, _markdown_rows(_cli_table(capsys, other)))


def test_experiments_missing_directory(tmp_path):
    at = _experiments_page(tmp_path / "nowhere")
    assert not at.exception
    assert any("does not exist" in e.value for e in at.error)
    at = _experiments_page(tmp_path)  # exists, holds no run
    _no_errors(at)
    assert any("No finished runs" in i.value for i in at.info)


def test_experiments_fresh_install_shows_the_empty_state(tmp_path, monkeypatch):
    """No runs/ yet (the default directory of a fresh install): a hint, not an error box."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SHARPSCAPE_RUNS", raising=False)
    at = AppTest.from_file(str(APP / "pages" / "5_Experiments.py"), default_timeout=300)
    at.run()
    _no_errors(at)
    assert at.text_input(key="exp_root").value == "runs"
    assert [i.value for i in at.info if "No finished runs" in i.value and "experiments run" in i.value]


# ------------------------------------------------------------------------------ curvature monitor


def _monitor_page(**preset) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "6_Curvature_monitor.py"), default_timeout=180)
    for k, v in preset.items():
        at.session_state[k] = v
    return at.run()


def _sharpness_traces(at: AppTest) -> tuple[dict, dict]:
    spec = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "sharpness")
    lam = next(d for d in spec["data"] if d["name"] == "lambda_max(H)")
    thr = next(d for d in spec["data"] if d["name"] == "threshold of lambda_max(H)")
    return lam, thr


def _dense_top_eigenvalue(model, x, y) -> float:
    """lambda_max of the float64 Hessian of the mean cross-entropy, built densely by autograd."""
    params = dict(model.named_parameters())
    names = list(params)

    def loss_of(*flat):
        out = torch.func.functional_call(model, dict(zip(names, flat)), (x,))
        return torch.nn.functional.cross_entropy(out, y)

    H = torch.autograd.functional.hessian(loss_of, tuple(p.detach() for p in params.values()))
    sizes = [p.numel() for p in params.values()]
    dense = torch.cat([torch.cat([H[i][j].reshape(sizes[i], sizes[j]) for j in range(len(sizes))], 1)
                       for i in range(len(sizes))], 0)  # fmt: skip
    return float(torch.linalg.eigvalsh(dense)[-1])


def test_monitor_defaults_plot_equals_history():
    at = _monitor_page()
    _no_errors(at)
    (run,) = at.session_state["monitor_runs"].values()
    hist = run.result.history
    assert [h["step"] for h in hist] == list(range(0, 61, 10))
    lam, thr = _sharpness_traces(at)
    assert _arr(lam["x"]).tolist() == [h["step"] for h in hist]
    assert _arr(lam["y"]).tolist() == [h["lambda_max"] for h in hist]
    np.testing.assert_array_equal(_arr(thr["y"]), 2.0 / 2.0)  # default lr = 2: threshold 2/lr
    assert lam["line"]["color"] == "#8c564b"  # the palette's GD colour
    rows = _frame(at, 0)
    assert rows["lambda_max"].tolist() == [h["lambda_max"] for h in hist]


def test_monitor_changed_widgets_against_dense_hessian():
    at = _monitor_page(mon_steps=20, mon_every=5, mon_hidden=8, mon_n=128, mon_lr=1.0)
    _no_errors(at)
    (run,) = at.session_state["monitor_runs"].values()
    hist = run.result.history
    assert [h["step"] for h in hist] == [0, 5, 10, 15, 20]
    lam, thr = _sharpness_traces(at)
    assert _arr(lam["y"]).tolist() == [h["lambda_max"] for h in hist]
    np.testing.assert_array_equal(_arr(thr["y"]), 2.0)
    # the first check is at the initial weights: the dense Hessian's top eigenvalue
    from dashboard.monitor_view import initial_problem, run_monitor

    model, x, y = initial_problem(hidden=8, n_train=128, seed=0)
    assert hist[0]["lambda_max"] == pytest.approx(_dense_top_eigenvalue(model, x, y), rel=1e-3)
    # the training-loss curve: the full-batch loss after s updates at x = s (0: the initial weights),
    # the step convention of the checks table: each check's loss lies on the curve
    loss_spec = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "training loss")
    assert _arr(loss_spec["data"][0]["y"]).tolist() == run.losses
    assert _arr(loss_spec["data"][0]["x"]).tolist() == list(range(21))
    table = _frame(at, 0)
    for step, loss in zip(table["step"], table["loss"]):
        assert run.losses[step] == pytest.approx(loss, rel=1e-6)
    with torch.no_grad():
        assert run.losses[0] == pytest.approx(
            float(torch.nn.functional.cross_entropy(model(x), y)), rel=1e-12
        )
    at.slider(key="mon_steps").set_value(10)
    at.select_slider(key="mon_every").set_value(50).run()
    _no_errors(at)
    assert list(_frame(at, 0)["step"]) == [0]  # every=50 > steps=10: only the check at the start
    with pytest.raises(ValueError, match="learning rate must be a positive"):
        run_monitor(lr=-1.0)
    with pytest.raises(ValueError, match="every must be an integer"):
        run_monitor(every=0)


def _monitor_directly(lr: float, steps: int, every: int, n: int, sizes: list[int]):
    """Full-batch GD with MSE on one-hot digits targets and ``CurvatureMonitor``, written with the
    library only (as docs/make_eos_figure.py does): ``(steps, lambda_max, losses)``, ``losses[s]``
    after ``s`` steps."""
    import landscape as ls
    from landscape.curvature.monitor import CurvatureMonitor

    x, labels = ls.data.load_digits("train", seed=0, dtype=torch.float64)
    x, y = x[:n], torch.nn.functional.one_hot(labels[:n], 10).to(torch.float64)
    model = ls.models.model_factory("mlp", sizes=sizes, activation="tanh", seed=0).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = CurvatureMonitor((x, y), torch.nn.MSELoss(), every=every, optimizer=opt, max_matvecs=20, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few thousand parameters: one thread is fastest
    try:
        mon.check(model, 0)
        hist = ls.models.train(model, (x, y), opt, epochs=steps, loss_fn=torch.nn.MSELoss(), callback=mon)
    finally:
        torch.set_num_threads(threads)
    st, lam = mon.result().series("lambda_max")
    with torch.no_grad():  # train's losses are before each step: the final weights' loss last
        final = float(torch.nn.MSELoss()(model(x), y))
    return st, lam, [*hist["loss"], final]


def test_monitor_edge_of_stability_preset():
    """?preset=edge_of_stability: MSE, tanh 64-32-32-10, 500 examples, lr 2, 800 steps; lambda_max
    ends within 10 % of 2/lr (Cohen et al. 2021), and the plotted series are the library's
    CurvatureMonitor run directly at the same settings."""
    at = AppTest.from_file(str(APP / "pages" / "6_Curvature_monitor.py"), default_timeout=300)
    at.query_params["preset"] = "edge_of_stability"
    at.run()
    _no_errors(at)
    assert not at.warning
    assert at.radio(key="mon_loss").value == "mse" and at.select_slider(key="mon_layers").value == 2
    assert at.select_slider(key="mon_n").value == 500 and at.slider(key="mon_steps").value == 800
    lam, thr = _sharpness_traces(at)
    y = _arr(lam["y"])
    np.testing.assert_array_equal(_arr(thr["y"]), 1.0)  # 2 / lr
    assert abs(y[-1] / 1.0 - 1) < 0.10, y[-1]
    assert y[0] < 0.7  # it starts well below the line: progressive sharpening, then the edge
    steps, direct, losses = _monitor_directly(2.0, 800, 10, 500, [64, 32, 32, 10])
    np.testing.assert_array_equal(_arr(lam["x"]), steps)
    np.testing.assert_allclose(y, direct, rtol=1e-9)
    loss_spec = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "training loss")
    np.testing.assert_allclose(_arr(loss_spec["data"][0]["y"]), losses, rtol=1e-9)
    assert f"{y[-1]:.3f} × 2/lr" in at.markdown[-1].value
    # choosing the other preset moves every widget back to its settings
    at.selectbox(key="mon_preset").select("cross_entropy").run()
    _no_errors(at)
    assert at.radio(key="mon_loss").value == "cross_entropy" and at.slider(key="mon_steps").value == 60
    assert list(_frame(at, 0)["step"]) == list(range(0, 61, 10))
    assert at.query_params["preset"] == "cross_entropy"


def test_monitor_thread_setting_is_restored():
    """run_monitor trains with one intra-op thread and gives torch its setting back, also when the
    run diverges; overlapping users (two sessions) restore the original count when the last leaves."""
    from dashboard.monitor_view import intra_op_threads, run_monitor

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        run = run_monitor(
            steps=2, every=1, hidden=8, n_train=128, on_step=lambda f: seen.append(torch.get_num_threads())
        )
        assert seen == [1, 1] and torch.get_num_threads() == 2 and run.config["loss"] == "cross_entropy"
        with pytest.raises(ValueError, match="lower the learning rate"):
            run_monitor(lr=1e200, steps=5, every=10, hidden=8, n_train=128, loss="mse")
        assert torch.get_num_threads() == 2
        a, b = intra_op_threads(1), intra_op_threads(1)
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert torch.get_num_threads() == 1  # b still runs
        b.__exit__(None, None, None)
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="unknown loss 'hinge'"):
            run_monitor(loss="hinge")
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------ paths between minima


def _paths_page(**preset) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "7_Paths_between_minima.py"), default_timeout=180)
    for k, v in preset.items():
        at.session_state[k] = v
    return at.run()


def _ce(model, data) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(data[0]), data[1]))


def test_paths_defaults_end_values_and_barrier():
    at = _paths_page()
    _no_errors(at)
    (pair,) = at.session_state["paths_pairs"].values()
    loss_a, loss_b = _ce(pair.model_a, pair.train), _ce(pair.model_b, pair.train)
    assert loss_a != loss_b  # two different minima
    spec = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "loss")
    traces = {d["name"]: d for d in spec["data"]}
    assert set(traces) == {"line", "bezier", "chord between the ends"}
    for name in ("line", "bezier"):
        t, y = _arr(traces[name]["x"]), _arr(traces[name]["y"])
        assert t[0] == 0.0 and t[-1] == 1.0 and len(t) == 21
        assert y[0] == pytest.approx(loss_a, rel=1e-12) and y[-1] == pytest.approx(loss_b, rel=1e-12)
    assert _arr(traces["chord between the ends"]["y"]) == pytest.approx([loss_a, loss_b], rel=1e-12)
    # the barrier in the table: the PathResult's, and max over the plotted points of loss - chord
    rows = _frame(at, 0)
    for i, name in enumerate(("line", "bezier")):
        t, y = _arr(traces[name]["x"]), _arr(traces[name]["y"])
        excess = float(np.max(y - ((1 - t) * loss_a + t * loss_b)))
        assert rows["path"].iloc[i] == name
        assert rows["barrier (above chord)"].iloc[i] == pytest.approx(excess, rel=1e-9, abs=1e-12)
    from dashboard import paths_view as pv

    line = pv.line_path(pair)
    assert rows["barrier (above chord)"].iloc[0] == line.barrier
    assert f"barrier {line.barrier:.4g}" in at.caption[-1].value


def test_paths_changed_widgets_and_uploads():
    at = _paths_page(paths_epochs=1, paths_hidden=8, paths_curve=False, paths_points=11, paths_split="test")
    _no_errors(at)
    (pair,) = at.session_state["paths_pairs"].values()
    spec = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "loss")
    line = next(d for d in spec["data"] if d["name"] == "line")
    y = _arr(line["y"])
    assert len(y) == 11 and [d["name"] for d in spec["data"]] == ["line", "chord between the ends"]
    assert y[0] == pytest.approx(_ce(pair.model_a, pair.test), rel=1e-12)
    assert y[-1] == pytest.approx(_ce(pair.model_b, pair.test), rel=1e-12)
    # the error panel: 1 - accuracy of each end model on the test split
    err = next(c for c in _charts(at) if c["layout"]["yaxis"]["title"]["text"] == "error")
    with torch.no_grad():
        acc_a = float((pair.model_a(pair.test[0]).argmax(1) == pair.test[1]).double().mean())
    assert _arr(err["data"][0]["y"])[0] == pytest.approx(1 - acc_a, abs=1e-12)
    at.session_state["paths_seed_b"] = 0
    at.run()
    assert not at.exception
    assert any("two different seeds" in e.value for e in at.error)
    at.radio(key="paths_source").set_value("upload two state dicts").run()
    _no_errors(at)
    assert any("Upload the state dicts" in i.value for i in at.info)
    # uploads: the state dicts round-trip bit for bit; bad files are named
    import io as _io

    from dashboard import paths_view as pv

    buf_a, buf_b = _io.BytesIO(), _io.BytesIO()
    torch.save(pair.model_a.state_dict(), buf_a)
    torch.save(pair.model_b.state_dict(), buf_b)
    up = pv.pair_from_state_dicts(
        pv.load_state_dict_bytes(buf_a.getvalue()), pv.load_state_dict_bytes(buf_b.getvalue())
    )
    for m_up, m in ((up.model_a, pair.model_a), (up.model_b, pair.model_b)):
        for (k1, v1), (k2, v2) in zip(m_up.state_dict().items(), m.state_dict().items()):
            assert k1 == k2 and torch.equal(v1, v2)
    assert pv.line_path(up, split="test", n_points=11).loss == pytest.approx(
        _arr(line["y"]).tolist(), rel=1e-12
    )
    with pytest.raises(ValueError, match="not a readable torch state dict"):
        pv.load_state_dict_bytes(b"not a file", "a.pt")
    small = {k: v for k, v in pair.model_a.state_dict().items()}
    small["3.weight"] = torch.zeros(5, 8, dtype=torch.float64)
    small["3.bias"] = torch.zeros(5, dtype=torch.float64)
    with pytest.raises(ValueError, match="the digits need 64 and 10"):
        pv.pair_from_state_dicts(small, pair.model_b.state_dict())
