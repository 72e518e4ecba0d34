"""Logic of the "Paths between minima" page: two digits MLPs (trained from different seeds, or
uploaded state dicts), the loss along the straight line between them (:func:`landscape.interpolate`;
Goodfellow et al. 2015, Frankle et al. 2020) and along a trained quadratic Bezier curve
(:func:`landscape.fit_curve` + :func:`landscape.evaluate_path`; Garipov et al. 2018, Sec. 3), with
the barrier heights of :class:`landscape.PathResult` (Entezari et al. 2022, eq. 1).
No Streamlit here, so tests call it directly.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
import torch
from torch import nn

import landscape as ls

from .layout import LEGEND_BELOW, fmt
from .toy.endpoints import NetworkEndPoint, classify_network_point, network_thresholds_text

__all__ = [
    "ModelPair",
    "PATH_COLORS",
    "train_pair",
    "pair_from_state_dicts",
    "load_state_dict_bytes",
    "line_path",
    "bezier_path",
    "paths_figure",
    "barrier_rows",
    "path_caption",
    "path_statement",
    "end_points",
    "end_point_rows",
    "DEFAULT_EPOCHS",
    "DEFAULT_CURVE_STEPS",
]

#: the page's defaults: 50 epochs train both networks to 100 % training accuracy; 300 curve steps
#: bring the Bezier curve's loss close to the ends' (see tests/test_app_truth_toys.py)
DEFAULT_EPOCHS = 50
DEFAULT_CURVE_STEPS = 300
#: losses that differ by less than this (relative to the ends' loss) count as equal
LOSS_RTOL = 1e-9

#: colours of the two paths (not methods: the palette's method colours do not apply)
PATH_COLORS = {"line": "#1f77b4", "bezier": "#d62728", "chord": "#7f7f7f"}


@dataclass
class ModelPair:
    """Two models of one architecture and the digits data the paths are measured on."""

    model_a: nn.Module
    model_b: nn.Module
    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)


def _digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return (
        ls.data.load_digits("train", seed=0, dtype=torch.float64),
        ls.data.load_digits("test", seed=0, dtype=torch.float64),
    )


def _mlp(hidden: int, seed: int) -> nn.Module:
    return ls.models.model_factory("mlp", sizes=[64, hidden, 10], activation="tanh", seed=seed).double()


def train_pair(
    *,
    seeds: tuple[int, int] = (0, 1),
    hidden: int = 16,
    epochs: int = DEFAULT_EPOCHS,
    lr: float = 0.05,
    batch_size: int = 64,
    on_step: Callable[[float], None] | None = None,
) -> ModelPair:
    """Two MLPs 64-``hidden``-10 (tanh, float64) trained on the digits training split with SGD
    (momentum 0.9, step ``lr``), each from its own seed (initialisation and batch order).

    ``on_step(fraction_done)`` follows both trainings."""
    if len(seeds) != 2 or seeds[0] == seeds[1]:
        raise ValueError(f"give two different seeds, got {seeds}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning rate must be a positive number, got {lr!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    train, test = _digits()
    per = epochs * math.ceil(len(train[1]) / batch_size)
    models = []
    for i, seed in enumerate(seeds):
        model = _mlp(hidden, seed)

        def callback(step: int, m: nn.Module, loss: float, i: int = i) -> None:
            if on_step is not None:
                on_step((i * per + step) / (2 * per))

        ls.models.train(
            model,
            train,
            lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9),
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
            callback=callback,
        )
        model.eval()
        models.append(model)
    config = {"seeds": list(seeds), "hidden": hidden, "epochs": epochs, "lr": lr, "batch_size": batch_size}
    return ModelPair(models[0], models[1], train, test, config)


def load_state_dict_bytes(data: bytes, name: str = "upload") -> dict[str, torch.Tensor]:
    """A state dict saved with ``torch.save(model.state_dict(), path)`` (read with
    ``weights_only=True``: no code in the file is run)."""
    try:
        sd = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise ValueError(f"{name}: not a readable torch state dict ({type(exc).__name__}); save it with "
                         "torch.save(model.state_dict(), path)") from None  # fmt: skip
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{name}: expected a dict of tensors (model.state_dict()), got {type(sd).__name__}")
    return sd


def _sizes(sd: dict[str, torch.Tensor], name: str) -> list[int]:
    weights = [k for k in sd if k.endswith(".weight")]
    if not weights or any(sd[k].ndim != 2 for k in weights):
        raise ValueError(f"{name}: not the state dict of an MLP (Linear layers only); keys: {list(sd)[:6]}")
    sizes = [int(sd[weights[0]].shape[1])] + [int(sd[k].shape[0]) for k in weights]
    if sizes[0] != 64 or sizes[-1] != 10:
        raise ValueError(
            f"{name}: an MLP with {sizes[0]} inputs and {sizes[-1]} outputs; the digits need 64 and 10"
        )
    return sizes


def pair_from_state_dicts(sd_a: dict[str, torch.Tensor], sd_b: dict[str, torch.Tensor]) -> ModelPair:
    """Two tanh MLPs ``landscape.models.model_factory("mlp", sizes=...)`` holding the given weights
    (the layer sizes read from the weight shapes; both must have the same ones)."""
    sizes_a, sizes_b = _sizes(sd_a, "model A"), _sizes(sd_b, "model B")
    if sizes_a != sizes_b:
        raise ValueError(
            f"the two models differ in layer sizes ({sizes_a} vs {sizes_b}); a path needs one architecture"
        )
    models = []
    for sd, label in ((sd_a, "model A"), (sd_b, "model B")):
        model = ls.models.model_factory("mlp", sizes=sizes_a, activation="tanh", seed=0).double()
        try:
            model.load_state_dict({k: v.double() for k, v in sd.items()})
        except RuntimeError as exc:
            raise ValueError(f"{label}: the weights do not fit a tanh MLP {sizes_a}: {exc}") from None
        model.eval()
        models.append(model)
    train, test = _digits()
    digest = [hashlib.sha256(b"".join(v.double().numpy().tobytes() for v in sd.values())).hexdigest()[:16]
              for sd in (sd_a, sd_b)]  # fmt: skip
    return ModelPair(models[0], models[1], train, test, {"uploaded": digest, "sizes": sizes_a})


def _data(pair: ModelPair, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return pair.train if split == "train" else pair.test


def line_path(pair: ModelPair, *, split: str = "train", n_points: int = 21) -> ls.PathResult:
    """Cross-entropy along ``(1 - t) theta_a + t theta_b`` on the chosen split."""
    return ls.interpolate(
        pair.model_a, pair.model_b, nn.CrossEntropyLoss(), _data(pair, split), n_points=n_points
    )


def bezier_path(
    pair: ModelPair,
    *,
    split: str = "train",
    steps: int = DEFAULT_CURVE_STEPS,
    n_points: int = 21,
    seed: int = 0,
    on_step: Callable[[float], None] | None = None,
) -> ls.PathResult:
    """A quadratic Bezier curve trained on the training split (Adam, lr 0.01, minibatches of 128,
    ``steps`` updates) and evaluated on the chosen split; ``on_step(fraction_done)`` after every
    update (a hook on the optimizer: the updates are those of ``optimizer="adam"``)."""

    def adam(params: list[torch.Tensor]) -> torch.optim.Optimizer:
        opt = torch.optim.Adam(params, lr=1e-2, weight_decay=0.0)
        if on_step is not None:
            done = [0]

            def hook(*_: Any) -> None:
                done[0] += 1
                on_step(done[0] / steps)

            opt.register_step_post_hook(hook)
        return opt

    curve = ls.fit_curve(
        pair.model_a,
        pair.model_b,
        nn.CrossEntropyLoss(),
        pair.train,
        kind="bezier",
        steps=steps,
        lr=1e-2,
        optimizer=adam,
        batch_size=128,
        seed=seed,
    )
    data = None if split == "train" else _data(pair, split)
    return ls.evaluate_path(curve, data=data, n_points=n_points)


def paths_figure(paths: dict[str, ls.PathResult], metric: str = "loss") -> go.Figure:
    """``metric`` against ``t`` for each path (line, bezier), with the chord between the end values
    (dashed, from the first path: both share their ends)."""
    fig = go.Figure()
    first = None
    for name, p in paths.items():
        base = p.to_plotly(metric)  # the path's own trace and chord
        trace = base.data[0]
        trace.update(name=name, line={"color": PATH_COLORS.get(name, "#000000")})
        fig.add_trace(trace)
        if first is None and len(base.data) > 1:
            first = base.data[1]
    if first is not None:
        first.update(name="chord between the ends", line={"color": PATH_COLORS["chord"], "dash": "dash"})
        fig.add_trace(first)
    fig.update_layout(
        xaxis_title="t", yaxis_title=metric, legend=LEGEND_BELOW, title=f"{metric} along the paths"
    )
    return fig


def barrier_rows(paths: dict[str, ls.PathResult]) -> list[dict[str, Any]]:
    """One row per path: end losses, the lowest and the highest loss on it and the barrier heights
    of :class:`PathResult`."""
    rows = []
    for name, p in paths.items():
        i_min = min(range(len(p.loss)), key=lambda i: p.loss[i])
        rows.append(
            {
                "path": name,
                "loss at A (t=0)": p.loss_a,
                "loss at B (t=1)": p.loss_b,
                "min loss": p.loss[i_min],
                "t of min": p.t[i_min],
                "max loss": p.max_loss,
                "barrier (above chord)": p.barrier,
                "t of barrier": p.t_barrier,
                "error barrier": p.error_barrier,
            }
        )
    return rows


def end_points(
    pair: ModelPair, progress: Callable[[float, str], None] | None = None
) -> dict[str, NetworkEndPoint]:
    """Each model's weights classified on the training cross-entropy (full batch: gradient and the
    extreme Hessian eigenvalues, ``toy.endpoints.classify_network_point``)."""
    out = {}
    for i, (label, model) in enumerate((("A", pair.model_a), ("B", pair.model_b))):
        if progress is not None:
            progress(i / 2, f"model {label}")
        out[label] = classify_network_point(model, nn.CrossEntropyLoss(), pair.train)
    return out


def _accuracy(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float((model(data[0]).argmax(1) == data[1]).double().mean())


def _scaled_loss(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], factor: float) -> float:
    """Training cross-entropy with the last layer's weights and bias scaled by ``factor``."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        w, b = last.weight.clone(), last.bias.clone()
        last.weight.mul_(factor)
        last.bias.mul_(factor)
        loss = float(nn.functional.cross_entropy(model(data[0]), data[1]))
        last.weight.copy_(w)
        last.bias.copy_(b)
    return loss


