"""Basins of attraction of gradient flow on a 2-D objective, estimated from a fixed set of starts.

For ``f: R^2 -> R`` the gradient flow ``dθ/dt = -∇f(θ)`` carries almost every start to a local
minimum ``m``; the *basin* of ``m`` is the set of starts that end there. Unlike steepest descent on a
plotting grid, the basins (and so their shares of a region) do not depend on any grid.

* **Flow.** ``dθ/dt = -∇f`` and its arc-length form ``dθ/ds = -∇f/||∇f||`` trace the same curves,
  so they have the same basins; the arc-length form crosses flat regions and saddles at unit speed.
  It is integrated with Heun's method, step ``h`` (global error ``O(h^2)``)::

      d(θ) = ∇f(θ) / ||∇f(θ)||,   θ' = θ - h d(θ),   θ <- θ - h (d(θ) + d(θ')) / 2.

  Where ``f`` is a maximum of smooth branches (a kink, e.g. a worst case over a ball), ``∇f`` is the
  gradient of the active branch (Danskin's theorem); where ``d(θ)·d(θ') < 0`` the step crossed such
  a kink and moves along ``(d(θ) + d(θ'))/||d(θ) + d(θ')||`` instead, a descent direction of both
  branches, so that it slides along the kink at unit speed as the (Filippov) flow slides along it.
* **Minima** (``find_minima``). From a regular pilot grid of starts: the flow with step ``h``, then
  with a geometrically shrinking step, then a local polish: Newton's method for a smooth ``f``,
  gradient sampling for a kinked one (the min-norm element of the convex hull of gradients at ``θ``
  and at points within ``δ``, with an Armijo line search and ``δ -> 0``; Burke, Lewis & Overton,
  SIAM J. Optim. 2005). A point is a minimum if ``||∇f|| < gtol`` and the Hessian (central
  differences of the gradient, step 1e-3) is positive definite (smooth ``f``), or if ``f`` rises in
  every direction on rings of radius 0.01, 0.1, 0.5 around it (kinked ``f``, which has no Hessian
  there). Minima closer than ``merge`` are one.
* **Capture** (``capture_radius``). If ``(θ - m)·∇f(θ) > 0`` on the ball ``B(m, r)`` except at ``m``,
  then ``d/dt ||θ - m||^2 = -2 (θ - m)·∇f(θ) < 0`` there: a trajectory that enters the ball stays in
  it and converges to ``m``, so ``B(m, r)`` lies in the basin of ``m``. The largest ``r`` of a list for
  which this holds on a polar set of check points is ``m``'s capture radius; a start is classified
  when its trajectory enters a capture ball (a numerical, not a rigorous, certificate).
* **Share** (``basin_shares``). With ``N`` i.i.d. uniform starts in a region ``R`` of which ``k``
  reach ``m``, ``p = |basin(m) ∩ R| / |R|`` is estimated by ``p̂ = k/N`` with standard error
  ``sqrt(p̂ (1 - p̂) / N)`` and the Wilson 95 % interval
  ``(p̂ + z²/2N ± z sqrt(p̂(1-p̂)/N + z²/4N²)) / (1 + z²/N)``, ``z = 1.96``. Starts not captured
  within ``n_steps`` hand their end points to ``find_minima`` (a minimum the pilot missed is added
  with its capture ball) and flow on; any still left are counted as unresolved (in no ``k``).

Objectives take and return float64 tensors: ``value(θ [N, 2]) -> [N]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "Objective",
    "uniform_starts",
    "grid_starts",
    "flow",
    "find_minima",
    "capture_radius",
    "basin_shares",
    "wilson_interval",
    "agree",
    "merge_points",
    "share_of",
]

Fn = Callable[[torch.Tensor], torch.Tensor]
RING_RADII = (0.01, 0.1, 0.5)


def _autograd_grad(value: Fn, theta: torch.Tensor) -> torch.Tensor:
    th = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(value(th).sum(), th)
    return g.detach()


@dataclass
class Objective:
    """``value(θ [N, 2]) -> [N]``; ``grad`` (default: autograd of ``value``); ``smooth``: twice
    differentiable at its minima (Hessian check) or a maximum of smooth branches (ring check)."""

    value: Fn
    grad: Fn | None = None
    smooth: bool = True

    def gradient(self, theta: torch.Tensor) -> torch.Tensor:
        return self.grad(theta) if self.grad is not None else _autograd_grad(self.value, theta)

    def hessian(self, theta: torch.Tensor, delta: float = 1e-3) -> torch.Tensor:
        """``[N, 2, 2]`` by central differences of the gradient, ``H e_j = (∇f(θ + δ e_j) -
        ∇f(θ - δ e_j)) / 2δ`` (error ``O(δ²)``), symmetrised."""
        n = theta.shape[0]
        E = delta * torch.eye(2, dtype=theta.dtype)
        pts = torch.cat([theta[:, None, :] + E, theta[:, None, :] - E], 1).reshape(-1, 2)
        G = self.gradient(pts).reshape(n, 2, 2, 2)
        H = (G[:, 0] - G[:, 1]) / (2 * delta)  # [n, j, i] = d_j g_i
        return 0.5 * (H + H.transpose(1, 2))


def uniform_starts(bounds, n: int, seed: int) -> torch.Tensor:
    """``n`` i.i.d. uniform points in the box ``((x_lo, x_hi), (y_lo, y_hi))`` from a seeded generator."""
    gen = torch.Generator().manual_seed(int(seed))
    lo = torch.tensor([b[0] for b in bounds], dtype=torch.float64)
    hi = torch.tensor([b[1] for b in bounds], dtype=torch.float64)
    return lo + (hi - lo) * torch.rand(int(n), 2, generator=gen, dtype=torch.float64)


def grid_starts(bounds, nx: int, ny: int) -> torch.Tensor:
    """Cell centres of an ``nx x ny`` regular grid on the box (the pilot starts of ``find_minima``)."""
    (x0, x1), (y0, y1) = bounds
    xs = x0 + (x1 - x0) * (torch.arange(nx, dtype=torch.float64) + 0.5) / nx
    ys = y0 + (y1 - y0) * (torch.arange(ny, dtype=torch.float64) + 0.5) / ny
    X, Y = torch.meshgrid(xs, ys, indexing="ij")
    return torch.stack([X.reshape(-1), Y.reshape(-1)], -1)


def _direction(obj: Objective, x: torch.Tensor) -> torch.Tensor:
    g = obj.gradient(x)
    d = g / g.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return torch.where(torch.isfinite(d), d, torch.zeros_like(d))


def flow(
    obj: Objective,
    starts: torch.Tensor,
    steps: Sequence[float],
    centres: torch.Tensor | None = None,
    radii: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Heun arc-length steps of sizes ``steps`` from ``starts [N, 2]``. A trajectory stops when it is
    within ``radii[k]`` of ``centres[k]``. Returns ``(end [N, 2], label [N])``, label -1: not captured."""
    theta = starts.detach().clone()
    label = torch.full((theta.shape[0],), -1, dtype=torch.long)
    active = torch.arange(theta.shape[0])
    has_capture = centres is not None and len(centres) > 0

    def capture(idx):
        dist = torch.cdist(theta[idx], centres)
        hit = dist < radii
        got = hit.any(1)
        label[idx[got]] = hit[got].float().argmax(1)
        return idx[~got]

    if has_capture:
        active = capture(active)
    for h in steps:
        if active.numel() == 0:
            break
        x = theta[active]
        d1 = _direction(obj, x)
        d2 = _direction(obj, x - h * d1)
        d = 0.5 * (d1 + d2)
        # the step crossed a kink (or overshot a minimum): slide at unit speed along it
        kink = ((d1 * d2).sum(-1, keepdim=True) < 0) & (d.norm(dim=-1, keepdim=True) > 0)
        d = torch.where(kink, d / d.norm(dim=-1, keepdim=True).clamp_min(1e-300), d)
        theta[active] = x - h * d
        if has_capture:
            active = capture(active)
    return theta, label


