"""Bad arguments at the edges: every one raises one clear error (type AND message checked).

Estimators (eigenvalues, trace, diagonal, spectral density), sharpness measures, loss surfaces
(directions, coordinates, resume fingerprints, memory) and optimizers (hyperparameters and
``load_state_dict``).  Valid inputs are checked against independent references where the test
also shows that the fix suggested by an error works.
"""

from __future__ import annotations

import copy
import math
import re
import tracemalloc

import numpy as np
import pytest
import torch
from torch import nn

import landscape as ls
from landscape import checks
from landscape import directions as D
from landscape.checks import ArgumentTypeError, check_probability, check_seed
from landscape.objective import Objective
from landscape.surface import load_surface, surface
from landscape.surface.trajectory import TrajectoryRecorder, project
from optimizers import ASAM, MFVI, SAM, BayesianSAM, SGDTracer, VariationalSAM
from tests.references import make_classification_data, make_mlp, matrix_with_spectrum, split_batches

CE = nn.CrossEntropyLoss()


def _matrix(p: int = 30) -> torch.Tensor:
    return matrix_with_spectrum(torch.linspace(0.1, 3.0, p, dtype=torch.float64), seed=0)


def _problem(n: int = 24, seed: int = 0):
    x, y = make_classification_data(n=n, d=4, n_classes=3, seed=seed)
    model = make_mlp((4, 5, 3), seed=1)
    return model, x, y


# ------------------------------------------------------------------------------- the validators
@pytest.mark.parametrize(
    "seed,exc,fragment",
    [
        (1.5, TypeError, "float"),
        (True, TypeError, "bool"),
        (-1, ValueError, "[0, 2**64 - 1]"),
        (2**64, ValueError, "[0, 2**64 - 1]"),
        ("0", TypeError, "str"),
    ],
)
def test_check_seed_rejects(seed, exc, fragment):
    with pytest.raises(exc, match=r"seed must be None, an integer") as info:
        check_seed(seed)
    assert fragment in str(info.value)


def test_check_seed_accepts_and_type_errors_are_value_errors_too():
    for ok in (None, 0, np.int64(7), 2**64 - 1, torch.Generator()):
        check_seed(ok)  # no error
    with pytest.raises(ValueError, match="seed"):  # ArgumentTypeError is a ValueError as well
        check_seed(2.0)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\], got nan"):
        check_probability("p", math.nan)


# --------------------------------------------------------------------------------- estimators
EIGEN_CASES = [
    (dict(tol=math.nan), ValueError, "tol must be a finite number >= 0, got nan"),
    (dict(tol=-1e-3), ValueError, "tol must be a finite number >= 0"),
    (dict(tol=0.0, atol=0.0), ValueError, "both zero"),
    (dict(seed=1.5), TypeError, "seed must be None, an integer"),
    (dict(seed=-2), ValueError, "seed must be None, an integer"),
    (dict(k=0), ValueError, "k must be an integer > 0"),
    (dict(k=True), TypeError, "k must be an integer"),
    (dict(k=31), ValueError, "k = 31 exceeds the operator dimension p = 30"),
    (dict(max_matvecs=0), ValueError, "max_matvecs must be an integer > 0"),
    (dict(max_matvecs=100.5), TypeError, "max_matvecs must be an integer"),
    (dict(block_size=0), ValueError, "block_size must be an integer > 0"),
    (dict(v0=torch.full((30,), math.nan, dtype=torch.float64)), ValueError, "v0 must be finite"),
]


@pytest.mark.parametrize("kw,exc,fragment", EIGEN_CASES)
def test_eigenvalues_bad_arguments(kw, exc, fragment):
    with pytest.raises(exc, match=re.escape(fragment)):
        ls.eigenvalues(_matrix(), **kw)


