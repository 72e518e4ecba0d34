"""State dicts of this package's optimizers: tagged when saved, checked when loaded.

``state_dict()`` adds the optimizer's class name and its parameter layout (the shape of every
parameter, group by group); ``load_state_dict()`` compares both with the optimizer it is loaded
into, before anything is changed, and raises one ``ValueError`` that names the mismatch.  Without
the check a state dict from another optimizer class, or for another model, loads "successfully"
and fails later inside a step with a ``KeyError`` or a shape error far from the cause.  State dicts
saved before the tags existed (no tag) are accepted as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = [
    "CLASS_KEY",
    "LAYOUT_KEY",
    "WrapperState",
    "check_state_dict",
    "check_tensor_shapes",
    "layout",
    "tag_state_dict",
]

CLASS_KEY = "optimizer_class"
LAYOUT_KEY = "param_layout"


def layout(param_groups: Iterable[Mapping[str, Any]]) -> list[list[list[int]]]:
    """``[[shape of each parameter] for each group]`` as lists of ints."""
    return [[list(p.shape) for p in g["params"]] for g in param_groups]


def tag_state_dict(sd: dict[str, Any], optimizer: Any, param_groups: Iterable[Mapping[str, Any]]) -> dict:
    """Add the class name and the parameter layout to ``sd`` (in place; returned for chaining)."""
    sd[CLASS_KEY] = type(optimizer).__name__
    sd[LAYOUT_KEY] = layout(param_groups)
    return sd


def _compare_layouts(saved: list, own: list, who: str) -> None:
    if len(saved) != len(own):
        raise ValueError(
            f"{who}.load_state_dict: the state dict has {len(saved)} parameter group(s), this optimizer "
            f"has {len(own)}; it was saved for another parameter layout (another model or grouping)"
        )
    for i, (sg, og) in enumerate(zip(saved, own)):
        if len(sg) != len(og):
            raise ValueError(
                f"{who}.load_state_dict: parameter group {i} holds {len(sg)} parameter(s) in the state "
                f"dict but {len(og)} in this optimizer; it was saved for another model"
            )
        for j, (ss, os_) in enumerate(zip(sg, og)):
            if list(ss) != list(os_):
                raise ValueError(
                    f"{who}.load_state_dict: parameter {j} of group {i} has shape {tuple(ss)} in the state "
                    f"dict but {tuple(os_)} in this optimizer; it was saved for another model"
                )


def check_state_dict(
    state_dict: Any,
    optimizer: Any,
    param_groups: Iterable[Mapping[str, Any]],
    required: Iterable[str] = (),
) -> dict[str, Any]:
    """Validate ``state_dict`` for ``optimizer`` and return a shallow copy without the tags.

    Raises ``TypeError`` for a non-mapping and ``ValueError`` naming the first mismatch: another
    optimizer class, missing entries (``required``), another number of groups / parameters or
    another parameter shape.
    """
    who = type(optimizer).__name__
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{who}.load_state_dict expects a dict from {who}.state_dict(), got {type(state_dict).__name__}"
        )
    sd = dict(state_dict)
    saved_cls = sd.pop(CLASS_KEY, None)
    saved_layout = sd.pop(LAYOUT_KEY, None)
    if saved_cls is not None and saved_cls != who:
        raise ValueError(
            f"{who}.load_state_dict: the state dict was saved by {saved_cls}, not by {who}; load it "
            f"into a {saved_cls} optimizer (hyperparameters and per-parameter state differ between classes)"
        )
    missing = [k for k in required if k not in sd]
    if missing:
        raise ValueError(
            f"{who}.load_state_dict: the state dict lacks {missing}; pass a dict produced by "
            f"{who}.state_dict() (got keys {sorted(map(str, sd))})"
        )
    if saved_layout is not None:
        _compare_layouts(saved_layout, layout(param_groups), who)
    return sd


def check_tensor_shapes(name: str, saved: list[Any], own: list[torch.Tensor], who: str) -> None:
    """Saved per-parameter tensors (e.g. MFVI's ``raw_std``) must match the parameters one by one."""
    if not isinstance(saved, (list, tuple)) or len(saved) != len(own):
        n = len(saved) if isinstance(saved, (list, tuple)) else type(saved).__name__
        raise ValueError(
            f"{who}.load_state_dict: {name!r} holds {n} tensors, this optimizer manages {len(own)} "
            "parameters; it was saved for another model"
        )
    for j, (s, o) in enumerate(zip(saved, own)):
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != tuple(o.shape):
            got = tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
            raise ValueError(
                f"{who}.load_state_dict: {name}[{j}] has shape {got}, the parameter has "
                f"{tuple(o.shape)}; it was saved for another model"
            )


class GeneratorStateMixin:
    """``state_dict``/``load_state_dict`` for optimizers that own a ``torch.Generator``.

    The generator's state travels with the state dict, the dict is tagged and checked like every
    optimizer's of the suite, and each param group must hold the keys in ``_group_keys``.
    Put it before ``torch.optim.Optimizer`` in the bases.
    """

    _group_keys: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["generator"] = self.generator.get_state()
        return tag_state_dict(sd, self, self.param_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = check_state_dict(state_dict, self, self.param_groups, required=("state", "param_groups"))
        name = type(self).__name__
        for i, group in enumerate(sd["param_groups"]):
            missing = [k for k in self._group_keys if k not in group]
            if missing:
                raise ValueError(
                    f"{name}.load_state_dict: param group {i} lacks {missing}; the state dict was "
                    f"not produced by {name}.state_dict()"
                )
        gen = sd.pop("generator", None)
        super().load_state_dict(sd)
        if gen is not None:
            self.generator.set_state(gen)


class WrapperState:
    """``state_dict`` / ``load_state_dict`` of an optimizer that shares its param groups with a
    ``self.base_optimizer`` (:class:`optimizers.perturbation.PerturbationOptimizer`): the base
    optimizer's state under ``"base_optimizer"`` (and its class), subclass extras (``_extra_state``)
    under ``"extra"``, the method's own hyperparameters (``self._own_defaults``) kept in the groups."""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["base_optimizer"] = self.base_optimizer.state_dict()
        sd["base_optimizer_class"] = type(self.base_optimizer).__name__
        sd["extra"] = self._extra_state()
        return tag_state_dict(sd, self, self.param_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and "base_optimizer" not in state_dict:
            raise ValueError(
                "state_dict has no 'base_optimizer' entry; pass a dict produced by this optimizer's "
                "state_dict()"
            )
        sd = check_state_dict(state_dict, self, self.param_groups, required=("state", "param_groups"))
        base_cls = sd.pop("base_optimizer_class", None)
        if base_cls is not None and base_cls != type(self.base_optimizer).__name__:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state dict's base optimizer is {base_cls}, "
                f"this one's is {type(self.base_optimizer).__name__}; build the optimizer with the same "
                "base_optimizer class"
            )
        for i, group in enumerate(sd["param_groups"]):
            self._check_group(group, i)  # the method's per-group rules
        base_sd = sd.pop("base_optimizer")
        extra = sd.pop("extra", {})
        super().load_state_dict(sd)
        self.base_optimizer.load_state_dict(base_sd)
        # re-share the (new) group dicts and keep the method's own hyperparameters
        for own_group, base_group in zip(self.param_groups, self.base_optimizer.param_groups):
            for k in self._own_defaults:
                if k in own_group:
                    base_group[k] = own_group[k]
        self.param_groups = self.base_optimizer.param_groups
        self._load_extra_state(extra)
