"""Independent dense float64 references for the test-suite.

Everything here is written directly with ``torch.func`` and deliberately shares no code with the
``landscape`` package, so that a bug in the library cannot hide in its own reference.

Conventions (the library follows the same ones):

* The *total* loss over a data set of ``N`` examples split into batches ``B_1..B_K`` is
  ``L = sum_k w_k * loss_fn(f(X_k), y_k)`` with ``w_k = |B_k| / N`` for a mean-reduced ``loss_fn``
  and ``w_k = 1`` for a sum-reduced one.  The result therefore does not depend on the batching.
* Hessian: ``H = d^2 L / d theta^2``.
* GGN: ``G = sum_k w_k J_k^T (d^2 loss_fn / d f^2) J_k`` with ``J_k = d f(X_k) / d theta``.
* Empirical Fisher: ``F = sum_n c * g_n g_n^T`` where ``g_n`` is the gradient of the loss of example
  ``n`` alone *with the same reduction* (``loss_fn(f(x_n), y_n)``), ``c = 1/N`` for mean reduction
  and ``c = 1`` for sum reduction.  For a mean-reduced MSE over ``C`` outputs the per-example loss is
  also averaged over the outputs, exactly as ``nn.MSELoss`` does on one example.

Parameters are flattened in ``model.named_parameters()`` order (restricted to ``names`` if given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

Batch = tuple[torch.Tensor, torch.Tensor]

__all__ = [
    "param_names",
    "flatten_params",
    "total_loss_fn",
    "dense_hessian",
    "dense_ggn",
    "dense_empirical_fisher",
    "per_example_gradients",
    "make_mlp",
    "make_cnn_bn",
    "UnusedParamNet",
    "DictInputNet",
    "make_classification_data",
    "split_batches",
    "matrix_with_spectrum",
    "scripted_clock",
]


# --------------------------------------------------------------------------------------------
# parameter handling
# --------------------------------------------------------------------------------------------
def param_names(model: nn.Module, names: Sequence[str] | None = None) -> list[str]:
    all_names = [n for n, _ in model.named_parameters()]
    if names is None:
        return all_names
    missing = set(names) - set(all_names)
    if missing:
        raise KeyError(f"unknown parameter names {sorted(missing)}")
    return [n for n in all_names if n in set(names)]


def flatten_params(model: nn.Module, names: Sequence[str] | None = None) -> torch.Tensor:
    params = dict(model.named_parameters())
    return torch.cat([params[n].detach().reshape(-1) for n in param_names(model, names)])


def _unflatten(model: nn.Module, names: list[str], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for n in names:
        numel = params[n].numel()
        out[n] = flat[offset : offset + numel].reshape(params[n].shape)
        offset += numel
    # parameters outside the subset stay fixed (detached constants)
    for n, p in params.items():
        if n not in out:
            out[n] = p.detach()
    return out


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach() for n, b in model.named_buffers()}


def _weights(batches: Sequence[Batch], reduction: str) -> list[float]:
    sizes = [len(y) for _, y in batches]
    n_total = sum(sizes)
    if reduction == "mean":
        return [s / n_total for s in sizes]
    if reduction == "sum":
        return [1.0 for _ in sizes]
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def total_loss_fn(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[Batch],
    names: Sequence[str] | None = None,
    reduction: str = "mean",
) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
    """Return ``(L, theta0)``: the total loss as a function of the flat parameter vector."""
    names_ = param_names(model, names)
    theta0 = flatten_params(model, names_)
    buffers = _buffers(model)
    weights = _weights(batches, reduction)

    def loss(theta: torch.Tensor) -> torch.Tensor:
        params = _unflatten(model, names_, theta)
        total = theta.new_zeros(())
        for w, (x, y) in zip(weights, batches):
            out = functional_call(model, (params, buffers), (x,))
            total = total + w * loss_fn(out, y)
        return total

    return loss, theta0


# --------------------------------------------------------------------------------------------
# dense matrices
# --------------------------------------------------------------------------------------------
def dense_hessian(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[Batch],
    names: Sequence[str] | None = None,
    reduction: str = "mean",
    chunk_size: int = 256,
) -> torch.Tensor:
    """Dense Hessian of the total loss, assembled column block by column block.

    Each block is ``vmap`` over unit vectors of a reverse-over-reverse product ``vjp(grad L)``
    (the Hessian is symmetric, so rows and columns agree); peak memory is ``O(chunk_size * p)``
    besides the ``p x p`` result (10k parameters: 800 MB).  Reverse-over-reverse is used on purpose:
    it is independent of the library's forward-over-reverse engine, and ``jvp`` through
    ``mse_loss(reduction="mean")`` raises "ZeroTensors are immutable" in torch 2.13.
    """
    loss, theta0 = total_loss_fn(model, loss_fn, batches, names, reduction)
    p = theta0.numel()
    _, vjp_fn = torch.func.vjp(torch.func.grad(loss), theta0)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        return vjp_fn(v)[0]

    hess = torch.empty(p, p, dtype=theta0.dtype, device=theta0.device)
    eye = torch.eye(p, dtype=theta0.dtype, device=theta0.device)
    for start in range(0, p, chunk_size):
        cols = eye[start : start + chunk_size]
        hess[:, start : start + chunk_size] = vmap(hvp)(cols).T
    return 0.5 * (hess + hess.T)


def dense_ggn(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[Batch],
    names: Sequence[str] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Dense generalised Gauss-Newton matrix ``sum_k w_k J_k^T H_out,k J_k``.

    ``H_out`` is the full Hessian of ``loss_fn`` w.r.t. the network output of the batch (it is block
    diagonal over examples for the usual losses, but nothing here assumes so).
    """
    names_ = param_names(model, names)
    theta0 = flatten_params(model, names_)
    buffers = _buffers(model)
    weights = _weights(batches, reduction)
    ggn = theta0.new_zeros(theta0.numel(), theta0.numel())
    for w, (x, y) in zip(weights, batches):

        def f(theta: torch.Tensor, x: torch.Tensor = x) -> torch.Tensor:
            return functional_call(model, (_unflatten(model, names_, theta), buffers), (x,))

        out = f(theta0).detach()
        jac = jacrev(f)(theta0).reshape(out.numel(), -1)  # [B*C, p]
        h_out = torch.func.hessian(lambda o, y=y: loss_fn(o, y))(out).reshape(out.numel(), out.numel())
        ggn += w * jac.T @ h_out @ jac
    return 0.5 * (ggn + ggn.T)