TRACE_CASES = [
    (dict(rtol=math.nan), ValueError, "rtol must be a finite number >= 0, got nan"),
    (dict(rtol=-0.1), ValueError, "rtol must be a finite number >= 0"),
    (dict(atol=math.inf), ValueError, "atol must be a finite number >= 0"),
    (dict(max_matvecs=0), ValueError, "max_matvecs must be an integer > 0"),
    (dict(max_matvecs=50.0), TypeError, "max_matvecs must be an integer"),
    (dict(seed=0.5), TypeError, "seed must be None, an integer"),
    (dict(level=math.nan), ValueError, "level must lie in"),
    (dict(block=0), ValueError, "block must be an integer > 0"),
]


@pytest.mark.parametrize("kw,exc,fragment", TRACE_CASES)
def test_trace_bad_arguments(kw, exc, fragment):
    with pytest.raises(exc, match=fragment):
        ls.trace(_matrix(), **kw)


@pytest.mark.parametrize(
    "call,exc,fragment",
    [
        (lambda A: ls.diagonal(A, samples=2.5), TypeError, "samples must be an integer"),
        (lambda A: ls.diagonal(A, seed=1.5), TypeError, "seed must be None, an integer"),
        (lambda A: ls.spectral_density(A, runs=True), TypeError, "runs must be an integer"),
        (lambda A: ls.spectral_density(A, sigma=math.inf), ValueError, "sigma must be a finite number > 0"),
        (lambda A: ls.spectral_density(A, sigma=math.nan), ValueError, "sigma must be a finite number > 0"),
        (lambda A: ls.spectral_density(A, grid=1), ValueError, r"grid must be an integer in \[2, inf\]"),
        (lambda A: ls.spectral_density(A, seed=-5), ValueError, "seed must be None, an integer"),
        (lambda A: ls.power_iteration(A, max_iter=0), ValueError, "max_iter must be an integer > 0"),
        (lambda A: ls.power_iteration(A, tol=math.nan), ValueError, "tol must be a finite number"),
    ],
)
def test_diagonal_density_power_bad_arguments(call, exc, fragment):
    with pytest.raises(exc, match=fragment):
        call(_matrix())


def test_non_finite_operators_raise_instead_of_returning_nan():
    A = _matrix()
    A[3, 3] = math.nan
    with pytest.raises(ValueError, match="NaN or inf entries"):
        ls.eigenvalues(A)

    class NanOp:  # an operator whose products go NaN (e.g. a Hessian at a NaN point)
        shape, dtype, device = (30, 30), torch.float64, torch.device("cpu")

        def matmat(self, V):
            return V * math.nan

    with pytest.raises(ValueError, match="returned NaN/inf in a matrix-vector product"):
        ls.trace(NanOp(), method="hutchinson")


def test_valid_estimator_calls_still_match_the_dense_reference():
    A = _matrix()
    evals = torch.linalg.eigvalsh(A)
    top = ls.eigenvalues(A, k=2, seed=np.int64(3), tol=1e-10)
    torch.testing.assert_close(top.values, evals.flip(0)[:2], rtol=1e-8, atol=1e-10)
    assert ls.trace(A, method="exact").value == pytest.approx(float(torch.trace(A)), rel=1e-12)


# --------------------------------------------------------------------------- sharpness measures
def _sqrt_at_zero_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # finite value (CE + sqrt(0)) with a NaN gradient: d sqrt(u)/du = inf at u = 0, times du = 0
    return CE(out, y) + torch.sqrt((out * 0.0).sum())


class _NanGradientObjective(Objective):
    """An objective whose gradient is NaN while its loss is finite (whatever the Objective itself
    checks): the measures' own check must catch it."""

    def loss_and_gradient(self, params=None):
        loss, grad = super().loss_and_gradient(params)
        return loss, grad * math.nan


class _NanAwayFromW0Objective(Objective):
    """Finite gradient at the current parameters, NaN anywhere else."""

    def loss_and_gradient(self, params=None):
        loss, grad = super().loss_and_gradient(params)
        at_w0 = params is None or torch.equal(torch.as_tensor(params), self.flat_params())
        return loss, grad if at_w0 else grad * math.nan


