"""What an end point is: a minimum, a saddle point, a maximum, near a minimum, not converged or
diverged, decided from the exact gradient and the exact 2-D Hessian (autograd) at that point.

The thresholds are relative to the plotted box (its width ``W``, the larger side) and to the
Hessian's own scale, so they mean the same on the Gaussian mixture (curvatures ~1e-3, ``W`` = 80)
as on Rosenbrock (curvatures ~1e3, ``W`` = 4):

* **stationary**: the Newton step ``||H^-1 grad L||`` (the distance to the stationary point of the
  local quadratic model) is at most :data:`STATIONARY_FRACTION` ``x W``;
* an eigenvalue counts as **zero** when ``|lambda| <= CURVATURE_RTOL x max |lambda|``;
* a stationary point is a **minimum** (all eigenvalues > 0), a **maximum** (all < 0), a **saddle
  point** (both signs) or **degenerate** (an eigenvalue is zero: the second-order test says nothing);
* a point that is not stationary is **near a minimum** when its Hessian is positive definite and
  Newton's method from it reaches a minimum within :data:`NEAR_FRACTION` ``x W``; otherwise it is
  **not converged**;
* a run the runner stopped, or whose iterates ran off, is **diverged** (``runs.run_status``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

import landscape as ls
import toy_problems as tp

from ..layout import fmt, fmt_point

__all__ = [
    "CURVATURE_RTOL",
    "NEAR_FRACTION",
    "STATIONARY_FRACTION",
    "EndPoint",
    "KINDS",
    "box_width",
    "classify_point",
    "thresholds_text",
]

#: stationary: Newton step at most this fraction of the plotted box's width
STATIONARY_FRACTION = 1e-3
#: "near a minimum": Newton's method reaches a minimum within this fraction of the width
NEAR_FRACTION = 0.05
#: an eigenvalue within this fraction of the largest |eigenvalue| counts as zero
CURVATURE_RTOL = 1e-6

#: every classification, in the order the summary lists them
KINDS = (
    "minimum",
    "near a minimum",
    "saddle point",
    "maximum",
    "degenerate stationary point",
    "not converged",
    "diverged",
)


@dataclass
class EndPoint:
    """The classification of one point with the numbers it rests on."""

    kind: str
    point: tuple[float, ...]
    loss: float
    grad_norm: float
    newton_step: float
    eigenvalues: list[float]
    width: float
    nearest: tuple[float, ...] | None = None  # the minimum Newton's method reached ("near a minimum")
    distance: float = math.nan  # from the point to ``nearest``
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_minimum(self) -> bool:
        return self.kind == "minimum"

    def reason(self) -> str:
        """The numbers behind the classification, in one short phrase."""
        ev = ", ".join(fmt(v, 3) for v in self.eigenvalues)
        step = f"Newton step {fmt(self.newton_step, 2)} = {fmt(self.newton_step / self.width, 2)} W"
        if self.kind == "diverged":
            return "the run diverged"
        if self.kind == "near a minimum":
            return f"{step}; minimum {fmt_point(self.nearest or ())} at distance {fmt(self.distance, 2)}"
        if self.kind == "not converged":
            neg = sum(v < 0 for v in self.eigenvalues)
            return f"{step}; eigenvalues {ev}" + (f" ({neg} negative)" if neg else "")
        return f"{step}; eigenvalues {ev}"


def box_width(prob: tp.ToyProblem) -> float:
    """``W``: the larger side of the plotted box."""
    (x0, x1), (y0, y1) = prob.bounds
    return float(max(x1 - x0, y1 - y0))


def _grad_hess(prob: tp.ToyProblem, point: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    point = point.detach().to(prob.dtype)
    with torch.enable_grad():
        t = point.clone().requires_grad_(True)
        loss = prob.loss(t, check=False)
        (g,) = torch.autograd.grad(loss, t)
    h = torch.autograd.functional.hessian(lambda v: prob.loss(v, check=False), point)
    return float(loss.detach()), g.detach(), h.detach()


def _newton_step(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H^-1 g, eigenvalues)``; an eigenvalue that is zero to round-off gives an infinite step
    unless the gradient has no component along it."""
    ev, vecs = torch.linalg.eigh(h)
    scale = float(ev.abs().max()) if ev.numel() else 0.0
    c = vecs.T @ g
    zero = ev.abs() <= 1e-14 * max(scale, 1e-300)
    safe = torch.where(zero, torch.ones_like(ev), ev)
    coef = torch.where(zero, torch.where(c == 0, torch.zeros_like(c), torch.full_like(c, math.inf)), c / safe)
    return vecs @ torch.nan_to_num(coef, posinf=math.inf), ev


