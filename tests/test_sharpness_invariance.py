"""Adaptive sharpness (c = |w|) is unchanged by function-preserving rescalings of a ReLU network;
non-adaptive measures change (Dinh et al. 2017; Kwon et al. 2021)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from landscape.objective import Objective
from landscape.sharpness import sharpness
from tests.references import make_classification_data, make_mlp, split_batches

F64 = torch.float64


def _relu_net_and_data():
    model = make_mlp((4, 6, 3), "relu", seed=1)
    x, y = make_classification_data(24, 4, 3, seed=1)
    return model, split_batches(x, y, [12, 12])


def _rescaled(model: nn.Module, alpha: torch.Tensor) -> nn.Module:
    """``W1 <- diag(alpha) W1, b1 <- alpha b1, W2 <- W2 diag(1/alpha)``: the same function
    (ReLU is positively homogeneous)."""
    new = copy.deepcopy(model)
    with torch.no_grad():
        new[0].weight.mul_(alpha[:, None])
        new[0].bias.mul_(alpha)
        new[2].weight.div_(alpha[None, :])
    return new


SCALINGS = {
    "layer": torch.full((6,), 3.0, dtype=F64),
    "filter": torch.tensor([0.3, 2.0, 5.0, 0.7, 1.5, 3.0], dtype=F64),
}

# (measure, options, [(what, invariant?)]): "value" or a key of ``extra``
CASES = [
    ("worst_case", {"rho": 0.1, "adaptive": True, "solver": "one_step"}, [("value", True)]),
    ("worst_case", {"rho": 0.1, "adaptive": True, "solver": "apgd", "iterations": 10}, [("value", True)]),
    (
        "worst_case",
        {"rho": 0.05, "adaptive": True, "p": "inf", "solver": "pgd", "iterations": 5},
        [("value", True)],
    ),
    ("worst_case", {"rho": 0.1, "scale": "fisher", "eta": 0.0, "solver": "one_step"}, [("value", True)]),
    ("average_case", {"rho": 0.05, "adaptive": True, "samples": 8}, [("value", True)]),
    ("gradient_norm", {"rho": 0.1, "adaptive": True}, [("sam_penalty", True), ("value", False)]),
    (
        "pacbayes_flatness",
        {"epsilon": 0.0, "criterion": "loss", "steps": 6, "samples": 4},
        [("inv_sigma_magnitude_sq", True), ("value", False)],
    ),
    ("tracer", {"delta": 0.0, "batch_size": 6}, [("value", True)]),
    ("worst_case", {"rho": 0.1, "solver": "one_step"}, [("value", False)]),
    ("worst_case", {"rho": 0.1, "solver": "apgd", "iterations": 10}, [("value", False)]),
    ("average_case", {"rho": 0.05, "samples": 8}, [("value", False)]),
    ("lambda_max", {"tol": 1e-6, "smallest": False}, [("value", False)]),
    ("keskar", {"epsilon": 1e-2, "iterations": 3}, [("value", False)]),
]


def _get(r, key):
    return r.value if key == "value" else r.extra[key]


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_adaptive_measures_invariant_non_adaptive_change(kind):
    model, batches = _relu_net_and_data()
    other = _rescaled(model, SCALINGS[kind])
    obj_a = Objective(model, nn.CrossEntropyLoss(), batches)
    obj_b = Objective(other, nn.CrossEntropyLoss(), batches)
    assert float(obj_a.loss()) == pytest.approx(float(obj_b.loss()), rel=1e-12)  # same function
    for name, opts, checks in CASES:
        ra, rb = sharpness(obj_a, name, **opts), sharpness(obj_b, name, **opts)
        for key, invariant in checks:
            a, b = _get(ra, key), _get(rb, key)
            assert a != 0
            if invariant:
                assert b == pytest.approx(a, rel=1e-4), (name, opts, key)
            else:
                assert abs(b - a) > 1e-2 * abs(a), (name, opts, key, a, b)