def per_example_gradients(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[Batch],
    names: Sequence[str] | None = None,
) -> torch.Tensor:
    """``[N, p]`` matrix of gradients of ``loss_fn`` evaluated on each example alone."""
    names_ = param_names(model, names)
    theta0 = flatten_params(model, names_)
    buffers = _buffers(model)
    rows = []
    for x, y in batches:
        for i in range(len(y)):

            def li(theta: torch.Tensor, i: int = i, x: torch.Tensor = x, y: torch.Tensor = y):
                out = functional_call(model, (_unflatten(model, names_, theta), buffers), (x[i : i + 1],))
                return loss_fn(out, y[i : i + 1])

            rows.append(torch.func.grad(li)(theta0))
    return torch.stack(rows)


def dense_empirical_fisher(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Sequence[Batch],
    names: Sequence[str] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Dense empirical Fisher ``c * sum_n g_n g_n^T`` (``c = 1/N`` for mean, ``1`` for sum)."""
    grads = per_example_gradients(model, loss_fn, batches, names)
    c = 1.0 / grads.shape[0] if reduction == "mean" else 1.0
    return c * grads.T @ grads


# --------------------------------------------------------------------------------------------
# model factories and data
# --------------------------------------------------------------------------------------------
def make_mlp(
    sizes: Sequence[int] = (4, 6, 3), activation: str = "tanh", seed: int = 0, dtype=torch.float64
) -> nn.Module:
    """Fully connected network ``sizes[0] -> ... -> sizes[-1]`` with tanh/relu/elu activations."""
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
    if activation not in acts:
        raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(acts[activation]())
    return nn.Sequential(*layers).to(dtype)


def make_cnn_bn(in_channels: int = 1, n_classes: int = 3, seed: int = 0, dtype=torch.float64) -> nn.Module:
    """Tiny CNN with BatchNorm for 1x6x6 inputs; BN running stats are randomised so eval != train."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(in_channels, 3, kernel_size=3),  # 6x6 -> 4x4
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.Conv2d(3, 2, kernel_size=2, stride=2),  # 4x4 -> 2x2
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(8, n_classes),
    ).to(dtype)
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    return model


class UnusedParamNet(nn.Module):
    """A small MLP with a parameter (``unused``) that never enters the forward pass."""

    def __init__(self, d_in: int = 4, d_hidden: int = 5, d_out: int = 3, seed: int = 0, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)
        self.unused = nn.Parameter(torch.randn(2, 2))
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class DictInputNet(nn.Module):
    """Takes a dict ``{"a": [B, 3], "b": [B, 2]}`` of inputs."""

    def __init__(self, d_out: int = 3, seed: int = 0, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(seed)
        self.fa = nn.Linear(3, 4)
        self.fb = nn.Linear(2, 4)
        self.head = nn.Linear(4, d_out)
        self.to(dtype)

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(torch.tanh(self.fa(x["a"]) + self.fb(x["b"])))


def make_classification_data(
    n: int = 24, d: int = 4, n_classes: int = 3, seed: int = 0, dtype=torch.float64, image: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs (``[n, d]`` or ``[n, 1, 6, 6]`` if ``image``) and uniform integer labels."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, 1, 6, 6) if image else (n, d)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    y = torch.randint(0, n_classes, (n,), generator=g)
    return x, y


def split_batches(x: torch.Tensor, y: torch.Tensor, sizes: Iterable[int]) -> list[Batch]:
    """Split ``(x, y)`` into consecutive batches of the given (possibly uneven) sizes."""
    sizes = list(sizes)
    if sum(sizes) != len(y):
        raise ValueError(f"batch sizes {sizes} do not add up to {len(y)}")
    out, start = [], 0
    for s in sizes:
        out.append((x[start : start + s], y[start : start + s]))
        start += s
    return out


def matrix_with_spectrum(eigs: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Dense symmetric float64 matrix ``Q diag(eigs) Q^T`` with a seeded random orthogonal ``Q``."""
    g = torch.Generator().manual_seed(seed)
    p = eigs.numel()
    Q, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=torch.float64))
    A = (Q * eigs) @ Q.T
    return 0.5 * (A + A.T)


def scripted_clock(durations: Iterable[float]):
    """A clock (``time.perf_counter`` stand-in) whose successive timed intervals are ``durations``
    (read as start, stop, start, stop, ...): makes timing-based choices deterministic in tests."""
    ticks, now = [], 0.0
    for d in durations:
        ticks += [now, now + d]
        now += d + 1.0
    it = iter(ticks)
    return lambda: next(it)
