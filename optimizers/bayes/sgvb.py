"""Mean-field Gaussian Bayesian layers (SGVB, SGVB-LRT): KL, ELBO and model-averaged prediction.

Posterior ``q(w) = N(mu, diag(sigma^2))`` over every weight and bias of the converted layers,
``sigma = softplus(rho)`` (Blundell et al. 2015, "Weight uncertainty in neural networks",
Sec. 3.2), prior ``N(0, prior_std^2 I)``.  Two estimators of the expected log-likelihood:

* **SGVB** (``local_reparam=False``): one weight sample ``W = mu + sigma * eps`` per forward pass,
  shared by the mini-batch (Kingma & Welling 2014, reparameterisation trick; Blundell et al. 2015,
  Sec. 3.2);
* **SGVB-LRT** (``local_reparam=True``): the local reparameterisation trick (Kingma, Salimans &
  Welling 2015, "Variational dropout and the local reparameterization trick", Sec. 2.3, eq. 6):
  the pre-activations ``b`` are sampled directly, per example,
  ``b = gamma + sqrt(delta) * eps`` with ``gamma = x mu^T + mu_b`` and
  ``delta = x^2 (sigma^2)^T + sigma_b^2`` (for ``Conv2d`` the same with convolutions), which has
  the marginal mean and variance of SGVB's pre-activations and a lower-variance gradient.

Training minimises the per-datum negative ELBO ``nll + kl / N`` (:func:`elbo_loss`,
:func:`kl_divergence`) with any ``torch.optim`` optimizer.  :class:`optimizers.bayes.flat_sgvb.FlatSGVB`
is the flat-seeking version (Nguyen et al. 2023, "Flat seeking Bayesian neural networks", Sec. 3.3, eqs. 6-7):
F-SGVB, F-SGVB-LRT and, with ``geometry=True``, their "+ Geometry" variants.  Prediction:
:func:`sgvb_predict` (Bayesian model averaging over ``S`` seeded samples).

Noise: every layer draws ``eps`` from its ``generator`` (a ``torch.Generator``; one generator is
shared by all layers that :func:`convert_to_bayesian` creates), in forward order, weight before
bias; it samples in train and eval mode alike (:func:`use_mean` switches to the mean network).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from landscape.checks import check_positive
from optimizers.posterior import check_nonneg, check_num_data, probabilities, resolve_generator

__all__ = [
    "BayesConv2d",
    "BayesLinear",
    "bayes_layers",
    "convert_to_bayesian",
    "elbo_loss",
    "kl_divergence",
    "sgvb_predict",
    "use_mean",
]


def _inv_softplus(x: float) -> float:
    # softplus(r) = log(1 + e^r) = x  <=>  r = log(e^x - 1); expm1 keeps small x accurate
    return math.log(math.expm1(x)) if x < 30 else x


class _BayesLayer(nn.Module):
    """Shared machinery: ``(mu, rho)`` parameters, noise modes, closed-form KL."""

    _modes = ("sample", "mean", "record", "replay")

    def _setup(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        prior_std: float,
        init_std: float,
        local_reparam: bool,
        generator: torch.Generator | None,
        seed: int | None,
    ) -> None:
        check_positive("prior_std", prior_std)
        check_positive("init_std", init_std)
        if not isinstance(local_reparam, bool):
            raise TypeError(f"local_reparam must be True or False, got {local_reparam!r}")
        r0 = _inv_softplus(float(init_std))
        w = weight.detach()
        self.weight_mu = nn.Parameter(w.clone())
        self.weight_rho = nn.Parameter(torch.full_like(w, r0))
        if bias is not None:
            self.bias_mu = nn.Parameter(bias.detach().clone())
            self.bias_rho = nn.Parameter(torch.full_like(bias.detach(), r0))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.prior_std = float(prior_std)
        self.init_std = float(init_std)
        self.local_reparam = local_reparam
        self.generator, _ = resolve_generator(seed, generator, None)
        self.noise_mode = "sample"
        self._log: list[tuple[torch.Tensor, ...]] = []
        self._pos = 0

    # ---- posterior --------------------------------------------------------------------------
    def mean_std_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """``[(weight_mu, weight_rho), (bias_mu, bias_rho)]`` (bias pair only if there is a bias)."""
        pairs = [(self.weight_mu, self.weight_rho)]
        if self.bias_mu is not None:
            pairs.append((self.bias_mu, self.bias_rho))
        return pairs

    def kl(self) -> torch.Tensor:
        """``KL(q || p) = sum [log(s0/sigma) + (sigma^2 + mu^2)/(2 s0^2) - 1/2]`` (differentiable)."""
        s0 = self.prior_std
        total = self.weight_mu.new_zeros(())
        for mu, rho in self.mean_std_pairs():
            sig = F.softplus(rho)
            total = total + (math.log(s0) - torch.log(sig) + (sig**2 + mu**2) / (2 * s0**2) - 0.5).sum()
        return total

    # ---- noise ------------------------------------------------------------------------------
    def _noise(self, shapes: list[torch.Size], like: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        mode = self.noise_mode
        if mode == "mean":
            return None
        if mode == "replay":
            if self._pos >= len(self._log):
                raise RuntimeError(
                    f"{type(self).__name__}: the pass at the perturbed point ran this layer more often "
                    "than the pass at the mean; the closure must do the same forward both times"
                )
            eps = self._log[self._pos]
            self._pos += 1
            if [e.shape for e in eps] != list(shapes):
                raise RuntimeError(
                    f"{type(self).__name__}: the perturbed pass saw other shapes than the first pass "
                    "(the closure must use the same batch in both passes)"
                )
            return eps
        g = self.generator
        eps = tuple(
            torch.randn(s, generator=g, dtype=like.dtype, device=g.device).to(like.device) for s in shapes
        )
        if mode == "record":
            self._log.append(eps)
        return eps

    def _forward(self, x: torch.Tensor, op: Callable[..., torch.Tensor]) -> torch.Tensor:
        if self.noise_mode not in self._modes:
            raise ValueError(f"noise_mode must be one of {list(self._modes)}, got {self.noise_mode!r}")
        b_mu = self.bias_mu
        if self.noise_mode == "mean":
            return op(x, self.weight_mu, b_mu)
        w_sig = F.softplus(self.weight_rho)
        b_sig = F.softplus(self.bias_rho) if b_mu is not None else None
        if self.local_reparam:
            gamma = op(x, self.weight_mu, b_mu)
            delta = op(x * x, w_sig * w_sig, None if b_sig is None else b_sig * b_sig)
            (eps,) = self._noise([gamma.shape], gamma)
            return gamma + torch.sqrt(delta.clamp_min(torch.finfo(delta.dtype).tiny)) * eps
        shapes = [self.weight_mu.shape] + ([b_mu.shape] if b_mu is not None else [])
        eps = self._noise(shapes, self.weight_mu)
        w = self.weight_mu + w_sig * eps[0]
        b = b_mu + b_sig * eps[1] if b_mu is not None else None
        return op(x, w, b)

    def extra_repr(self) -> str:
        return f"prior_std={self.prior_std}, local_reparam={self.local_reparam}"


class BayesLinear(_BayesLayer):
    """Mean-field Gaussian ``nn.Linear`` (SGVB, or SGVB-LRT with ``local_reparam=True``).

    ``BayesLinear(in_features, out_features, bias=True, *, prior_std=1.0, init_std=1e-3,
    local_reparam=False, seed=None, generator=None, device=None, dtype=None)``: ``mu`` is
    initialised as ``nn.Linear`` initialises its weights, ``sigma = init_std`` (softplus
    parameterisation).  :meth:`from_linear` converts an existing layer (``mu`` = its weights).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        prior_std: float = 1.0,
        init_std: float = 1e-3,
        local_reparam: bool = False,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
        _template: nn.Linear | None = None,
    ) -> None:
        super().__init__()
        lin = _template or nn.Linear(in_features, out_features, bias, device=device, dtype=dtype)
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self._setup(lin.weight, lin.bias, prior_std, init_std, local_reparam, generator, seed)

    @classmethod
    def from_linear(cls, layer: nn.Linear, **kwargs: Any) -> BayesLinear:
        """A ``BayesLinear`` with ``mu`` equal to ``layer``'s weight and bias (``layer`` is not modified)."""
        return cls(layer.in_features, layer.out_features, layer.bias is not None, _template=layer, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, F.linear)


