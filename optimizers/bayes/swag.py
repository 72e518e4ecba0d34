"""SWAG and F-SWAG (Maddox et al. 2019; the flat-seeking BNN paper, Sec. 3-4).

:class:`SWAG` wraps *any* optimizer (plain SGD gives SWAG, :class:`optimizers.SAM` gives
F-SWAG) and collects the running mean ``theta_bar``, the running second moment ``theta2_bar``
(diagonal) and the last ``rank`` deviations ``theta_i - theta_bar_i`` (Maddox et al. 2019, "A simple
baseline for Bayesian uncertainty in deep learning", Alg. 1), either every ``collect_every``
steps after ``start_step`` (``collect="step"``) or once per epoch after ``start_epoch`` epochs
(``collect="epoch"``, the paper's and the authors' code's rule: from epoch 161 of 300, rank 20).

**The default, ``collect="step"`` with ``collect_every=1``, collects after EVERY optimizer step --
not the paper's schedule.**  Maddox et al. collect once per epoch (Alg. 1 with ``c`` = one epoch;
swa_gaussian ``run_swag.py``: ``--swa_c_epochs 1``, a per-batch rule only with
``--swa_c_batches``).  For the paper's posterior use ``collect="epoch"`` (and call
:meth:`SWAG.on_epoch_end` after every epoch) or, equivalently, ``collect_every=steps_per_epoch,
start_step=start_epoch * steps_per_epoch`` (what ``experiments`` builds).  Per-step collection
gathers highly correlated iterates: with ``rank=20`` the deviation matrix then spans the last 20
steps, a much smaller and differently shaped covariance than 20 epochs'.  The default stays
per-step because callers that count steps (``start_step``, ``collect_every`` in steps) rely on it.
Sampling has two conventions, chosen by ``convention=``.  ``"paper"`` (the default) is Maddox et
al.'s eq. 1 and Sec. 4.2 as printed::

    SWAG-Diag:  theta = theta_bar + scale * Sigma_diag^{1/2} z
    SWAG:       theta = theta_bar + scale * (Sigma_diag^{1/2} z1 / sqrt(2) + D z2 / sqrt(2 (K - 1)))

``"code"`` is what their released sampler runs (swa_gaussian, ``swag/posteriors/swag.py``,
``SWAG.sample_fullrank``), which the flat-seeking BNN authors evaluate with::

    SWAG-Diag:  theta = theta_bar + sqrt(scale) * Sigma_diag^{1/2} z
    SWAG:       theta = theta_bar + sqrt(scale) * (Sigma_diag^{1/2} z1 + D z2 / sqrt(rank - 1))

``scale`` multiplies the *variance* there, the two parts are not halved, and the deviation term
divides by ``rank - 1`` (``max_num_models - 1``) even before ``rank`` columns are collected.  Per
coordinate the variances are ``scale^2 (Sigma_diag + diag(D D^T) / (K - 1)) / 2`` (paper, full) and
``scale (Sigma_diag + diag(D D^T) / (rank - 1))`` (code, full): a scale taken from the authors'
commands (0.1 full, 0.2 diagonal) needs ``convention="code"``, or ``sqrt(2 * 0.1)`` and
``sqrt(0.2)`` in the paper convention.  ``Sigma_diag = max(theta2_bar - theta_bar^2, var_clamp)``
and ``D`` is the ``p x K`` deviation matrix.

For a network with BatchNorm every sampled model needs its own running statistics:
:func:`bn_update` recomputes them on training data, as the authors' code does for every sample
(``bn_data=`` of :meth:`SWAG.bayesian_model_average`).  :func:`f_swag` builds ``SWAG(SAM(...))``
(reference settings: ``rho = 0.05`` CIFAR-10, rank 20, 30 posterior samples).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from optimizers.bayes.batchnorm_stats import bn_update, has_batchnorm
from optimizers.perturbation import bn_restore, bn_snapshot
from optimizers.posterior import (
    _ensemble_average,
    _weights_set_to,
    check_nonneg,
    check_positive,
    resolve_generator,
)
from optimizers.sam.sam import SAM
from optimizers.state import check_state_dict, tag_state_dict

__all__ = ["SWAG", "bn_update", "f_swag", "has_batchnorm"]


class _Shared:
    """An attribute of the wrapped optimizer (``param_groups``, ``defaults``, ``state``), read and
    written through to it, so that it stays shared even after ``optimizer.load_state_dict`` replaces
    the wrapped optimizer's lists.  Before the wrapped optimizer is attached (inside
    ``torch.optim.Optimizer.__init__``) the value lives on the instance."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.own = name, f"_own_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        inner = obj.__dict__.get("optimizer")
        return getattr(inner, self.name) if inner is not None else obj.__dict__[self.own]

    def __set__(self, obj: Any, value: Any) -> None:
        inner = obj.__dict__.get("optimizer")
        if inner is None:
            obj.__dict__[self.own] = value
        else:
            setattr(inner, self.name, value)