def test_nan_gradient_at_w0_raises_a_clear_error():
    model, x, y = _problem()
    obj = Objective(model, _sqrt_at_zero_loss, (x, y))
    assert math.isfinite(float(obj.loss()))  # the loss itself is fine, its gradient is NaN
    with pytest.raises(ValueError, match=r"gradient.*(not finite|NaN)"):
        ls.sharpness(obj, "gradient_norm")
    nan_obj = _NanGradientObjective(model, CE, (x, y))
    with pytest.raises(ValueError, match=r"non-finite gradient at w0 \(43 NaN/inf of 43 entries\)"):
        ls.sharpness(nan_obj, "gradient_norm")
    with pytest.raises(ValueError, match="non-finite gradient at w0"):
        ls.sharpness(nan_obj, "worst_case", solver="one_step")
    away = _NanAwayFromW0Objective(model, CE, (x, y))
    with pytest.raises(ValueError, match="non-finite gradient at a perturbed point"):
        ls.sharpness(away, "worst_case", solver="pgd", iterations=2)


def test_nan_parameters_raise_before_any_evaluation():
    model, x, y = _problem()
    with torch.no_grad():
        model[0].weight[0, 0] = math.nan
    obj = Objective(model, CE, (x, y))
    with pytest.raises(ValueError, match="1 of the 43 selected parameters are NaN or inf"):
        ls.sharpness(obj, "lambda_max")


@pytest.mark.parametrize(
    "measure,kw,exc,fragment",
    [
        ("worst_case", dict(momentum=math.nan), ValueError, r"momentum must lie in \[0, 1\]"),
        ("worst_case", dict(m=0), ValueError, "m must be an integer > 0"),
        ("worst_case", dict(rho=math.nan), ValueError, "rho must be a finite number > 0"),
        ("sharpness_flatness", dict(solver="adam"), ValueError, "solver must be one of"),
        ("gradient_norm", dict(adaptive=True, scale="fisher"), ValueError, "conflicts with scale"),
        ("lambda_max", dict(seed=1.5), TypeError, "seed must be None, an integer"),
        ("lambda_max", dict(k=44), ValueError, "k = 44 exceeds the number of parameters p = 43"),
        ("tracer", dict(f_bar=torch.full((43,), math.nan)), ValueError, "f_bar contains NaN"),
        ("average_case", dict(seed=-1), ValueError, "seed must be None, an integer"),
        ("perturbation_robustness", dict(alphas=[0.1, math.nan]), ValueError, r"alphas\[1\] must be"),
    ],
)
def test_sharpness_bad_options(measure, kw, exc, fragment):
    model, x, y = _problem()
    obj = Objective(model, CE, (x, y))
    with pytest.raises(exc, match=fragment):
        ls.sharpness(obj, measure, **kw)


# ------------------------------------------------------------------------------------ surfaces
@pytest.fixture(scope="module")
def setup():
    x, y = make_classification_data(n=30, d=4, n_classes=3, seed=3)
    model = make_mlp((4, 5, 3), seed=4)
    obj = Objective(model, CE, split_batches(x, y, [12, 10, 8]))
    return model, x, y, obj, D.random(obj, seed=0), D.random(obj, seed=1)


def test_surface_direction_checks(setup):
    _, _, _, obj, d1, _ = setup
    xs = np.linspace(-1, 1, 3)
    bad = {n: t.clone() for n, t in d1.items()}
    bad["0.weight"][0, 0] = math.nan
    with pytest.raises(ValueError, match=r"directions\[0\]\['0.weight'\] contains NaN or inf"):
        surface(obj, [bad], [xs])
    big = {n: t.clone() for n, t in d1.items()}
    big["0.weight"][0, 0] = 1e300  # finite in float64, inf in float32
    obj32 = Objective(setup[0], CE, split_batches(setup[1], setup[2], [30]), dtype=torch.float32)
    with pytest.raises(ValueError, match="after casting to torch.float32"):
        surface(obj32, [big], [xs])
    with pytest.raises(ValueError, match=r"directions\[0\] is all zero"):
        surface(obj, [{n: torch.zeros_like(t) for n, t in d1.items()}], [xs])
    with pytest.raises(TypeError, match="real floating tensor"):
        surface(obj, [{"0.weight": torch.ones(5, 4, dtype=torch.int64)}], [xs])