def _stationary_kind(ev: torch.Tensor) -> str:
    scale = float(ev.abs().max())
    tol = CURVATURE_RTOL * scale
    if scale == 0 or bool((ev.abs() <= tol).any()):
        return "degenerate stationary point"
    if bool((ev > 0).all()):
        return "minimum"
    if bool((ev < 0).all()):
        return "maximum"
    return "saddle point"


def _newton_to_minimum(prob, start: torch.Tensor, width: float, iters: int = 40) -> torch.Tensor | None:
    """Newton's method from ``start``: the minimum it converges to, or None (it stalls, leaves the
    valid region, or converges to a point that is not a minimum)."""
    t = start.detach().clone()
    for _ in range(iters):
        if not bool(prob.in_domain(t)):
            return None
        _, g, h = _grad_hess(prob, t)
        step, ev = _newton_step(g, h)
        if not bool(torch.isfinite(step).all()):
            return None
        t = t - step
        if float(step.norm()) <= 1e-12 * width:
            break
    if not bool(prob.in_domain(t)) or not bool(torch.isfinite(t).all()):
        return None
    _, g, h = _grad_hess(prob, t)
    step, ev = _newton_step(g, h)
    if float(step.norm()) > STATIONARY_FRACTION * width or _stationary_kind(ev) != "minimum":
        return None
    return t


def classify_point(
    prob: tp.ToyProblem, point: Any, *, diverged: bool = False, width: float | None = None
) -> EndPoint:
    """Classify ``point`` from the exact gradient and Hessian of ``prob`` there (module docstring).

    ``diverged`` (the run's status) wins over everything; a point outside the valid region or with a
    non-finite loss, gradient or Hessian is also "diverged"."""
    w = box_width(prob) if width is None else float(width)
    p = torch.as_tensor(point, dtype=prob.dtype).detach().reshape(prob.dim)
    nan = EndPoint("diverged", tuple(p.tolist()), math.nan, math.nan, math.nan, [math.nan] * prob.dim, w)
    if diverged or not bool(torch.isfinite(p).all()) or not bool(prob.in_domain(p)):
        return nan
    loss, g, h = _grad_hess(prob, p)
    if not (math.isfinite(loss) and bool(torch.isfinite(g).all()) and bool(torch.isfinite(h).all())):
        return nan
    step, ev = _newton_step(g, h)
    s = float(step.norm())
    out = EndPoint("not converged", tuple(p.tolist()), loss, float(g.norm()), s, ev.tolist(), w)
    if s <= STATIONARY_FRACTION * w:
        out.kind = _stationary_kind(ev)
        return out
    if _stationary_kind(ev) == "minimum":  # positive-definite Hessian: is a minimum close by?
        m = _newton_to_minimum(prob, p, w)
        if m is not None and float((m - p).norm()) <= NEAR_FRACTION * w:
            out.kind, out.nearest, out.distance = "near a minimum", tuple(m.tolist()), float((m - p).norm())
    return out


def thresholds_text(width: float) -> str:
    """The thresholds in words, for the caption under the table."""
    return (
        f"**How an end point is classified** (exact gradient and Hessian by autograd; W = {fmt(width)} is "
        f"the width of the plotted box): *stationary* when the Newton step ‖H⁻¹∇L‖ is at most "
        f"{STATIONARY_FRACTION:g} W = {fmt(STATIONARY_FRACTION * width, 2)}; a stationary point is a "
        "*minimum* (both Hessian eigenvalues > 0), a *saddle point* (one of each sign), a *maximum* (both "
        f"< 0) or *degenerate* (an eigenvalue within {CURVATURE_RTOL:g}·max|λ| of 0). A point that is not "
        "stationary is *near a minimum* when its Hessian is positive definite and Newton's method from it "
        f"reaches a minimum within {NEAR_FRACTION:g} W = {fmt(NEAR_FRACTION * width, 2)}, else *not "
        "converged*; *diverged*: the run was stopped or its iterates ran off."
    )


