"""Real-browser test: start the dashboard server and load every page in headless Chromium.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and selenium.
Run with ``python -m pytest -m browser``; screenshots go to ``$SCREENSHOT_DIR`` (default
``out/screenshots``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "home": "",
    "playground": "Optimizer_playground",
    "smoothed": "Smoothed_objectives",
    "bayes": "Bayesian_view",
    "network": "Network_landscape",
}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium")
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app" / "Home.py"),
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--browser.gatherUsageStats",
            "false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the streamlit server did not start within 60 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1500,1100",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def _wait_until_idle(driver, timeout: float = 400.0) -> None:
    """Wait for the page title and for streamlit's "running" indicator to stay gone for 3 s."""
    from selenium.webdriver.common.by import By

    start = time.time()
    idle_since = None
    while time.time() - start < timeout:
        has_title = bool(driver.find_elements(By.CSS_SELECTOR, "h1"))
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        if has_title and not running:
            idle_since = idle_since or time.time()
            if time.time() - idle_since > 3:
                return
        else:
            idle_since = None
        time.sleep(0.5)
    raise AssertionError(f"page did not finish running within {timeout} s")


@pytest.mark.parametrize("page", list(PAGES))
def test_page_loads_without_errors(server, browser, page):
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/{PAGES[page]}")
    _wait_until_idle(browser)
    out = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "out" / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(out / f"{page}.png"))
    exceptions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    errors = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    assert not exceptions, [e.text for e in exceptions]
    assert not errors, [e.text for e in errors]
    title = browser.find_elements(By.CSS_SELECTOR, "h1")[0].text
    assert title, "page has no title"
    if page != "home":
        assert browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"), "no Plotly figure rendered"
