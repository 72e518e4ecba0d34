"""Objective under torch.func and autograd (issue 28): ``grad``/``hessian``/``vmap`` of ``obj.loss``
and ``obj.gradient`` against dense float64 references written here and in ``tests.references``; the
caller's model bit-identical afterwards (also after errors); dict inputs passed as keyword arguments
(``input_mode``) against a hand-computed loss and a dense Hessian."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, hessian, jacrev, vmap

import landscape as ls
from landscape.objective import Objective
from tests import references as ref

CE = nn.CrossEntropyLoss()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is faster than two on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _small_cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 2, kernel_size=3),  # 6x6 -> 4x4
        nn.Tanh(),
        nn.Conv2d(2, 2, kernel_size=2, stride=2),  # 4x4 -> 2x2
        nn.Flatten(),
        nn.Linear(8, 3),
    ).double()


MODELS = {
    "mlp": lambda: (ref.make_mlp((4, 6, 3)), ref.make_classification_data(19)),
    "cnn": lambda: (_small_cnn(), ref.make_classification_data(13, image=True)),
    "cnn_bn_eval": lambda: (ref.make_cnn_bn(), ref.make_classification_data(13, image=True)),
}


def _problem(name: str):
    model, (x, y) = MODELS[name]()
    n = len(y)
    batches = ref.split_batches(x, y, [n // 2, n - n // 2])  # uneven batches: weights |B_k| / N
    for p in model.parameters():  # a .grad the calls must leave alone
        p.grad = torch.full_like(p, 0.25)
    return model, batches


def _snapshot(model: nn.Module):
    slots = [
        (t, t.detach().clone(), t.grad, None if t.grad is None else t.grad.clone(), t.requires_grad)
        for m in model.modules()
        for t in [*m._parameters.values(), *m._buffers.values()]
        if t is not None
    ]
    return slots, [m.training for m in model.modules()]


def _assert_unchanged(model: nn.Module, snap) -> None:
    slots, flags = snap
    now = [
        t for m in model.modules() for t in [*m._parameters.values(), *m._buffers.values()] if t is not None
    ]
    assert len(now) == len(slots)
    for t, (obj, value, g, gv, rg) in zip(now, slots):
        assert t is obj and t.requires_grad == rg
        assert t.dtype == value.dtype and torch.equal(t.detach(), value)
        assert t.grad is g and (g is None or torch.equal(g, gv))
    assert [m.training for m in model.modules()] == flags


def _reference_loss(model: nn.Module, batches):
    """An independent functional loss of the flat parameter vector (named_parameters order)."""
    named = list(model.named_parameters())
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    n_total = sum(len(y) for _, y in batches)

    def loss(theta: torch.Tensor) -> torch.Tensor:
        params, off = {}, 0
        for n, p in named:
            params[n] = theta[off : off + p.numel()].view_as(p)
            off += p.numel()
        total = theta.new_zeros(())
        for x, y in batches:
            logits = functional_call(model, (params, buffers), (x,))
            total = total + len(y) / n_total * nn.functional.cross_entropy(logits, y)
        return total

    return loss, torch.cat([p.detach().reshape(-1) for _, p in named])


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ------------------------------------------------------------------------------------ torch.func
@pytest.mark.parametrize("name", sorted(MODELS))
def test_func_grad_hessian_vmap_match_dense_references(name):
    model, batches = _problem(name)
    model.eval()
    snap = _snapshot(model)
    obj = Objective(model, CE, batches)
    w = obj.flat_params()
    loss_ref, theta0 = _reference_loss(model, batches)
    assert torch.equal(w, theta0)
    # reference gradient: eager autograd on the loss written above
    t = theta0.clone().requires_grad_(True)
    g_ref = torch.autograd.grad(loss_ref(t), t)[0]
    assert float(g_ref.norm()) > 1e-3

    assert _max_abs(grad(obj.loss)(w), g_ref) <= 1e-12
    H_ref = ref.dense_hessian(model, CE, batches)
    H = hessian(obj.loss)(w)
    assert H.shape == H_ref.shape and H.dtype == torch.float64
    assert _max_abs(H, H_ref) <= 1e-10
    assert _max_abs(jacrev(obj.gradient)(w), H_ref) <= 1e-10  # the gradient is differentiable too

    g = torch.Generator().manual_seed(0)
    W = torch.stack([w, w + 0.1 * torch.randn(w.shape, generator=g, dtype=w.dtype), w - 0.3])
    batched = vmap(obj.loss)(W)
    separate = torch.stack([obj.loss(v) for v in W])
    assert batched.shape == (3,) and _max_abs(batched, separate) <= 1e-12 * float(separate.abs().max())
    assert _max_abs(batched, torch.stack([loss_ref(v) for v in W])) <= 1e-12
    grads = vmap(obj.gradient)(W)
    assert _max_abs(grads, torch.stack([obj.gradient(v) for v in W])) <= 1e-12
    _assert_unchanged(model, snap)
    assert not model.training  # eval model stays in eval


def test_eager_autograd_through_loss_and_gradient():
    """A parameter vector that requires grad gives a differentiable loss (no silent zeros from
    ``torch.autograd.functional.hessian``); without it nothing is tracked (the default path)."""
    model, batches = _problem("mlp")
    snap = _snapshot(model)
    obj = Objective(model, CE, batches)
    loss_ref, w = _reference_loss(model, batches)
    t = w.clone().requires_grad_(True)
    g_ref = torch.autograd.grad(loss_ref(t), t)[0]
    t = w.clone().requires_grad_(True)
    assert _max_abs(torch.autograd.grad(obj.loss(t), t)[0], g_ref) <= 1e-12
    H_ref = ref.dense_hessian(model, CE, batches)
    assert _max_abs(torch.autograd.functional.hessian(obj.loss, w), H_ref) <= 1e-10
    assert _max_abs(torch.autograd.functional.jacobian(obj.gradient, w), H_ref) <= 1e-10
    assert not obj.loss(w).requires_grad and not obj.gradient(w).requires_grad
    with torch.no_grad():
        assert not obj.loss(t).requires_grad
    assert float(obj.loss(t).detach()) == float(obj.loss(w))
    _assert_unchanged(model, snap)


def test_dict_params_and_subset_under_func():
    model, batches = _problem("mlp")
    obj = Objective(model, CE, batches)
    loss_ref, w = _reference_loss(model, batches)
    t = w.clone().requires_grad_(True)
    g_ref = obj.unflatten(torch.autograd.grad(loss_ref(t), t)[0])
    g = grad(obj.loss)(obj.params())  # a dict of parameters: a dict of gradients
    assert list(g) == obj.param_names
    assert all(_max_abs(g[n], g_ref[n]) <= 1e-12 for n in g)
    last = obj.subset("2")  # the output layer only; the rest held at the model's values
    H_last = ref.dense_hessian(model, CE, batches, names=["2.weight", "2.bias"])
    assert _max_abs(hessian(last.loss)(last.flat_params()), H_last) <= 1e-10


def test_model_unchanged_after_calls_that_raise_under_transforms():
    model, (x, y) = MODELS["mlp"]()
    x = x.clone()
    x[3, 1] = float("nan")
    batches = ref.split_batches(x, y, [9, 10])
    snap = _snapshot(model)
    obj = Objective(model, CE, batches)
    w = obj.flat_params()
    with pytest.raises(ValueError, match="batch 0 is not finite: its inputs contain 1 NaN"):
        grad(obj.loss)(w)
    with pytest.raises(ValueError, match="batch 0 is not finite"):
        vmap(obj.gradient)(torch.stack([w, w]))
    with pytest.raises(RuntimeError, match="evaluate cannot run inside a torch.func transform"):
        vmap(lambda v: torch.tensor(obj.evaluate(v)["loss"]))(torch.stack([w, w]))
    _assert_unchanged(model, snap)


def test_batchnorm_train_mode_grad_works_and_vmap_names_the_fix():
    model, batches = _problem("cnn_bn_eval")
    snap = _snapshot(model)
    obj = Objective(model, CE, batches, mode="train")  # batch statistics, running stats in copies
    w = obj.flat_params()
    g = obj.gradient(w)
    assert _max_abs(grad(obj.loss)(w), g) <= 1e-12 * float(g.abs().max())
    with pytest.raises(RuntimeError, match="BatchNorm in mode='train' is not supported.*mode='eval'"):
        vmap(obj.loss)(torch.stack([w, w]))
    _assert_unchanged(model, snap)


def test_distributed_reduction_refuses_differentiation():
    class Reducing(Objective):  # stands in for DistributedObjective: an all-reduce that detaches
        def all_reduce(self, t):
            return t.detach().clone()

    model, batches = _problem("mlp")
    snap = _snapshot(model)
    obj = Reducing(model, CE, batches)
    w = obj.flat_params()
    for fn in (obj.loss, obj.gradient):
        with pytest.raises(RuntimeError, match="all_reduce.*detaches"):
            grad(lambda v, fn=fn: fn(v).sum())(w)
    assert float(obj.loss(w)) == float(Objective(model, CE, batches).loss(w))  # eager path as before
    _assert_unchanged(model, snap)


# ------------------------------------------------------------------------------------ dict inputs
class KeywordNet(nn.Module):
    """HuggingFace-style: ``forward(input_ids, attention_mask)`` returning an object with ``logits``."""

    def __init__(self, vocab: int = 7, width: int = 4, classes: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, classes)
        self.double()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        h = torch.tanh(self.emb(input_ids))
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return SimpleNamespace(logits=self.head((h * m).sum(1) / m.sum(1)))


def _token_batches():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 7, (10, 5), generator=g)
    mask = (torch.rand(10, 5, generator=g) > 0.3).long()
    mask[:, 0] = 1
    y = torch.randint(0, 3, (10,), generator=g)
    return [
        ({"input_ids": ids[:4], "attention_mask": mask[:4]}, y[:4]),
        ({"input_ids": ids[4:], "attention_mask": mask[4:]}, y[4:]),
    ]


def _hand_loss(theta: dict[str, torch.Tensor], batches) -> torch.Tensor:
    """The keyword model's loss written out: mean-pooled tanh embeddings, linear head, CE."""
    total = theta["head.bias"].new_zeros(())
    for inputs, y in batches:
        h = torch.tanh(theta["emb.weight"][inputs["input_ids"]])
        m = inputs["attention_mask"].unsqueeze(-1).to(h.dtype)
        logits = (h * m).sum(1) / m.sum(1) @ theta["head.weight"].T + theta["head.bias"]
        logp = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        total = total - logp[torch.arange(len(y)), y].sum() / 10
    return total