@pytest.mark.parametrize(
    "coords,fragment",
    [
        (np.array([0.0, 1.0, 0.5]), "strictly increasing or strictly decreasing"),
        (np.array([0.0, 0.0, 1.0]), "strictly increasing or strictly decreasing"),
        (np.array([]), "non-empty 1-D array of finite numbers"),
        (np.array([0.0, np.inf]), "non-empty 1-D array of finite numbers"),
    ],
)
def test_surface_coordinate_checks(setup, coords, fragment):
    _, _, _, obj, d1, _ = setup
    with pytest.raises(ValueError, match=fragment):
        surface(obj, [d1], [coords])


def test_surface_decreasing_coords_are_valid(setup):
    _, _, _, obj, d1, _ = setup
    up = surface(obj, [d1], [np.array([-0.5, 0.0, 0.5])], strategy="loop")
    down = surface(obj, [d1], [np.array([0.5, 0.0, -0.5])], strategy="loop")
    np.testing.assert_array_equal(down.loss, up.loss[::-1])
    assert up.loss[1] == float(obj.loss())


def test_huge_grid_is_refused_before_allocating(setup, monkeypatch):
    _, _, _, obj, d1, d2 = setup
    monkeypatch.setattr(checks, "available_bytes", lambda device: 16 * 2**30)
    xs = np.linspace(-1, 1, 100_000)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"100000 x 100000 grid has 10,000,000,000 points") as info:
            surface(obj, [d1, d2], [xs, xs])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "fewer coordinates per axis" in str(info.value)
    assert peak < 50 * 2**20  # nothing grid-sized was allocated


def test_strategy_workspace_is_checked_and_the_suggested_fix_works(setup, monkeypatch):
    _, _, _, obj, d1, d2 = setup
    xs = np.linspace(-1, 1, 10)
    monkeypatch.setattr(checks, "available_bytes", lambda device: 60_000)
    with pytest.raises(ValueError, match=r"strategy 'vmap' would allocate .*smaller batch_points"):
        surface(obj, [d1, d2], [xs, xs], strategy="vmap", batch_points=100)
    ok = surface(obj, [d1, d2], [xs, xs], strategy="vmap", batch_points=4)
    ref = surface(obj, [d1, d2], [xs, xs], strategy="loop")
    np.testing.assert_allclose(ok.loss, ref.loss, rtol=1e-12)
    monkeypatch.setattr(checks, "available_bytes", lambda device: 3_000)
    with pytest.raises(ValueError, match=r"strategy 'linear_first_layer' .*use strategy='loop'"):
        surface(obj, [d1], [xs[:3]], strategy="linear_first_layer")


def _interrupting_loss(limit: list):
    def loss(out, y):
        limit[0] -= 1
        if limit[0] < 0:
            raise KeyboardInterrupt
        return CE(out, y)

    return loss


