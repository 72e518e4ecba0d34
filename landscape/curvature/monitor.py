"""Curvature monitor: the sharpness ``lambda_max(H)`` (and optionally ``tr H`` and, for Adam, the
preconditioned sharpness ``lambda_max(P^{-1} H)``) on a fixed batch every few training steps, with
a bounded number of Hessian-vector products, against the optimizer's stability threshold.

The thresholds -- the largest curvature ``a`` for which the optimizer is stable on ``a x^2 / 2``:
``2 / lr`` for gradient descent, the heavy-ball and Nesterov forms, and for Adam the preconditioned
sharpness ``lambda_max(P^{-1} H)`` against ``(2 + 2 beta1) / ((1 - beta1) lr)`` (Cohen et al. 2021,
2022) -- and Adam's preconditioner ``P`` are derived in :mod:`landscape.curvature.stability`.

Weight decay is not part of the monitored Hessian (that of ``loss_fn`` on the batch): coupled L2
decay ``wd`` adds ``wd`` to every eigenvalue of the trained objective's Hessian.

Cost: every check builds one Hessian operator at the current weights; ``lambda_max`` is thick-restart
Lanczos (:func:`landscape.eigenvalues`) started from the previous check's top eigenvector (warm
start), limited to ``max_matvecs`` products; the trace is Hutchinson with ``trace_probes`` Rademacher
probes (the same seeded probes at every check, so that changes between checks are not masked by
probe noise).  A total ``budget`` of products bounds the whole run: a check that cannot afford its
estimates is recorded as skipped.  The caller's model is left bit-identical (``Objective.guard``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from landscape.checks import check_choice, check_int, check_positive, check_seed
from landscape.curvature.eigen import eigenvalues
from landscape.curvature.hessian import hessian
from landscape.curvature.memory import parse_budget
from landscape.curvature.stability import ADAM, Preconditioned, adam_preconditioner, stability_threshold
from landscape.curvature.trace import trace
from landscape.guard import model_guard
from landscape.objective import Objective
from landscape.results import Result

__all__ = ["CurvatureMonitor", "MonitorResult", "adam_preconditioner", "stability_threshold"]

_NCV = 20  # Lanczos basis size; eigenvalues() solves operators with p <= _NCV + 1 densely (p products)
_RECORD_KEYS = (
    "step", "status", "note", "loss", "train_loss", "lambda_max", "residual", "converged",
    "lanczos_matvecs", "warm", "threshold", "threshold_rule", "lr", "precond_lambda_max",
    "precond_residual", "precond_converged", "precond_matvecs", "precond_threshold", "adam_step",
    "trace", "trace_stderr", "trace_matvecs", "matvecs", "total_matvecs", "seconds",
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass
class MonitorResult(Result):
    """The monitor's checks (``history``: one dict per check) with the run's configuration and cost."""

    history: list[dict[str, Any]] = field(default_factory=list)
    matvecs: int = 0
    checks: int = 0
    skipped: int = 0

    kind: ClassVar[str] = "monitor"

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of the checks where ``key`` was recorded (not None)."""
        rows = [(h["step"], h[key]) for h in self.history if h.get(key) is not None]
        return np.array([r[0] for r in rows], dtype=float), np.array([r[1] for r in rows], dtype=float)

    def _lines(self) -> list[tuple[str, np.ndarray, np.ndarray, bool]]:
        """``(label, steps, values, is_threshold)`` of every line to draw."""
        out = []
        for key, label in (("lambda_max", "lambda_max(H)"), ("precond_lambda_max", "lambda_max(P^-1 H)")):
            thr = "threshold" if key == "lambda_max" else "precond_threshold"
            for k, lab, dashed in ((key, label, False), (thr, f"threshold of {label}", True)):
                x, y = self.series(k)
                if len(x) and (dashed is False or len(self.series(key)[0])):
                    out.append((lab, x, y, dashed))
        return out

    def plot(self, ax: Any = None, *, label: str | None = None, color: str | None = None) -> Any:
        """Sharpness against step (solid) with the stability threshold(s) (dashed, same colour);
        ``label`` prefixes the legend entries (several runs on one axes). Returns the axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        for lab, x, y, dashed in self._lines():
            c = color or ("C0" if "P^-1" not in lab else "C1")
            lab = f"{label}: {lab}" if label else lab
            ax.plot(x, y, "--" if dashed else "-", color=c, lw=1 if dashed else 1.2, label=lab,
                    marker=None if dashed else ".", ms=3)  # fmt: skip
        ax.set_xlabel("step")
        ax.set_ylabel("sharpness")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        return ax

    def to_plotly(self) -> Any:
        """The same lines as :meth:`plot` in a ``plotly.graph_objects.Figure``."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for lab, x, y, dashed in self._lines():
            mode, dash = ("lines", "dash") if dashed else ("lines+markers", "solid")
            fig.add_trace(go.Scatter(x=x, y=y, name=lab, mode=mode, line={"dash": dash}))
        fig.update_layout(xaxis_title="step", yaxis_title="sharpness")
        return fig