def merge_points(points: torch.Tensor, values: torch.Tensor, tol: float) -> list[int]:
    """Greedy clustering by distance: indices of the lowest-valued point of each cluster."""
    order = torch.argsort(values).tolist()
    keep: list[int] = []
    for i in order:
        if all(float((points[i] - points[j]).norm()) >= tol for j in keep):
            keep.append(i)
    return keep


def _newton(obj: Objective, x: torch.Tensor, iters: int = 50, max_step: float = 1.0) -> torch.Tensor:
    """Damped Newton on ``∇f = 0`` (a normalised gradient step where the Hessian is not PD)."""
    x = x.clone()
    for _ in range(iters):
        g = obj.gradient(x[None])[0]
        H = obj.hessian(x[None])[0]
        if float(torch.linalg.eigvalsh(H).min()) > 0:
            step = torch.linalg.solve(H, g)
        else:
            step = 0.1 * g / g.norm().clamp_min(1e-300)
        n = float(step.norm())
        if n > max_step:
            step = step * (max_step / n)
        x = x - step
        if n < 1e-12 * max(1.0, float(x.norm())):
            break
    return x


def _min_norm_hull(G: torch.Tensor) -> torch.Tensor:
    """Min-norm point of the convex hull of the rows of ``G [k, 2]``: 0 if the origin is inside (the
    largest angular gap between the rows is below pi), else the nearest point of the segments
    between all pairs of rows (the hull's edges are among them)."""
    P = G.detach().cpu().numpy()
    ang = np.sort(np.arctan2(P[:, 1], P[:, 0]))
    gaps = np.diff(np.concatenate([ang, ang[:1] + 2 * np.pi]))
    if gaps.max() < np.pi or not np.all(np.linalg.norm(P, axis=1) > 0):
        return torch.zeros_like(G[0])
    i, j = np.triu_indices(len(P), 1)
    e = P[j] - P[i]
    t = np.clip(-(P[i] * e).sum(1) / np.maximum((e * e).sum(1), 1e-300), 0, 1)
    Q = np.concatenate([P, P[i] + t[:, None] * e])
    return torch.as_tensor(Q[np.argmin(np.linalg.norm(Q, axis=1))], dtype=G.dtype)