def test_resume_refuses_other_data_of_the_same_size_and_resumes_the_same_data(setup, tmp_path):
    model, x, y, _, d1, d2 = setup
    batches = split_batches(x, y, [12, 10, 8])
    xs, ys = np.linspace(-1, 1, 5), np.linspace(-1, 1, 4)
    limit = [10**9]
    flaky = Objective(model, _interrupting_loss(limit), batches)
    limit[0] = 3 * 7  # three batches per point: the run stops in point 8 of 20
    path = tmp_path / "run.npz"
    with pytest.raises(KeyboardInterrupt):
        surface(flaky, [d1, d2], [xs, ys], strategy="loop", resume=path, checkpoint_every=0.0, batch_points=2)
    part = load_surface(path)
    n_done = int(part.mask.sum())
    assert 0 < n_done < 20 and not part.complete
    copy_path = tmp_path / "copy.npz"
    part.save(copy_path)
    limit[0] = 10**9
    # other data of the same size (30 examples of the same shapes): refused, naming the data
    x2, y2 = make_classification_data(n=30, d=4, n_classes=3, seed=99)
    other = Objective(model, _interrupting_loss(limit), split_batches(x2, y2, [12, 10, 8]))
    with pytest.raises(
        ValueError, match=r"cannot resume .*data \(a hash of the inputs and targets\)"
    ) as info:
        surface(other, [d1, d2], [xs, ys], strategy="loop", resume=path)
    assert "delete the file or choose another resume path" in str(info.value)
    assert "loss function" not in str(info.value)
    # the same inputs with one label changed: refused too
    y3 = y.clone()
    y3[0] = (y3[0] + 1) % 3
    relabeled = Objective(model, _interrupting_loss(limit), split_batches(x, y3, [12, 10, 8]))
    with pytest.raises(ValueError, match=r"cannot resume .*data \(a hash"):
        surface(relabeled, [d1, d2], [xs, ys], strategy="loop", resume=path)
    assert int(load_surface(path).mask.sum()) == n_done  # the refused runs left the file alone
    # the same data resumes to exactly the values of an uninterrupted run
    full = surface(Objective(model, CE, batches), [d1, d2], [xs, ys], strategy="loop")
    done = surface(flaky, [d1, d2], [xs, ys], strategy="loop", resume=path)
    assert done.complete and done.evaluations == 20 - n_done
    np.testing.assert_array_equal(done.loss, full.loss)
    np.testing.assert_array_equal(done.accuracy, full.accuracy)
    # ... also when it is cut into other batches (the fingerprint does not depend on the batching;
    # the new points differ from the uninterrupted ones by summation order only)
    rebatched = Objective(model, _interrupting_loss(limit), split_batches(x, y, [15, 15]))
    again = surface(rebatched, [d1, d2], [xs, ys], strategy="loop", resume=copy_path)
    np.testing.assert_array_equal(again.loss[part.mask], full.loss[part.mask])
    np.testing.assert_allclose(again.loss, full.loss, rtol=1e-13, atol=0)


def test_resume_refuses_another_loss_with_the_same_name(setup, tmp_path):
    model, x, y, obj, d1, _ = setup
    xs = np.linspace(-1, 1, 3)
    path = tmp_path / "plain.npz"
    surface(obj, [d1], [xs], resume=path)
    smooth = Objective(model, nn.CrossEntropyLoss(label_smoothing=0.1), split_batches(x, y, [12, 10, 8]))
    with pytest.raises(
        ValueError, match=r"cannot resume .*loss function \(a hash of its code and settings\)"
    ):
        surface(smooth, [d1], [xs], resume=path)


def test_direction_and_trajectory_helpers(setup):
    model, _, _, obj, d1, d2 = setup
    with pytest.raises(ValueError, match="seed must be None, an integer"):
        D.random(obj, seed=-3)
    with pytest.raises(TypeError, match="dtype must be None or a floating torch.dtype"):
        D.random(obj, dtype=torch.int64)
    same = [dict(model.named_parameters())] * 3
    with pytest.raises(ValueError, match="only 0 non-zero principal component"):
        D.pca(same, k=1)
    with pytest.raises(TypeError, match="every must be an integer"):
        TrajectoryRecorder(every=True)
    bad = {n: t.clone() for n, t in d1.items()}
    bad["2.bias"][0] = math.inf
    with pytest.raises(ValueError, match="'2.bias' contains NaN or inf"):
        project([dict(model.named_parameters())], [bad, d2], model)


