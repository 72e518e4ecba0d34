"""Laplace approximations of a trained classifier: diagonal (all or some weights) and last layer.

Around trained weights ``theta*`` the posterior is approximated by ``N(theta*, (G + delta I)^-1)``,
``G = sum_n J_n^T Lambda_n J_n`` the generalised Gauss-Newton matrix of the summed negative
log-likelihood (MacKay 1992; Ritter et al. 2018; Daxberger et al. 2021, "Laplace Redux", Sec. 2),
``Lambda_n`` the Hessian of the loss in the logits (``diag(p_n) - p_n p_n^T`` for cross-entropy,
``p_n (1 - p_n)`` for a binary logistic loss) and ``delta`` the prior precision.

* :class:`DiagLaplace`: ``G`` replaced by its exact diagonal;
* :class:`LastLayerLaplace`: the exact, full ``G`` of the last ``nn.Linear`` layer, all other weights
  fixed at ``theta*`` (Kristiadi et al. 2020; Daxberger et al. 2021).  Fit to a SAM-trained network
  it is the "SAM + Laplace" baseline.

Both give the linearised (GLM) predictive ``f(x) ~ N(f(x; theta*), J(x) Sigma J(x)^T)`` (Immer et al.
2021, "Improving predictions of Bayesian neural nets via local linearization"), turned into
probabilities by the probit approximation or by Monte Carlo in function space, and the Laplace log
marginal likelihood with a prior precision fitted by maximising it.  The equations are in
``docs/methods/optimizers.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import jacrev, vmap

from landscape.checks import check_choice, check_positive
from landscape.inputs import _map_inputs
from landscape.objective import Objective
from optimizers.posterior import DiagonalGaussianPosterior, resolve_generator

__all__ = ["DiagLaplace", "KronLaplace", "LastLayerLaplace"]


# --------------------------------------------------------------------------------------------
# likelihood
# --------------------------------------------------------------------------------------------
def _likelihood(loss_fn: Any) -> str:
    """``"categorical"`` (cross-entropy) or ``"bernoulli"`` (binary cross-entropy with logits)."""
    if isinstance(loss_fn, nn.CrossEntropyLoss) or loss_fn is nn.functional.cross_entropy:
        if isinstance(loss_fn, nn.CrossEntropyLoss) and (
            loss_fn.weight is not None or loss_fn.label_smoothing != 0.0 or loss_fn.ignore_index >= 0
        ):
            raise ValueError(
                "the Laplace approximation needs the plain negative log-likelihood: CrossEntropyLoss "
                "with class weights, label smoothing or ignore_index is not one; use nn.CrossEntropyLoss()"
            )
        return "categorical"
    if isinstance(loss_fn, nn.BCEWithLogitsLoss) or loss_fn is nn.functional.binary_cross_entropy_with_logits:
        if isinstance(loss_fn, nn.BCEWithLogitsLoss) and (
            loss_fn.weight is not None or loss_fn.pos_weight is not None
        ):
            raise ValueError(
                "the Laplace approximation needs the plain negative log-likelihood: BCEWithLogitsLoss "
                "with weight or pos_weight is not one; use nn.BCEWithLogitsLoss()"
            )
        return "bernoulli"
    raise ValueError(
        f"the Laplace approximation supports classification losses only, got {type(loss_fn).__name__}; "
        "pass nn.CrossEntropyLoss() (C logits) or nn.BCEWithLogitsLoss() (one logit per example)"
    )


def _logits(out: torch.Tensor, lik: str) -> torch.Tensor:
    """Model output as ``[B, C]`` logits (``C = 1`` for the binary case)."""
    if lik == "categorical":
        if out.ndim != 2:
            raise ValueError(f"cross-entropy needs model outputs of shape [B, C], got {tuple(out.shape)}")
        return out
    if out.ndim == 1 or (out.ndim == 2 and out.shape[1] == 1):
        return out.reshape(-1, 1)
    if lik == "gaussian":
        if out.ndim in (1, 2):
            return out.reshape(out.shape[0], -1)
        raise ValueError(f"the Gaussian likelihood needs model outputs [B] or [B, C], got {tuple(out.shape)}")
    raise ValueError(
        f"a binary logistic loss needs one logit per example ([B] or [B, 1]), got {tuple(out.shape)}"
    )


def _nll_and_lambda(f: torch.Tensor, y: torch.Tensor, lik: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed negative log-likelihood and ``Lambda_n`` (``[B, C, C]``), the loss Hessian in the logits."""
    if lik == "categorical":
        nll = nn.functional.cross_entropy(f, y, reduction="sum")
        p = torch.softmax(f, dim=1)
        lam = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
        return nll, lam
    t = y.reshape(-1, 1).to(f.dtype)
    nll = nn.functional.binary_cross_entropy_with_logits(f, t, reduction="sum")
    p = torch.sigmoid(f)
    return nll, (p * (1 - p)).unsqueeze(2)


