"""Reliability diagrams (DeGroot & Fienberg 1983; Guo et al., ICML 2017, fig. 1) with matplotlib and Plotly.

Both take one model's ``probs`` or a mapping ``{name: probs}`` of several models evaluated on
the same ``targets`` and draw, per confidence bin: a bar of the accuracy, the gap to the mean
confidence (hatched, red), the diagonal of perfect calibration and the number of examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from landscape.metrics._calibration import Binning, CalibrationCurve, calibration_curve

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def curves(
    probs: torch.Tensor | Mapping[str, torch.Tensor],
    targets: torch.Tensor,
    n_bins: int,
    binning: Binning,
) -> dict[str, CalibrationCurve]:
    """One :class:`CalibrationCurve` per model; a lone tensor is named ``"model"``."""
    if isinstance(probs, Mapping):
        if not probs:
            raise ValueError("probs is an empty mapping: pass {name: probs} with at least one model")
        bad = [k for k in probs if not isinstance(k, str)]
        if bad:
            raise TypeError(f"model names (the keys of probs) must be strings, got {bad!r}")
        items = dict(probs)
    else:
        items = {"model": probs}
    return {name: calibration_curve(p, targets, n_bins, binning) for name, p in items.items()}


def _layout(c: CalibrationCurve, j: int, k: int) -> tuple[list[float], list[float]]:
    """Bar centres and widths of model ``j`` of ``k`` sharing each bin."""
    lo, hi = c.lower.tolist(), c.upper.tolist()
    width = [(h - low) / k for low, h in zip(lo, hi, strict=True)]
    centre = [low + (j + 0.5) * w for low, w in zip(lo, width, strict=True)]
    return centre, width


def _opt(x: torch.Tensor) -> list[float | None]:
    return [None if v != v else float(v) for v in x.tolist()]  # NaN (empty bin) -> no bar


def reliability_diagram(
    probs: torch.Tensor | Mapping[str, torch.Tensor],
    targets: torch.Tensor,
    n_bins: int = 20,
    binning: Binning = "equal_width",
    ax: Any = None,
    show_counts: bool = True,
    title: str | None = None,
) -> Any:
    """Matplotlib reliability diagram; returns the ``Axes`` it drew on.

    Args:
        probs: ``[B, C]`` (or ``[B]`` binary) probabilities, or ``{name: probs}`` for several
            models on the same data (their bars share each bin side by side).
        targets: ``[B]`` integer labels.
        n_bins, binning: as in :func:`calibration_curve`.
        ax: a matplotlib ``Axes`` to draw on; ``None`` makes a new figure (not registered with
            ``pyplot``; reach it as ``ax.figure``).
        show_counts: add the per-bin counts as grey bars on a secondary axis (the bottom quarter).
        title: axes title.

    The legend gives each model's ECE with the same bins. The accuracy bars are the first ``k``
    bar containers of ``ax.containers`` (one per model), the gaps the next ``k``.
    """
    import matplotlib.figure

    cs = curves(probs, targets, n_bins, binning)
    if ax is None:
        ax = matplotlib.figure.Figure(figsize=(5.0, 5.0), layout="constrained").add_subplot()
    k = len(cs)
    placed = [_layout(c, j, k) for j, c in enumerate(cs.values())]
    for j, (name, c) in enumerate(cs.items()):
        x, w = placed[j]
        acc = [float("nan") if v is None else v for v in _opt(c.accuracy)]
        ax.bar(
            x,
            acc,
            width=w,
            color=_COLORS[j % len(_COLORS)],
            edgecolor="black",
            linewidth=0.5,
            label=f"{name} (ECE {c.calibration_error('l1'):.3f})",
        )
    for j, c in enumerate(cs.values()):
        x, w = placed[j]
        acc, gap = c.accuracy.tolist(), c.gap.tolist()
        ax.bar(
            x,
            gap,
            bottom=acc,
            width=w,
            color="red",
            alpha=0.25,
            edgecolor="red",
            hatch="//",
            linewidth=0.5,
            label="gap (confidence - accuracy)" if j == 0 else None,
        )
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (max probability)", ylabel="accuracy")
    if show_counts:
        cax = ax.twinx()
        top = 1.0
        for j, c in enumerate(cs.values()):
            x, w = placed[j]
            cax.bar(x, c.count.tolist(), width=w, color="grey", alpha=0.35)
            top = max(top, float(c.count.max()))
        cax.set_ylim(0, 4 * top)
        cax.set_ylabel("examples per bin")
        ax.set_zorder(cax.get_zorder() + 1)  # counts behind the bars, legend on top
        ax.patch.set_visible(False)
    ax.legend(loc="upper left", fontsize="small")
    if title:
        ax.set_title(title)
    return ax


def reliability_figure(
    probs: torch.Tensor | Mapping[str, torch.Tensor],
    targets: torch.Tensor,
    n_bins: int = 20,
    binning: Binning = "equal_width",
    title: str | None = None,
) -> Any:
    """Plotly reliability diagram: accuracy bars, gaps and diagonal on top, counts below.

    Args:
        probs: ``[B, C]`` (or ``[B]`` binary) probabilities, or ``{name: probs}`` for several
            models on the same data.
        targets: ``[B]`` integer labels.
        n_bins, binning: as in :func:`calibration_curve`.
        title: figure title.

    Returns:
        A ``plotly.graph_objects.Figure``. Every trace carries ``meta={"model": name, "role": r}``
        with ``r`` one of ``"accuracy"``, ``"gap"``, ``"count"`` (``"diagonal"`` for the line);
        an empty bin's accuracy and gap are ``None``.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cs = curves(probs, targets, n_bins, binning)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25], vertical_spacing=0.05)
    k = len(cs)
    for j, (name, c) in enumerate(cs.items()):
        x, w = _layout(c, j, k)
        color = _COLORS[j % len(_COLORS)]
        acc, conf, gap, count = _opt(c.accuracy), _opt(c.confidence), _opt(c.gap), c.count.tolist()
        ece = c.calibration_error("l1")
        custom = list(zip(conf, count, c.lower.tolist(), c.upper.tolist(), strict=True))
        hover = (
            "bin (%{customdata[2]:.3f}, %{customdata[3]:.3f}]<br>accuracy %{y:.3f}<br>"
            "confidence %{customdata[0]:.3f}<br>examples %{customdata[1]}<extra>" + name + "</extra>"
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=acc,
                width=w,
                name=f"{name} (ECE {ece:.3f})",
                marker_color=color,
                legendgroup=name,
                customdata=custom,
                hovertemplate=hover,
                meta={"model": name, "role": "accuracy"},
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=gap,
                base=acc,
                width=w,
                name="gap (confidence - accuracy)",
                marker={
                    "color": "rgba(214,39,40,0.3)",
                    "line": {"color": "rgb(214,39,40)", "width": 1},
                    "pattern": {"shape": "/"},
                },
                legendgroup="gap",
                showlegend=j == 0,
                hovertemplate="gap %{y:.3f}<extra>" + name + "</extra>",
                meta={"model": name, "role": "gap"},
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=count,
                width=w,
                name=f"{name} examples",
                marker_color=color,
                opacity=0.6,
                legendgroup=name,
                showlegend=False,
                hovertemplate="%{y} examples<extra>" + name + "</extra>",
                meta={"model": name, "role": "count"},
            ),
            row=2,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=[0, 1],
            y=[0, 1],
            mode="lines",
            line={"dash": "dash", "color": "grey"},
            name="perfect calibration",
            meta={"model": None, "role": "diagonal"},
        ),
        row=1,
        col=1,
    )
    fig.update_layout(barmode="overlay", title=title, legend={"x": 0.01, "y": 0.99}, bargap=0)
    fig.update_xaxes(range=[0, 1], row=1, col=1)
    fig.update_xaxes(range=[0, 1], title_text="confidence (max probability)", row=2, col=1)
    fig.update_yaxes(range=[0, 1], title_text="accuracy", row=1, col=1)
    fig.update_yaxes(title_text="examples", row=2, col=1)
    return fig
