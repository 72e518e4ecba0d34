"""Deep ensembles (Lakshminarayanan et al. 2017) and F-Deep-Ensembles (Nguyen et al. 2023).

A deep ensemble is ``M`` copies of a network, each initialised independently at random and trained
independently (each with its own shuffling of the data), whose predictive distributions are
averaged (Lakshminarayanan, Pritzel & Blundell 2017, "Simple and scalable predictive uncertainty
estimation using deep ensembles", Sec. 2.4 and Alg. 1; adversarial training, their optional
step 3, is not used here, as in the flat-seeking paper's experiments):

    p(y | x) = 1/M sum_m softmax(f(x; theta_m)).

F-Deep-Ensembles train every member with the SAM gradient (Nguyen et al. 2023, "Flat seeking
Bayesian neural networks", Tables 1-2): pass ``optimizer_factory=sam_factory(...)`` to
:func:`train_ensemble`.  All members go through one loop, :func:`landscape.models.train`, one
member after the other.

Reproducibility: member ``k`` is built by ``model_fn()`` with torch's global RNG forked and seeded
with ``seed + k`` (restored afterwards), and trained with batches shuffled by a generator seeded
with ``train_seed + k``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from landscape.checks import check_positive, check_seed
from landscape.models.training import train
from optimizers.bayes.mc_dropout import seeded_global_rng
from optimizers.posterior import probabilities
from optimizers.sam.sam import SAM

__all__ = ["DeepEnsemble", "sam_factory", "train_ensemble"]

_MAX_SEED = 2**64 - 1


class DeepEnsemble(nn.Module):
    """``M`` independently initialised members of one architecture (Lakshminarayanan et al. 2017).

    Args:
        model_fn: ``() -> nn.Module``, called once per member.
        num_members: ``M``; default 5 (Lakshminarayanan et al. 2017, Sec. 3; the flat-seeking
            paper's code trains 3 to 5).
        seed: member ``k`` is built with torch's global RNG seeded with ``seed + k`` (forked, so
            the caller's RNG is untouched); ``member_seeds`` records them.

    ``forward(x)`` returns the members' outputs stacked, ``[M, ...]``; :meth:`predict` (alias
    :meth:`bayesian_model_average`) the mean of their predictive probabilities.  ``config``
    records the configuration.
    """

    def __init__(self, model_fn: Callable[[], nn.Module], num_members: int = 5, seed: int = 0) -> None:
        super().__init__()
        if not callable(model_fn):
            raise TypeError(f"model_fn must be a callable returning an nn.Module, got {model_fn!r}")
        check_positive("num_members", num_members, integer=True)
        check_seed(seed, allow_generator=False)
        if seed is None:
            raise ValueError("seed must be an integer (member k is initialised with seed + k), got None")
        members = []
        self.member_seeds = [(int(seed) + k) % (_MAX_SEED + 1) for k in range(int(num_members))]
        for s in self.member_seeds:
            with seeded_global_rng(s):
                member = model_fn()
            if not isinstance(member, nn.Module):
                raise TypeError(f"model_fn must return an nn.Module, got {type(member).__name__}")
            members.append(member)
        if len({id(m) for m in members}) != len(members):
            raise ValueError("model_fn returned the same module twice; it must build a new network per call")
        self.members = nn.ModuleList(members)
        self.config = {"num_members": int(num_members), "seed": int(seed), "member_seeds": self.member_seeds}

    def __len__(self) -> int:
        return len(self.members)

    def forward(self, inputs: Any) -> torch.Tensor:
        return torch.stack([member(inputs) for member in self.members])

    def member_probabilities(self, inputs: Any) -> torch.Tensor:
        """``[M, ...]`` predictive probabilities of each member (eval mode, no grad; modes restored)."""
        flags = {m: m.training for m in self.modules()}
        try:
            self.eval()
            with torch.no_grad():
                outs = []
                for member in self.members:
                    out = member(inputs)
                    if not isinstance(out, torch.Tensor):
                        raise TypeError(f"a member returned {type(out).__name__}, expected a logits tensor")
                    outs.append(probabilities(out))
                return torch.stack(outs)
        finally:
            for m, flag in flags.items():
                m.training = flag

    def predict(self, inputs: Any) -> torch.Tensor:
        """Ensemble predictive ``1/M sum_m probs(f(x; theta_m))`` (Lakshminarayanan et al. 2017, Sec. 2.4)."""
        return self.member_probabilities(inputs).mean(dim=0)

    def bayesian_model_average(self, inputs: Any) -> torch.Tensor:
        """Same as :meth:`predict` (the ``M`` members are the ensemble's samples)."""
        return self.predict(inputs)


def sam_factory(
    base_optimizer: Any = torch.optim.SGD,
    rho: float = 0.05,  # the flat-seeking paper's CIFAR-10 setting (0.1 for CIFAR-100)
    *,
    m: int = 1,
    **base_kwargs: Any,
) -> Callable[..., SAM]:
    """``(params, model=None) -> SAM(params, base_optimizer, rho, model=model, m=m, **base_kwargs)``.

    The optimizer factory of F-Deep-Ensembles (and of F-MC-Dropout with :func:`train_ensemble` or
    :func:`landscape.models.train`); :func:`train_ensemble` passes each member as ``model`` so that
    SAM keeps BatchNorm statistics out of the perturbed pass.
    """
    SAM([torch.zeros(1, requires_grad=True)], base_optimizer, rho, m=m, **base_kwargs)  # validate now

    def factory(params: Iterable[torch.Tensor], model: nn.Module | None = None) -> SAM:
        return SAM(params, base_optimizer, rho, model=model, m=m, **base_kwargs)

    return factory


def _accepts_model(factory: Callable[..., Any]) -> bool:
    try:
        return "model" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def train_ensemble(
    ensemble: DeepEnsemble,
    data: Any,
    optimizer_factory: Callable[..., torch.optim.Optimizer] | Sequence[torch.optim.Optimizer],
    epochs: int = 1,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    callback: Callable[[int, int, nn.Module, float], Any] | None = None,
) -> dict[str, Any]:
    """Train every member of ``ensemble`` in one loop (:func:`landscape.models.train` per member).

    Args:
        optimizer_factory: ``params -> Optimizer`` (``torch.optim.SGD`` etc. for Deep-Ensembles,
            :func:`sam_factory` for F-Deep-Ensembles; a factory with a ``model`` keyword receives
            the member), or a sequence of ``M`` optimizers (one per member, to continue training).
        data, epochs, loss_fn, batch_size, device: as in :func:`landscape.models.train`.
        seed: member ``k`` shuffles its batches with a generator seeded with ``seed + k``
            (independent shuffling, Lakshminarayanan et al. 2017, Sec. 2.4).
        callback: ``callback(member, step, model, loss)`` after every step.
        progress: a tqdm bar over the members.

    Returns:
        ``{"loss": [per-step losses of member k], "epoch_loss": [...], "optimizers": [...],
        "seeds": [...], "config": {...}}``.
    """
    if not isinstance(ensemble, DeepEnsemble):
        raise TypeError(f"ensemble must be a DeepEnsemble, got {type(ensemble).__name__}")
    check_seed(seed, allow_generator=False)
    if seed is None:
        raise ValueError("seed must be an integer (member k shuffles with seed + k), got None")
    members = list(ensemble.members)
    if isinstance(optimizer_factory, torch.optim.Optimizer):
        raise TypeError(
            "optimizer_factory must be a factory params -> Optimizer (each member needs its own "
            "optimizer) or a sequence of one optimizer per member, not a single optimizer"
        )
    if isinstance(optimizer_factory, Sequence):
        opts = list(optimizer_factory)
        if len(opts) != len(members) or not all(isinstance(o, torch.optim.Optimizer) for o in opts):
            raise ValueError(
                f"optimizer_factory as a sequence must hold one torch.optim.Optimizer per member "
                f"({len(members)}), got {len(opts)} items"
            )
    elif callable(optimizer_factory):
        with_model = _accepts_model(optimizer_factory)
        opts = [
            optimizer_factory(mb.parameters(), model=mb) if with_model else optimizer_factory(mb.parameters())
            for mb in members
        ]
        for o in opts:
            if not isinstance(o, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizer_factory must return a torch.optim.Optimizer, got {type(o).__name__}"
                )
    else:
        raise TypeError("optimizer_factory must be a callable params -> Optimizer or a list of optimizers")
    seeds = [(int(seed) + k) % (_MAX_SEED + 1) for k in range(len(members))]
    out: dict[str, Any] = {"loss": [], "epoch_loss": [], "optimizers": opts, "seeds": seeds}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(members), desc="ensemble", unit="member")
    try:
        for k, (member, opt) in enumerate(zip(members, opts)):
            cb = None if callback is None else (lambda step, mod, loss, k=k: callback(k, step, mod, loss))
            hist = train(
                member,
                data,
                opt,
                epochs,
                loss_fn=loss_fn,
                batch_size=batch_size,
                callback=cb,
                seed=seeds[k],
                device=device,
            )
            out["loss"].append(hist["loss"])
            out["epoch_loss"].append(hist["epoch_loss"])
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    out["config"] = {
        "epochs": epochs,
        "batch_size": batch_size,
        "seed": int(seed),
        "optimizer": type(opts[0]).__name__ if opts else None,
        "ensemble": dict(ensemble.config),
    }
    return out