def end_point_rows(pair: ModelPair, ends: dict[str, NetworkEndPoint]) -> list[dict[str, Any]]:
    """One row per end model: what its weights are (minimum, saddle point, not converged, diverged),
    with the numbers the classification rests on and the training accuracy."""
    models = {"A": pair.model_a, "B": pair.model_b}
    return [
        {
            "model": label,
            "end point is": e.kind,
            "training loss": fmt(e.loss),
            "training accuracy": f"{100 * _accuracy(models[label], pair.train):.2f}%",
            "‖∇L‖": fmt(e.grad_norm, 3),
            "λ_min": fmt(e.lambda_min, 3),
            "λ_max": fmt(e.lambda_max, 3),
            "Lanczos residual": fmt(e.residual, 2),
        }
        for label, e in ends.items()
    ]


def ends_statement(pair: ModelPair, ends: dict[str, NetworkEndPoint]) -> str:
    """What the two end points are, in words built from the table's numbers, with the rule."""
    kinds = {e.kind for e in ends.values()}
    text = "**End points.** "
    if kinds == {"minimum"}:
        text += "Both ends are minima of the training loss to the stated tolerance. "
    else:
        parts = [f"{label} is {'a ' if e.kind != 'not converged' else ''}{e.kind} ({e.reason()})"
                 for label, e in ends.items()]  # fmt: skip
        lead = "Neither end is a minimum" if "minimum" not in kinds else "Only one end is a minimum"
        text += f"{lead}: " + "; ".join(parts) + ". "
        models = {"A": pair.model_a, "B": pair.model_b}
        for label, e in ends.items():
            if e.kind == "not converged" and _accuracy(models[label], pair.train) == 1.0:
                lower = _scaled_loss(models[label], pair.train, 1.1)
                if lower < e.loss:
                    text += (
                        f"{label} classifies every training example correctly, and scaling its last layer by "
                        f"1.1 lowers the training loss from {fmt(e.loss)} to {fmt(lower)}: cross-entropy on "
                        "data a network fits perfectly has no minimum at finite weights, so training longer "
                        "only shrinks the gradient. "
                    )
                    break
    return text + "Rule: " + network_thresholds_text()


