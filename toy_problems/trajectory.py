"""Run any optimizer on a toy problem and record the path, the SAM probe and the losses."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from landscape.io import to_jsonable
from toy_problems.base import ToyProblem

__all__ = ["Trajectory", "run_trajectory"]


@dataclass
class Trajectory:
    """Result of :func:`run_trajectory`.

    ``path [k+1, dim]``: the iterate before every step and after the last completed one.
    ``perturbations [k, dim]``: for step ``t``, the last point the closure was evaluated at minus
    ``path[t]`` (SAM family: the probe ``eps``; bSAM: ``eps`` of the pass at ``w + eps``; one-pass
    methods such as RandomSAM/MFVI: the sampled offset; plain optimizers: 0).
    ``evaluations``: every point the closure was evaluated at during step ``t`` (list of ``[n_t, dim]``).
    ``losses [k+1]``: the exact loss at each ``path`` point (NaN outside the domain).
    ``step_losses [k]``: what ``optimizer.step`` returned.
    ``diverged``: True if the run stopped early; ``message`` says why (non-finite loss/gradient,
    or the iterate left the problem's valid region); ``steps`` = completed steps.
    ``posterior_std``: for optimizers with a diagonal-Gaussian posterior (MFVI, bSAM, VSAM), its
    standard deviation at the end; ``config``: what produced the run.
    """

    path: torch.Tensor
    perturbations: torch.Tensor
    losses: torch.Tensor
    step_losses: torch.Tensor
    evaluations: list[torch.Tensor]
    diverged: bool = False
    message: str = ""
    steps: int = 0
    posterior_std: torch.Tensor | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": to_jsonable(self.path),
            "perturbations": to_jsonable(self.perturbations),
            "losses": to_jsonable(self.losses),
            "step_losses": to_jsonable(self.step_losses),
            "diverged": self.diverged,
            "message": self.message,
            "steps": self.steps,
            "posterior_std": to_jsonable(self.posterior_std),
            "config": to_jsonable(self.config),
        }


def _point(t: torch.Tensor) -> str:
    """A point in 4 significant digits per coordinate, for messages (``(3.705e+115, 1.508e+77)``)."""
    v = t.reshape(-1).tolist()
    more = f", ... ({len(v)} coordinates)" if len(v) > 6 else ""
    return "(" + ", ".join(f"{x:.4g}" for x in v[:6]) + more + ")"


def _exact_loss(prob: ToyProblem, t: torch.Tensor) -> float:
    with torch.no_grad():
        if not bool(prob.in_domain(t)):
            return math.nan
        return float(prob.loss(t))


def run_trajectory(
    prob: ToyProblem,
    optimizer_factory: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    start: Sequence[float] | torch.Tensor,
    steps: int,
    *,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    scheduler_factory: Callable[[torch.optim.Optimizer], Any] | None = None,
    progress: bool = False,
) -> Trajectory:
    """Run ``optimizer_factory([theta])`` from ``start`` for ``steps`` steps on ``prob.loss``.

    Works with every optimizer of the ``optimizers`` suite (closure-based, called once, twice or
    more per step) and any ``torch.optim`` optimizer. The closure records where it was evaluated,
    so the SAM probe is read off the evaluation points, whatever the optimizer's internals.

    A non-finite loss or gradient, or an evaluation outside the problem's valid region (e.g.
    ``sigma <= 0``), stops the run with ``diverged=True`` and a message; no exception escapes for
    those. Bad arguments raise ``ValueError``/``TypeError``.

    Args:
        prob: a toy problem.
        optimizer_factory: ``params -> optimizer``, e.g. ``lambda p: SAM(p, torch.optim.SGD, rho=1, lr=5)``.
        start: initial point ``[dim]`` (must lie in the valid region).
        steps: number of optimizer steps (>= 0).
        loss_fn: objective to minimise instead of ``prob.loss`` (e.g. ``LogisticRegression.nll`` for
            optimizers that add the prior themselves); ``losses`` still reports ``prob.loss``.
        scheduler_factory: optional ``optimizer -> lr scheduler`` stepped after every step.
        progress: show a tqdm bar.
    """
    if not isinstance(prob, ToyProblem):
        raise TypeError(f"prob must be a toy problem (toy_problems.get(name)), got {type(prob).__name__}")
    if not callable(optimizer_factory):
        raise TypeError("optimizer_factory must be a callable params -> torch.optim.Optimizer")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    start_t = prob._as_tensor(torch.as_tensor(start, dtype=prob.dtype)).detach().clone().reshape(prob.dim)
    prob.domain_check(start_t)
    objective = loss_fn if loss_fn is not None else (lambda t: prob.loss(t, check=False))

    theta = torch.nn.Parameter(start_t.clone())
    opt = optimizer_factory([theta])
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer_factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
    sched = scheduler_factory(opt) if scheduler_factory is not None else None

    calls: list[torch.Tensor] = []
    problem: list[str] = []

    def closure(*_chunk):
        opt.zero_grad()
        point = theta.detach().clone()
        calls.append(point)
        if not bool(prob.in_domain(point)):
            problem.append(
                f"the closure was evaluated outside the valid region ({prob.domain}) at {_point(point)}"
            )
        loss = objective(theta)
        loss.backward()
        if not bool(torch.isfinite(loss)) or (
            theta.grad is not None and not bool(torch.isfinite(theta.grad).all())
        ):
            problem.append(f"non-finite loss or gradient at {_point(point)}")
        return loss.detach()

    path = [start_t.clone()]
    perts: list[torch.Tensor] = []
    evals: list[torch.Tensor] = []
    step_losses: list[float] = []
    losses = [_exact_loss(prob, start_t)]
    message = ""
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"{prob.name}: {type(opt).__name__}")
    for _ in it:
        calls.clear()
        problem.clear()
        before = theta.detach().clone()
        try:
            out = opt.step(closure)
        except (RuntimeError, ValueError, FloatingPointError) as exc:
            # the optimizer refused the non-finite values we fed it: stop with a flag
            if problem:
                message = problem[0] + f" (optimizer raised: {exc})"
                break
            raise
        if problem:
            message = problem[0]
        after = theta.detach().clone()
        if not message and not bool(torch.isfinite(after).all()):
            message = f"the iterate became non-finite: {_point(after)}"
        if not message and not bool(prob.in_domain(after)):
            message = f"the iterate left the valid region ({prob.domain}): {_point(after)}"
        if message:
            break
        evals.append(torch.stack(calls) if calls else before[None].clone())
        perts.append((calls[-1] - before) if calls else torch.zeros_like(before))
        step_losses.append(float(out) if out is not None else math.nan)
        path.append(after)
        losses.append(_exact_loss(prob, after))
        if sched is not None:
            sched.step()

    std = None
    if hasattr(opt, "posterior_std"):
        try:
            std = opt.posterior_std()[theta].detach().clone()
        except (KeyError, TypeError, AttributeError):
            std = None
    dim = prob.dim
    return Trajectory(
        path=torch.stack(path),
        perturbations=torch.stack(perts) if perts else torch.zeros(0, dim, dtype=start_t.dtype),
        losses=torch.tensor(losses, dtype=torch.float64),
        step_losses=torch.tensor(step_losses, dtype=torch.float64),
        evaluations=evals,
        diverged=bool(message),
        message=f"stopped after {len(perts)} of {steps} steps: {message}" if message else "",
        steps=len(perts),
        posterior_std=std,
        config={
            "problem": prob.name,
            "problem_params": prob.params(),
            "optimizer": type(opt).__name__,
            "optimizer_defaults": {
                k: v for k, v in opt.defaults.items() if isinstance(v, (int, float, str, bool, tuple))
            },
            "start": start_t.tolist(),
            "steps": steps,
        },
    )
