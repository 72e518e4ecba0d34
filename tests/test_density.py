"""Stochastic Lanczos quadrature against dense spectra and exact moments."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import landscape as ls  # noqa: E402
from tests import references as ref  # noqa: E402

_matrix = ref.matrix_with_spectrum


@pytest.mark.parametrize("reorth", [True, False])
def test_density_integrates_to_one_and_trace_within_3_stderr(reorth):
    eigs = torch.linspace(-1, 2, 300, dtype=torch.float64) ** 3
    A = _matrix(eigs)
    r = ls.spectral_density(A, runs=10, lanczos_steps=30, reorth=reorth, seed=0)
    assert r.matvecs == 300 and len(r.nodes) == 10
    assert abs(np.trapezoid(r.density.numpy(), r.grid.numpy()) - 1.0) < 1e-6
    assert abs(r.trace - float(eigs.sum())) <= 3 * r.trace_stderr
    for w in r.weights:
        assert abs(sum(w) - 1.0) < 1e-10 and min(w) >= 0
    # per run, p * sum_j tau_j theta_j is the Hutchinson sample z^T A z of its Rademacher probe
    assert r.config["reorth"] is reorth


def test_gauss_quadrature_reproduces_moments_exactly():
    # unit start vectors e_i over all i: the average of e_i^T A^k e_i is exactly tr(A^k) / p
    p, steps = 40, 5
    eigs = torch.linspace(-1.0, 1.5, p, dtype=torch.float64)
    A = _matrix(eigs, seed=3)
    r = ls.spectral_density(A, lanczos_steps=steps, probes=torch.eye(p, dtype=torch.float64))
    for k in range(2 * steps):
        exact = float((eigs**k).sum()) / p
        assert abs(r.moments(k) - exact) <= 1e-10 * max(1.0, abs(exact)), k
    # degree 2m is not integrated exactly any more
    assert abs(r.moments(2 * steps) - float((eigs ** (2 * steps)).sum()) / p) > 1e-8


def test_per_run_quadrature_matches_its_probe():
    p, steps = 50, 6
    A = _matrix(torch.randn(p, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    probes = torch.randn(p, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    r = ls.spectral_density(A, lanczos_steps=steps, probes=probes)
    for j in range(3):
        v = probes[:, j] / probes[:, j].norm()
        for k in range(2 * steps):
            exact = float(v @ torch.linalg.matrix_power(A, k) @ v)
            quad = float(np.sum(np.asarray(r.weights[j]) * np.asarray(r.nodes[j]) ** k))
            assert abs(quad - exact) <= 1e-9 * max(1.0, abs(exact))


def test_full_krylov_space_recovers_the_spectrum():
    eigs = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0, 7.0], dtype=torch.float64)
    A = _matrix(eigs)
    r = ls.spectral_density(A, runs=2, lanczos_steps=50, seed=1)
    for nodes in r.nodes:  # capped at p steps: the nodes are the eigenvalues
        assert np.allclose(sorted(nodes), eigs.numpy(), atol=1e-10)
    assert r.matvecs == 12


def test_real_hessian_density_and_plot(tmp_path):
    model = ref.make_mlp((5, 8, 3), seed=2)
    x, y = ref.make_classification_data(40, d=5, seed=3)
    loss = torch.nn.functional.cross_entropy
    obj = ls.Objective(model, loss, (x, y))
    H = ref.dense_hessian(model, loss, [(x, y)])
    ev = torch.linalg.eigvalsh(H)
    r = ls.spectral_density(obj, runs=8, lanczos_steps=20, seed=0)
    assert abs(r.trace - float(ev.sum())) <= 3 * r.trace_stderr
    all_nodes = np.concatenate([np.asarray(n) for n in r.nodes])
    assert all_nodes.min() >= float(ev[0]) - 1e-9 and all_nodes.max() <= float(ev[-1]) + 1e-9
    assert abs(all_nodes.max() - float(ev[-1])) < 1e-6  # extreme nodes converge first
    ax = r.plot(log=True)
    ax.figure.savefig(tmp_path / "d.png")
    r.save(tmp_path / "d.json")
    back = ls.load_result(tmp_path / "d.json")
    assert isinstance(back, ls.DensityResult) and torch.allclose(back.density, r.density)


def test_bad_inputs():
    A = _matrix(torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="runs"):
        ls.spectral_density(A, runs=0)
    with pytest.raises(ValueError, match="sigma"):
        ls.spectral_density(A, sigma=-1.0)
