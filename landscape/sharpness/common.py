"""Shared machinery of the sharpness measures: counted evaluations, scales, data splitting.

Conventions (``docs/methods/sharpness.md``): ``L`` is the objective's loss on its evaluation data, ``w0``
the selected parameters flattened in ``obj.param_names`` order, ``c`` a per-parameter scale and
every perturbation is written ``delta = c * u`` with ``u`` in the "normalised" coordinates where
the constraint / noise is isotropic. Working in ``u`` makes every adaptive measure exactly
invariant to rescalings ``w -> T w`` (``T`` positive diagonal) that leave the network function
unchanged, because ``c = |w|`` transforms like ``w`` (Kwon et al. 2021, ASAM, Sec. 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from landscape.checks import check_choice, check_positive, check_seed

__all__ = [
    "Ctx",
    "make_scale",
    "split_data",
    "per_example_gradients",
    "check_positive",
    "check_choice",
    "make_generator",
    "mean_and_stderr",
]


# --------------------------------------------------------------------------------------------
# randomness (the argument checks are landscape.checks', re-exported here for the measures)
# --------------------------------------------------------------------------------------------
def make_generator(seed: int | torch.Generator | None) -> tuple[torch.Generator, int | None]:
    """A CPU generator (draws are made on the CPU and moved, so results match across devices)."""
    check_seed(seed)
    if isinstance(seed, torch.Generator):
        return seed, None
    seed = 0 if seed is None else int(seed)
    return torch.Generator().manual_seed(seed), seed


def mean_and_stderr(samples: torch.Tensor | list[float]) -> tuple[float, float]:
    """Sample mean and its standard error ``std(ddof=1) / sqrt(n)`` (a standard deviation, never a
    variance)."""
    x = torch.as_tensor(samples, dtype=torch.float64).reshape(-1)
    n = x.numel()
    if n < 2:
        raise ValueError(f"need at least 2 samples for an error bar, got {n}")
    return float(x.mean()), float(x.std(unbiased=True) / math.sqrt(n))


# --------------------------------------------------------------------------------------------
# counted evaluation
# --------------------------------------------------------------------------------------------
class Ctx:
    """The objective evaluated at flat parameter vectors, with shared evaluation counters.

    ``loss`` counts one forward pass over the objective's data, ``gradient`` one forward+backward,
    ``hvp`` one Hessian(-like)-vector product (each over the whole evaluation data of ``obj``).
    """

    def __init__(self, obj, *, progress: bool = False, counts: dict[str, int] | None = None):
        self.obj = obj
        self.progress = progress
        self.counts = counts if counts is not None else {"loss": 0, "gradient": 0, "hvp": 0}
        self.w0 = obj.flat_params().detach()
        bad = int((~torch.isfinite(self.w0)).sum())
        if bad:
            raise ValueError(
                f"{bad} of the {self.w0.numel()} selected parameters are NaN or inf: sharpness is "
                "undefined there; check the model (e.g. a diverged training run)"
            )

    def child(self, obj) -> Ctx:
        """Context for another objective (sub-batch, other loss) sharing these counters."""
        return Ctx(obj, progress=self.progress, counts=self.counts)

    @property
    def p(self) -> int:
        return self.w0.numel()

    def _where(self, w: torch.Tensor | None) -> str:
        at_w0 = w is None or w is self.w0 or torch.equal(w.to(self.w0), self.w0)
        return "at w0" if at_w0 else "at a perturbed point"

    def _finite(self, what: str, value: float | torch.Tensor, w: torch.Tensor | None) -> None:
        """Raise a clear error for a non-finite loss or gradient (the objective checks each batch's
        loss; a NaN gradient with a finite loss, e.g. from ``sqrt`` at 0, is caught here)."""
        t = torch.as_tensor(value)
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(
                f"non-finite {what} {self._where(w)} ({bad} NaN/inf of {t.numel()} entries): "
                "the sharpness measure would be NaN; check the loss function (e.g. log/sqrt at 0), "
                "the data and the parameters, or evaluate in float64"
            )

    def loss(self, w: torch.Tensor | None = None) -> float:
        self.counts["loss"] += 1
        value = float(self.obj.loss(self.w0 if w is None else w))
        self._finite("loss", value, w)
        return value

    def gradient(self, w: torch.Tensor | None = None) -> torch.Tensor:
        self.counts["gradient"] += 1
        grad = self.obj.gradient(self.w0 if w is None else w).detach().reshape(-1)
        self._finite("gradient", grad, w)
        return grad

    def loss_grad(self, w: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        self.counts["gradient"] += 1
        loss, grad = self.obj.loss_and_gradient(self.w0 if w is None else w)
        self._finite("loss", loss, w)
        self._finite("gradient", grad, w)
        return float(loss), grad.detach().reshape(-1)

    def evaluate(self, w: torch.Tensor | None = None) -> dict[str, float | None]:
        self.counts["loss"] += 1
        out = self.obj.evaluate(self.w0 if w is None else w)
        return {"loss": float(out["loss"]), "accuracy": out.get("accuracy")}

    def randn(self, gen: torch.Generator, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, self.p, generator=gen, dtype=torch.float64).to(self.w0)

    def rand(self, gen: torch.Generator, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, self.p, generator=gen, dtype=torch.float64).to(self.w0)

    def tqdm(self, iterable, **kwargs):
        if not self.progress:
            return iterable
        from tqdm.auto import tqdm

        return tqdm(iterable, **kwargs)


# --------------------------------------------------------------------------------------------
# per-parameter scales c
# --------------------------------------------------------------------------------------------
def make_scale(
    ctx: Ctx,
    scale: str | torch.Tensor | None,
    eta: float,
    *,
    fisher: str = "empirical",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The per-parameter scale ``c`` (flat, ``ctx.w0``'s dtype/device) and its description.

    * ``None`` / ``"none"``: ``c = 1`` (Euclidean neighbourhood, SAM).
    * ``"adaptive"``: ``c = |w| + eta`` (ASAM, Kwon et al. 2021, eq. 8; ``eta = 0`` makes it exactly
      scale invariant).
    * ``"fisher"``: ``c = (f + eta)^{-1/2}`` with ``f`` a diagonal Fisher: ``fisher="empirical"``
      the mean of per-example squared gradients (FSAM paper eq. 11) or ``"gradient"`` the squared
      mean gradient (FSAM paper eq. 12).
    * a tensor of ``p`` positive numbers: used as is.
    """
    if scale is None or (isinstance(scale, str) and scale == "none"):
        return torch.ones_like(ctx.w0), {"scale": "none"}
    if isinstance(scale, torch.Tensor):
        c = scale.detach().reshape(-1).to(ctx.w0)
        if c.numel() != ctx.p:
            raise ValueError(f"scale tensor has {c.numel()} entries, the objective has {ctx.p} parameters")
        if not bool(torch.all(c > 0)) or not bool(torch.isfinite(c).all()):
            raise ValueError("a scale tensor must be finite and strictly positive (no 0, NaN or inf)")
        return c, {"scale": "custom"}
    check_choice("scale", scale, ("none", "adaptive", "fisher"))
    check_positive("eta", eta, allow_zero=True)
    if scale == "adaptive":
        c = ctx.w0.abs() + eta
        if not bool(torch.all(c > 0)):
            raise ValueError(
                "scale='adaptive' with eta=0 needs every parameter to be non-zero (c = |w| would "
                "vanish); pass eta > 0 (e.g. 0.01, as ASAM) or select non-zero parameters"
            )
        return c, {"scale": "adaptive", "eta": eta}
    check_choice("fisher", fisher, ("empirical", "gradient"))
    if fisher == "gradient":
        f = ctx.gradient() ** 2
    else:
        f = per_example_gradients(ctx, square_sum=True)
    if eta == 0 and not bool(torch.all(f > 0)):
        raise ValueError("scale='fisher' with eta=0 needs a strictly positive diagonal Fisher; pass eta > 0")
    return (f + eta).rsqrt(), {"scale": "fisher", "eta": eta, "fisher": fisher}


