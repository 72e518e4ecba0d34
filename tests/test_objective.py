"""Objective: loss/gradient vs dense references, batching invariance, selections, safety, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from landscape.objective import Objective
from tests import references as ref


def _state(model: nn.Module):
    return (
        [p.detach().clone() for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [b.detach().clone() for b in model.buffers()],
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
    )


def _assert_same_state(model: nn.Module, state) -> None:
    params, grads, buffers, flags, rgs = state
    for p, q in zip(model.parameters(), params):
        assert p.dtype == q.dtype and torch.equal(p.detach(), q)
    for p, g in zip(model.parameters(), grads):
        assert (p.grad is None) == (g is None)
        if g is not None:
            assert torch.equal(p.grad, g)
    for b, q in zip(model.buffers(), buffers):
        assert torch.equal(b, q)
    assert [m.training for m in model.modules()] == flags
    assert [p.requires_grad for p in model.parameters()] == rgs


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


CASES = {
    "mlp_ce_mean": lambda: (
        ref.make_mlp((4, 6, 3)),
        nn.CrossEntropyLoss(),
        *ref.make_classification_data(23),
    ),
    "mlp_ce_sum": lambda: (
        ref.make_mlp((4, 6, 3), "relu"),
        nn.CrossEntropyLoss(reduction="sum"),
        *ref.make_classification_data(23),
    ),
    "cnn_bn": lambda: (
        ref.make_cnn_bn(),
        nn.CrossEntropyLoss(),
        *ref.make_classification_data(17, image=True),
    ),
    "mse": lambda: (
        ref.make_mlp((4, 5, 2)),
        nn.MSELoss(),
        ref.make_classification_data(19)[0],
        torch.randn(19, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("sizes", [None, (5, 7, 11)])
def test_loss_and_gradient_match_reference(case, sizes):
    model, loss_fn, x, y = CASES[case]()
    n = len(y)
    split = (n,) if sizes is None else (*sizes[:-1], n - sum(sizes[:-1]))
    batches = ref.split_batches(x, y, split)
    red = loss_fn.reduction
    model.train()  # the objective evaluates in eval mode and restores this
    state = _state(model)
    obj = Objective(model, loss_fn, batches)
    model.eval()
    f, theta = ref.total_loss_fn(model, loss_fn, batches, reduction=red)
    want_loss = f(theta)
    want_grad = torch.func.grad(f)(theta)
    model.train()
    loss, grad = obj.loss_and_gradient()
    assert abs(float(obj.loss()) - float(want_loss)) <= 1e-12 * abs(float(want_loss))
    assert abs(float(loss) - float(want_loss)) <= 1e-12 * abs(float(want_loss))
    assert _rel(grad, want_grad) <= 1e-12
    assert _rel(obj.gradient(), want_grad) <= 1e-12
    _assert_same_state(model, state)


def test_batching_invariance():
    model = ref.make_mlp((4, 8, 3))
    x, y = ref.make_classification_data(40)
    one = Objective(model, nn.CrossEntropyLoss(), (x, y))
    many = Objective(model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [1, 13, 2, 24]))
    assert one.num_examples == many.num_examples == 40
    assert abs(float(one.loss() - many.loss())) <= 1e-12 * float(one.loss())
    assert _rel(many.gradient(), one.gradient()) <= 1e-12
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=7)
    dl = Objective(model, nn.CrossEntropyLoss(), loader)
    assert dl.batch_sizes == [7] * 5 + [5]
    assert _rel(dl.gradient(), one.gradient()) <= 1e-12


def test_sum_reduction_weights():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(10)
    obj = Objective(model, nn.CrossEntropyLoss(reduction="sum"), ref.split_batches(x, y, [3, 7]))
    assert obj.reduction == "sum"
    assert [w for _, _, w in obj.batches()] == [1.0, 1.0]
    want = nn.CrossEntropyLoss(reduction="sum")(model(x), y).detach()
    assert abs(float(obj.loss() - want)) <= 1e-12 * float(want)
    mean = Objective(model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [3, 7]))
    assert [w for _, _, w in mean.batches()] == [0.3, 0.7]


def test_functional_loss_defaults_to_mean_and_explicit_reduction():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(10)
    obj = Objective(model, nn.functional.cross_entropy, ref.split_batches(x, y, [4, 6]))
    assert obj.reduction == "mean"
    assert abs(float(obj.loss() - nn.functional.cross_entropy(model(x), y).detach())) <= 1e-13
    with pytest.raises(ValueError, match="reduction"):
        Objective(model, nn.CrossEntropyLoss(reduction="none"), (x, y))


@pytest.mark.parametrize(
    "spec, names",
    [
        (["0.weight"], ["0.weight"]),
        ("2", ["2.weight", "2.bias"]),
        (lambda n: n.endswith("bias"), ["0.bias", "2.bias"]),
        ("module", ["2.weight", "2.bias"]),
    ],
)
def test_parameter_subsets(spec, names):
    model = ref.make_mlp((4, 6, 3))
    if spec == "module":
        spec = model[2]
    x, y = ref.make_classification_data(12)
    obj = Objective(model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [5, 7]), params=spec)
    assert obj.param_names == names
    f, theta = ref.total_loss_fn(model, nn.CrossEntropyLoss(), [(x, y)], names=names)
    assert obj.num_params == theta.numel()
    assert _rel(obj.gradient(), torch.func.grad(f)(theta)) <= 1e-12
    assert torch.equal(obj.flat_params(), theta)
    # evaluating at another point of the subset
    theta2 = theta + 0.1
    assert abs(float(obj.loss(theta2) - f(theta2))) <= 1e-12
    sub = obj.subset(["0.bias"])
    assert sub.param_names == ["0.bias"] and sub.num_params == 6


def test_selection_matching_nothing_lists_names():
    model = ref.make_mlp((4, 6, 3))
    data = ref.make_classification_data(6)
    with pytest.raises(ValueError, match=r"available names: \['0.weight'"):
        Objective(model, nn.CrossEntropyLoss(), data, params=["conv.weight"])
    with pytest.raises(ValueError, match="matches nothing.*available names"):
        Objective(model, nn.CrossEntropyLoss(), data, params=lambda n: False)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="matches nothing"):
        Objective(model, nn.CrossEntropyLoss(), data)


def test_unused_parameter_gets_zero_gradient_and_dict_inputs():
    model = ref.UnusedParamNet()
    x, y = ref.make_classification_data(9)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y))
    g = obj.unflatten(obj.gradient())
    assert torch.equal(g["unused"], torch.zeros(2, 2, dtype=torch.float64))
    net = ref.DictInputNet()
    gen = torch.Generator().manual_seed(1)
    inputs = {
        "a": torch.randn(8, 3, generator=gen, dtype=torch.float64),
        "b": torch.randn(8, 2, generator=gen, dtype=torch.float64),
    }
    yy = torch.randint(0, 3, (8,), generator=gen)
    dobj = Objective(
        net,
        nn.CrossEntropyLoss(),
        [({k: v[:3] for k, v in inputs.items()}, yy[:3]), ({k: v[3:] for k, v in inputs.items()}, yy[3:])],
    )
    want = nn.functional.cross_entropy(net(inputs), yy).detach()
    assert abs(float(dobj.loss() - want)) <= 1e-13


def test_tuple_inputs_are_positional():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2).double()

        def forward(self, u, v):
            return self.a(u) * v

    m = Two()
    u, v, y = torch.randn(5, 3).double(), torch.randn(5, 2).double(), torch.randn(5, 2).double()
    obj = Objective(m, nn.MSELoss(), ((u, v), y))
    assert abs(float(obj.loss() - nn.functional.mse_loss(m(u, v), y))) <= 1e-14


def test_dtype_conversion_float32_model():
    model = ref.make_mlp((4, 6, 3), dtype=torch.float32)
    x, y = ref.make_classification_data(10, dtype=torch.float32)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y), dtype=torch.float64)
    assert obj.flat_params().dtype == torch.float64
    m64 = ref.make_mlp((4, 6, 3), dtype=torch.float32).double()
    want = nn.functional.cross_entropy(m64(x.double()), y)
    assert obj.loss().dtype == torch.float64
    assert abs(float(obj.loss() - want)) <= 1e-14
    assert next(model.parameters()).dtype == torch.float32  # caller's model untouched


def test_train_mode_uses_batch_stats_and_leaves_buffers():
    model = ref.make_cnn_bn()
    x, y = ref.make_classification_data(12, image=True)
    model.eval()
    state = _state(model)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y), mode="train")
    got = float(obj.loss())
    model.train()
    want = float(nn.functional.cross_entropy(model(x), y))
    model.load_state_dict({k: v for k, v in zip(dict(model.named_buffers()), state[2])}, strict=False)
    model.eval()
    assert abs(got - want) <= 1e-13
    _assert_same_state(model, state)
    assert abs(float(Objective(model, nn.CrossEntropyLoss(), (x, y)).loss()) - got) > 1e-6


def test_evaluate_accuracy():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(30)
    res = Objective(model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [10, 20])).evaluate()
    assert res["accuracy"] == pytest.approx(float((model(x).argmax(1) == y).double().mean()), abs=1e-15)
    m1 = ref.make_mlp((4, 5, 1))
    yb = (y == 0).double().reshape(-1, 1)
    r1 = Objective(m1, nn.BCEWithLogitsLoss(), (x, yb)).evaluate()
    assert r1["accuracy"] == pytest.approx(float(((m1(x) > 0).double() == yb).double().mean()), abs=1e-15)
    r2 = Objective(ref.make_mlp((4, 5, 2)), nn.MSELoss(), (x, torch.randn(30, 2).double())).evaluate()
    assert r2["accuracy"] is None


def test_forward_flatten_unflatten_and_config():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(5)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y))
    theta = obj.flat_params()
    assert torch.equal(obj.flatten(obj.unflatten(theta)), theta)
    assert torch.equal(obj.forward(None, x), model(x))
    zero = {"2.bias": torch.zeros(3, dtype=torch.float64)}
    with torch.no_grad():
        assert torch.allclose(obj.forward(zero, x), model(x) - model[2].bias, atol=1e-15)
    cfg = obj.config()
    assert cfg["num_params"] == 51 and cfg["num_examples"] == 5 and cfg["reduction"] == "mean"
    assert cfg["dtype"] == "float64"
    with pytest.raises(ValueError, match=r"expected \[51\]"):
        obj.loss(torch.zeros(50, dtype=torch.float64))
    with pytest.raises(ValueError, match="51 selected"):
        obj.unflatten(torch.zeros(52))
    with_other = obj.with_data(ref.make_classification_data(7, seed=4))
    assert with_other.num_examples == 7 and with_other.param_names == obj.param_names


def test_guard_restores_everything_even_on_error():
    model = ref.make_cnn_bn()
    model.train()
    model[1].eval()  # mixed modes must come back as they were
    x, y = ref.make_classification_data(6, image=True)
    model(x).sum().backward()  # some .grad present
    model[0].bias.grad = None
    state = _state(model)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y))
    with pytest.raises(RuntimeError, match="boom"):
        with obj.guard():
            assert not any(m.training for m in model.modules())
            with torch.no_grad():
                model[0].weight.add_(1.0)
                model[1].running_mean.mul_(3.0)
            model[6].weight.grad.zero_()
            model[0].bias.grad = torch.ones(3, dtype=torch.float64)
            model[6].bias.requires_grad_(False)
            model.train()
            raise RuntimeError("boom")
    _assert_same_state(model, state)


def test_calls_that_raise_leave_model_identical():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(8)
    model.train()
    state = _state(model)

    def bad_loss(out, t):
        raise RuntimeError("loss exploded")

    obj = Objective(model, bad_loss, (x, y))
    with pytest.raises(RuntimeError, match="loss exploded"):
        obj.gradient()
    _assert_same_state(model, state)


def test_errors():
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(8)
    with pytest.raises(ValueError, match="empty"):
        Objective(model, nn.CrossEntropyLoss(), [])
    with pytest.raises(ValueError, match="empty"):
        Objective(model, nn.CrossEntropyLoss(), (x[:0], y[:0]))
    with pytest.raises(TypeError, match="one-shot"):
        Objective(model, nn.CrossEntropyLoss(), (b for b in [(x, y)]))
    xbad = x.clone()
    xbad[5, 0] = float("nan")
    obj = Objective(model, nn.CrossEntropyLoss(), ref.split_batches(xbad, y, [4, 4]))
    with pytest.raises(ValueError, match="batch 1 is not finite"):
        obj.loss()
    with pytest.raises(ValueError, match="batch 1 is not finite"):
        obj.gradient()
    with pytest.raises(ValueError, match=r"device=.*move the model"):
        Objective(model, nn.CrossEntropyLoss(), (x.to("meta"), y.to("meta")))
    with pytest.raises(ValueError, match="mode"):
        Objective(model, nn.CrossEntropyLoss(), (x, y), mode="inference")
    with pytest.raises(TypeError, match="params must be"):
        Objective(model, nn.CrossEntropyLoss(), (x, y), params=3)


def test_check_determinism_warns_on_dropout_and_not_otherwise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 3)).double()
    x, y = ref.make_classification_data(20)
    with pytest.warns(UserWarning, match="dropout"):
        Objective(model, nn.CrossEntropyLoss(), (x, y), mode="train", check_determinism=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obj = Objective(model, nn.CrossEntropyLoss(), (x, y), check_determinism=True)
    assert obj.check_determinism()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5, shuffle=True)
    # a shuffling loader is refused outright (tests/test_objective_data_passes.py), no longer a warning
    with pytest.raises(TypeError, match="order of the examples changed.*shuffle=False"):
        Objective(model, nn.CrossEntropyLoss(), loader, check_determinism=True)