class SWAG(torch.optim.Optimizer):
    """SWAG / SWAG-Diag moment collector around any optimizer (Maddox et al. 2019, Alg. 1).

    A ``torch.optim.Optimizer`` whose ``param_groups`` (and ``defaults``, ``state``) are the wrapped
    optimizer's own objects, as :class:`optimizers.perturbation.PerturbationOptimizer` shares its
    base optimizer's: an LR scheduler attached to the SWAG (``StepLR(swag, ...)``) changes the
    learning rate the wrapped optimizer steps with.

    ``SWAG(optimizer, rank=20, collect_every=1, start_step=0, diag_only=False, var_clamp=1e-30,
    seed=None, generator=None, *, collect="step", start_epoch=161, convention="paper")``.

    When the weights are collected (:meth:`collect`, which you may also call yourself):

    * ``collect="step"`` (default): on every ``collect_every``-th :meth:`step` after
      ``start_step`` steps -- with the defaults **after every step, not once per epoch as in the
      paper** (see the module docstring); ``collect_every=steps_per_epoch`` gives the paper's rate;
    * ``collect="epoch"``: at :meth:`on_epoch_end`, once every ``collect_every`` epochs after
      ``start_epoch`` epochs -- after epoch ``e`` (counted from 1) when ``e > start_epoch`` and
      ``(e - start_epoch) % collect_every == 0``.  This is the rule of the paper (moments
      collected once per epoch) and of the authors' code (swa_gaussian,
      ``experiments/train/run_swag.py``: ``--swa_start 161`` of 300 epochs, ``--swa_c_epochs 1``,
      ``max_num_models=20``), which ``SWAG(opt, collect="epoch")`` reproduces.

    Statistics are flat float vectors over all parameters of the optimizer's param groups, in
    order.  Attributes after collection: ``n_collected``, :attr:`mean`, :attr:`sq_mean`,
    :attr:`variance`, :attr:`deviations` (``p x K`` matrix, oldest column first); ``n_steps``,
    ``n_epochs``.  ``self.last`` mirrors the wrapped optimizer's ``last`` plus ``n_collected``.
    Defaults: rank 20 (Maddox et al. Sec. 4 and their code), sample ``scale`` 1.

    BatchNorm: a sampled network needs running statistics of its own weights.  Pass the training
    inputs as ``bn_data=`` to :meth:`bayesian_model_average`, :meth:`sample` or :meth:`swa`: they
    are recomputed with :func:`bn_update` for every sample, as the authors' evaluation does
    (``experiments/uncertainty/uncertainty.py``: ``utils.bn_update`` after every
    ``model.sample``), and the model's own statistics are put back afterwards.  Without
    ``bn_data`` a model with BatchNorm gets a ``UserWarning`` and every sample uses the model's
    current running statistics.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rank: int = 20,  # Maddox et al. 2019 and their code (max_num_models=20)
        collect_every: int = 1,
        start_step: int = 0,
        diag_only: bool = False,
        var_clamp: float = 1e-30,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        *,
        collect: str = "step",
        start_epoch: int = 161,  # authors' code: --swa_start 161 (of 300 epochs)
        convention: str = "paper",
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer instance, got {type(optimizer).__name__}"
            )
        if collect not in ("step", "epoch"):
            raise ValueError(f"collect must be 'step' or 'epoch', got {collect!r}")
        _check_convention(convention)
        for name, v, lo in (
            ("rank", rank, 0),
            ("collect_every", collect_every, 1),
            ("start_step", start_step, 0),
            ("start_epoch", start_epoch, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if collect == "epoch" and start_step:
            raise ValueError("collect='epoch' counts epochs: give start_epoch=, not start_step=")
        if not diag_only and rank < 2:
            raise ValueError(
                "full SWAG needs rank >= 2 (the deviation term divides by K - 1); use diag_only=True"
            )
        check_nonneg("var_clamp", var_clamp)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        super().__init__([{"params": params}], {})  # validation, hooks; then _Shared groups
        for name in ("param_groups", "defaults", "state"):
            del self.__dict__[f"_own_{name}"]
        self.optimizer = optimizer
        self.rank = rank
        self.collect_mode = collect
        self.collect_every = collect_every
        self.start_step = start_step
        self.start_epoch = start_epoch
        self.diag_only = diag_only
        self.var_clamp = var_clamp
        self.convention = convention
        self.params = params
        dev = self.params[0].device if self.params else None
        self.generator, self.seed = resolve_generator(seed, generator, dev)
        self.n_steps = 0
        self.n_epochs = 0
        self.n_collected = 0
        self._mean: torch.Tensor | None = None
        self._sq_mean: torch.Tensor | None = None
        self._devs: deque[torch.Tensor] = deque(maxlen=max(rank, 1))
        self.last: dict[str, Any] = {}
        self.config = dict(rank=rank, collect=collect, collect_every=collect_every, start_step=start_step,
                           start_epoch=start_epoch if collect == "epoch" else None, diag_only=diag_only,
                           convention=convention, seed=self.seed,
                           optimizer=type(optimizer).__name__)  # fmt: skip

    param_groups = _Shared()
    defaults = _Shared()
    state = _Shared()

    def __getstate__(self) -> dict[str, Any]:
        # the whole object (torch's Optimizer pickles only defaults/state/param_groups), less an LR
        # scheduler's per-instance ``step`` wrapper, which points back at this instance
        return {k: v for k, v in self.__dict__.items() if k != "step"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the wrapped optimizer (only before any weights are collected)."""
        if "optimizer" not in self.__dict__:  # inside torch.optim.Optimizer.__init__
            super().add_param_group(param_group)
            return
        if self._mean is not None:
            raise ValueError(
                "SWAG.add_param_group: the moments are already collected over the old parameters"
            )
        self.optimizer.add_param_group(param_group)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def step(self, closure: Callable[..., Any] | None = None) -> Any:
        loss = self.optimizer.step(closure)
        self.n_steps += 1
        if (
            self.collect_mode == "step"
            and self.n_steps > self.start_step
            and (self.n_steps - self.start_step) % self.collect_every == 0
        ):
            self.collect()
        self.last = dict(getattr(self.optimizer, "last", {}))
        self.last["n_collected"] = self.n_collected
        return loss

    def on_epoch_end(self) -> bool:
        """Count one finished epoch; with ``collect="epoch"`` collect if due.  Returns whether it did."""
        self.n_epochs += 1
        e = self.n_epochs
        due = (
            self.collect_mode == "epoch"
            and e > self.start_epoch
            and (e - self.start_epoch) % self.collect_every == 0
        )
        if due:
            self.collect()
        self.last["n_collected"] = self.n_collected
        return due

    @torch.no_grad()
    def collect(self) -> None:
        """Add the current weights to the running moments (Maddox et al. 2019, Alg. 1)."""
        w = self._flat().clone()
        n = self.n_collected
        if self._mean is None:
            self._mean, self._sq_mean = w.clone(), w.square()
        else:
            self._mean.mul_(n / (n + 1)).add_(w / (n + 1))
            self._sq_mean.mul_(n / (n + 1)).add_(w.square() / (n + 1))
        self.n_collected = n + 1
        if self.rank > 0:
            self._devs.append(w - self._mean)

    def _require(self) -> None:
        if self._mean is None:
            raise RuntimeError("SWAG has not collected any weights yet: run some steps (or call collect())")

    @property
    def mean(self) -> torch.Tensor:
        self._require()
        return self._mean.clone()

    @property
    def sq_mean(self) -> torch.Tensor:
        self._require()
        return self._sq_mean.clone()

    @property
    def variance(self) -> torch.Tensor:
        """``max(theta2_bar - theta_bar^2, var_clamp)`` (diagonal covariance)."""
        self._require()
        return torch.clamp(self._sq_mean - self._mean.square(), min=self.var_clamp)

    @property
    def deviations(self) -> torch.Tensor:
        """``p x K`` matrix of the last ``K <= rank`` deviations ``theta_i - theta_bar_i``."""
        self._require()
        if not self._devs:
            return self._mean.new_zeros(self._mean.numel(), 0)
        return torch.stack(list(self._devs), dim=1)

    def sample_weights(
        self,
        generator: torch.Generator | None = None,
        scale: float = 1.0,
        diag_only: bool | None = None,
        convention: str | None = None,
    ) -> torch.Tensor:
        """A flat weight vector drawn from the SWAG posterior (formulas in the module docstring).

        ``convention`` (default: the one given at construction) says what ``scale`` means:
        ``"paper"`` multiplies the standard deviation, ``"code"`` the variance as the authors'
        sampler does.  Draws ``z1`` (``p`` values) then, for full SWAG, ``z2`` (``K`` values) from
        the generator.
        """
        check_nonneg("scale", scale)
        convention = self.convention if convention is None else convention
        _check_convention(convention)
        self._require()
        gen = generator if generator is not None else self.generator
        diag = self.diag_only if diag_only is None else diag_only
        mean = self._mean
        z1 = torch.randn(mean.shape, generator=gen, dtype=mean.dtype, device=mean.device)
        sd = self.variance.sqrt()
        k = len(self._devs)
        paper = convention == "paper"
        factor = scale if paper else math.sqrt(scale)
        if diag or k < 2:
            return mean + factor * sd * z1
        z2 = torch.randn((k,), generator=gen, dtype=mean.dtype, device=mean.device)
        if paper:  # (the expression as before the "code" convention: same bits)
            low_rank = self.deviations @ z2 / math.sqrt(2.0 * (k - 1))
            return mean + factor * (sd * z1 / math.sqrt(2.0) + low_rank)
        return mean + factor * (sd * z1 + self.deviations @ z2 / math.sqrt(self.rank - 1))

    def sample_variance(self, scale: float = 1.0, diag_only: bool | None = None) -> torch.Tensor:
        """Per-coordinate variance of :meth:`sample_weights` at ``scale`` (closed form, see the module
        docstring), in the instance's convention."""
        check_nonneg("scale", scale)
        self._require()
        diag = self.diag_only if diag_only is None else diag_only
        k = len(self._devs)
        paper = self.convention == "paper"
        var_scale = scale**2 if paper else scale
        if diag or k < 2:
            return var_scale * self.variance
        dev_sq = self.deviations.square().sum(dim=1)
        if paper:
            return var_scale * (self.variance + dev_sq / (k - 1)) / 2.0
        return var_scale * (self.variance + dev_sq / (self.rank - 1))

    def sample(
        self,
        generator: torch.Generator | None = None,
        scale: float = 1.0,
        diag_only: bool | None = None,
        *,
        model: nn.Module | None = None,
        bn_data: Any = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager: parameters set to a SWAG sample; restored bit-exactly on exit.

        With ``model`` and ``bn_data`` the model's BatchNorm statistics are recomputed for the
        sample (:func:`bn_update`) and restored on exit.
        """
        return self._set_to(self.sample_weights(generator, scale, diag_only), model, bn_data)

    def swa(
        self, *, model: nn.Module | None = None, bn_data: Any = None
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager: parameters set to the SWA mean ``theta_bar`` (BatchNorm as :meth:`sample`)."""
        return self._set_to(self.mean, model, bn_data)

    @contextlib.contextmanager
    def _set_to(self, flat: torch.Tensor, model: nn.Module | None, bn_data: Any) -> Iterator[None]:
        if bn_data is not None and model is None:
            raise ValueError("bn_data= needs model= (the network whose BatchNorm statistics to recompute)")
        snap = bn_snapshot(model) if bn_data is not None else []
        try:
            with _weights_set_to(self.params, flat):
                if bn_data is not None:
                    bn_update(model, bn_data)
                yield
        finally:
            bn_restore(snap)

    def bayesian_model_average(
        self,
        model: nn.Module,
        inputs: Any,
        samples: int = 30,  # Maddox et al. and the authors' uncertainty.py: N = 30
        generator: torch.Generator | None = None,
        scale: float = 1.0,
        bn_data: Any = None,
    ) -> torch.Tensor:
        """Average predictive probabilities over ``samples`` SWAG draws (eval mode).

        ``bn_data``: training inputs (a tensor or an iterable of batches) on which the BatchNorm
        statistics are recomputed for every sample (:func:`bn_update`); the model's statistics are
        restored afterwards.  A model with BatchNorm and no ``bn_data`` triggers a ``UserWarning``.
        """
        check_positive("samples", samples, integer=True)
        self._require()
        if bn_data is None and has_batchnorm(model):
            warnings.warn(
                "SWAG.bayesian_model_average: the model has BatchNorm layers but no bn_data= was given, "
                "so every sampled network uses the model's current running statistics; pass the training "
                "inputs (bn_data=x_train or a DataLoader) to recompute them for each sample as Maddox et "
                "al. do",
                UserWarning,
                stacklevel=2,
            )
        return _ensemble_average(
            model,
            inputs,
            (lambda: self.sample(generator, scale, model=model, bn_data=bn_data) for _ in range(samples)),
        )

    def state_dict(self) -> dict[str, Any]:
        sd = {
            "optimizer": self.optimizer.state_dict(),
            "optimizer_wrapped": type(self.optimizer).__name__,
            "n_steps": self.n_steps,
            "n_epochs": self.n_epochs,
            "n_collected": self.n_collected,
            "mean": self._mean,
            "sq_mean": self._sq_mean,
            "devs": list(self._devs),
        }
        return tag_state_dict(sd, self, self.optimizer.param_groups)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        keys = ("optimizer", "n_steps", "n_collected", "mean", "sq_mean", "devs")
        sd = check_state_dict(sd, self, self.optimizer.param_groups, required=keys)
        wrapped = sd.get("optimizer_wrapped")
        if wrapped is not None and wrapped != type(self.optimizer).__name__:
            raise ValueError(
                f"SWAG.load_state_dict: the state dict wraps a {wrapped}, this SWAG wraps a "
                f"{type(self.optimizer).__name__}"
            )
        p = sum(q.numel() for q in self.params)
        for key in ("mean", "sq_mean"):
            t = sd[key]
            if t is not None and (not isinstance(t, torch.Tensor) or t.numel() != p):
                got = t.numel() if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"SWAG.load_state_dict: {key!r} has {got} entries, the parameters have {p}; it was "
                    "saved for another model"
                )
        if any(not isinstance(d, torch.Tensor) or d.numel() != p for d in sd["devs"]):
            raise ValueError(f"SWAG.load_state_dict: 'devs' must be tensors of {p} entries (another model?)")
        self.optimizer.load_state_dict(sd["optimizer"])
        self.n_steps, self.n_collected = sd["n_steps"], sd["n_collected"]
        self.n_epochs = sd.get("n_epochs", 0)
        self._mean, self._sq_mean = sd["mean"], sd["sq_mean"]
        self._devs = deque(sd["devs"], maxlen=max(self.rank, 1))


