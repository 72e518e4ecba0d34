"""An Objective refuses data that changes between passes (``landscape.data_fingerprint``).

The construction scan records per-example fingerprints; every later pass is compared batch by batch.
Shuffling DataLoaders (with or without ``drop_last``), in-place changes of the data and random
augmentation raise ``DataChangedError`` naming the fix; deterministic sources (unshuffled DataLoader,
list of batches, one batch, tuple and dict inputs) give bitwise-reproducible products equal to a
dense float64 Hessian; the caller's model is bit-identical after a refusal; the fingerprint costs two
float64 per example and two vectorised reductions per batch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import DataLoader, Dataset, TensorDataset

import landscape as ls
import landscape.data_fingerprint as fp
from landscape.data_fingerprint import DataChangedError, example_fingerprints
from landscape.objective import Objective
from tests.test_model_safety import _assert_identical, _snapshot

CE = nn.CrossEntropyLoss()
GEN = torch.Generator().manual_seed(0)
N = 30
X = torch.randn(N, 4, generator=GEN, dtype=torch.float64)
XB = torch.randn(N, 2, generator=GEN, dtype=torch.float64)
Y = torch.randint(0, 3, (N,), generator=GEN)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


class TwoInputs(nn.Module):
    """``forward(a, b)`` (tuple inputs) or ``forward({"a": a, "b": b})`` (dict inputs)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fa, self.fb, self.head = nn.Linear(4, 5), nn.Linear(2, 5), nn.Linear(5, 3)
        self.double()

    def forward(self, a, b=None):
        if isinstance(a, dict):
            a, b = a["a"], a["b"]
        return self.head(torch.tanh(self.fa(a) + self.fb(b)))


class Pairs(Dataset):
    """``((a, b), y)`` or ``({"a": a, "b": b}, y)`` examples: default_collate batches them alike."""

    def __init__(self, kind: str):
        self.kind = kind

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        if self.kind == "dict":
            return {"a": X[i], "b": XB[i]}, Y[i]
        return (X[i], XB[i]), Y[i]


class Augmented(Dataset):
    """Adds fresh random noise to every example it returns (random augmentation)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return X[i] + 0.01 * torch.randn(4, dtype=torch.float64), Y[i]


def _shuffled(drop_last: bool = False) -> DataLoader:
    return DataLoader(
        TensorDataset(X, Y),
        batch_size=8,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(0),
    )


def _vec(p: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _dense_hessian(model: nn.Module, args: tuple) -> torch.Tensor:
    """Independent reference: ``torch.autograd.functional.hessian`` of the mean CE on all N examples."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    theta0 = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])

    def loss(theta):
        params, off = {}, 0
        for n, s in zip(names, shapes):
            k = int(torch.Size(s).numel())
            params[n] = theta[off : off + k].reshape(s)
            off += k
        return CE(functional_call(model, params, args), Y)

    return torch.autograd.functional.hessian(loss, theta0)


# --------------------------------------------------------------------------------------------
# refused: shuffled loaders, in-place changes, augmentation
# --------------------------------------------------------------------------------------------
def test_shuffled_drop_last_loader_is_refused_on_the_second_pass():
    model = _mlp()
    snap = _snapshot(model)
    obj = Objective(model, CE, _shuffled(drop_last=True))  # the scan (pass 1) is the reference
    assert obj.num_examples == 24 and obj.batch_sizes == [8, 8, 8]
    H = ls.hessian(obj)
    with pytest.raises(DataChangedError, match=r"batch 0 .*shuffle=False and drop_last=False") as info:
        H @ _vec(obj.num_params)  # pass 2
    msg = str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert "shuffles (shuffle=True) and drops the last incomplete batch (drop_last=True)" in msg
    assert "data = list(loader)" in msg and "Monte-Carlo Fisher" in msg
    assert H.matvecs in (0, 1)  # the failed product is not a result
    _assert_identical(model, snap)


def test_shuffled_loader_without_drop_last_is_refused_as_an_order_change():
    model = _mlp()
    obj = Objective(model, CE, _shuffled())
    assert obj.num_examples == N
    with pytest.raises(DataChangedError, match=r"the order of the examples changed.*shuffle=False") as info:
        obj.loss()
    assert "drop_last=True)" not in str(info.value)  # this loader keeps every example
    # check_determinism makes the two passes at construction: refused there (it used to only warn)
    with pytest.raises(DataChangedError, match="shuffle=False"):
        Objective(model, CE, _shuffled(), check_determinism=True)


