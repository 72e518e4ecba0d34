"""Every bad input to ``Objective`` and the curvature operators gets one clear error.

Each case asserts the error type, a fragment of the message naming the problem or the fix, that it
is raised where promised (at construction when the first batch shows it), and that the caller's
model is bit-identical afterwards (``tests.test_model_safety``'s snapshot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.objective import Objective
from tests import references as ref
from tests.test_model_safety import _assert_identical, _snapshot

ROOT = Path(__file__).resolve().parents[1]

CE = nn.CrossEntropyLoss()
GEN = torch.Generator().manual_seed(0)
X = torch.randn(8, 10, generator=GEN, dtype=torch.float64)
Y = torch.randint(0, 3, (8,), generator=GEN)


def _mlp(d_in: int = 10, d_out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, 16), nn.Tanh(), nn.Linear(16, d_out)).double()


class Tuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3).double()

    def forward(self, x):
        return self.lin(x), x


class Dict(nn.Module):
    def __init__(self, key: str = "scores"):
        super().__init__()
        self.lin = nn.Linear(10, 3).double()
        self.key = key

    def forward(self, x):
        return {self.key: self.lin(x), "hidden": x}


class HFOutput(dict):
    """Like a HuggingFace ModelOutput: a dict whose entries are also attributes."""

    __getattr__ = dict.__getitem__


class HF(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3).double()

    def forward(self, x):
        return HFOutput(loss=None, logits=self.lin(x))


class SqrtAtZero(nn.Module):
    """Finite loss, infinite gradient w.r.t. ``s`` at ``s = 0``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3).double()
        self.s = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return self.lin(x) * (1.0 + torch.sqrt(self.s))


class OneShotSource:
    """A generator behind ``__iter__``: the second pass sees nothing."""

    def __init__(self, batches):
        self._it = iter(batches)

    def __iter__(self):
        return self._it


class OneShotStream(torch.utils.data.IterableDataset):
    def __init__(self):
        self._it = iter([(X[i], Y[i]) for i in range(8)])

    def __iter__(self):
        return self._it


class Shrinking:
    """Re-iterable, but every pass after the first two yields one batch less."""

    def __init__(self):
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        yield (X[:4], Y[:4])
        if self.passes <= 2:
            yield (X[4:], Y[4:])


def _bad(model: nn.Module, exc: type, fragment: str, build, *, at_construction: bool = True):
    """``build()`` (construction) or ``build()()`` (construction, then the call) raises ``exc``
    matching ``fragment`` and leaves ``model`` bit-identical."""
    snap = _snapshot(model)
    with pytest.raises(exc, match=fragment):
        if at_construction:
            build()
        else:
            call = build()
            _assert_identical(model, snap)
            call()
    _assert_identical(model, snap)


# --------------------------------------------------------------------------------------------
# data that does not match the model or the loss: raised at construction
# --------------------------------------------------------------------------------------------
def test_wrong_feature_size_names_layer_and_sizes():
    model = _mlp(d_in=64)
    _bad(
        model,
        ValueError,
        r"layer '0' \(Linear\) expects 64 input features.*\[8, 10\]",
        lambda: Objective(model, CE, (X, Y)),
    )


def test_wrong_channel_count_names_conv_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(3)).double()
    model(torch.zeros(1, 3, 6, 6, dtype=torch.float64))  # initialise the lazy layer
    x = torch.randn(8, 1, 6, 6, dtype=torch.float64)
    _bad(model, ValueError, r"expects 3 input channels \(dimension 1\)", lambda: Objective(model, CE, (x, Y)))


def test_inputs_and_targets_of_different_length():
    model = _mlp()
    _bad(
        model,
        ValueError,
        r"inputs hold 8 examples.*targets 6.*same length",
        lambda: Objective(model, CE, (X, Y[:6])),
    )


def test_class_targets_of_wrong_shape():
    model = _mlp()
    _bad(
        model,
        ValueError,
        r"must have shape \[8\], got \[8, 1\].*squeeze",
        lambda: Objective(model, CE, (X, Y[:, None])),
    )


def test_regression_targets_that_would_broadcast():
    model = _mlp(d_out=1)
    y = torch.randn(8, dtype=torch.float64)
    _bad(
        model,
        ValueError,
        r"outputs have shape \[8, 1\] but the targets \[8\].*broadcast them to \[8, 8\]",
        lambda: Objective(model, nn.MSELoss(), (X, y)),
    )