# --------------------------------------------------------------------------------------------
# monitor
# --------------------------------------------------------------------------------------------
class CurvatureMonitor:
    """Training callback: sharpness on a fixed batch every ``every`` steps (see the module docstring).

    Use as ``landscape.models.train(..., callback=monitor)`` (called as ``monitor(step, model, loss)``)
    or from any loop: ``monitor.step(model, step)`` / ``monitor(model, step)`` after the update of
    step ``step`` (a check runs when ``step % every == 0``; ``step=None`` counts calls), or
    ``monitor.check(model, step)`` to check now.

    Args:
        data: the fixed batch ``(inputs, targets)`` (or a list of batches) every check uses.
        loss_fn: ``loss_fn(outputs, targets) -> scalar``.
        every: check every ``every`` steps.
        optimizer: the training optimizer; gives the threshold (:func:`stability_threshold`, read
            at every check, so learning-rate schedules are followed) and, for Adam/AdamW, the
            preconditioner.
        lr: without an optimizer, the threshold ``2 / lr`` (gradient descent).
        threshold: a fixed threshold (overrides the optimizer's).
        max_matvecs: Hessian-vector products per Lanczos run (``lambda_max``; the same again for
            the preconditioned sharpness).
        tol: relative residual tolerance of Lanczos (``||H v - lambda v|| <= tol |lambda|``).
        budget: total products over all checks (None: unbounded); checks that cannot afford their
            estimates are recorded with ``status="skipped"``.
        trace_probes: Hutchinson probes per check (0: no trace; otherwise at least 2).
        preconditioned: ``"auto"`` (with an Adam/AdamW optimizer), ``True`` or ``False``.
        warm_start: start Lanczos from the previous check's top eigenvector.
        seed: seed of the cold Lanczos start and of the Hutchinson probes.
        params, mode, dtype, device: passed to :class:`landscape.Objective`.
        max_memory: budget of a block of Hessian products' peak memory (bytes, ``"2GiB"``, a
            fraction of the free memory; :mod:`landscape.curvature.memory`); ``None``: no limit.
        progress: tqdm bars in the estimators.

    Attributes:
        history: one dict per check, always with the same keys (None where not computed):
            ``step``, ``status`` (``"ok"``, ``"partial"``, ``"skipped"``; ``note`` says why),
            ``loss`` (on the batch, after the update), ``train_loss`` (as passed), ``lambda_max``,
            ``residual``, ``converged``, ``lanczos_matvecs``, ``warm``, ``threshold``,
            ``threshold_rule``, ``lr``, ``precond_lambda_max`` / ``_residual`` / ``_converged`` /
            ``_matvecs`` / ``_threshold``, ``adam_step``, ``trace``, ``trace_stderr``,
            ``trace_matvecs``, ``matvecs`` (this check), ``total_matvecs``, ``seconds``.
    """

    def __init__(
        self,
        data: Any,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        every: int = 10,
        optimizer: torch.optim.Optimizer | None = None,
        lr: float | None = None,
        threshold: float | None = None,
        max_matvecs: int = 20,
        tol: float = 1e-3,
        budget: int | None = None,
        trace_probes: int = 0,
        preconditioned: bool | str = "auto",
        warm_start: bool = True,
        seed: int = 0,
        params: Any = None,
        mode: str = "eval",
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        max_memory: int | float | str | None = None,
        progress: bool = False,
    ) -> None:
        if data is None:
            raise ValueError("data is required: the fixed batch (inputs, targets) every check uses")
        if not callable(loss_fn):
            raise TypeError("loss_fn must be callable as loss_fn(outputs, targets) -> scalar tensor")
        check_positive("every", every, integer=True)
        check_int("max_matvecs", max_matvecs, minimum=2)  # one Lanczos step and its residual check
        check_positive("tol", tol)
        if budget is not None:
            check_positive("budget", budget, integer=True)
        check_positive("trace_probes", trace_probes, integer=True, allow_zero=True)
        if trace_probes == 1:
            raise ValueError("trace_probes must be 0 (no trace) or at least 2 (for a standard error)")
        check_seed(seed, allow_generator=False)
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if lr is not None:
            check_positive("lr", lr)
            if optimizer is not None:
                raise ValueError("give either optimizer (its lr is read at every check) or lr, not both")
        if threshold is not None:
            check_positive("threshold", threshold)
        check_choice("preconditioned", preconditioned, ("auto", True, False))
        is_adam = isinstance(optimizer, ADAM)
        if preconditioned is True and not is_adam:
            raise ValueError(
                "preconditioned=True needs optimizer=<torch.optim.Adam or AdamW> (its exp_avg_sq gives "
                f"the preconditioner), got {type(optimizer).__name__}"
            )
        self.preconditioned = is_adam if preconditioned == "auto" else bool(preconditioned)
        self.data, self.loss_fn, self.optimizer = data, loss_fn, optimizer
        self.every, self.max_matvecs, self.tol, self.budget = every, max_matvecs, tol, budget
        self.trace_probes, self.warm_start, self.seed = trace_probes, warm_start, seed
        self.lr, self.fixed_threshold, self.progress = lr, threshold, progress
        parse_budget(
            max_memory, "cpu" if device is None else device
        )  # a bad budget fails here, not at a check
        self.max_memory = max_memory
        self._obj_kw = dict(params=params, mode=mode, dtype=dtype, device=device)
        self.history: list[dict[str, Any]] = []
        self.total_matvecs = 0
        self._calls = 0
        self._model: nn.Module | None = None
        self._obj: Objective | None = None
        self._params: list[torch.Tensor] = []
        self._v: torch.Tensor | None = None
        self._v_pre: torch.Tensor | None = None

    # ------------------------------------------------------------------ calling conventions
    def __call__(self, a: Any, b: Any = None, loss: float | None = None) -> dict[str, Any] | None:
        """``monitor(step, model, loss)`` (the ``train`` callback) or ``monitor(model, step)``."""
        if isinstance(a, nn.Module):
            return self.step(a, b, loss)
        if isinstance(b, nn.Module):
            return self.step(b, a, loss)
        raise TypeError(
            "call the monitor as monitor(step, model, loss) (landscape.models.train's callback) or "
            f"monitor(model, step); got {type(a).__name__} and {type(b).__name__}"
        )

    def step(
        self, model: nn.Module, step: int | None = None, loss: float | None = None
    ) -> dict[str, Any] | None:
        """Call after the update of step ``step``; checks when ``step % every == 0``.

        Returns the check's record, or None when this step is not checked."""
        self._calls += 1
        step = self._calls if step is None else step
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be an int, got {type(step).__name__} ({step!r})")
        return self.check(model, int(step), loss) if step % self.every == 0 else None

    # ------------------------------------------------------------------ one check
    def _bind(self, model: nn.Module) -> Objective:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if self._model is not None:
            if model is not self._model:
                raise ValueError(
                    "this monitor is bound to another model (its history and warm-start vectors "
                    "belong to it); create one CurvatureMonitor per model"
                )
            return self._obj
        with model_guard(model):
            obj = Objective(model, self.loss_fn, self.data, **self._obj_kw)
        named = dict(model.named_parameters())
        self._params = [named[n] for n in obj.param_names]
        if self.optimizer is not None:
            owned = {id(q) for g in self.optimizer.param_groups for q in g["params"]}
            missing = [n for n, p in zip(obj.param_names, self._params) if id(p) not in owned]
            if missing and (self.preconditioned or self.fixed_threshold is None):
                raise ValueError(
                    f"parameters {missing} are not optimised by the optimizer given; pass params=[...] "
                    "to monitor only the optimised parameters"
                )
        self._model, self._obj = model, obj
        return obj

    def _threshold(self) -> dict[str, Any]:
        if self.fixed_threshold is not None:
            return {"value": float(self.fixed_threshold), "applies_to": "lambda_max", "rule": "given"}
        if self.optimizer is not None:
            return stability_threshold(self.optimizer, self._params)
        if self.lr is not None:
            return {
                "value": 2.0 / self.lr,
                "applies_to": "lambda_max",
                "rule": "2/lr (given lr)",
                "lr": self.lr,
            }
        return {"value": None, "applies_to": None, "rule": "no optimizer, lr or threshold given"}

    def _lanczos(self, op: Any, v0: torch.Tensor | None, left: float) -> Any:
        """Top eigenpair of ``op`` within ``min(max_matvecs, left)`` products (p for tiny ``op``)."""
        p = op.shape[0]
        cap = p if p <= _NCV + 1 else int(min(self.max_matvecs, left))
        return eigenvalues(
            op, k=1, which="largest", tol=self.tol, max_matvecs=cap, seed=self.seed, ncv=_NCV,
            v0=v0 if self.warm_start else None, progress=self.progress,
        )  # fmt: skip

    def check(self, model: nn.Module, step: int | None = None, loss: float | None = None) -> dict[str, Any]:
        """Run one check now (regardless of ``every``) and append its record to ``history``."""
        t0 = time.perf_counter()
        obj = self._bind(model)
        rec: dict[str, Any] = dict.fromkeys(_RECORD_KEYS)
        thr = self._threshold()
        rec.update(
            step=len(self.history) if step is None else int(step), status="ok", note="",
            train_loss=None if loss is None else float(loss), lr=thr.get("lr"), threshold_rule=thr["rule"],
            threshold=thr["value"] if thr["applies_to"] == "lambda_max" else None,
            precond_threshold=thr["value"] if thr["applies_to"] == "precond_lambda_max" else None,
        )  # fmt: skip
        need = obj.num_params if obj.num_params <= _NCV + 1 else 2  # the cheapest Lanczos run
        left = math.inf if self.budget is None else self.budget - self.total_matvecs
        notes: list[str] = []
        H = None
        if left < need:
            rec.update(
                status="skipped", note=f"HVP budget exhausted ({self.total_matvecs} of {self.budget} used)"
            )
        else:
            with obj.guard():
                H = hessian(obj, max_memory=self.max_memory)
                rec["loss"] = float(obj.loss())
                rec["warm"] = self.warm_start and self._v is not None
                res = self._lanczos(H, self._v, left)
                self._v = res.vectors[:, 0].clone()
                rec.update(
                    lambda_max=float(res.values[0]), residual=float(res.residuals[0]),
                    converged=bool(res.converged[0]), lanczos_matvecs=int(res.matvecs),
                )  # fmt: skip
                if self.preconditioned:
                    self._precond(H, rec, left - H.matvecs, need, notes)
                if self.trace_probes and left - H.matvecs < self.trace_probes:
                    notes.append("trace skipped: HVP budget")
                elif self.trace_probes:
                    n = self.trace_probes
                    tr = trace(
                        H, method="hutchinson", rtol=0.0, atol=0.0, max_matvecs=n, seed=self.seed, block=n,
                        min_samples=n, progress=self.progress,
                    )  # fmt: skip
                    rec.update(
                        trace=float(tr.value), trace_stderr=float(tr.stderr), trace_matvecs=int(tr.matvecs)
                    )
            self.total_matvecs += H.matvecs
        if notes:
            rec["note"] = "; ".join(notes)
            rec["status"] = "partial" if any("budget" in n for n in notes) else rec["status"]
        rec.update(
            matvecs=0 if H is None else int(H.matvecs), total_matvecs=self.total_matvecs,
            seconds=time.perf_counter() - t0,
        )  # fmt: skip
        self.history.append(rec)
        return rec

    def _precond(self, H: Any, rec: dict[str, Any], left: float, need: int, notes: list[str]) -> None:
        pdiag = adam_preconditioner(self.optimizer, self._params)
        if pdiag is None:
            notes.append(
                "preconditioned sharpness skipped: the optimizer has no state yet (before its first step)"
            )
        elif left < need:
            notes.append("preconditioned sharpness skipped: HVP budget")
        else:
            res = self._lanczos(Preconditioned(H, pdiag), self._v_pre, left)
            self._v_pre = res.vectors[:, 0].clone()
            rec.update(
                precond_lambda_max=float(res.values[0]), precond_residual=float(res.residuals[0]),
                precond_converged=bool(res.converged[0]), precond_matvecs=int(res.matvecs),
                adam_step=int(float(self.optimizer.state[self._params[0]]["step"])),
            )  # fmt: skip

    # ------------------------------------------------------------------ results
    def config(self) -> dict[str, Any]:
        """The monitor's settings (and the objective's, once bound) as a JSON-friendly dict."""
        cfg: dict[str, Any] = {
            "every": self.every, "max_matvecs": self.max_matvecs, "tol": self.tol, "budget": self.budget,
            "trace_probes": self.trace_probes, "preconditioned": self.preconditioned, "seed": self.seed,
            "warm_start": self.warm_start, "lr": self.lr, "threshold": self.fixed_threshold,
            "optimizer": None if self.optimizer is None else type(self.optimizer).__name__, "ncv": _NCV,
            "max_memory": self.max_memory,
        }  # fmt: skip
        if self.optimizer is not None:
            cfg["optimizer_defaults"] = {
                k: (list(v) if isinstance(v, tuple) else v)
                for k, v in self.optimizer.defaults.items()
                if isinstance(v, (int, float, bool, tuple, str)) or v is None
            }
        if self._obj is not None:
            cfg["objective"] = self._obj.config()
        return cfg

    def result(self) -> MonitorResult:
        """The history so far as a :class:`MonitorResult` (``save``/``load`` as JSON)."""
        return MonitorResult(
            config=self.config(),
            seconds=float(sum(h.get("seconds", 0.0) for h in self.history)),
            history=[dict(h) for h in self.history],
            matvecs=self.total_matvecs,
            checks=sum(h["status"] != "skipped" for h in self.history),
            skipped=sum(h["status"] == "skipped" for h in self.history),
        )

    def plot(self, ax: Any = None, *, label: str | None = None, color: str | None = None) -> Any:
        """``lambda_max`` against step with the threshold line (see :meth:`MonitorResult.plot`)."""
        return self.result().plot(ax, label=label, color=color)

    def to_plotly(self) -> Any:
        """Plotly version of :meth:`plot`."""
        return self.result().to_plotly()