class BayesConv2d(_BayesLayer):
    """Mean-field Gaussian ``nn.Conv2d`` (SGVB, or SGVB-LRT with ``local_reparam=True``).

    Same arguments as ``nn.Conv2d`` (``padding_mode="zeros"`` only) plus the Bayesian keywords of
    :class:`BayesLinear`.  With the local reparameterisation the output is
    ``conv(x, mu) + sqrt(conv(x^2, sigma^2)) * eps``, ``eps`` independent per output element.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        *,
        prior_std: float = 1.0,
        init_std: float = 1e-3,
        local_reparam: bool = False,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
        _template: nn.Conv2d | None = None,
    ) -> None:
        super().__init__()
        conv = _template or nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            device=device, dtype=dtype,
        )  # fmt: skip
        if conv.padding_mode != "zeros":
            raise ValueError(
                f"BayesConv2d supports padding_mode='zeros' only, got {conv.padding_mode!r}; pad the "
                "input explicitly (F.pad) and use padding=0"
            )
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.padding = conv.kernel_size, conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        self._setup(conv.weight, conv.bias, prior_std, init_std, local_reparam, generator, seed)

    @classmethod
    def from_conv(cls, layer: nn.Conv2d, **kwargs: Any) -> BayesConv2d:
        """A ``BayesConv2d`` with ``mu`` equal to ``layer``'s weight and bias (``layer`` is not modified)."""
        return cls(
            layer.in_channels, layer.out_channels, layer.kernel_size, bias=layer.bias is not None,
            _template=layer, **kwargs,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def op(inp: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            return F.conv2d(inp, w, b, self.stride, self.padding, self.dilation, self.groups)

        return self._forward(x, op)


# --------------------------------------------------------------------------------------------
# model-level helpers
# --------------------------------------------------------------------------------------------
def bayes_layers(model: nn.Module) -> list[_BayesLayer]:
    """The :class:`BayesLinear` / :class:`BayesConv2d` modules of ``model``, in ``modules()`` order."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return [m for m in model.modules() if isinstance(m, _BayesLayer)]


def _require_layers(model: nn.Module, who: str) -> list[_BayesLayer]:
    layers = bayes_layers(model)
    if not layers:
        raise ValueError(
            f"{who}: the model has no Bayesian layer; convert it first with "
            "convert_to_bayesian(model) or build it from BayesLinear / BayesConv2d"
        )
    return layers


def convert_to_bayesian(
    model: nn.Module,
    *,
    prior_std: float = 1.0,
    init_std: float = 1e-3,
    local_reparam: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` / ``nn.Conv2d`` layers are Bayesian (``mu`` = their weights).

    ``model`` itself is not modified.  All new layers share one noise generator (``generator``, or
    a new one seeded with ``seed``).  Other layers (BatchNorm, ...) stay deterministic.
    ``local_reparam=True`` gives SGVB-LRT, ``False`` SGVB.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    gen, _ = resolve_generator(seed, generator, None)
    kw = dict(prior_std=prior_std, init_std=init_std, local_reparam=local_reparam, generator=gen)
    new = copy.deepcopy(model)

    def convert(mod: nn.Module) -> nn.Module | None:
        if type(mod) is nn.Linear:  # exact types: subclasses (e.g. attention projections) are kept
            return BayesLinear.from_linear(mod, **kw)
        if type(mod) is nn.Conv2d:
            return BayesConv2d.from_conv(mod, **kw)
        return None

    root = convert(new)
    if root is not None:
        return root
    for mod in list(new.modules()):
        for child_name, child in list(mod.named_children()):
            repl = convert(child)
            if repl is not None:
                setattr(mod, child_name, repl)
    if not bayes_layers(new):
        raise ValueError("convert_to_bayesian: the model has no nn.Linear or nn.Conv2d layer to convert")
    return new


def kl_divergence(model: nn.Module) -> torch.Tensor:
    """``KL(q || p)`` summed over every Bayesian layer (closed form; differentiable in ``mu``, ``rho``)."""
    layers = _require_layers(model, "kl_divergence")
    total = layers[0].kl()
    for layer in layers[1:]:
        total = total + layer.kl()
    return total


def elbo_loss(
    model: nn.Module,
    outputs: torch.Tensor,
    targets: torch.Tensor,
    num_data: int,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    kl_weight: float = 1.0,
) -> torch.Tensor:
    """Negative ELBO per datum: ``loss_fn(outputs, targets) + kl_weight * KL(q || p) / N``.

    ``loss_fn`` (default cross-entropy) is the mean negative log-likelihood of the batch, so the
    KL is divided by the training-set size ``N = num_data`` (Blundell et al. 2015, eq. 2 and Sec.
    3.4 with uniform mini-batch weights; Kingma et al. 2015, eq. 3).
    """
    check_num_data(num_data)
    check_nonneg("kl_weight", kl_weight)
    nll = (loss_fn or F.cross_entropy)(outputs, targets)
    if kl_weight == 0:
        return nll
    return nll + kl_weight * kl_divergence(model) / num_data


@contextlib.contextmanager
def _noise_mode(layers: list[_BayesLayer], mode: str) -> Iterator[None]:
    old = [layer.noise_mode for layer in layers]
    for layer in layers:
        layer.noise_mode = mode
        if mode == "record":
            layer._log = []
        elif mode == "replay":
            layer._pos = 0
    try:
        yield
    finally:
        for layer, m in zip(layers, old):
            layer.noise_mode = m


@contextlib.contextmanager
def use_mean(model: nn.Module) -> Iterator[None]:
    """Inside this block the Bayesian layers compute the mean network (``eps = 0``)."""
    with _noise_mode(_require_layers(model, "use_mean"), "mean"):
        yield


def sgvb_predict(
    model: nn.Module,
    inputs: Any,
    samples: int = 32,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    include_mean: bool = False,
) -> torch.Tensor:
    """Bayesian model average ``1/S sum_s probs(f(x; w_s))`` over ``S`` posterior samples.

    Blundell et al. 2015, eq. 5 (for SGVB-LRT the samples are pre-activation samples, Kingma et al.
    2015).  The model runs in eval mode under ``torch.no_grad()``; the noise comes from
    ``generator``, or from a new generator seeded with ``seed`` (the layers' own generators are
    then left untouched), or, with neither, from the layers' own generators.
    ``include_mean=True`` adds the mean network as one more member.  Parameters, buffers,
    ``.grad``, modes and generators are restored on exit.
    """
    layers = _require_layers(model, "sgvb_predict")
    check_nonneg("samples", samples, integer=True)
    if samples == 0 and not include_mean:
        raise ValueError("samples must be > 0 unless include_mean=True (nothing to average otherwise)")
    gen = None
    if generator is not None or seed is not None:
        gen, _ = resolve_generator(seed, generator, None)
    flags = {m: m.training for m in model.modules()}
    old_gens = [layer.generator for layer in layers]
    total: torch.Tensor | None = None
    try:
        model.eval()
        if gen is not None:
            for layer in layers:
                layer.generator = gen
        with torch.no_grad():
            runs = (["mean"] if include_mean else []) + ["sample"] * int(samples)
            for mode in runs:
                with _noise_mode(layers, mode):
                    out = model(inputs)
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"model(inputs) must return a logits tensor, got {type(out).__name__}")
                probs = probabilities(out)
                total = probs.clone() if total is None else total + probs
    finally:
        for m, flag in flags.items():
            m.training = flag
        for layer, g in zip(layers, old_gens):
            layer.generator = g
    assert total is not None
    return total / (int(samples) + int(include_mean))
