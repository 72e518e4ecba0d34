"""``SHARPSCAPE_REQUIRE_PEERS=1`` (``tests/conftest.py``, set by ``.ci/run`` after the peers are
installed): a skip caused by a missing optional package -- ``pytest.importorskip`` of a whole module
at collection or inside one test -- becomes a failure that names the package and how to install it;
without the variable (or with ``0``) it stays a skip, and other skips are never touched.

The hooks run in a pytest session of their own (``pytester``) on tiny generated test files, with this
project's ``tests/conftest.py`` as their conftest.  The last tests check the registry behind the
message against the files that install the packages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import INSTALL_HINTS, REQUIRE_PEERS_ENV, missing_package_message

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
ABSENT = "sharpscape_absent_peer_pkg"  # a package that exists nowhere

MODULE_SKIP = f"""
import pytest

pytest.importorskip("{ABSENT}.sub")


def test_never_runs_without_the_package():
    assert False
"""

TEST_SKIPS = """
import sys

import pytest


def test_peer_missing_inside_a_test(monkeypatch):
    monkeypatch.setitem(sys.modules, "curvlinops", None)  # curvlinops made uninstalled
    pytest.importorskip("curvlinops")
    assert False


def test_other_skip_reasons_stay_skips():
    pytest.skip("needs CUDA (no GPU on this machine)")


def test_present_package_runs():
    json = pytest.importorskip("json")
    assert json.loads("[1, 2]") == [1, 2]
"""


@pytest.fixture
def session(pytester, monkeypatch):
    """Run pytest in-process on generated files with this project's conftest, the variable set to
    ``value`` (``None``: unset)."""
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())

    def run(files: dict[str, str], value: str | None):
        if value is None:
            monkeypatch.delenv(REQUIRE_PEERS_ENV, raising=False)
        else:
            monkeypatch.setenv(REQUIRE_PEERS_ENV, value)
        pytester.makepyfile(**files)
        return pytester.runpytest_inprocess("-rA", "-p", "no:cacheprovider")

    return run


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_a_missing_package_skips_the_module(session, value):
    result = session({"test_peer_module": MODULE_SKIP}, value)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([f"*could not import '{ABSENT}.sub'*"])


def test_required_a_module_skipped_as_a_whole_is_a_collection_error(session):
    result = session({"test_peer_module": MODULE_SKIP}, "1")
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert (
        f"test module test_peer_module.py was skipped because the optional package {ABSENT!r}"
        f" (PyPI: {ABSENT}) is not installed" in out
    )
    assert f"install it with `pip install {ABSENT}`" in out
    assert f"{REQUIRE_PEERS_ENV}=1 requires every cross-check to run" in out


def test_without_the_variable_a_missing_package_skips_one_test(session):
    result = session({"test_peer_tests": TEST_SKIPS}, None)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK


def test_required_a_test_skipped_for_a_missing_peer_fails_and_names_its_install(session):
    result = session({"test_peer_tests": TEST_SKIPS}, "1")
    # only the missing package fails: the GPU skip stays a skip, the present package passes
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "FAILED test_peer_tests.py::test_peer_missing_inside_a_test" in out
    assert re.search(r"SKIPPED \[1\] test_peer_tests\.py:\d+: needs CUDA \(no GPU on this machine\)", out)
    assert (
        "test test_peer_tests.py::test_peer_missing_inside_a_test was skipped because the optional"
        " package 'curvlinops' (PyPI: curvlinops-for-pytorch) is not installed" in out
    )
    assert "install it with `bash benchmarks/install_peers.sh`" in out


def test_message_names_the_missing_top_level_package_not_the_submodule():
    reason = (
        "Skipped: could not import 'torchmetrics.functional.classification': No module named 'torchmetrics'"
    )
    msg = missing_package_message("test t", reason)
    assert msg.startswith(
        "test t was skipped because the optional package 'torchmetrics' (PyPI: torchmetrics)"
    )
    assert "`bash benchmarks/install_peers.sh`" in msg
    # the package the ImportError names wins over the imported module (a dependency of a peer)
    reason = "Skipped: could not import 'torchmetrics': No module named 'lightning_utilities'"
    assert "'lightning_utilities' (PyPI: lightning-utilities)" in missing_package_message("t", reason)
    assert missing_package_message("t", "Skipped: needs CUDA") is None


# ---------------------------------------------------------------------- the registry vs the installers
ALWAYS_INSTALLED = {"torch", "scipy", "numpy", "optimizers", "landscape", "toy_problems", "experiments"}


def _importorskipped() -> set[str]:
    """Top-level packages the test modules importorskip (the generated files above excluded)."""
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        for name in re.findall(r"""importorskip\(\s*["']([\w.]+)["']""", path.read_text()):
            found.add(name.split(".")[0])
    return found


def test_every_importorskipped_package_is_installed_by_the_test_extra_or_the_peer_script():
    """Each optional package a test importorskips has an install hint, and the file the hint names
    installs it: ``benchmarks/install_peers.sh`` (the ``--no-deps`` peers) or the ``test`` extra of
    ``pyproject.toml`` (installed by the README's command)."""
    found = _importorskipped()
    # the packages the reviewer found skipped are among those seen (the scan reads the real files)
    assert {"curvlinops", "hessian_eigenthings", "pyhessian", "torchmetrics", "ivon"} <= found
    script = (ROOT / "benchmarks" / "install_peers.sh").read_text().lower()
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*?)^\]", pyproject, re.S | re.M).group(1).lower()
    for top in sorted(found - ALWAYS_INSTALLED):
        assert top in INSTALL_HINTS, (
            f"{top}: add it to INSTALL_HINTS in tests/conftest.py and install it in CI"
        )
        dist, how = INSTALL_HINTS[top]
        if "install_peers.sh" in how:
            assert f'"{dist.lower()}==' in script or f'"{dist.lower()}>=' in script, (top, dist)
        else:
            assert f'"{dist.lower()}' in test_extra, (top, dist)


def test_ci_requires_the_peers_where_it_installs_them():
    """``.ci/run``: after ``install_peers.sh`` the slow tests and every module that importorskips run
    with ``SHARPSCAPE_REQUIRE_PEERS=1``; the README's command before it runs without the variable."""
    text = (ROOT / ".ci" / "run").read_text().splitlines()
    lines = [ln.strip() for ln in text if not ln.lstrip().startswith("#")]
    readme_cmd = 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q'
    readme = next(i for i, ln in enumerate(lines) if ln.startswith(readme_cmd))
    peers = lines.index("bash benchmarks/install_peers.sh")
    assert readme < peers
    required = [ln for ln in lines[peers:] if ln.startswith(f"{REQUIRE_PEERS_ENV}=1 python -m pytest")]
    assert any("-m slow" in ln for ln in required), required
    cross = [ln for ln in required if '-m "not slow and not browser"' in ln]
    assert cross and cross[0].endswith(" $cross_checks"), required
    assert 'cross_checks=$(grep -l "importorskip" tests/test_*.py)' in lines[peers:]
    assert not any(REQUIRE_PEERS_ENV in ln for ln in lines[:peers])
