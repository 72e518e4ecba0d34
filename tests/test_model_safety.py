"""The caller's model is bit-identical after every public entry point, also one that raises.

"Bit-identical": every parameter and buffer slot of every module holds the same tensor object with
the same bytes, dtype, ``requires_grad`` and ``.grad`` (object and bytes), and every module has its
train/eval flag.  The models are the hard cases: tied weights (an embedding tied to the output
layer; one ``nn.Linear`` registered under two names and applied twice), a forward that switches a
submodule's mode, MC dropout, a forward that mutates a parameter and a buffer in place, and a
forward that raises midway after doing all of that.  Tied models also get their Hessian checked
against a dense reference with respect to the shared tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.parameter import is_lazy

import landscape as ls
from landscape.objective import Objective
from tests import references as ref

CE = nn.CrossEntropyLoss()


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------
class TiedLM(nn.Module):
    """Embedding whose weight is also the output layer's (weight tying)."""

    def __init__(self, vocab: int = 6, dim: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.emb.weight
        self.mix = nn.Linear(dim, dim)

    def forward(self, tok):
        return self.out(torch.tanh(self.mix(self.emb(tok).mean(1))))


class SharedTwice(nn.Module):
    """One ``nn.Linear`` registered under two names and applied twice in the forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.again = self.lin
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.again(torch.tanh(self.lin(x)))))


class ModeSwitch(nn.Module):
    """Switches its BatchNorm to train mode inside the forward (batch statistics: deterministic)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.bn = nn.BatchNorm1d(5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        self.bn.train()
        return self.head(torch.tanh(self.bn(self.lin(x))))


class MCDropout(nn.Module):
    """Monte-Carlo dropout: the forward puts its dropout in train mode whatever the model's mode."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        self.drop.train()
        return self.head(self.drop(torch.tanh(self.lin(x))))


class InPlace(nn.Module):
    """Mutates a parameter and a buffer in place in every forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.head = nn.Linear(5, 3)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(0.5)
            self.calls.add_(1.0)
        return self.head(torch.tanh(self.lin(x)))


class RaisesMidway(nn.Module):
    """Switches a mode, mutates a parameter in place, then raises once ``fail`` is set."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.head = nn.Linear(5, 3)
        self.fail = False

    def forward(self, x):
        self.head.train(not self.head.training)
        with torch.no_grad():
            self.lin.bias.add_(1.0)
        h = torch.tanh(self.lin(x))
        if self.fail:
            raise RuntimeError("boom midway")
        return self.head(h)


def _data(model: nn.Module, n: int = 10):
    g = torch.Generator().manual_seed(1)
    if isinstance(model, TiedLM):
        x = torch.randint(0, 6, (n, 3), generator=g)
        y = torch.randint(0, 6, (n,), generator=g)
    else:
        x = torch.randn(n, 4, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (n,), generator=g)
    return [(x[:6], y[:6]), (x[6:], y[6:])]


MODELS = {
    "tied": TiedLM,
    "shared_twice": SharedTwice,
    "mode_switch": ModeSwitch,
    "mc_dropout": MCDropout,
    "in_place": InPlace,
    "raises": RaisesMidway,
}


def _make(name: str) -> tuple[nn.Module, list]:
    torch.manual_seed(0)
    model = MODELS[name]().double()
    model.eval()
    next(model.parameters()).grad = torch.full_like(next(model.parameters()), 0.25)  # one .grad set
    return model, _data(model)


# --------------------------------------------------------------------------------------------
# the snapshot: slots, objects, bytes, flags
# --------------------------------------------------------------------------------------------
def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


def _snapshot(model: nn.Module):
    slots = []
    for prefix, mod in model.named_modules(remove_duplicate=False):
        for store in (mod._parameters, mod._buffers):
            for name, t in store.items():
                if t is None or is_lazy(t):  # bias=False; lazy: no data yet
                    slots.append((f"{prefix}.{name}", t, type(t), None, None, None, None, None))
                    continue
                g = t.grad
                slots.append(
                    (
                        f"{prefix}.{name}",
                        t,  # the object itself: identity is compared with `is`
                        type(t),
                        t.dtype,
                        t.requires_grad,
                        _bytes(t),
                        g,
                        None if g is None else _bytes(g),
                    )
                )
    flags = [(n, m.training) for n, m in model.named_modules(remove_duplicate=False)]
    return slots, flags


def _assert_identical(model: nn.Module, snap) -> None:
    now = _snapshot(model)
    slots, flags = snap
    assert [f for f in now[1]] == flags, "train/eval flags changed"
    assert len(now[0]) == len(slots)
    for a, b in zip(slots, now[0]):
        name = a[0]
        assert a[1] is b[1], f"{name}: the slot holds another object"
        assert a[2] is b[2] and a[3] == b[3] and a[4] == b[4], f"{name}: type/dtype/requires_grad changed"
        assert a[5] == b[5], f"{name}: bytes changed"
        assert a[6] is b[6], f"{name}: .grad object changed"
        assert a[7] == b[7], f"{name}: .grad bytes changed"


# --------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------
def _objective(model, batches, **kw) -> Objective:
    if isinstance(model, MCDropout):
        kw.setdefault("stochastic", "fixed")
    return Objective(model, CE, batches, **kw)


def _vec(obj: Objective) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, obj.num_params, dtype=obj.dtype)


def _surface(obj: Objective):
    d = ls.directions.random(obj, "filter", seed=0)
    return ls.surface(obj, [d], [np.array([-0.5, 0.0, 0.5])])


ENTRY_POINTS = {
    "loss": lambda o: o.loss(),
    "gradient": lambda o: o.gradient(),
    "loss_and_gradient": lambda o: o.loss_and_gradient(),
    "forward": lambda o: o.forward(None, next(iter(o.batches()))[0]),
    "evaluate": lambda o: o.evaluate(),
    "hessian": lambda o: ls.hessian(o) @ _vec(o),
    "hessian_fwd_rev": lambda o: ls.hessian(o, engine="forward_over_reverse") @ _vec(o),
    "ggn": lambda o: ls.ggn(o) @ _vec(o),
    "empirical_fisher": lambda o: ls.empirical_fisher(o) @ _vec(o),
    "fisher": lambda o: ls.fisher(o, samples=2, seed=0) @ _vec(o),
    "eigenvalues": lambda o: ls.eigenvalues(o, k=1, max_matvecs=30),
    "trace": lambda o: ls.trace(o, max_matvecs=12),
    "spectral_density": lambda o: ls.spectral_density(o, runs=2, lanczos_steps=6),
    "sharpness_lambda_max": lambda o: ls.sharpness(o, "lambda_max", max_matvecs=20),
    "sharpness_average_case": lambda o: ls.sharpness(o, "average_case", samples=3),
    "surface": _surface,
}
PER_EXAMPLE = ("empirical_fisher", "fisher")


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("name", ["tied", "shared_twice", "mode_switch", "mc_dropout", "in_place"])
def test_model_bit_identical_after_entry_point(name, entry):
    model, batches = _make(name)
    snap = _snapshot(model)
    obj = _objective(model, batches)
    _assert_identical(model, snap)
    if name in ("mc_dropout", "mode_switch") and entry in PER_EXAMPLE:
        # per-example gradients of a random or batch-coupled forward are refused, model untouched
        with pytest.raises(ValueError, match="draws random numbers|BatchNorm layer"):
            ENTRY_POINTS[entry](obj)
    else:
        ENTRY_POINTS[entry](obj)
    _assert_identical(model, snap)
    # the same with a float32 copy evaluation of a float64 model (dtype conversion path)
    if entry in ("loss", "hessian", "forward"):
        ENTRY_POINTS[entry](_objective(model, batches, dtype=torch.float32))
        _assert_identical(model, snap)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_model_bit_identical_when_forward_raises_midway(entry):
    model, batches = _make("raises")
    snap = _snapshot(model)
    obj = _objective(model, batches)
    ops = {  # operators built before the forward starts failing: the failure is in the product
        "hessian": ls.hessian(obj),
        "ggn": ls.ggn(obj),
        "empirical_fisher": ls.empirical_fisher(obj, cache_bytes=0),
        "fisher": ls.fisher(obj, samples=2, seed=0, cache_bytes=0),
    }
    _assert_identical(model, snap)
    model.fail = True
    snap = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom midway"):
        if entry in ops:
            ops[entry] @ _vec(obj)
        else:
            ENTRY_POINTS[entry](obj)
    _assert_identical(model, snap)


def test_flags_restored_after_every_product_of_a_mode_switching_forward():
    model, batches = _make("mode_switch")
    obj = _objective(model, batches)
    H = ls.hessian(obj, cache_graph=False)
    v = _vec(obj)
    for _ in range(3):
        H @ v
        assert not model.bn.training and not model.training
    # batch statistics are used (the forward's own switch), and identically in every product:
    # the Hessian is the dense one of the network written out by hand with batch statistics
    shapes = [p.shape for p in model.parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(flat):
        w, off = [], 0
        for s in shapes:
            w.append(flat[off : off + s.numel()].view(s))
            off += s.numel()
        lw, lb, gw, gb, hw, hb = w
        total = flat.new_zeros(())
        for x, y in batches:
            z = x @ lw.T + lb
            z = (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5) * gw + gb
            total = total + len(y) / 10 * CE(torch.tanh(z) @ hw.T + hb, y)
        return total

    assert float(obj.loss()) == pytest.approx(float(f(theta)), rel=1e-12)
    dense = torch.autograd.functional.hessian(f, theta)
    assert torch.allclose(H.to_dense(), dense, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# tied parameters: one parameter, the Hessian w.r.t. the shared tensor
# --------------------------------------------------------------------------------------------
def test_tied_embedding_hessian_is_the_dense_one_of_the_shared_tensor():
    model, batches = _make("tied")
    obj = Objective(model, CE, batches)
    assert obj.param_names == ["emb.weight", "mix.weight", "mix.bias"]
    # the reference fills the tied slot through torch's tie_weights (independent of our slots)
    dense = ref.dense_hessian(model, CE, batches)
    for engine in ("double_backward", "forward_over_reverse"):
        assert torch.allclose(ls.hessian(obj, engine=engine).to_dense(), dense, rtol=1e-10, atol=1e-12)
    # selecting the tied weight under its other name selects the same parameter
    sub = Objective(model, CE, batches, params=["out.weight"])
    assert sub.param_names == ["emb.weight"]
    assert torch.allclose(
        ls.hessian(sub).to_dense(), ref.dense_hessian(model, CE, batches, names=["emb.weight"]), rtol=1e-10
    )


def test_shared_module_hessian_matches_closed_form_function():
    model, batches = _make("shared_twice")
    snap = _snapshot(model)
    obj = Objective(model, CE, batches)
    assert obj.param_names == ["lin.weight", "lin.bias", "head.weight", "head.bias"]
    W, b = model.lin.weight.detach(), model.lin.bias.detach()
    Wh, bh = model.head.weight.detach(), model.head.bias.detach()
    n = sum(len(y) for _, y in batches)

    def f(flat: torch.Tensor) -> torch.Tensor:  # the same network written out by hand
        w = flat[:16].view(4, 4)
        c = flat[16:20]
        total = flat.new_zeros(())
        for x, y in batches:
            h = torch.tanh(torch.tanh(x @ w.T + c) @ w.T + c)
            total = total + len(y) / n * nn.functional.cross_entropy(h @ Wh.T + bh, y)
        return total

    dense = torch.autograd.functional.hessian(f, torch.cat([W.reshape(-1), b]))
    sub = obj.subset(["again"])  # the second name of the shared module
    assert sub.param_names == ["lin.weight", "lin.bias"]
    assert torch.allclose(ls.hessian(sub).to_dense(), dense, rtol=1e-10, atol=1e-12)
    assert float(obj.loss()) == pytest.approx(float(f(torch.cat([W.reshape(-1), b]))), rel=1e-13)
    _assert_identical(model, snap)
    assert model.lin is model.again and model.lin.weight is snap[0][0][1]


# --------------------------------------------------------------------------------------------
# stochastic="fixed": deterministic products, honest Lanczos residuals
# --------------------------------------------------------------------------------------------
def test_stochastic_fixed_makes_products_deterministic_and_residuals_honest():
    model, batches = _make("mc_dropout")
    plain = Objective(model, CE, batches)
    assert plain.random_forward
    with pytest.raises(ValueError, match=r"draws random numbers.*stochastic='fixed'"):
        ls.hessian(plain)
    rng_before = torch.get_rng_state()
    obj = Objective(model, CE, batches, stochastic="fixed", seed=3)
    assert obj.config()["stochastic"] == "fixed" and obj.config()["seed"] == 3
    H = ls.hessian(obj, cache_graph=False)
    v = _vec(obj)
    assert torch.equal(H @ v, H @ v)
    V = torch.stack([v, v.flip(0)], dim=1)
    assert torch.allclose(ls.hessian(obj, engine="forward_over_reverse") @ V, H @ V, rtol=1e-10, atol=1e-12)
    G = ls.ggn(obj, cache=False)
    GV = G @ V  # the first product finds out whether forward mode works (column 0 alone)
    assert torch.allclose(GV, G @ V, rtol=1e-12, atol=1e-15)
    GV = G @ V
    assert torch.equal(GV, G @ V)
    assert torch.allclose(GV, torch.stack([G @ v, G @ v.flip(0)], dim=1), rtol=1e-10, atol=1e-12)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is not advanced
    dense = H.to_dense()
    assert torch.allclose(dense, dense.T, atol=1e-12)
    # reference: each batch's forward draws its mask right after seeding the generator with 3
    mask_model, _ = _make("mc_dropout")
    theta = ref.flatten_params(mask_model)
    names = ref.param_names(mask_model)

    def f(flat):
        from torch.func import functional_call

        params, off = {}, 0
        for nm, p in mask_model.named_parameters():
            params[nm] = flat[off : off + p.numel()].view_as(p)
            off += p.numel()
        total = flat.new_zeros(())
        for x, y in batches:
            torch.manual_seed(3)
            total = total + len(y) / 10 * CE(functional_call(mask_model, params, (x,)), y)
        return total

    assert names == obj.param_names
    assert torch.allclose(dense, torch.autograd.functional.hessian(f, theta), rtol=1e-10, atol=1e-12)
    res = ls.eigenvalues(H, k=2, tol=1e-10)
    for lam, vec, r in zip(res.values, res.vectors.T, res.residuals):
        true = float((dense @ vec - lam * vec).norm())
        assert float(r) == pytest.approx(true, rel=1e-6, abs=1e-12)
    top = torch.linalg.eigvalsh(dense)[-2:].flip(0)
    assert torch.allclose(res.values, top, rtol=1e-8)


def test_stochastic_argument_errors():
    model, batches = _make("tied")
    with pytest.raises(ValueError, match="stochastic must be None or 'fixed'"):
        Objective(model, CE, batches, stochastic="random")
    with pytest.raises(TypeError, match="seed must be an int"):
        Objective(model, CE, batches, stochastic="fixed", seed=1.5)