@pytest.mark.parametrize("input_mode", ["auto", "kwargs"])
def test_dict_inputs_as_keyword_arguments(input_mode):
    model = KeywordNet()
    snap = _snapshot(model)
    batches = _token_batches()
    obj = Objective(model, CE, batches, input_mode=input_mode)
    assert obj.config()["input_mode"] == "kwargs" and obj.config()["output"] == "logits"
    theta = {n: p.detach() for n, p in model.named_parameters()}
    assert abs(float(obj.loss()) - float(_hand_loss(theta, batches))) <= 1e-14

    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]

    def flat_hand(v: torch.Tensor) -> torch.Tensor:
        parts = torch.split(v, [s.numel() for s in shapes])
        return _hand_loss({n: t.view(s) for n, t, s in zip(names, parts, shapes)}, batches)

    H_ref = torch.autograd.functional.hessian(flat_hand, obj.flat_params())
    v = torch.linspace(-1.0, 1.0, obj.num_params, dtype=torch.float64)
    Hv = ls.hessian(obj) @ v
    assert _max_abs(Hv, H_ref @ v) <= 1e-10 * float((H_ref @ v).abs().max())
    assert _max_abs(hessian(obj.loss)(obj.flat_params()), H_ref) <= 1e-10
    out = obj.forward(None, batches[0][0])
    assert out.shape == (4, 3)
    _assert_unchanged(model, snap)


def test_input_mode_rules_and_errors():
    batches = _token_batches()
    with pytest.raises(TypeError, match=r"input_mode='kwargs'\) to call model\(\*\*inputs\)"):
        Objective(KeywordNet(), CE, batches, input_mode="positional")
    x, y = ref.make_classification_data(8)
    with pytest.raises(TypeError, match="input_mode='kwargs' calls model"):
        Objective(ref.make_mlp((4, 6, 3)), CE, (x, y), input_mode="kwargs")
    with pytest.raises(ValueError, match="input_mode must be one of"):
        Objective(ref.make_mlp((4, 6, 3)), CE, (x, y), input_mode="keywords")
    # a forward taking the dict itself (keys that are not its parameter names) keeps it whole
    g = torch.Generator().manual_seed(0)
    inputs = {
        "a": torch.randn(6, 3, generator=g, dtype=torch.float64),
        "b": torch.randn(6, 2, dtype=torch.float64),
    }
    labels = torch.randint(0, 3, (6,), generator=g)
    obj = Objective(ref.DictInputNet(), CE, (inputs, labels))
    assert obj.config()["input_mode"] == "positional"
    assert torch.isfinite(obj.loss()) and obj.subset("head").config()["input_mode"] == "positional"