# ---------------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize(
    "make,exc,fragment",
    [
        (
            lambda p: SAM(p, torch.optim.SGD, rho=math.nan, lr=0.1),
            ValueError,
            "rho must be a finite number >= 0",
        ),
        (lambda p: SAM(p, torch.optim.SGD, lr=math.nan), ValueError, "lr must be a finite number >= 0"),
        (
            lambda p: ASAM(p, torch.optim.SGD, eta=-0.1, lr=0.1),
            ValueError,
            "eta must be a finite number >= 0",
        ),
        (
            lambda p: SAM([{"params": p, "rho": -0.5}], torch.optim.SGD, lr=0.1),
            ValueError,
            r"rho \(param group 0\) must be a finite number >= 0",
        ),
        (lambda p: VariationalSAM(p, num_data=True, lr=0.1), TypeError, "num_data .* must be an integer"),
        (lambda p: VariationalSAM(p, num_data=100.0, lr=0.1), TypeError, "num_data .* must be an integer"),
        (lambda p: MFVI(p, lr=0.1, num_data=-5), ValueError, "num_data .* must be an integer > 0"),
        (lambda p: BayesianSAM(p, lr=0.1, num_data=10, betas=(0.9, math.nan)), ValueError, r"betas\[1\]"),
        (lambda p: BayesianSAM(p, lr=0.1, num_data=10, seed=1.5), TypeError, "seed must be None, an integer"),
        (lambda p: SGDTracer(p, lr=0.1, beta=math.nan), ValueError, r"beta .* must lie in \(0, 1\]"),
    ],
)
def test_optimizer_bad_hyperparameters(make, exc, fragment):
    model = make_mlp((4, 5, 3))
    with pytest.raises(exc, match=fragment):
        make(list(model.parameters()))


def _stepped_sam(model, cls=SAM, base=torch.optim.SGD):
    x, y = make_classification_data(n=12, d=4, seed=5)
    opt = cls(model.parameters(), base, lr=0.1, momentum=0.9)

    def closure():
        opt.zero_grad()
        loss = CE(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    return opt, closure


def test_load_state_dict_mismatches_are_named_before_anything_changes():
    a = make_mlp((4, 5, 3), seed=0)
    opt, closure = _stepped_sam(a)
    sd = opt.state_dict()
    assert sd["optimizer_class"] == "SAM" and sd["param_layout"] == [[[5, 4], [5], [3, 5], [3]]]
    # another class
    asam = ASAM(make_mlp((4, 5, 3), seed=1).parameters(), torch.optim.SGD, lr=0.1)
    before = asam.state_dict()
    with pytest.raises(ValueError, match="saved by SAM, not by ASAM"):
        asam.load_state_dict(sd)
    assert asam.state_dict() == before  # untouched by the failed load
    # another base optimizer
    adam_sam = SAM(make_mlp((4, 5, 3), seed=1).parameters(), torch.optim.Adam, lr=0.1)
    with pytest.raises(ValueError, match="base optimizer is SGD, this one's is Adam"):
        adam_sam.load_state_dict(sd)
    # the same number of tensors, other shapes; more tensors
    wider = SAM(make_mlp((4, 6, 3), seed=1).parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(
        ValueError, match=r"parameter 0 of group 0 has shape \(5, 4\) in the state dict but \(6, 4\)"
    ):
        wider.load_state_dict(sd)
    deeper = SAM(make_mlp((4, 5, 5, 3), seed=1).parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="group 0 holds 4 parameter.* in the state dict but 6"):
        deeper.load_state_dict(sd)
    # dicts from another optimizer family
    bsam = BayesianSAM(make_mlp((4, 5, 3), seed=1).parameters(), lr=0.1, num_data=10)
    with pytest.raises(ValueError, match="saved by SAM, not by BayesianSAM"):
        bsam.load_state_dict(sd)
    mfvi = MFVI(make_mlp((4, 5, 3), seed=1).parameters(), lr=0.1, num_data=10)
    untagged = {k: v for k, v in sd.items() if k not in ("optimizer_class", "param_layout")}
    with pytest.raises(ValueError, match=r"lacks \['base', 'raw_std'\]"):
        mfvi.load_state_dict(untagged)
    # the matching optimizer loads it and continues exactly like the original (momentum included)
    b = make_mlp((4, 5, 3), seed=7)
    with torch.no_grad():
        for pb, pa in zip(b.parameters(), a.parameters()):
            pb.copy_(pa)
    twin, twin_closure = _stepped_sam(b)
    with torch.no_grad():  # undo the twin's own first step, then take over the state
        for pb, pa in zip(b.parameters(), a.parameters()):
            pb.copy_(pa)
    twin.load_state_dict(copy.deepcopy(sd))  # as from a file (torch would alias the tensors)
    opt.step(closure)
    twin.step(twin_closure)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