def test_custom_loss_that_broadcasts_is_caught_by_its_warning():
    model = _mlp(d_out=1)
    y = torch.randn(8, dtype=torch.float64)
    _bad(
        model,
        ValueError,
        r"would be broadcast silently",
        lambda: Objective(model, lambda o, t: nn.functional.mse_loss(o, t), (X, y)),
    )


@pytest.mark.parametrize("labels, bad", [(Y + 3, 5), (Y - 3, -3)])
def test_class_labels_out_of_range_in_a_later_batch(labels, bad):
    model = _mlp()
    data = [(X, Y), (X, labels)]
    _bad(
        model,
        ValueError,
        rf"batch 1 contain class label {bad} but the model outputs 3 classes",
        lambda: Objective(model, CE, data),
    )


def test_float_class_labels():
    model = _mlp()
    _bad(model, ValueError, r"integer tensor \(y.long\(\)\)", lambda: Objective(model, CE, (X, Y.double())))


def test_embedding_index_out_of_range():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(6, 4), nn.Flatten(), nn.Linear(8, 3)).double()
    tok = torch.tensor([[0, 9]] * 8)
    _bad(model, ValueError, r"Embedding\) has 6 entries", lambda: Objective(model, CE, (tok, Y)))


def test_forward_with_wrong_arity_is_a_type_error():
    model = _mlp()
    _bad(model, TypeError, r"forward failed on the first batch", lambda: Objective(model, CE, ((X, X), Y)))


def test_batch_that_is_not_a_pair():
    model = _mlp()
    _bad(
        model,
        TypeError,
        r"batch 1 is not an \(inputs, targets\) pair.*length 3",
        lambda: Objective(model, CE, [(X, Y), (X, Y, Y)]),
    )


# --------------------------------------------------------------------------------------------
# outputs that are not a tensor
# --------------------------------------------------------------------------------------------
def test_forward_returning_a_tuple_names_output_fn():
    model = Tuple()
    _bad(
        model,
        TypeError,
        r"returns a tuple of 2 elements.*output_fn=lambda out: out\[0\]",
        lambda: Objective(model, CE, (X, Y)),
    )
    obj = Objective(model, CE, (X, Y), output_fn=lambda out: out[0])
    assert obj.config()["output"] == "output_fn:<lambda>"
    assert float(obj.loss()) == pytest.approx(float(CE(model.lin(X), Y).detach()), rel=1e-14)


def test_forward_returning_a_dict_names_its_keys():
    model = Dict()
    _bad(
        model,
        TypeError,
        r"dict with keys \['scores', 'hidden'\].*out\['scores'\]",
        lambda: Objective(model, CE, (X, Y)),
    )


def test_logits_key_and_attribute_are_used_automatically():
    for model in (Dict("logits"), HF()):
        obj = Objective(model, CE, (X, Y))
        assert obj.config()["output"] == "logits"
        assert float(obj.loss()) == pytest.approx(float(CE(model.lin(X), Y).detach()), rel=1e-14)
        H = ls.hessian(obj).to_dense()
        ref = Objective(model.lin, CE, (X, Y), params=None)
        assert torch.allclose(H, ls.hessian(ref).to_dense(), rtol=1e-12, atol=1e-14)


def test_output_fn_that_is_not_callable_or_returns_no_tensor():
    model = Tuple()
    _bad(model, TypeError, r"output_fn must be callable", lambda: Objective(model, CE, (X, Y), output_fn=0))
    _bad(
        model,
        TypeError,
        r"output_fn must return a tensor",
        lambda: Objective(model, CE, (X, Y), output_fn=lambda out: out[0].tolist()),
    )


# --------------------------------------------------------------------------------------------
# losses that do not return a differentiable scalar
# --------------------------------------------------------------------------------------------
def test_per_example_losses_name_the_reduction_fix():
    model = _mlp()
    per_example = lambda o, t: nn.functional.cross_entropy(o, t, reduction="none")  # noqa: E731
    _bad(
        model,
        ValueError,
        r"shape \[8\] \(one value per example.*reduction='mean'",
        lambda: Objective(model, per_example, (X, Y)),
    )
    _bad(
        model,
        ValueError,
        r"got 'none'.*reduction='mean'",
        lambda: Objective(model, nn.CrossEntropyLoss(reduction="none"), (X, Y)),
    )


def test_loss_returning_a_float_or_a_detached_value():
    model = _mlp()
    _bad(
        model,
        TypeError,
        r"returned a float, not a tensor",
        lambda: Objective(model, lambda o, t: CE(o, t).item(), (X, Y)),
    )
    _bad(
        model,
        ValueError,
        r"does not depend differentiably",
        lambda: Objective(model, lambda o, t: CE(o, t).detach(), (X, Y)),
    )