# --------------------------------------------------------------------------------------------
# evidence and prior precision
# --------------------------------------------------------------------------------------------
def log_marginal_likelihood(
    nll: float,
    theta_sq: Any,
    curvature_eigs: torch.Tensor,
    prior_precision: Any,
    group_sizes: Sequence[int] | None = None,
) -> float:
    """Laplace log evidence ``-nll - delta/2 ||theta*||^2 + P/2 log delta - 1/2 sum log(lambda_i + delta)``.

    From ``log p(D) ~ log p(D|theta*) + log p(theta*) + P/2 log 2 pi - 1/2 log det(G + delta I)``
    with the prior ``N(0, I/delta)`` (MacKay 1992, "Bayesian interpolation", the evidence
    framework; Immer et al. 2021, "Scalable marginal likelihood estimation for model selection in
    deep learning"; Daxberger et al. 2021, Sec. 2): the ``2 pi`` terms cancel.  ``curvature_eigs`` are the
    eigenvalues of ``G`` (its diagonal for the diagonal approximation).

    With one prior precision per group of parameters (``group_sizes``: the groups' sizes, in the
    order of ``curvature_eigs``, where the posterior precision is block diagonal over the groups or
    diagonal in a basis that respects them; ``theta_sq`` and ``prior_precision`` one value per group)
    the prior is ``N(0, diag(I/delta_g))`` and the evidence is
    ``-nll - sum_g (delta_g/2 ||theta*_g||^2 - P_g/2 log delta_g) - 1/2 sum_i log(lambda_i + delta_g(i))``.
    """
    lam = curvature_eigs.clamp_min(0.0).to(torch.float64)
    sizes = [lam.numel()] if group_sizes is None else list(group_sizes)

    def per_group(value: Any) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=lam.device).reshape(-1).expand(len(sizes))

    d, t = per_group(prior_precision), per_group(theta_sq)
    n = torch.tensor(sizes, dtype=torch.float64, device=lam.device)
    per_eig = torch.repeat_interleave(d, torch.tensor(sizes, device=lam.device))
    logdet = torch.log(lam + per_eig).sum()
    return float(-nll - 0.5 * (d * t).sum() + 0.5 * (n * torch.log(d)).sum() - 0.5 * logdet)


def fit_prior_precision(theta_sq: float, curvature_eigs: torch.Tensor, bounds: tuple[float, float]) -> float:
    """The prior precision maximising :func:`log_marginal_likelihood` (a 1-D search in ``log delta``).

    The derivative in ``u = log delta`` is ``(gamma(delta) - delta ||theta*||^2) / 2`` with
    ``gamma = sum_i lambda_i / (lambda_i + delta)`` (MacKay 1992, "Bayesian interpolation": the
    effective number of parameters); it decreases strictly in ``u``, so the maximiser is its unique
    root, found by Brent's method in ``[log bounds[0], log bounds[1]]``.
    """
    from scipy.optimize import brentq

    lam = curvature_eigs.clamp_min(0.0).to(torch.float64)

    def slope(u: float) -> float:
        d = math.exp(u)
        return float((lam / (lam + d)).sum()) - d * theta_sq

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    s_lo, s_hi = slope(lo), slope(hi)
    if s_lo <= 0:
        raise ValueError(
            f"the marginal likelihood decreases at the lower bound prior_precision={bounds[0]:g} "
            "(its maximum lies below it, the curvature is ~0 or ||theta*|| is too large); lower bounds[0]"
        )
    if s_hi >= 0:
        raise ValueError(
            f"the marginal likelihood still increases at the upper bound prior_precision={bounds[1]:g} "
            "(||theta*|| ~ 0?); raise bounds[1]"
        )
    u = brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15, maxiter=500)
    return math.exp(u)


def _is_number(value: Any) -> bool:
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    return plain or (isinstance(value, torch.Tensor) and value.ndim == 0)