def _check_convention(convention: Any) -> None:
    if convention not in ("paper", "code"):
        raise ValueError(
            f"convention must be 'paper' (scale multiplies the standard deviation, Maddox et al. eq. 1) "
            f"or 'code' (scale multiplies the variance, as swa_gaussian's SWAG.sample), got {convention!r}"
        )


def f_swag(
    params: Any,
    base_optimizer: Any = torch.optim.SGD,
    rho: float = 0.05,  # paper reference setting (CIFAR-10; 0.1 for CIFAR-100)
    *,
    rank: int = 20,
    collect_every: int = 1,
    start_step: int = 0,
    diag_only: bool = False,
    seed: int | None = None,
    model: nn.Module | None = None,
    collect: str = "step",
    start_epoch: int = 161,
    convention: str = "paper",
    **base_kwargs: Any,
) -> SWAG:
    """F-SWAG (``diag_only=False``) / F-SWAG-Diag: SWAG moments of SAM-trained weights (paper Sec. 4).

    The default ``collect="step"`` collects after every step; ``collect="epoch"`` with the default
    ``start_epoch=161`` is the authors' schedule (flat_bnn README: ``--swa_start=161`` of
    ``--epochs=300``, ``--cov_mat``); see :class:`SWAG`.
    """
    sam = SAM(params, base_optimizer, rho, model=model, **base_kwargs)
    return SWAG(
        sam,
        rank=rank,
        collect_every=collect_every,
        start_step=start_step,
        diag_only=diag_only,
        seed=seed,
        collect=collect,
        start_epoch=start_epoch,
        convention=convention,
    )