# --------------------------------------------------------------------------------------------
# data handling
# --------------------------------------------------------------------------------------------
def _tree_map(fn: Callable[[torch.Tensor], Any], x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, v) for v in x)
    return x


def _first_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    values = x.values() if isinstance(x, dict) else x
    for v in values:
        return _first_tensor(v)
    raise TypeError("inputs contain no tensor")


def _cat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, dict):
        return {k: _cat([p[k] for p in parts]) for k in first}
    return type(first)(_cat([p[i] for p in parts]) for i in range(len(first)))


def all_data(obj) -> tuple[Any, torch.Tensor]:
    """The objective's whole evaluation data as one ``(inputs, targets)`` pair (device/dtype)."""
    xs, ys = [], []
    for x, y, _ in obj.batches():
        xs.append(x)
        ys.append(y)
    return _cat(xs), torch.cat(ys)


def split_data(obj, size: int) -> list[tuple[Any, torch.Tensor]]:
    """Consecutive sub-batches of ``size`` examples (the last one may be smaller)."""
    check_positive("batch size", size, integer=True)
    x, y = all_data(obj)
    n = len(y)
    return [(_tree_map(lambda t, s=s: t[s : s + size], x), y[s : s + size]) for s in range(0, n, size)]


def sub_batch_weights(obj, sizes: list[int]) -> list[float]:
    """Weights ``w_k`` with ``sum_k w_k L_k = L`` (``n_k/N`` for mean reduction, ``1`` for sum)."""
    n = sum(sizes)
    if obj.reduction == "sum":
        return [1.0] * len(sizes)
    return [s / n for s in sizes]