# --------------------------------------------------------------------------------------------
# devices, lazy modules, BatchNorm batches of one
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda():
    model = _mlp()
    _bad(
        model,
        ValueError,
        r"device='cuda' but CUDA is not available.*device='cpu'",
        lambda: Objective(model, CE, (X, Y), device="cuda"),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_index_that_does_not_exist():
    model = _mlp()
    _bad(model, ValueError, r"only \d+ CUDA device", lambda: Objective(model, CE, (X, Y), device="cuda:99"))


@pytest.mark.parametrize(
    "device, exc, fragment",
    [("gpu", ValueError, r"invalid device 'gpu'.*'cuda:0'"), (1.5, TypeError, r"device must be a string")],
)
def test_invalid_device(device, exc, fragment):
    model = _mlp()
    _bad(model, exc, fragment, lambda: Objective(model, CE, (X, Y), device=device))


def test_lazy_module_asks_for_one_forward_first():
    model = nn.Sequential(nn.LazyLinear(3)).double()
    _bad(
        model,
        ValueError,
        r"uninitialised \(lazy\).*\['0.weight', '0.bias'\].*forward pass first",
        lambda: Objective(model, CE, (X, Y)),
    )


@pytest.mark.parametrize("sizes, k", [((7, 1), 1), ((1,), 0)])
def test_batchnorm_train_mode_on_a_batch_of_one(sizes, k):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).double()
    data, start = [], 0
    for s in sizes:
        data.append((X[start : start + s], Y[start : start + s]))
        start += s
    _bad(
        model,
        ValueError,
        rf"BatchNorm layer '1' in train mode.*batch {k} holds a single example.*drop_last",
        lambda: Objective(model, CE, data, mode="train"),
    )
    Objective(model, CE, data)  # eval mode (running statistics) is fine


# --------------------------------------------------------------------------------------------
# data that can be iterated only once
# --------------------------------------------------------------------------------------------
def test_one_shot_sources_are_refused_at_construction():
    model = _mlp()
    _bad(
        model,
        TypeError,
        r"one-shot.*second pass.*list\(data\)",
        lambda: Objective(model, CE, OneShotSource([(X[:4], Y[:4]), (X[4:], Y[4:])])),
    )
    loader = torch.utils.data.DataLoader(OneShotStream(), batch_size=4)
    _bad(
        model,
        TypeError,
        r"one-shot.*DataLoader over a map-style Dataset",
        lambda: Objective(model, CE, loader),
    )


def test_source_changing_between_passes_is_refused_when_evaluated():
    model = _mlp()
    _bad(
        model,
        TypeError,
        r"one-shot.*saw 4 examples but the Objective was built on 8",
        lambda: Objective(model, CE, Shrinking()).loss,
        at_construction=False,
    )


# --------------------------------------------------------------------------------------------
# non-finite data, parameters, gradients and products
# --------------------------------------------------------------------------------------------
def test_nan_inputs_and_inf_targets_name_the_batch():
    model = _mlp(d_out=1)
    xn = X.clone()
    xn[6, 2] = float("nan")
    yi = torch.randn(8, 1, dtype=torch.float64)
    yi[1, 0] = float("inf")
    data = [(X[:4], yi[:4]), (xn[4:], yi[4:])]
    obj = Objective(model, nn.MSELoss(), data)  # reported when the batch is evaluated
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"batch 0 is not finite: its targets contain 1 NaN/inf"):
        obj.loss()
    with pytest.raises(ValueError, match=r"the data of batch 0 is not finite.*nan_to_num"):
        ls.hessian(obj)
    with pytest.raises(ValueError, match=r"batch 1 is not finite: its inputs contain 1 NaN/inf"):
        obj.with_data([(X[:4], torch.zeros(4, 1, dtype=torch.float64)), data[1]]).gradient()
    _assert_identical(model, snap)


def test_nan_parameters_are_named():
    model = _mlp()
    with torch.no_grad():
        model[2].bias[1] = float("nan")
    _bad(
        model,
        ValueError,
        r"parameters \['2.bias'\] contain NaN/inf",
        lambda: Objective(model, CE, (X, Y)).evaluate,
        at_construction=False,
    )


def test_nan_gradient_and_product_name_the_parameter():
    model = SqrtAtZero()
    _bad(
        model,
        ValueError,
        r"gradient with respect to parameter\(s\) \['s'\] is not finite on batch 0",
        lambda: Objective(model, CE, (X, Y)).gradient,
        at_construction=False,
    )
    obj = Objective(model, CE, (X, Y))
    _bad(
        model,
        ValueError,
        r"hessian product is not finite in the rows of parameter\(s\) \['s'",
        lambda: lambda: ls.hessian(obj) @ torch.ones(obj.num_params, dtype=torch.float64),
        at_construction=False,
    )


