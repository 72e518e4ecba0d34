"""Per-example gradient moments against BackPACK (Dangel et al. 2020; ``BatchGrad``, ``BatchL2Grad``,
``SumGradSquared``) in float64 on the test problems of BackPACK's first-order extension tests
(``test/extensions/firstorder/firstorder_settings.py`` and ``make_simple_cnn_setting`` of
``test/extensions/automated_settings.py`` in github.com/f-dangel/backpack; the layer configurations
transcribed, the ones with a per-example rule here: Linear with 0-3 extra dimensions, Conv1d / Conv2d
with stride, padding, dilation, no bias, eval-mode BatchNorm)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimizers.per_example import PerExampleGradients

backpack = pytest.importorskip("backpack")
from backpack import backpack as bp_context  # noqa: E402
from backpack import extend  # noqa: E402
from backpack.extensions import BatchGrad, BatchL2Grad, SumGradSquared  # noqa: E402


def _eval_bn(bn: nn.Module) -> nn.Module:
    """BackPACK's ``initialize_training_false_recursive``: random running statistics and affine
    parameters, eval mode."""
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn.eval()


def _cnn(shape, conv, params):
    """``make_simple_cnn_setting``: conv, ReLU, Flatten, a frozen Linear to 5 classes."""

    def make():
        layer = conv(*params)
        out = layer(torch.rand(shape)).numel() // shape[0]
        head = nn.Linear(out, 5)
        head.requires_grad_(False)
        return nn.Sequential(layer, nn.ReLU(), nn.Flatten(), head)

    return dict(shape=shape, make=make, loss="ce", targets=(shape[0],), classes=5, reduction="mean")


SETTINGS = {
    "example": dict(
        shape=(3, 10),
        make=lambda: nn.Sequential(nn.Linear(10, 5)),
        loss="ce",
        targets=(3,),
        classes=5,
        reduction="sum",
    ),
    "linear2-ce": dict(
        shape=(3, 10),
        make=lambda: nn.Sequential(nn.Linear(10, 7), nn.Linear(7, 5)),
        loss="ce",
        targets=(3,),
        classes=5,
        reduction="mean",
    ),
    "linear-relu-ce": dict(
        shape=(3, 10),
        make=lambda: nn.Sequential(nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 5)),
        loss="ce",
        targets=(3,),
        classes=5,
        reduction="sum",
    ),
    "linear-sigmoid-mse": dict(
        shape=(3, 10),
        make=lambda: nn.Sequential(nn.Linear(10, 7), nn.Sigmoid(), nn.Linear(7, 5)),
        loss="mse",
        targets=(3, 5),
        reduction="mean",
    ),
    "one-additional-mse": dict(
        shape=(3, 4, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2)),
        loss="mse",
        targets=(3, 4, 2),
        reduction="mean",
    ),
    "two-additional-mse": dict(
        shape=(3, 4, 2, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.Sigmoid(), nn.Linear(3, 2)),
        loss="mse",
        targets=(3, 4, 2, 2),
        reduction="mean",
    ),
    "three-additional-mse": dict(
        shape=(3, 4, 2, 3, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2)),
        loss="mse",
        targets=(3, 4, 2, 3, 2),
        reduction="sum",
    ),
    "one-additional-ce": dict(
        shape=(3, 4, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2), nn.Flatten()),
        loss="ce",
        targets=(3,),
        classes=8,
        reduction="mean",
    ),
    "two-additional-ce": dict(
        shape=(3, 4, 2, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.Sigmoid(), nn.Linear(3, 2), nn.Flatten()),
        loss="ce",
        targets=(3,),
        classes=16,
        reduction="mean",
    ),
    "three-additional-ce": dict(
        shape=(3, 4, 2, 3, 5),
        make=lambda: nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2), nn.Flatten()),
        loss="ce",
        targets=(3,),
        classes=48,
        reduction="sum",
    ),
    "conv1d": _cnn((3, 3, 7), nn.Conv1d, (3, 2, 2)),
    "conv1d-dilation-stride": _cnn((3, 2, 7), nn.Conv1d, (2, 3, 2, 2, 0, 2)),
    "conv1d-stride-padding": _cnn((3, 3, 7), nn.Conv1d, (3, 2, 2, 2, 1)),
    "conv1d-stride-padding-dilation": _cnn((3, 3, 8), nn.Conv1d, (3, 6, 2, 4, 2, 3)),
    "conv1d-no-bias": _cnn((3, 3, 7), nn.Conv1d, (3, 2, 2, 4, 2, 1, 1, False)),
    "conv2d": _cnn((3, 3, 7, 7), nn.Conv2d, (3, 2, 2)),
    "conv2d-dilation-stride": _cnn((3, 2, 7, 7), nn.Conv2d, (2, 3, 2, 2, 0, 2)),
    "conv2d-stride-padding": _cnn((3, 3, 7, 7), nn.Conv2d, (3, 2, 2, 2, 1)),
    "conv2d-stride-padding-dilation": _cnn((3, 3, 8, 8), nn.Conv2d, (3, 6, 2, 4, 2, 3)),
    "conv2d-no-bias": _cnn((3, 3, 7, 7), nn.Conv2d, (3, 2, 2, 4, 2, 1, 1, False)),
    "batchnorm1d-eval": dict(
        shape=(2, 3, 4),
        make=lambda: _eval_bn(nn.BatchNorm1d(3)),
        loss="ce",
        targets=(2, 4),
        classes=3,
        reduction="mean",
    ),
    "batchnorm2d-eval": dict(
        shape=(3, 2, 4, 3),
        make=lambda: _eval_bn(nn.BatchNorm2d(2)),
        loss="ce",
        targets=(3, 4, 3),
        classes=2,
        reduction="mean",
    ),
}


def _setting(name):
    s = SETTINGS[name]
    torch.manual_seed(0)
    model = s["make"]().double()
    x = torch.rand(s["shape"], dtype=torch.float64)
    if s["loss"] == "ce":
        y = torch.randint(0, s["classes"], s["targets"])
        loss_cls = nn.CrossEntropyLoss
    else:
        y = torch.rand(s["targets"], dtype=torch.float64)
        loss_cls = nn.MSELoss
    return model, x, y, loss_cls, s["reduction"]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_moments_equal_backpack_first_order_extensions(name):
    model, x, y, loss_cls, reduction = _setting(name)
    params = [p for p in model.parameters() if p.requires_grad]

    # here: per-example losses whose sum is the reduced loss (a mean divides by its element count)
    def losses():
        out = loss_cls(reduction="none")(model(x), y)
        per = out.reshape(out.shape[0], -1).sum(1)
        return per / out.numel() if reduction == "mean" else per

    engine = PerExampleGradients(params, model)
    with engine.capture():
        ls = losses()
    got = engine.moments(ls)
    # BackPACK: one extended backward of the reduced loss
    bmodel, bloss = extend(model), extend(loss_cls(reduction=reduction))
    with bp_context(BatchGrad(), BatchL2Grad(), SumGradSquared()):
        bloss(bmodel(x), y).backward()
    ref_batch = [p.grad_batch.detach().clone() for p in params]
    ref_sq = [p.sum_grad_squared.detach().clone() for p in params]
    ref_l2 = sum(p.batch_l2.detach() for p in params)

    assert got.method == "layers", engine.reason
    for s, sq, gb, rsq in zip(got.sum, got.sum_sq, ref_batch, ref_sq):
        torch.testing.assert_close(s, gb.sum(0), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(sq, rsq, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.norms.square(), ref_l2, rtol=1e-10, atol=1e-12)