def test_batches_of_a_list_in_another_order_are_refused():
    batches = ls.data.batches(X, Y, 10)
    obj = Objective(_mlp(), CE, batches)
    batches.reverse()  # same examples, other batches at each position
    with pytest.raises(DataChangedError, match=r"batch 0 holds other examples.*order"):
        obj.loss()
    batches.reverse()
    batches[1] = (batches[1][0].flip(0), batches[1][1].flip(0))  # same batch, examples permuted
    with pytest.raises(DataChangedError, match=r"batch 1 holds the same examples .* in another order"):
        obj.loss()


def test_targets_or_inputs_changed_in_place_are_refused():
    batches = [(X[:16].clone(), Y[:16].clone()), (X[16:].clone(), Y[16:].clone())]
    obj = Objective(_mlp(), CE, batches)
    before = obj.loss()
    assert torch.equal(obj.loss(), before)  # unchanged data: fine
    batches[1][1][3] = (batches[1][1][3] + 1) % 3
    with pytest.raises(DataChangedError, match=r"batch 1 holds 1 example\(s\) whose targets .*in place"):
        obj.loss()
    batches[1][1][3] = Y[16 + 3]  # restored: accepted again
    assert torch.equal(obj.loss(), before)
    batches[0][0][5, 2] += 1e-12
    with pytest.raises(DataChangedError, match=r"batch 0 holds 1 example\(s\) whose inputs "):
        obj.gradient()
    # an objective built after the change has its own fingerprint
    assert torch.isfinite(obj.with_data(batches).loss())


def test_random_augmentation_is_refused():
    loader = DataLoader(Augmented(), batch_size=10)
    torch.manual_seed(0)
    obj = Objective(_mlp(), CE, loader)
    with pytest.raises(DataChangedError, match=r"batch 0 holds 10 example\(s\) whose inputs.*augmentation"):
        obj.loss()


def test_monte_carlo_fisher_over_a_shuffled_loader_is_refused():
    model = _mlp()
    snap = _snapshot(model)
    obj = Objective(model, CE, _shuffled())
    with pytest.raises(DataChangedError, match="shuffle=False"):
        F = ls.fisher(obj, samples=2, seed=0)  # draws its labels over a pass
        F @ _vec(obj.num_params)
    _assert_identical(model, snap)
    # the same loader unshuffled: works, products reproducible, equal to the materialised data's
    loader = DataLoader(TensorDataset(X, Y), batch_size=8)
    F1 = ls.fisher(Objective(model, CE, loader), samples=2, seed=0)
    F2 = ls.fisher(Objective(model, CE, list(loader)), samples=2, seed=0)
    v = _vec(obj.num_params)
    a, b = F1 @ v, F1 @ v
    assert torch.equal(a, b)
    assert float((a - F2 @ v).abs().max()) <= 1e-12 * float(a.abs().max())


def test_model_is_bit_identical_after_the_refusal():
    model = _mlp()
    model.train()  # the objective evaluates in eval mode: the flags must come back
    model[0].weight.grad = grad = torch.full_like(model[0].weight, 0.5)
    model.register_buffer("counter", torch.tensor([3.0], dtype=torch.float64))
    snap = _snapshot(model)
    obj = Objective(model, CE, _shuffled(drop_last=True))
    for call in (obj.loss, obj.gradient, lambda: ls.hessian(obj) @ _vec(obj.num_params)):
        with pytest.raises(DataChangedError):
            call()
        _assert_identical(model, snap)
    assert model.training and model[0].weight.grad is grad and bool((grad == 0.5).all())


# --------------------------------------------------------------------------------------------
# accepted: deterministic sources, bitwise-reproducible and exact
# --------------------------------------------------------------------------------------------
def _source(kind: str):
    """(model, data, forward args of all N examples as one batch)."""
    if kind in ("tuple", "dict"):
        inputs = (X, XB) if kind == "tuple" else ({"a": X, "b": XB},)
        return TwoInputs(), DataLoader(Pairs(kind), batch_size=7), inputs
    data = {
        "loader": DataLoader(TensorDataset(X, Y), batch_size=7, shuffle=False),
        "list": ls.data.batches(X, Y, 11),
        "one_batch": (X, Y),
    }[kind]
    return _mlp(), data, (X,)


@pytest.mark.parametrize("kind", ["loader", "list", "one_batch", "tuple", "dict"])
def test_deterministic_sources_give_bitwise_equal_exact_products(kind):
    model, data, args = _source(kind)
    obj = Objective(model, CE, data)
    H = ls.hessian(obj, cache_graph=False)  # every product is a full pass over the data
    v = _vec(obj.num_params)
    a, b = H @ v, H @ v
    assert torch.equal(a, b)
    dense = _dense_hessian(model, args)
    assert float((a - dense @ v).abs().max()) <= 1e-10 * float((dense @ v).abs().max())
    one = obj.with_data((args[0] if len(args) == 1 else args, Y))  # the data materialised as one batch
    assert float((ls.hessian(one) @ v - a).abs().max()) <= 1e-10 * float(a.abs().max())
    assert torch.equal(obj.loss(), obj.loss())