def test_nan_probe_vector():
    model = _mlp()
    obj = Objective(model, CE, (X, Y))
    v = torch.ones(obj.num_params, dtype=torch.float64)
    v[3] = float("nan")
    _bad(
        model,
        ValueError,
        r"hessian operator contains NaN/inf",
        lambda: lambda: ls.hessian(obj) @ v,
        at_construction=False,
    )


# --------------------------------------------------------------------------------------------
# randomness in the forward
# --------------------------------------------------------------------------------------------
def test_dropout_in_train_mode_is_refused_by_every_curvature_entry_point():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.3), nn.Linear(16, 3)).double()
    obj = Objective(model, CE, (X, Y), mode="train")
    assert obj.random_forward and obj.config()["random_forward"]
    assert not Objective(model, CE, (X, Y)).random_forward  # eval mode: deterministic
    for call in (ls.hessian, ls.ggn, lambda o: ls.trace(o, max_matvecs=4), lambda o: ls.eigenvalues(o, k=1)):
        _bad(
            model,
            ValueError,
            r"draws random numbers in mode='train'.*stochastic='fixed'",
            lambda c=call: lambda: c(obj),
            at_construction=False,
        )


def test_integer_targets_of_other_losses_are_not_second_guessed():
    # one logit, integer 0/1 labels, a custom BCE: no "class label out of range" false alarm
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 1)).double()
    yb = (Y > 0).long()

    def bce(o, t):
        return nn.functional.binary_cross_entropy_with_logits(o.squeeze(1), t.double())

    obj = Objective(model, bce, (X, yb))
    want = nn.functional.binary_cross_entropy_with_logits(model(X).squeeze(1), yb.double()).detach()
    assert float(obj.loss()) == pytest.approx(float(want), rel=1e-14)


# --------------------------------------------------------------------------------------------
# inputs that do not fit a forward taking keyword arguments: the message names input_mode
# --------------------------------------------------------------------------------------------
class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(10, 3).double()

    def forward(self, *, input_ids):
        return self.lin(input_ids)


class KwargsOnly(KeywordOnly):
    def forward(self, **inputs):
        return self.lin(inputs["input_ids"])


class ArgsKwargs(KeywordOnly):
    """A wrapper's ``forward(*args, **kwargs)``: ``input_mode="auto"`` cannot see the names."""

    def forward(self, *args, **kwargs):
        return self.lin(kwargs["input_ids"])


def _keyword_loss(model: nn.Module) -> float:
    with torch.no_grad():
        return float(CE(model.lin(X), Y))


@pytest.mark.parametrize("inputs", [X, (X,)], ids=["tensor", "tuple"])
def test_keyword_only_forward_fed_positional_inputs_names_input_mode(inputs):
    model = KeywordOnly()
    _bad(
        model,
        TypeError,
        r"forward\(\*, input_ids\) takes its inputs as keyword arguments \['input_ids'\].*"
        r"\(\{'input_ids': \.\.\.\}, targets\).*input_mode='kwargs'",
        lambda: Objective(model, CE, (inputs, Y)),
    )
    # the fix named works, with either input_mode that passes keywords
    for mode in ("kwargs", "auto"):
        obj = Objective(model, CE, ({"input_ids": X}, Y), input_mode=mode)
        assert obj.config()["input_mode"] == "kwargs"
        assert float(obj.loss()) == pytest.approx(_keyword_loss(model), rel=1e-14)


def test_dict_inputs_that_do_not_fit_the_forward_name_the_input_mode_to_use():
    model = KeywordOnly()
    good = ({"input_ids": X}, Y)
    # a dict passed as one argument to a keyword-only forward: input_mode='kwargs'
    _bad(
        model,
        TypeError,
        r"passed as one argument.*forward\(\*, input_ids\).*input_mode='kwargs'",
        lambda: Objective(model, CE, good, input_mode="positional"),
    )
    # keys that are not the forward's parameters: they are named, and the other input_mode
    _bad(
        model,
        TypeError,
        r"keys \['ids'\] do not fit forward\(\*, input_ids\).*\['input_ids'\].*input_mode='positional'",
        lambda: Objective(model, CE, ({"ids": X}, Y), input_mode="kwargs"),
    )
    _bad(
        model,
        TypeError,
        r"name its keys after the forward's parameters \['input_ids'\] and pass.*input_mode='kwargs'",
        lambda: Objective(model, CE, ({"ids": X}, Y)),
    )
    # forward(**inputs): a tensor, and a dict passed whole
    kw = KwargsOnly()
    _bad(
        kw,
        TypeError,
        r"forward\(\*\*inputs\) takes its inputs as keyword.*input_mode='kwargs'",
        lambda: Objective(kw, CE, (X, Y)),
    )
    _bad(kw, TypeError, r"passed as one argument.*input_mode='kwargs'", lambda: Objective(kw, CE, good))
    assert float(Objective(kw, CE, good, input_mode="kwargs").loss()) == pytest.approx(
        _keyword_loss(kw), rel=1e-14
    )


