"""Shared pytest configuration: GPU tests skip without CUDA; float64 default for references.

Cross-checks against peer libraries skip with ``pytest.importorskip`` where the peer is missing (the
README's test command installs none of the ``--no-deps`` peers).  With ``SHARPSCAPE_REQUIRE_PEERS=1``
(set by ``.ci/run`` after ``benchmarks/install_peers.sh``) such a skip -- of a whole module at
collection or of one test -- is turned into a failure naming the package and how to install it, so
that a cross-check cannot silently run nowhere."""

from __future__ import annotations

import os
import re

import pytest
import torch

# Tests never read the user's data directory: loaders get explicit paths (tmp_path files).
os.environ.pop("SHARPSCAPE_DATA", None)

# Two cores on CI: keep torch from oversubscribing them. Under pytest-xdist the cores are shared out
# between the workers, and the processes the tests start (OMP_NUM_THREADS) get the same share.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, os.cpu_count() or 1) // _WORKERS)
torch.set_num_threads(_THREADS)
if _WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)


@pytest.fixture
def one_thread():
    """One torch thread for the test (runner tests compare runs bit for bit and count steps): a
    module uses it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


REQUIRE_PEERS_ENV = "SHARPSCAPE_REQUIRE_PEERS"
_PEERS_SCRIPT = "bash benchmarks/install_peers.sh"
# top-level module -> (distribution on PyPI, how this project installs it)
INSTALL_HINTS = {
    "curvlinops": ("curvlinops-for-pytorch", _PEERS_SCRIPT),
    "safetensors": ("safetensors", _PEERS_SCRIPT),
    "backpack": ("backpack-for-pytorch", _PEERS_SCRIPT),
    "laplace": ("laplace-torch", _PEERS_SCRIPT),
    "hessian_eigenthings": ("hessian-eigenthings", _PEERS_SCRIPT),
    "pyhessian": ("PyHessian", _PEERS_SCRIPT),
    "loss_landscapes": ("loss-landscapes", _PEERS_SCRIPT),
    "torchmetrics": ("torchmetrics", _PEERS_SCRIPT),
    "lightning_utilities": ("lightning-utilities", _PEERS_SCRIPT),
    "lightning": ("lightning", _PEERS_SCRIPT),
    "transformers": ("transformers", _PEERS_SCRIPT),
    "accelerate": ("accelerate", _PEERS_SCRIPT),
    "ivon": ("ivon-opt", 'pip install -e ".[test]"'),
    "selenium": ("selenium", 'pip install -e ".[test]"'),
    "streamlit": ("streamlit", 'pip install -e ".[test]"'),
}
# pytest.importorskip's skip message: "could not import 'pkg.sub': No module named 'pkg'"
_IMPORTORSKIP = re.compile(r"could not import '([^']+)'(?::\s*(.*))?", re.S)


def peers_required() -> bool:
    """``SHARPSCAPE_REQUIRE_PEERS`` set to anything but empty / ``0``."""
    return os.environ.get(REQUIRE_PEERS_ENV, "").strip() not in ("", "0")


def missing_package_message(what: str, reason: str) -> str | None:
    """The failure text for a skip whose ``reason`` is ``pytest.importorskip``'s, else ``None``."""
    m = _IMPORTORSKIP.search(reason)
    if m is None:
        return None
    module, why = m.group(1), (m.group(2) or "").strip()
    # the package that is missing: the module ImportError names, else the imported one's top level
    named = re.search(r"No module named '([^']+)'", why)
    top = (named.group(1) if named else module).split(".")[0]
    dist, how = INSTALL_HINTS.get(top, (top, f"pip install {top}"))
    return (
        f"{what} was skipped because the optional package {top!r} (PyPI: {dist}) is not installed"
        f" -- {reason.strip()}.\n{REQUIRE_PEERS_ENV}=1 requires every cross-check to run: install it"
        f" with `{how}` (torch-based peers with pip install --no-deps), or unset {REQUIRE_PEERS_ENV}"
        " to let it skip."
    )


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: ...")
        return str(longrepr[2])
    return str(longrepr)


def _require(report, what: str) -> None:
    if not (report.skipped and peers_required()):
        return
    message = missing_package_message(what, _skip_reason(report))
    if message is not None:
        report.outcome = "failed"
        report.longrepr = message


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _require(outcome.get_result(), f"test module {collector.nodeid}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _require(outcome.get_result(), f"test {item.nodeid}")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def devices() -> list[str]:
    """Devices to run device-agnostic tests on: always CPU, plus CUDA when present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