# --------------------------------------------------------------------------------------------
# per-example gradients
# --------------------------------------------------------------------------------------------
def per_example_gradients(
    ctx: Ctx,
    *,
    square_sum: bool = False,
    targets_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    chunk_size: int = 64,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    c: float | None = None,
) -> torch.Tensor:
    """Per-example gradients ``g_n = grad loss_fn(f(x_n), y_n)`` at ``w0`` (same reduction on a
    single example, the ``tests/references.py`` convention).

    ``square_sum=False``: the ``[N]`` vector ``c * ||g_n||^2``; ``square_sum=True``: the diagonal
    empirical Fisher ``c * sum_n g_n**2`` (``[p]``), with ``c = 1/N`` (mean) or ``1`` (sum).
    ``targets_fn(outputs, targets)`` replaces the targets (Monte-Carlo Fisher: sampled labels);
    ``loss_fn`` and ``c`` replace the objective's loss and the factor ``c``.
    Uses ``torch.func.vmap`` in chunks; falls back to a loop if the model does not vmap.
    """
    obj = ctx.obj
    params = obj.unflatten(ctx.w0)
    loss_fn = obj.loss_fn if loss_fn is None else loss_fn
    n_total = obj.num_examples
    if c is None:
        c = 1.0 / n_total if obj.reduction != "sum" else 1.0

    def one(p: dict[str, torch.Tensor], x: Any, y: torch.Tensor) -> torch.Tensor:
        out = obj.forward(p, _tree_map(lambda t: t.unsqueeze(0), x))
        return loss_fn(out, y.unsqueeze(0))

    grad_one = torch.func.grad(one)
    acc = torch.zeros_like(ctx.w0) if square_sum else []
    for x, y, _ in obj.batches():
        if targets_fn is not None:
            with torch.no_grad():
                y = targets_fn(obj.forward(params, x), y)
        try:
            g = torch.func.vmap(grad_one, in_dims=(None, 0, 0), chunk_size=chunk_size)(params, x, y)
            flat = torch.cat([g[name].reshape(len(y), -1) for name in obj.param_names], dim=1)
        except (RuntimeError, NotImplementedError, ValueError):
            rows = []
            for i in range(len(y)):
                xi = _tree_map(lambda t, i=i: t[i], x)
                gi = grad_one(params, xi, y[i])
                rows.append(torch.cat([gi[name].reshape(-1) for name in obj.param_names]))
            flat = torch.stack(rows)
        flat = flat.detach()
        if square_sum:
            acc += c * (flat**2).sum(0)
        else:
            acc.append(c * (flat**2).sum(1))
    ctx.counts["gradient"] += 1  # one pass of per-example gradients counts as one gradient
    out = acc if square_sum else torch.cat(acc)
    ctx._finite("per-example gradients", out, None)
    return out