def test_args_kwargs_wrapper_failing_on_a_whole_dict_names_input_mode():
    """forward(*args, **kwargs) that reads keywords gets the dict as one argument under "auto" and
    fails inside (KeyError): the message adds the input_mode that passes keywords."""
    model = ArgsKwargs()
    _bad(
        model,
        ValueError,
        r"KeyError: 'input_ids'; the dict of inputs was passed as one argument.*input_mode='kwargs'",
        lambda: Objective(model, CE, ({"input_ids": X}, Y)),
    )
    _bad(
        model, ValueError, r"KeyError: 'input_ids'.*input_mode='kwargs'", lambda: Objective(model, CE, (X, Y))
    )
    obj = Objective(model, CE, ({"input_ids": X}, Y), input_mode="kwargs")
    assert float(obj.loss()) == pytest.approx(_keyword_loss(model), rel=1e-14)


# --------------------------------------------------------------------------------------------
# jvp="linearize": torch's own tracing warnings stay inside; the model's own warnings do not
# --------------------------------------------------------------------------------------------
def _linearize_problem(model: nn.Module | None = None):
    model = model or _mlp()
    batches = [(X[:3], Y[:3]), (X[3:], Y[3:])]
    V = torch.randn(sum(p.numel() for p in model.parameters()), 3, generator=torch.Generator().manual_seed(1))
    return model, batches, V.double()


@pytest.mark.parametrize("kind", ["ggn", "empirical_fisher"])
def test_linearize_lets_no_torch_fx_warning_escape_and_matches_the_dense_reference(kind):
    model, batches, V = _linearize_problem()
    dense = ref.dense_ggn if kind == "ggn" else ref.dense_empirical_fisher
    A_ref = dense(model, CE, batches)
    obj = Objective(model, CE, batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning that escapes fails the test
        op = getattr(ls, kind)(obj, jvp="linearize")
        block, col = op @ V, op @ V[:, 0]
        again = op @ V
    # the traced linearisation ran (a warning raised as an error inside it would have made it fall
    # back to plain forward mode silently)
    assert op.record.used == "linearize" and op.record.fallback_reason is None
    scale = float((A_ref @ V).abs().max())
    assert float((block - A_ref @ V).abs().max()) <= 1e-12 * scale
    assert float((col - A_ref @ V[:, 0]).abs().max()) <= 1e-12 * scale
    assert float((again - block).abs().max()) <= 1e-14 * scale


class Chatty(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(10, 3).double()

    def forward(self, x):
        warnings.warn("the model's own warning", UserWarning, stacklevel=2)
        return self.lin(x)


def test_linearize_passes_unrelated_warnings_through():
    model, batches, V = _linearize_problem(Chatty())
    with pytest.warns(UserWarning, match="the model's own warning"):  # the validation pass
        op = ls.ggn(Objective(model, CE, batches), jvp="linearize")
    with pytest.warns(UserWarning, match="the model's own warning") as caught:
        op @ V
    assert op.record.used == "linearize"
    assert not [w for w in caught if "get_attr" in str(w.message)]


def test_linearize_in_a_fresh_process_with_warnings_as_errors():
    """The first forward-mode call of a process imports torch's jvp decompositions (a
    torch.jit.script DeprecationWarning); with ``-W error`` nothing escapes and the traced path runs."""
    code = (
        "import torch, landscape as ls\n"
        "from torch import nn\n"
        "from landscape.objective import Objective\n"
        "torch.manual_seed(0)\n"
        "m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()\n"
        "x, y = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,))\n"
        "op = ls.ggn(Objective(m, nn.CrossEntropyLoss(), (x, y)), jvp='linearize')\n"
        "op @ torch.ones(op.shape[0], dtype=torch.float64)\n"
        "assert op.record.used == 'linearize' and op.record.fallback_reason is None, op.record\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