# --------------------------------------------------------------------------------------------
# shared machinery
# --------------------------------------------------------------------------------------------
class _Laplace:
    """Fitting data, evidence, prior precision and the GLM predictive shared by both variants."""

    _output_ndim = 2
    chunk_size: int | None = None

    def _setup(
        self,
        model: nn.Module,
        loss_fn: Any,
        data: Any,
        params: Any,
        likelihood: str | None = None,
        **kw,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.likelihood = _likelihood(loss_fn) if likelihood is None else likelihood
        self.model = model
        self.objective = Objective(model, loss_fn, data, params=params, mode="eval", **kw)

    # ---------------------------------------------------------------- the prior
    def _set_prior(self, prior_precision: Any, groups: list[tuple[str, torch.Tensor]]) -> None:
        """The prior's groups (name, positions in the flat parameter vector), in the order of
        :meth:`_curvature_eigs`, and the prior precision (one number, or one per group)."""
        self.prior_groups = [name for name, _ in groups]
        self._group_index = [idx for _, idx in groups]
        self._group_sizes = [int(idx.numel()) for idx in self._group_index]
        flat = self.objective.flat_params().detach().to(torch.float64)
        self._theta_sq_groups = torch.stack([flat[idx].square().sum() for idx in self._group_index]).cpu()
        self.theta_sq = float(self._theta_sq_groups.sum())
        d = self._prior(prior_precision)  # validated here, at the public boundary
        self.prior_precision = float(prior_precision) if _is_number(prior_precision) else d

    def _prior(self, prior_precision: Any = None) -> torch.Tensor:
        """``[G]`` float64: one prior precision per group, from a number or one value per group."""
        d = self.prior_precision if prior_precision is None else prior_precision
        groups = len(self.prior_groups)
        if _is_number(d):
            check_positive("prior_precision", float(d))
            return torch.full((groups,), float(d), dtype=torch.float64)
        t = torch.as_tensor(d, dtype=torch.float64).detach().cpu() if not isinstance(d, str) else None
        if t is None or t.ndim != 1 or t.numel() != groups or not bool((t > 0).all() and t.isfinite().all()):
            shown = ", ".join(self.prior_groups[:4]) + (", ..." if groups > 4 else "")
            raise ValueError(
                f"prior_precision must be a number > 0 or {groups} numbers > 0, one per group of "
                f"prior_groups ({shown}); got {d!r}"
            )
        return t.clone()

    def _prior_per_position(self, prior_precision: Any = None) -> torch.Tensor:
        """``[P]``: each parameter's prior precision (the objective's parameter order)."""
        obj = self.objective
        d = self._prior(prior_precision).to(dtype=obj.dtype, device=obj.device)
        out = torch.empty(obj.num_params, dtype=obj.dtype, device=obj.device)
        for value, idx in zip(d, self._group_index):
            out[idx] = value
        return out

    def _prior_per_eigenvalue(self, prior_precision: Any = None) -> torch.Tensor:
        """``[P]``: the prior precision of each of :meth:`_curvature_eigs`' eigenvalues."""
        eigs = self._curvature_eigs()
        d = self._prior(prior_precision).to(dtype=eigs.dtype, device=eigs.device)
        return torch.repeat_interleave(d, torch.tensor(self._group_sizes, device=eigs.device))

    # ---------------------------------------------------------------- evidence
    def _curvature_eigs(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_marginal_likelihood(self, prior_precision: Any = None) -> float:
        """Laplace log evidence at ``prior_precision`` (default: the current one; a number or one
        per group of ``prior_groups``); see :func:`log_marginal_likelihood`."""
        d = self._prior(prior_precision)
        return log_marginal_likelihood(
            self.nll, self._theta_sq_groups, self._curvature_eigs(), d, self._group_sizes
        )

    def optimize_prior_precision(
        self, bounds: tuple[float, float] = (1e-8, 1e8), layerwise: bool = False
    ) -> float | torch.Tensor:
        """Set ``prior_precision`` to the maximiser of the log evidence in ``bounds`` and return it:
        one number, or with ``layerwise=True`` one per group of ``prior_groups`` (laplace-torch's
        per-layer prior).  The evidence is a sum of one term per group, each depending on its own
        ``delta_g`` only (:func:`log_marginal_likelihood`), so each group's maximiser is the 1-D
        root of :func:`fit_prior_precision` on the group's eigenvalues and ``||theta*_g||^2``."""
        if not (isinstance(bounds, (tuple, list)) and len(bounds) == 2 and 0 < bounds[0] < bounds[1]):
            raise ValueError(f"bounds must be (low, high) with 0 < low < high, got {bounds!r}")
        eigs = self._curvature_eigs()
        if not layerwise:
            self.prior_precision = fit_prior_precision(self.theta_sq, eigs, tuple(bounds))
            return self.prior_precision
        fitted = []
        for name, theta_sq, lam in zip(
            self.prior_groups, self._theta_sq_groups, torch.split(eigs, self._group_sizes)
        ):
            try:
                fitted.append(fit_prior_precision(float(theta_sq), lam, tuple(bounds)))
            except ValueError as exc:
                raise ValueError(f"group {name!r}: {exc}") from None
        self.prior_precision = torch.tensor(fitted, dtype=torch.float64)
        return self.prior_precision

    def _jacobian(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, C]`` and per-example Jacobians ``[B, C, P]`` in the selected weights at
        ``theta*`` (``vmap(jacrev)`` over the examples, ``chunk_size`` at a time)."""
        obj = self.objective
        full, bufs = obj.point(None), obj.buffers()
        sel = {n: full[n] for n in obj.param_names}
        frozen = {n: t for n, t in full.items() if n not in sel}
        out = obj.call(full, bufs, x)
        self._output_ndim = out.ndim
        f = _logits(out, self.likelihood)

        def one(s, xi):
            out = obj.call({**frozen, **s}, bufs, _map_inputs(xi, lambda t: t.unsqueeze(0)))
            return out.reshape(-1)

        jac = vmap(jacrev(one), in_dims=(None, 0), chunk_size=self.chunk_size)(sel, x)
        B, C = f.shape
        J = torch.cat([jac[n].reshape(B, C, -1) for n in obj.param_names], dim=2)
        return f, J

    # ---------------------------------------------------------------- predictive
    def _function_space(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def predictive_mean_and_covariance(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """GLM predictive in logit space: mean ``f(x; theta*)`` ``[B, C]`` and covariance
        ``J(x) Sigma J(x)^T`` ``[B, C, C]`` (``C = 1`` for one logit; Immer, Korzepa, Bauer 2021)."""
        obj = self.objective
        with obj.guard(), torch.no_grad():
            x = _map_inputs(inputs, obj.convert)
            return self._function_space(x)

    def predictive(
        self,
        inputs: Any,
        link: str = "probit",
        samples: int = 100,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """Predictive probabilities of the linearised model (shape of a softmax/sigmoid of the output).

        ``link="probit"``: ``softmax(f / sqrt(1 + pi/8 diag(S)))`` (for one logit ``sigmoid``: the
        moderated output of MacKay 1992, "The evidence framework applied to classification
        networks"; the multi-class form as used by Daxberger et al. 2021);
        ``link="mc"``: the mean over ``samples`` draws ``f_s ~ N(f, S)`` in function space of
        ``softmax(f_s)`` (``generator``, else ``seed``).
        """
        check_choice("link", link, ("probit", "mc"))
        mean, cov = self.predictive_mean_and_covariance(inputs)
        single = self.likelihood == "bernoulli"
        if link == "probit":
            kappa = torch.rsqrt(1.0 + math.pi / 8.0 * torch.diagonal(cov, dim1=1, dim2=2))
            z = mean * kappa
            probs = torch.sigmoid(z) if single else torch.softmax(z, dim=1)
        else:
            check_positive("samples", samples, integer=True)
            gen, _ = resolve_generator(seed, generator, mean.device)
            C = mean.shape[1]
            eye = torch.eye(C, dtype=cov.dtype, device=cov.device)
            scale = cov.diagonal(dim1=1, dim2=2).mean(1).clamp_min(1e-300).view(-1, 1, 1)
            L = torch.linalg.cholesky(cov + 1e-12 * scale * eye)
            z = torch.randn((samples, *mean.shape), generator=gen, dtype=mean.dtype, device=mean.device)
            f = mean.unsqueeze(0) + torch.einsum("bcd,sbd->sbc", L, z)
            probs = (torch.sigmoid(f) if single else torch.softmax(f, dim=2)).mean(0)
        return probs.reshape(-1) if single and self._output_ndim == 1 else probs


# --------------------------------------------------------------------------------------------
# diagonal Laplace
# --------------------------------------------------------------------------------------------
class DiagLaplace(_Laplace, DiagonalGaussianPosterior):
    r"""Diagonal Laplace: ``N(theta*, diag(1 / (diag(G) + delta)))`` over the selected weights.

    ``diag(G)_j = sum_n sum_c p_nc (J_ncj - sum_c' p_nc' J_nc'j)^2`` for cross-entropy (the
    factorisation ``Lambda = A A^T``, ``A = diag(sqrt p) - p sqrt(p)^T``, written as a weighted
    variance, a sum of non-negative terms), ``sum_n p_n (1 - p_n) J_nj^2`` for the binary loss.
    Equivalently ``diag(G)_j = sum_n sum_k (J_n^T s_nk)_j^2`` with ``s_nk`` the columns of a square
    root ``S_n S_n^T = Lambda_n`` (``s_nk = sqrt(p_nk) (e_k - p_n)``; ``sqrt(p_n (1 - p_n))``): the
    squared per-example gradients of the pseudo-losses ``s_nk^T f_n`` (``s`` held fixed), the
    per-example form of the GGN diagonal (Dangel, Kunstner & Hennig 2020, "BackPACK", the
    ``DiagGGNExact`` extension).  Two ways to the same numbers (``curvature=``):

    * ``"per_example"`` (default): :class:`optimizers.per_example.PerExampleGradients` on the
      examples of a batch repeated once per column ``k`` (``C B`` pseudo-losses): one forward and one
      backward pass per batch (or per ``chunk_size`` examples), the squares from each layer's input and
      output gradient (``"layers"``), or the batched backward where the layer rules do not apply;
      memory ``C B`` activations;
    * ``"jacobian"``: the per-example Jacobians ``J_n`` (``C x P``) by ``vmap(jacrev)``: ``C`` backward
      passes per example, vectorised; memory ``B C P`` per batch, or ``chunk_size C P``.

    Both are exact (the stochastic estimator ``landscape.diagonal(landscape.ggn(obj))`` is not
    needed); the predictive's Jacobians are always the ``vmap(jacrev)`` ones.

    Args:
        model: the trained classifier (never modified; evaluated in eval mode).
        loss_fn: ``nn.CrossEntropyLoss()`` or ``nn.BCEWithLogitsLoss()`` (the reduction is ignored:
            the Laplace approximation uses the summed negative log-likelihood).
        data: one ``(inputs, targets)`` batch or a re-iterable of batches (the training set).
        prior_precision: ``delta``: a number, or one per selected parameter tensor (``prior_groups``,
            laplace-torch's per-layer prior); see :meth:`optimize_prior_precision`.
        params: which weights (the :class:`landscape.Objective` selection; default all).
        chunk_size: examples per vectorised Jacobian block / per backward pass (``None``: a whole
            batch).
        curvature: ``"per_example"`` (default) or ``"jacobian"``, the computation of ``diag(G)``.
        seed, generator: for :meth:`sample` / :meth:`bayesian_model_average` (weight-space samples).
        dtype, device, progress: as for :class:`landscape.Objective`.

    Attributes: ``ggn_diagonal`` (``[P]``), ``nll`` (``-log p(D|theta*)``), ``theta_sq``
    (``||theta*||^2``), ``num_params``, ``config`` (with the per-example engine's choice).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Any,
        data: Any,
        prior_precision: float | Sequence[float] | torch.Tensor = 1.0,
        *,
        params: Any = None,
        chunk_size: int | None = None,
        curvature: str = "per_example",
        seed: int | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> None:
        check_choice("curvature", curvature, ("per_example", "jacobian"))
        self._setup(model, loss_fn, data, params, dtype=dtype, device=device, progress=progress)
        if chunk_size is not None:
            check_positive("chunk_size", chunk_size, integer=True)
        self.chunk_size = chunk_size
        obj = self.objective
        self.num_params = obj.num_params
        named = dict(model.named_parameters())
        self._model_params = [named[n] for n in obj.param_names]
        self.generator, self.seed = resolve_generator(seed, generator, self._model_params[0].device)
        engine = None
        if curvature == "per_example":
            from optimizers.per_example import PerExampleGradients

            engine = PerExampleGradients(self._model_params, model, chunk_size=chunk_size)
        diag = torch.zeros(obj.num_params, dtype=obj.dtype, device=obj.device)
        nll = 0.0
        with obj.guard(), torch.no_grad():
            for x, y, _ in obj.batches():
                if engine is not None:
                    n_b, d_b = self._diagonal_per_example(engine, x, y)
                    nll += n_b
                    diag += d_b
                    continue
                f, J = self._jacobian(x)
                n_b, lam = _nll_and_lambda(f, y, self.likelihood)
                nll += float(n_b)
                if self.likelihood == "categorical":
                    p = torch.softmax(f, dim=1)
                    centred = J - torch.einsum("bc,bcp->bp", p, J).unsqueeze(1)
                    diag += torch.einsum("bc,bcp->p", p, centred.square())
                else:
                    diag += torch.einsum("b,bp->p", lam[:, 0, 0], J[:, 0].square())
        self.ggn_diagonal = diag
        self.nll = nll
        starts = torch.tensor([0] + [p.numel() for p in self._model_params]).cumsum(0).tolist()
        ranges = [torch.arange(a, b, device=obj.device) for a, b in zip(starts[:-1], starts[1:])]
        self._set_prior(prior_precision, list(zip(obj.param_names, ranges)))
        self.config = {
            "kind": "diag_laplace",
            "likelihood": self.likelihood,
            "objective": obj.config(),
            "chunk_size": chunk_size,
            "curvature": curvature,
            "per_example": None if engine is None else engine.config(),
            "seed": self.seed,
        }

    def _diagonal_per_example(self, engine: Any, x: Any, y: torch.Tensor) -> tuple[float, torch.Tensor]:
        """``(nll, diag(G))`` of one batch from the squared per-example gradients of the pseudo-losses
        ``s_nk^T f_n`` (class docstring), ``chunk_size`` examples (times ``C``) per backward pass."""
        obj = self.objective
        full, bufs = obj.point(None), obj.buffers()
        out = obj.call(full, bufs, x)
        self._output_ndim = out.ndim
        f = _logits(out, self.likelihood)
        nll, lam = _nll_and_lambda(f, y, self.likelihood)
        if self.likelihood == "categorical":
            p = torch.softmax(f, dim=1)
            eye = torch.eye(p.shape[1], dtype=p.dtype, device=p.device)
            S = (eye[None] - p[:, :, None]) * p.sqrt()[:, None, :]  # [B, C, k]: column k sqrt(p_k)(e_k - p)
        else:
            S = lam.sqrt()
        K, B = S.shape[2], f.shape[0]
        step = B if self.chunk_size is None else self.chunk_size
        diag = torch.zeros(obj.num_params, dtype=obj.dtype, device=obj.device)
        # the engine's plan (which layer owns which parameter) is made on the model's own parameters;
        # the gradients are taken with respect to the tensors the functional forward uses, same order
        leaves = [full[n].detach().requires_grad_(True) for n in obj.param_names]
        engine.params = leaves
        point = {**full, **dict(zip(obj.param_names, leaves))}
        # the engine checks its layer rules against the batched backward on its first call (all rows of
        # the per-example Jacobian): that call gets two examples, so the check costs 2 C rows
        bounds, i = [], 0
        if engine.method == "layers" and engine.verify and not engine.verified:
            bounds, i = [(0, min(B, 2))], min(B, 2)
        bounds += [(j, min(B, j + step)) for j in range(i, B, step)]
        for i, stop in bounds:
            xs = _map_inputs(x, lambda t, i=i, stop=stop: t[i:stop].repeat(K, *([1] * (t.ndim - 1))))
            with torch.enable_grad(), engine.capture():
                fk = _logits(obj.call(point, bufs, xs), self.likelihood)
                b = stop - i
                losses = torch.einsum("kbc,bck->kb", fk.reshape(K, b, -1), S[i:stop]).reshape(-1)
                m = engine.moments(losses)
            diag += torch.cat(
                [
                    torch.zeros_like(t).reshape(-1) if s is None else s.reshape(-1)
                    for s, t in zip(m.sum_sq, leaves)
                ]
            )
        return float(nll), diag

    def _curvature_eigs(self) -> torch.Tensor:
        return self.ggn_diagonal

    def posterior_variance(self) -> torch.Tensor:
        """``1 / (diag(G) + delta)`` as a flat ``[P]`` vector (the objective's parameter order)."""
        return 1.0 / (self.ggn_diagonal + self._prior_per_position())

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """Per selected model parameter, ``sqrt(1 / (diag(G) + delta))`` (for :meth:`sample`)."""
        std = self.posterior_variance().sqrt()
        out, off = {}, 0
        for p in self._model_params:
            out[p] = std[off : off + p.numel()].reshape(p.shape).to(device=p.device, dtype=p.dtype)
            off += p.numel()
        return out

    def _function_space(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        f, J = self._jacobian(x)
        cov = torch.einsum("bcp,p,bdp->bcd", J, self.posterior_variance(), J)
        return f, cov


# --------------------------------------------------------------------------------------------
# last-layer Laplace
# --------------------------------------------------------------------------------------------
def _find_last_linear(model: nn.Module, last_layer: Any) -> tuple[str, nn.Linear]:
    mods = dict(model.named_modules())
    if last_layer is None:
        found = [(n, m) for n, m in mods.items() if isinstance(m, nn.Linear)]
        if not found:
            raise ValueError(
                "the model has no nn.Linear layer; pass last_layer= (a Linear module or its name)"
            )
        return found[-1]
    if isinstance(last_layer, str):
        if last_layer not in mods:
            raise ValueError(
                f"last_layer {last_layer!r} is not a module name of the model; names: {list(mods)}"
            )
        last_layer = mods[last_layer]
    for n, m in mods.items():
        if m is last_layer:
            if not isinstance(m, nn.Linear):
                raise TypeError(f"last_layer must be an nn.Linear, got {type(m).__name__}")
            return n, m
    raise ValueError("last_layer is not a submodule of model")


class LastLayerLaplace(_Laplace):
    r"""Laplace over the last ``nn.Linear`` layer, with the exact full GGN in closed form.

    With ``phi_n`` the layer's input and ``f_n = W phi_n + b`` the logits, the Jacobian of ``f_n``
    in ``(W, b)`` is ``[I_C (x) phi_n^T, I_C]`` (``W`` flattened row-major, then ``b``: the order of
    ``model.named_parameters()``), so

        G_WW = sum_n Lambda_n (x) phi_n phi_n^T,  G_Wb = sum_n Lambda_n (x) phi_n,  G_bb = sum_n Lambda_n

    (in vec/column-major order the first is ``sum_n phi_n phi_n^T (x) Lambda_n``).  One pass over the
    data, cost ``O(N C^2 D^2)``, memory ``O(C^2 D^2)``; one eigendecomposition of ``G``
    (``O((C D)^3)``) then gives the covariance, log-determinant and evidence for every ``delta``.
    The model's output must be the layer's output (checked); the predictive is exact in function
    space given the features, since the logits are linear in the layer's weights.

    Args:
        model, loss_fn, data, prior_precision, dtype, device, progress: as :class:`DiagLaplace`.
        last_layer: the ``nn.Linear`` (or its name); default the last one in ``model.modules()``.

    Attributes: ``ggn`` (``[P, P]``), ``nll``, ``theta_sq``, ``num_params``, ``param_names``,
    ``config``.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Any,
        data: Any,
        prior_precision: float | Sequence[float] | torch.Tensor = 1.0,
        *,
        last_layer: Any = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        name, layer = _find_last_linear(model, last_layer)
        self.layer = layer
        self._setup(model, loss_fn, data, layer, dtype=dtype, device=device, progress=progress)
        obj = self.objective
        self.param_names = list(obj.param_names)
        self.num_params = obj.num_params
        C, D = layer.out_features, layer.in_features
        self._has_bias = layer.bias is not None
        Dt = D + int(self._has_bias)
        G = torch.zeros(C, Dt, C, Dt, dtype=obj.dtype, device=obj.device)
        nll = 0.0
        with obj.guard(), torch.no_grad():
            for x, y, _ in obj.batches():
                phi, f = self._features(x)
                n_b, lam = _nll_and_lambda(f, y, self.likelihood)
                nll += float(n_b)
                G += torch.einsum("nab,nd,ne->adbe", lam, phi, phi)
        # augmented order (c, d~) with d~ = D the bias  ->  parameter order (W row-major, then b)
        self._perm = self._param_order(C, D)
        self.ggn = G.reshape(C * Dt, C * Dt)[self._perm][:, self._perm]
        self.ggn = 0.5 * (self.ggn + self.ggn.T)
        self._eigvals, self._eigvecs = torch.linalg.eigh(self.ggn)
        self.nll = nll
        # one group: the eigenvectors of the full G mix the weight and the bias
        self._set_prior(prior_precision, [(name, torch.arange(self.num_params, device=obj.device))])
        self.config = {
            "kind": "last_layer_laplace",
            "likelihood": self.likelihood,
            "last_layer": name,
            "objective": obj.config(),
        }

    def _param_order(self, C: int, D: int) -> torch.Tensor:
        """Index into the augmented ``(c, d~)`` flattening for each parameter position."""
        Dt = D + int(self._has_bias)
        aug = torch.arange(C * Dt).reshape(C, Dt)
        order = [aug[:, :D].reshape(-1)]
        if self._has_bias:
            order.append(aug[:, D])
        return torch.cat(order).to(self.objective.device)

    def _features(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer inputs ``phi`` (``[B, D]``, with a column of ones if there is a bias) and logits."""
        obj = self.objective
        seen: dict[str, torch.Tensor] = {}

        def hook(_m, inp, out):
            seen["phi"], seen["out"] = inp[0], out

        handle = self.layer.register_forward_hook(hook)
        try:
            out = obj.call(obj.point(None), obj.buffers(), x)
        finally:
            handle.remove()
        if "phi" not in seen or seen["out"].shape != out.shape or not torch.equal(seen["out"], out):
            raise ValueError(
                "the model's output is not the output of the last layer "
                f"({type(self.layer).__name__}); the last-layer Laplace needs logits = layer(features): "
                "pass last_layer= or move post-processing out of the model"
            )
        self._output_ndim = out.ndim
        phi = seen["phi"]
        if phi.ndim != 2:
            raise ValueError(f"the last layer's input must be [B, D] features, got {tuple(phi.shape)}")
        if self._has_bias:
            phi = torch.cat([phi, torch.ones_like(phi[:, :1])], dim=1)
        return phi, _logits(out, self.likelihood)

    def _curvature_eigs(self) -> torch.Tensor:
        return self._eigvals

    def posterior_covariance(self, prior_precision: Any = None) -> torch.Tensor:
        """``(G + delta I)^-1`` ``[P, P]`` in the parameter order (``param_names``)."""
        d = float(self._prior(prior_precision)[0])
        V, lam = self._eigvecs, self._eigvals.clamp_min(0.0)
        return (V / (lam + d)) @ V.T

    def _function_space(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        phi, f = self._features(x)
        C, Dt = f.shape[1], phi.shape[1]
        S = torch.empty_like(self.ggn)
        S[self._perm.unsqueeze(1), self._perm.unsqueeze(0)] = self.posterior_covariance()
        S = S.reshape(C, Dt, C, Dt)
        return f, torch.einsum("bd,cdke,be->bck", phi, S, phi)


# --------------------------------------------------------------------------------------------
# Kronecker-factored Laplace
# --------------------------------------------------------------------------------------------
def _kron_likelihood(loss_fn: Any) -> str:
    """:func:`_likelihood`, plus ``"gaussian"`` for ``nn.MSELoss()`` (regression)."""
    if isinstance(loss_fn, nn.MSELoss) or loss_fn is nn.functional.mse_loss:
        return "gaussian"
    try:
        return _likelihood(loss_fn)
    except ValueError as exc:
        if "classification losses only" not in str(exc):
            raise
        raise ValueError(
            f"KronLaplace supports nn.CrossEntropyLoss(), nn.BCEWithLogitsLoss() and nn.MSELoss() "
            f"(regression, with sigma_noise), got {type(loss_fn).__name__}"
        ) from None


_SUM_LOSSES = {
    "categorical": nn.CrossEntropyLoss,
    "bernoulli": nn.BCEWithLogitsLoss,
    "gaussian": nn.MSELoss,
}


class KronLaplace(_Laplace):
    r"""Kronecker-factored Laplace over the ``nn.Linear`` / ``nn.Conv2d`` weights of a whole network.

    The GGN of the summed negative log-likelihood is replaced by KFAC (:func:`landscape.kfac`, the
    type-2 Fisher; Martens & Grosse 2015; Ritter, Botev & Barber 2018, "A scalable Laplace
    approximation for neural networks"), one block per layer (weight and bias as two blocks by
    default, as laplace-torch's ``KronLaplace``), and the posterior precision of block ``l`` is

        ``P_l = s (G_l kron A_l) + delta I``,  ``G_l = sum_n sum_j g_nj g_nj^T``,
        ``A_l = (1/N) sum_n a_n a_n^T``

    (``G`` the gradient factor of the *summed* loss, ``A`` the *averaged* input factor, so
    ``G kron A ~ N E[g g^T] kron E[a a^T]``: laplace-torch's normalisation, ``Kron`` with curvlinops'
    ``KFACLinearOperator`` rescaled by its ``_rescale_kron_factors``); ``s = 1`` for cross-entropy and
    the logistic loss and ``s = 1 / (2 sigma^2)`` for ``nn.MSELoss`` (whose summed loss is
    ``||y - f||^2`` with output Hessian ``2 I``; the Gaussian likelihood's is ``I / sigma^2``).

    With ``G = Q_G diag(l_G) Q_G^T`` and ``A = Q_A diag(l_A) Q_A^T``, ``P_l`` is diagonal in
    ``Q_G kron Q_A`` with eigenvalues ``s l_G,i l_A,j + delta``, so the prior is added *exactly*
    (no factor-wise damping): ``log det P = sum_l sum_ij log(s l_G,i l_A,j + delta)``, ``P^-1`` and
    ``P^-1/2`` are ``Q [(Q^T . Q) * (s l_G l_A^T + delta)^-1 or ^-1/2] Q^T`` per block (Immer et al.
    2021, "Scalable marginal likelihood estimation for model selection in deep learning", Sec. 4 /
    App. A; laplace-torch's ``KronDecomposed`` with ``damping=False``).  The log marginal
    likelihood, the prior-precision fit, the linearised predictive and the probit / function-space
    MC links are the base's (:class:`DiagLaplace`); ``predictive(pred_type="mc")`` samples weights
    ``theta* + P^-1/2 z`` (the symmetric square root, as laplace-torch's ``sample``) and averages the
    network's softmax.

    Args:
        model: the trained network (never modified; evaluated in eval mode).  Every selected weight
            must belong to an ``nn.Linear`` / ``nn.Conv2d``; other layers (BatchNorm, Embedding, ...)
            are refused by name unless left out with ``params=``.
        loss_fn: ``nn.CrossEntropyLoss()``, ``nn.BCEWithLogitsLoss()`` or ``nn.MSELoss()`` (its
            reduction is ignored: the Laplace approximation uses the summed negative log-likelihood).
        data: one ``(inputs, targets)`` batch or a re-iterable of batches (the training set).
        prior_precision: ``delta``: a number, or one per block (``prior_groups``: the blocks' names;
            with ``separate_bias=True`` one per parameter tensor, laplace-torch's per-layer prior),
            added exactly in each block's eigenbasis; see :meth:`optimize_prior_precision`.
        params: which weights (the :class:`landscape.Objective` selection; default all).
        sigma_noise: the Gaussian likelihood's noise standard deviation (``nn.MSELoss`` only).
        separate_bias: ``True`` (default): a layer's weight and bias are two blocks (laplace-torch);
            ``False``: one block with a column of ones in ``A`` (Martens & Grosse 2015).
        kfac_approx: ``"expand"`` or ``"reduce"`` for weight-sharing inputs (:func:`landscape.kfac`).
        chunk_size: examples per vectorised Jacobian block in the linearised predictive.
        seed, generator: the default generator of :meth:`sample`.
        dtype, device, progress: as for :class:`landscape.Objective`.

    Attributes: ``kfac`` (the :class:`~landscape.curvature.kfac.KFACOperator`), ``nll``, ``theta_sq``,
    ``num_params``, ``num_data``, ``config``.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Any,
        data: Any,
        prior_precision: float | Sequence[float] | torch.Tensor = 1.0,
        *,
        params: Any = None,
        sigma_noise: float = 1.0,
        separate_bias: bool = True,
        kfac_approx: str = "expand",
        chunk_size: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        progress: bool = False,
    ) -> None:
        from landscape.curvature.kfac import kfac

        lik = _kron_likelihood(loss_fn)
        check_positive("sigma_noise", sigma_noise)
        if lik != "gaussian" and sigma_noise != 1.0:
            raise ValueError(
                f"sigma_noise is the Gaussian likelihood's (nn.MSELoss); a {lik} likelihood has none, "
                "leave it at 1.0"
            )
        if chunk_size is not None:
            check_positive("chunk_size", chunk_size, integer=True)
        self.chunk_size = chunk_size
        self.sigma_noise = float(sigma_noise)
        sum_loss = _SUM_LOSSES[lik](reduction="sum")
        self._setup(model, sum_loss, data, params, lik, dtype=dtype, device=device, progress=progress)
        obj = self.objective
        try:
            self.kfac = kfac(obj, kfac_approx=kfac_approx, separate_bias=separate_bias)
        except ValueError as exc:
            if "no Kronecker form" not in str(exc):
                raise
            raise ValueError(f"KronLaplace: {exc} (pass params= to KronLaplace)") from None
        self.num_params = obj.num_params
        self.num_data = obj.num_examples
        self._scale = 1.0 / (2.0 * self.sigma_noise**2) if lik == "gaussian" else 1.0
        self._eigs = []  # per block: (block, l_G, Q_G, l_A | None, Q_A | None)
        for b in self.kfac.blocks():
            lg, qg = torch.linalg.eigh(b.left)
            la, qa = (None, None) if b.right is None else torch.linalg.eigh(b.right)
            self._eigs.append((b, lg, qg, la, qa))
        self.generator, self.seed = resolve_generator(seed, generator, obj.device)
        self.nll, self._outputs = self._nll()
        self._set_prior(prior_precision, [(b.name, b.index) for b, *_ in self._eigs])
        self.config = {
            "kind": "kron_laplace",
            "likelihood": lik,
            "sigma_noise": self.sigma_noise,
            "separate_bias": bool(separate_bias),
            "kfac_approx": kfac_approx,
            "objective": obj.config(),
            "chunk_size": chunk_size,
            "seed": self.seed,
        }

    def _nll(self) -> tuple[float, int]:
        """``-log p(D | theta*)`` (summed) and the outputs per example.  Gaussian:
        ``||y - f||^2 / (2 sigma^2) + N C log(sigma sqrt(2 pi))`` (laplace-torch's ``log_likelihood``)."""
        obj = self.objective
        total, outputs = 0.0, 1
        with obj.guard(), torch.no_grad():
            full, bufs = obj.point(None), obj.buffers()
            for x, y, _ in obj.batches():
                out = obj.call(full, bufs, x)
                self._output_ndim = out.ndim
                f = _logits(out, self.likelihood)
                outputs = f.shape[1]
                total += float(obj.loss_fn(out, y))
        if self.likelihood == "gaussian":
            total = total * self._scale + self.num_data * outputs * math.log(
                self.sigma_noise * math.sqrt(2 * math.pi)
            )
        return total, outputs

    # ---------------------------------------------------------------- the posterior's algebra
    def _grid(self, lg: torch.Tensor, la: torch.Tensor | None) -> torch.Tensor:
        """``[d_out, c]``: the block's curvature eigenvalues ``s l_G,i l_A,j``."""
        return self._scale * (lg[:, None] if la is None else lg[:, None] * la[None, :])

    def _curvature_eigs(self) -> torch.Tensor:
        return torch.cat([self._grid(lg, la).reshape(-1) for _, lg, _, la, _ in self._eigs])

    def _blocks(self, exponent: float, prior_precision: Any = None) -> list:
        """``P^exponent`` per block in the eigenbasis form of :class:`KroneckerBlock`."""
        from landscape.curvature.kronecker import KroneckerBlock

        out = []
        for (b, lg, qg, la, qa), d in zip(self._eigs, self._prior(prior_precision).tolist()):
            den = self._grid(lg, la).clamp_min(0.0) + d
            out.append(
                KroneckerBlock(
                    b.name, b.index, b.d_out, b.cols, q_left=qg, q_right=qa, diag=den.pow(exponent)
                )
            )
        return out

    def _apply(self, blocks: list, V: torch.Tensor) -> torch.Tensor:
        """``blockdiag(blocks) @ V`` for ``V`` ``[P, k]`` (the objective's parameter order)."""
        out = torch.zeros_like(V)
        k = V.shape[1]
        for b in blocks:
            M = V[b.index].T.reshape(k, b.d_out, b.cols)
            out[b.index] = b.apply(M).reshape(k, -1).T
        return out

    def posterior_precision(self, prior_precision: Any = None) -> torch.Tensor:
        """``s (G kron A) + diag(delta)`` as a dense ``[P, P]`` matrix (for small models and checks)."""
        K = self.kfac.to_dense() * self._scale
        return K + torch.diag(self._prior_per_position(prior_precision).to(K.dtype))

    def posterior_covariance(self, prior_precision: Any = None) -> torch.Tensor:
        """The posterior covariance ``P^-1`` as a dense ``[P, P]`` matrix (from the eigenbasis)."""
        eye = torch.eye(self.num_params, dtype=self.objective.dtype, device=self.objective.device)
        return self._apply(self._blocks(-1.0, prior_precision), eye)

    def log_det_posterior_precision(self, prior_precision: Any = None) -> float:
        """``log det P = sum_blocks sum_ij log(s l_G,i l_A,j + delta_block)`` (exact for the prior)."""
        d = self._prior_per_eigenvalue(prior_precision)
        return float(torch.log(self._curvature_eigs().clamp_min(0.0) + d).sum())

    def sample(
        self, samples: int = 100, generator: torch.Generator | None = None, seed: int | None = None
    ) -> torch.Tensor:
        """``[samples, P]`` weight vectors ``theta* + P^-1/2 z``, ``z ~ N(0, I)`` drawn as
        ``torch.randn(samples, P)`` with ``generator`` (else ``seed``, else the posterior's own
        generator): laplace-torch's ``KronLaplace.sample`` draws the same vectors from the same
        generator state."""
        check_positive("samples", samples, integer=True)
        obj = self.objective
        gen = self.generator
        if generator is not None or seed is not None:
            gen = resolve_generator(seed, generator, obj.device)[0]
        z = torch.randn(samples, self.num_params, generator=gen, dtype=obj.dtype, device=obj.device)
        return obj.flat_params().unsqueeze(0) + self._apply(self._blocks(-0.5), z.T).T

    # ---------------------------------------------------------------- predictive
    def _function_space(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        f, J = self._jacobian(x)
        B, C, P = J.shape
        SJ = self._apply(self._blocks(-1.0), J.reshape(B * C, P).T).T.reshape(B, C, P)
        return f, torch.einsum("bcp,bdp->bcd", J, SJ)

    def predictive(
        self,
        inputs: Any,
        link: str = "probit",
        samples: int = 100,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        pred_type: str = "glm",
    ) -> torch.Tensor:
        """Predictive class probabilities.  ``pred_type="glm"``: the linearised predictive with the
        ``link`` of :meth:`DiagLaplace.predictive` (``"probit"`` or ``"mc"`` in function space);
        ``pred_type="mc"``: ``1/S sum_s softmax(f(x; theta_s))`` (sigmoid for one logit) over ``S =
        samples`` weight vectors of :meth:`sample` (laplace-torch's ``pred_type="nn"``)."""
        check_choice("pred_type", pred_type, ("glm", "mc"))
        if self.likelihood == "gaussian":
            raise ValueError(
                "predictive() gives class probabilities; for regression use "
                "predictive_mean_and_covariance(x) (add sigma_noise**2 for the predictive of y)"
            )
        if pred_type == "glm":
            return super().predictive(inputs, link=link, samples=samples, generator=generator, seed=seed)
        check_positive("samples", samples, integer=True)
        obj = self.objective
        gen = resolve_generator(seed, generator, obj.device)[0]
        thetas = self.sample(samples, generator=gen)
        single = self.likelihood == "bernoulli"
        total = None
        with obj.guard(), torch.no_grad():
            x = _map_inputs(inputs, obj.convert)
            bufs = obj.buffers()
            for theta in thetas:
                f = _logits(obj.call(obj.point(theta), bufs, x), self.likelihood)
                p = torch.sigmoid(f) if single else torch.softmax(f, dim=1)
                total = p if total is None else total + p
        probs = total / samples
        return probs.reshape(-1) if single and self._output_ndim == 1 else probs