def path_statement(p: ls.PathResult, name: str) -> str:
    """One sentence about one path, only what its numbers support: a dip below both ends means the
    ends are not minima along it (no barrier is stated); a barrier of 0 means the loss stays at or
    below the chord; otherwise the barrier height and where it is."""
    low = min(p.loss_a, p.loss_b)
    tol = LOSS_RTOL * max(abs(p.loss_a), abs(p.loss_b), 1e-300)
    inner = [(t, v) for t, v in zip(p.t, p.loss) if 0.0 < t < 1.0]
    if inner:
        t_min, v_min = min(inner, key=lambda tv: tv[1])
        if v_min < low - tol:
            return (
                f"{name}: the loss at t = {fmt(t_min, 3)} ({fmt(v_min)}) is lower than at both ends "
                f"({fmt(p.loss_a)} at A, {fmt(p.loss_b)} at B), so the ends are not minima along this path "
                "and there is no barrier between minima to report."
            )
    if not p.barrier > tol:
        return (
            f"{name}: no barrier: the loss stays at or below the chord from {fmt(p.loss_a)} (A) to "
            f"{fmt(p.loss_b)} (B) at every evaluated point."
        )
    return (
        f"{name}: barrier {fmt(p.barrier)} at t = {fmt(p.t_barrier, 3)} above the chord from {fmt(p.loss_a)} "
        f"(A) to {fmt(p.loss_b)} (B)."
    )


def path_caption(
    pair: ModelPair,
    paths: dict[str, ls.PathResult],
    split: str,
    ends: dict[str, NetworkEndPoint] | None = None,
) -> str:
    """What the figure shows: one statement per path (:func:`path_statement`), whether the ends are
    minima (with ``ends``), and how the barrier was measured."""
    n = len(_data(pair, split)[1])
    text = f"Cross-entropy on the {split} split ({n} examples)."
    names = {"line": "Straight line", "bezier": "Bézier curve"}
    for key, p in paths.items():
        text += " " + path_statement(p, names.get(key, key))
    if ends is not None and any(e.kind != "minimum" for e in ends.values()):
        text += (
            " The ends are not both minima (see End points), so these are heights between two trained "
            "networks, not barriers between minima."
        )
    if paths:
        k = len(next(iter(paths.values())).t)
        text += (
            f" Barriers are the largest excess over the chord among the {k} evaluated points (t in steps of "
            f"{fmt(1 / max(k - 1, 1), 2)}; a higher point between them is missed), each on the full split "
            "(no sampling error), for this one pair of seeds."
        )
    return text