def _gradient_sampling(obj: Objective, x: torch.Tensor, delta: float = 0.1, iters: int = 200) -> torch.Tensor:
    """Minimise a kinked ``f`` from ``x`` by gradient sampling (gradients at ``x`` and 8 points at
    distance ``δ``; ``δ`` shrinks by 4 when their hull nearly contains 0 or no descent is found)."""
    ang = torch.arange(8, dtype=torch.float64) * (2 * math.pi / 8)
    ring = torch.stack([ang.cos(), ang.sin()], -1)
    x = x.clone()
    fx = float(obj.value(x[None])[0])
    for _ in range(iters):
        if delta < 1e-5:
            break
        G = obj.gradient(torch.cat([x[None], x + delta * ring]))
        d = _min_norm_hull(G)
        dn = float(d.norm())
        if dn <= 1e-6 * max(float(G[0].norm()), 1e-12):
            delta /= 4
            continue
        t, moved = 2 * delta, False
        while t > 1e-2 * delta:
            y = x - t * d / dn
            fy = float(obj.value(y[None])[0])
            if fy < fx - 1e-4 * t * dn:
                x, fx, moved = y, fy, True
                break
            t /= 2
        if not moved:
            delta /= 4
    return x


def _rises_on_rings(obj: Objective, x: torch.Tensor, n_angles: int = 64) -> bool:
    ang = torch.arange(n_angles, dtype=torch.float64) * (2 * math.pi / n_angles)
    ring = torch.stack([ang.cos(), ang.sin()], -1)
    f0 = float(obj.value(x[None])[0])
    return all(bool((obj.value(x + r * ring) > f0).all()) for r in RING_RADII)


def _describe(obj: Objective, x: torch.Tensor, gtol: float) -> dict:
    """Value, gradient norm and the minimum check at a polished point."""
    out = {"theta": [float(v) for v in x], "value": float(obj.value(x[None]).detach()[0])}
    if obj.smooth:
        g = obj.gradient(x[None])[0]
        eig = torch.linalg.eigvalsh(obj.hessian(x[None])[0])
        out["grad_norm"] = float(g.norm())
        out["hessian_eigenvalues"] = [float(v) for v in eig]
        out["is_minimum"] = bool(out["grad_norm"] < gtol and float(eig.min()) > 0)
    else:
        out["check"] = f"f rises on rings of radius {', '.join(f'{r:g}' for r in RING_RADII)}"
        out["is_minimum"] = _rises_on_rings(obj, x)
    return out


def find_minima(
    obj: Objective,
    pilot: torch.Tensor,
    step: float = 1.0,
    n_steps: int = 50,
    n_shrink: int = 40,
    shrink: float = 0.85,
    merge: float = 0.1,
    gtol: float = 1e-9,
) -> tuple[list[dict], list[dict]]:
    """Local minima reached by the flow from ``pilot [M, 2]`` (see the module docstring). Returns
    ``(minima, rejected)``: dicts with ``theta``, ``value``, the check and ``n_pilot`` (pilot starts
    that ended there); ``rejected`` holds polished end points that failed the check (e.g. saddles)."""
    schedule = [step] * n_steps + [step * shrink**k for k in range(1, n_shrink + 1)]
    ends, _ = flow(obj, pilot, schedule)
    finite = torch.isfinite(ends).all(1)
    ends = ends[finite]
    vals = obj.value(ends).detach()
    reps = merge_points(ends, vals, 0.25)
    if not reps:
        return [], []
    polished = []
    for i in reps:
        x = _newton(obj, ends[i]) if obj.smooth else _gradient_sampling(obj, ends[i])
        polished.append(x)
    P = torch.stack(polished)
    keep = merge_points(P, obj.value(P).detach(), merge)
    minima, rejected = [], []
    for i in keep:
        d = _describe(obj, P[i], gtol)
        (minima if d["is_minimum"] else rejected).append(d)
    minima.sort(key=lambda m: m["value"])
    if minima:
        C = torch.tensor([m["theta"] for m in minima], dtype=torch.float64)
        nearest = torch.cdist(ends, C).argmin(1)
        for k, m in enumerate(minima):
            m["n_pilot"] = int((nearest == k).sum())
    return minima, rejected


