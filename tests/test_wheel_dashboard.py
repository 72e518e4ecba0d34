"""The dashboard really starts and listens on 127.0.0.1 only: from the checkout (``sharpscape
dashboard`` and the README's ``streamlit run app/Home.py``) and from a wheel installed in a fresh
virtual environment (``-m slow``: builds the wheel, installs torch first and then the wheel with the
``app`` extra, keeping torch; several minutes, most of it pip).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from sharpscape.dashboard import STREAMLIT_SETTINGS, streamlit_command

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("landscape", "optimizers", "toy_problems", "experiments", "sharpscape")
INSTALLED_AS = {"app": "sharpscape_app", "configs": "sharpscape_configs"}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process handling")


# ------------------------------------------------------------------------------- the wheel's contents
def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_and_data_directory_is_shipped():
    """``packages`` is listed by hand (app/ and configs/ are renamed): nothing may be missing."""
    cfg = _setuptools()
    want = set()
    for top in (*SHIPPED, *INSTALLED_AS):
        for d in [ROOT / top, *sorted((ROOT / top).rglob("*"))]:
            if not d.is_dir() or "__pycache__" in d.parts or not any(f.is_file() for f in d.iterdir()):
                continue
            if top in SHIPPED and not (d / "__init__.py").is_file():
                continue  # not a package of the library (nothing there is shipped)
            rel = d.relative_to(ROOT / top).parts
            want.add(".".join((INSTALLED_AS.get(top, top), *rel)))
    assert sorted(want - set(cfg["packages"])) == [], "add these to [tool.setuptools] packages"
    assert sorted(set(cfg["packages"]) - want) == [], "remove these from [tool.setuptools] packages"
    assert cfg["package-dir"] == {installed: top for top, installed in INSTALLED_AS.items()}
    data = cfg["package-data"]
    assert data["*"] == ["py.typed"] and all((ROOT / p / "py.typed").is_file() for p in SHIPPED)
    assert {"*.toml", "README.md"} <= set(data["sharpscape_configs"])


# --------------------------------------------------------------------------------- serving helpers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_listeners(port: int) -> set[str] | None:
    """Addresses listening on TCP ``port`` (Linux ``/proc/net/tcp*``), or None elsewhere."""
    found: set[str] = set()
    for name, size in (("tcp", 4), ("tcp6", 16)):
        path = Path("/proc/net") / name
        if not path.exists():
            return None
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(addr_hex)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found


def _outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(addr).is_loopback else addr


def _wait_for_http(url: str, proc: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    raise AssertionError(f"no answer from {url} within {timeout:.0f} s")


@contextlib.contextmanager
def _serving(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """Run the dashboard ``cmd`` (output in ``log``), stopped with SIGTERM on leaving."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    except BaseException:
        print(log.read_text(errors="replace")[-4000:])
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _check_served_on_loopback_only(proc: subprocess.Popen, port: int) -> None:
    assert _wait_for_http(f"http://127.0.0.1:{port}/_stcore/health", proc, timeout=180) == 200
    assert _wait_for_http(f"http://127.0.0.1:{port}/", proc, timeout=30) == 200
    listeners = _proc_listeners(port)
    if listeners is not None:
        assert listeners == {"127.0.0.1"}, f"port {port} listens on {listeners}"
    outside = _outside_address()
    if outside is not None:
        with socket.socket() as s, pytest.raises(OSError):  # refused: nothing listens there
            s.settimeout(5)
            s.connect((outside, port))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


# ------------------------------------------------------------------------- from the checkout
def test_sharpscape_dashboard_listens_on_loopback_only(tmp_path):
    port = _free_port()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "sharpscape", "dashboard", "--port", str(port)]
    log = tmp_path / "dashboard.log"
    with _serving(cmd, tmp_path, _env(PYTHONPATH=path), log) as proc:  # run from outside the repo
        _check_served_on_loopback_only(proc, port)
    assert f"note: dashboard at http://127.0.0.1:{port}/ (this machine only" in log.read_text()


def test_every_entry_point_gives_streamlit_the_same_settings():
    """``sharpscape dashboard`` (installed, run from anywhere) passes exactly the settings of the
    checkout's ``.streamlit/config.toml``, usage statistics off included."""
    raw = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    checkout = {f"{section}.{key}": value for section, keys in raw.items() for key, value in keys.items()}
    assert checkout == STREAMLIT_SETTINGS
    cmd = streamlit_command("Home.py", "127.0.0.1", 8501, 32)
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    expected = {f"--{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in checkout.items()}
    assert {k: flags[k] for k in expected} == expected
    assert flags["--browser.gatherUsageStats"] == "false" and flags["--server.headless"] == "true"


def test_readme_streamlit_command_listens_on_loopback_only(tmp_path):
    """``streamlit run app/Home.py`` in the repository: ``.streamlit/config.toml`` sets the address."""
    port = _free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "app/Home.py", "--server.port", str(port)]
    cmd += ["--server.headless", "true"]
    with _serving(cmd, ROOT, _env(), tmp_path / "streamlit.log") as proc:
        _check_served_on_loopback_only(proc, port)


# --------------------------------------------------------------------------- from a fresh wheel
def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, (
        f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    )
    return res


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_in_a_fresh_venv_serves_the_dashboard_on_loopback(tmp_path):
    started = time.monotonic()
    # 1. the wheel, built from a copy of the sources (the checkout gets no build/ or egg-info)
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*SHIPPED, *INSTALLED_AS):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(src),
        ]
    )
    (wheel,) = dist.glob("sharpscape-*.whl")
    # 2. a fresh venv: torch first (the local CPU build), then the wheel with the app extra
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    env = _env(PIP_DISABLE_PIP_VERSION_CHECK="1", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    _run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], env=env)
    version = "import torch; print(torch.__version__)"
    torch_before = _run([str(py), "-c", version], env=env).stdout.strip()
    pins = tmp_path / "constraints.txt"
    pins.write_text(f"torch=={torch_before.split('+')[0]}\n")  # pip may not replace the torch build
    _run([str(py), "-m", "pip", "install", "-q", "-c", str(pins), f"{wheel}[app]"], env=env)
    assert _run([str(py), "-c", version], env=env).stdout.strip() == torch_before
    # 3. from a directory outside the repository: the shipped files are used
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = str(bin_dir / "sharpscape")
    listing = _run([script, "run", "--list-configs"], cwd=elsewhere, env=env).stdout
    assert "site-packages" in listing and "digits_sam_vs_sgd" in listing
    dry = _run([script, "dashboard", "--dry-run"], cwd=elsewhere, env=env).stdout
    assert "site-packages/sharpscape_app/Home.py --server.address 127.0.0.1" in dry
    # the app's own imports (dashboard.*) resolve from site-packages: run Home.py once, headless
    probe = (
        "from streamlit.testing.v1 import AppTest\nfrom sharpscape.resources import app_home\n"
        "at = AppTest.from_file(str(app_home()), default_timeout=300).run()\n"
        "assert not at.exception, at.exception\nprint(app_home())\n"
    )
    assert "site-packages" in _run([str(py), "-c", probe], cwd=elsewhere, env=env).stdout
    port = _free_port()
    with _serving([script, "dashboard", "--port", str(port)], elsewhere, env, tmp_path / "dash.log") as proc:
        _check_served_on_loopback_only(proc, port)
    print(f"wheel test: {time.monotonic() - started:.0f} s")
