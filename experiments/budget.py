"""The ``budget`` of a config (a number in (0, 1]): a shortened run for a quick check of a protocol.

:func:`apply_budget` scales the epoch-based values of a resolved config (epochs; SWAG's start;
the factor ``epoch_scale`` for milestones, warm-up, ``swa_start`` and "N epochs"
hyperparameters), :func:`data_limit` the number of examples where the data are loaded.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["apply_budget", "data_limit"]


def apply_budget(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` shortened by ``cfg["budget"]`` (see module docstring); ``budget = 1`` is a no-op.

    Only the epoch-based values change here; data sizes are scaled where the data are loaded
    (:func:`data_limit`).
    """
    out = copy.deepcopy(dict(cfg))
    b = float(out["budget"])
    if b >= 1.0:
        return out
    t = out["train"]
    full_epochs = t["epochs"]
    t["epochs"] = max(1, math.ceil(full_epochs * b))
    ratio = t["epochs"] / full_epochs
    # epoch-valued settings (milestones >= 1, warm-up, swa_start, "N epochs" hyperparameters) are
    # multiplied by this factor where they are used
    t["epoch_scale"] = ratio
    for m in out["methods"]:
        if m["swag"]:
            m["swag"]["start_epoch"] = min(t["epochs"] - 1, math.floor(m["swag"]["start_epoch"] * ratio))
    return out


def data_limit(n: int, limit: int, budget: float, minimum: int = 1) -> int:
    """How many of ``n`` examples a run uses: ``limit`` (0 = all), then scaled by ``budget``."""
    k = n if limit <= 0 else min(n, limit)
    if budget < 1.0:
        k = min(k, max(minimum, math.ceil(k * budget)))
    return k