# ------------------------------------------------------------------------------------ networks
#: a network's end point is stationary when one gradient step of length 1/lambda_max would lower the
#: loss, by the local quadratic model (``||grad||^2 / (2 lambda_max)``), by at most this share of it
NET_DROP_RTOL = 1e-3
#: ... and has no direction of negative curvature when lambda_min >= -NET_CURVATURE_RTOL lambda_max
NET_CURVATURE_RTOL = 1e-3


@dataclass
class NetworkEndPoint:
    """A trained network's weights classified from the full-batch gradient and the extreme Hessian
    eigenvalues (Lanczos, ``landscape.eigenvalues``, with their residuals ``||Hv - lambda v||``)."""

    kind: str
    loss: float
    grad_norm: float
    lambda_min: float
    lambda_max: float
    residual: float
    n_params: int

    @property
    def predicted_drop(self) -> float:
        """``||grad||^2 / (2 lambda_max)``: what a gradient step of length ``1/lambda_max`` lowers the
        loss by in the local quadratic model (inf when lambda_max <= 0)."""
        return self.grad_norm**2 / (2 * self.lambda_max) if self.lambda_max > 0 else math.inf

    def reason(self) -> str:
        if self.kind == "diverged":
            return "non-finite loss or gradient"
        share = self.predicted_drop / max(abs(self.loss), 1e-300)
        return (
            f"‖∇L‖ = {fmt(self.grad_norm, 2)}: a gradient step would lower L by {fmt(100 * share, 2)}%; "
            f"λ_min = {fmt(self.lambda_min, 2)}, λ_max = {fmt(self.lambda_max, 3)} "
            f"(± {fmt(self.residual, 1)})"
        )


def classify_network_point(model: torch.nn.Module, loss_fn: Any, data: Any) -> NetworkEndPoint:
    """Classify a network's weights on ``loss_fn`` over all of ``data`` (full batch): "diverged"
    (non-finite), "not converged" (a gradient step would still lower the loss by more than
    ``NET_DROP_RTOL`` of it), else "saddle point" (``lambda_min < -NET_CURVATURE_RTOL lambda_max``)
    or "minimum"."""
    obj = ls.Objective(model, loss_fn, data)
    loss = float(obj.loss())
    g = obj.gradient()
    n = int(g.numel())
    if not (math.isfinite(loss) and bool(torch.isfinite(g).all())):
        return NetworkEndPoint("diverged", loss, math.nan, math.nan, math.nan, math.nan, n)
    top = ls.eigenvalues(obj, k=1, which="largest", tol=1e-4)
    low = ls.eigenvalues(obj, k=1, which="smallest", tol=1e-4)
    lmax, lmin = float(top.values[0]), float(low.values[0])
    res = max(float(top.residuals[0]), float(low.residuals[0]))
    out = NetworkEndPoint("not converged", loss, float(g.norm()), lmin, lmax, res, n)
    if out.predicted_drop <= NET_DROP_RTOL * abs(loss):
        out.kind = "saddle point" if lmin < -NET_CURVATURE_RTOL * abs(lmax) else "minimum"
    return out


def network_thresholds_text() -> str:
    return (
        "*stationary*: one gradient step of length 1/λ_max would lower the loss, by its local quadratic "
        f"model ‖∇L‖²/(2λ_max), by at most {100 * NET_DROP_RTOL:g}% of its value; a stationary point is a "
        f"*minimum* when λ_min ≥ −{NET_CURVATURE_RTOL:g}·λ_max, else a *saddle point*; otherwise *not "
        "converged*. Full-batch gradient; λ_min and λ_max by Lanczos on the exact Hessian (± the larger "
        "residual ‖Hv − λv‖)."
    )