def capture_radius(
    obj: Objective,
    m: Sequence[float],
    radii: Sequence[float] = (20.0, 16.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0, 1.0, 0.5, 0.25),
    n_rings: int = 16,
    n_angles: int = 96,
) -> float:
    """Largest ``r`` in ``radii`` with ``(θ - m)·∇f(θ) > 0`` at ``n_rings x n_angles`` points of
    ``B(m, r)`` (radii ``r k / n_rings``); 0 if none."""
    centre = torch.as_tensor(m, dtype=torch.float64)
    ang = torch.arange(n_angles, dtype=torch.float64) * (2 * math.pi / n_angles)
    unit = torch.stack([ang.cos(), ang.sin()], -1)
    for r in sorted(radii, reverse=True):
        rr = r * torch.arange(1, n_rings + 1, dtype=torch.float64) / n_rings
        off = (rr[:, None, None] * unit[None]).reshape(-1, 2)
        g = obj.gradient(centre + off)
        if bool(((off * g).sum(1) > 0).all()):
            return float(r)
    return 0.0


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k/n``."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z / den * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def basin_shares(
    obj: Objective,
    minima: Sequence[dict],
    starts: torch.Tensor,
    step: float = 0.5,
    n_steps: int = 800,
    radii: Sequence[float] | None = None,
    discover: int = 2,
) -> dict:
    """Classify ``starts`` by the minimum their flow reaches. ``radii`` are the capture radii (default:
    ``capture_radius`` of each minimum). Starts not captured within ``n_steps`` are handed, up to
    ``discover`` times, to ``find_minima`` from where they stopped; new minima are appended (with
    their capture radii) and those starts flow on. Returns ``minima`` (possibly extended),
    ``capture_radii``, ``labels``, per minimum ``{"count", "share", "se", "wilson95"}`` and the number
    of starts still unresolved."""
    minima = [dict(m) for m in minima]
    radii = [capture_radius(obj, m["theta"]) for m in minima] if radii is None else list(radii)

    def centres():
        return torch.tensor([m["theta"] for m in minima], dtype=torch.float64).reshape(-1, 2)

    end, label = flow(obj, starts, [step] * n_steps, centres(), torch.tensor(radii, dtype=torch.float64))
    for _ in range(discover):
        todo = (label < 0).nonzero().squeeze(1)
        if todo.numel() == 0:
            break
        found, _ = find_minima(obj, end[todo], step=step)
        for m in found:
            if all(math.dist(m["theta"], q["theta"]) >= 0.1 for q in minima):
                minima.append(m)
                radii.append(capture_radius(obj, m["theta"]))
        end[todo], label[todo] = flow(
            obj, end[todo], [step] * n_steps, centres(), torch.tensor(radii, dtype=torch.float64)
        )
    return {
        "n_starts": int(starts.shape[0]),
        "minima": minima,
        "capture_radii": [float(v) for v in radii],
        "shares": [share_of(label, k) for k in range(len(minima))],
        "unresolved": int((label < 0).sum()),
        "labels": label,
    }


def share_of(labels: torch.Tensor, k: int) -> dict:
    """``{"count", "share", "se", "wilson95"}`` of label ``k`` among ``labels`` (one per start)."""
    n = int(labels.numel())
    c = int((labels == k).sum())
    p = c / n
    lo, hi = wilson_interval(c, n)
    return {"count": c, "share": p, "se": math.sqrt(p * (1 - p) / n), "wilson95": [lo, hi]}


def agree(a: dict, b: dict, z: float = 1.96) -> bool:
    """Two independent estimates ``{"share", "se"}`` agree: ``|p1 - p2| <= z sqrt(se1² + se2²)``."""
    return abs(a["share"] - b["share"]) <= z * math.hypot(a["se"], b["se"])