def test_unshuffled_drop_last_loader_and_converted_dtype_are_accepted():
    model = _mlp()
    loader = DataLoader(TensorDataset(X, Y), batch_size=8, drop_last=True)  # the same 24 examples
    obj = Objective(model, CE, loader, dtype=torch.float32)  # fingerprints of the raw float64 batches
    H = ls.hessian(obj, cache_graph=False)
    v = _vec(obj.num_params).float()
    assert obj.num_examples == 24 and torch.equal(H @ v, H @ v)
    sub = obj.subset("0")  # a new objective: its own scan and fingerprint
    assert sub.fingerprint is not obj.fingerprint and torch.equal(sub.loss(), obj.loss())


# --------------------------------------------------------------------------------------------
# the fingerprint itself: exact, vectorised, small
# --------------------------------------------------------------------------------------------
def test_fingerprint_is_exact_for_equal_data_in_any_layout_and_thread_count():
    img = torch.randn(5, 3, 4, 4, generator=GEN)
    y = torch.randint(0, 10, (5,), generator=GEN)
    ref = example_fingerprints(img, y)
    for same in (img.clone(), img.to(memory_format=torch.channels_last), img.transpose(2, 3).transpose(2, 3)):
        got = example_fingerprints(same, y.clone())
        assert all(torch.equal(g.view(torch.int64), r.view(torch.int64)) for g, r in zip(got, ref))
    assert ref[0].dtype == torch.float64 and ref[0].shape == (5,)
    one = torch.randn(1, 300_001, generator=GEN)  # one example: its sum must not depend on threads
    threads = torch.get_num_threads()
    try:
        vals = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            vals.append(example_fingerprints(one, y[:1])[0])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(v.view(torch.int64), vals[0].view(torch.int64)) for v in vals)
    # a label change, an input change by one ulp, and two examples swapped are all visible
    y2 = y.clone()
    y2[2] = (y2[2] + 1) % 10
    assert not torch.equal(example_fingerprints(img, y2)[1], ref[1])
    img2 = img.clone()
    img2[4, 1, 2, 3] = torch.nextafter(img2[4, 1, 2, 3], torch.tensor(1e9))
    fx = example_fingerprints(img2, y)[0]
    assert torch.equal(fx[:4], ref[0][:4]) and fx[4] != ref[0][4]
    assert torch.equal(example_fingerprints(img.flip(0), y.flip(0))[0], ref[0].flip(0))


def test_fingerprint_costs_two_float64_per_example_and_no_loop_over_examples(monkeypatch):
    x = torch.randn(200 * 64, 8, generator=GEN, dtype=torch.float64)
    y = torch.randint(0, 3, (200 * 64,), generator=GEN)
    batches = ls.data.batches(x, y, 64)
    calls = []
    real = fp._dot
    monkeypatch.setattr(fp, "_dot", lambda t, B, seed: calls.append(B) or real(t, B, seed))
    model = nn.Sequential(nn.Linear(8, 3)).double()
    obj = Objective(model, CE, batches)
    f = obj.fingerprint
    assert f.sizes == [64] * 200
    for stored in (f.inputs, f.targets):
        assert stored.shape == (200 * 64,) and stored.dtype == torch.float64 and stored.device.type == "cpu"
    assert f.inputs.untyped_storage().nbytes() == 200 * 64 * 8  # one shared [N] tensor per component
    assert calls == [64] * 400  # one vectorised reduction per tensor per batch, none per example
    calls.clear()
    obj.loss()
    assert calls == [64] * 400
    tuple_obj = Objective(TwoInputs(), CE, DataLoader(Pairs("tuple"), batch_size=N))
    assert tuple_obj.fingerprint.inputs.shape == (N,)  # both input tensors folded into one number


@pytest.mark.gpu
def test_fingerprint_of_cuda_data_is_exact_and_equals_on_repeated_passes():
    x, y = X.cuda(), Y.cuda()
    a, b = example_fingerprints(x, y), example_fingerprints(x.clone(), y.clone())
    assert all(torch.equal(p.view(torch.int64), q.view(torch.int64)) for p, q in zip(a, b))
    obj = Objective(_mlp().cuda(), CE, DataLoader(TensorDataset(x, y), batch_size=7))
    H = ls.hessian(obj, cache_graph=False)
    v = _vec(obj.num_params).cuda()
    assert torch.equal(H @ v, H @ v)
