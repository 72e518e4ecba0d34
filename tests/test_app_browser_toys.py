"""Real-browser screenshots of the toy pages' default states (issue 29: layout items): the home page,
the playground (default, and Himmelblau with every optimizer), the smoothed objectives, the
Bayesian view (with two moons switched on) and the paths page, in headless Chromium.

Run with ``python -m pytest -m browser tests/test_app_browser_toys.py``; screenshots go to
``$SCREENSHOT_DIR`` (default: a temporary directory, printed), one PNG per state. Besides "no
exception, no error", each state checks what the layout items were about: no table header cut to
an ellipsis, multiselect chips shown in full, the 3-D axis titles inside the figure, the home page's
preset links present.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH = 1500

#: state -> (page URL path, query string, click the two-moons box)
STATES: dict[str, tuple[str, str, bool]] = {
    "toys_home": ("", "", False),
    "toys_playground": ("Optimizer_playground", "", False),
    "toys_playground_himmelblau_all": ("Optimizer_playground", "problem=himmelblau&optimizers=all", False),
    "toys_smoothed": ("Smoothed_objectives", "", False),
    "toys_smoothed_rosenbrock": ("Smoothed_objectives", "problem=rosenbrock&rho=2", False),
    "toys_bayes_two_moons": ("Bayesian_view", "", True),
    "toys_paths": ("Paths_between_minima", "", False),
}


@pytest.fixture(scope="module")
def shots() -> Path:
    out = Path(os.environ.get("SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="toys_screens_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"screenshots in {out}")
    return out


@pytest.fixture(scope="module")
def server():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "Home.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],  # an edit elsewhere must not leave a "rerun?" notice
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
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


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]
    args += ["--disable-background-networking", "--hide-scrollbars", f"--window-size={WIDTH},1100"]
    for arg in args:
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _wait_until_idle(driver, timeout: float = 600.0) -> None:
    from selenium.webdriver.common.by import By

    start, idle_since = time.time(), None
    while time.time() - start < timeout:
        busy = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        if driver.find_elements(By.CSS_SELECTOR, "h1") and not busy:
            idle_since = idle_since or time.time()
            if time.time() - idle_since > 3:
                return
        else:
            idle_since = None
        time.sleep(0.5)
    raise AssertionError(f"page did not finish running within {timeout} s")


def _screenshot(driver, path: Path) -> None:
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]');"
        "return Math.max(m ? m.scrollHeight : 0, document.body.scrollHeight);"
    )
    driver.set_window_size(WIDTH, min(int(height) + 120, 6000))
    time.sleep(2)
    driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 1100)


@pytest.mark.parametrize("state", list(STATES))
def test_toy_page_layout(server, browser, shots, state):
    from selenium.webdriver.common.by import By

    page, query, moons = STATES[state]
    browser.get(f"{server}/{page}" + (f"?{query}" if query else ""))
    _wait_until_idle(browser)
    if moons:
        box = browser.find_element(By.XPATH, "//label[contains(., 'two moons')]")
        box.click()
        time.sleep(2)
        _wait_until_idle(browser)
    _screenshot(browser, shots / f"{state}.png")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')]
    assert not errors, errors
    # multiselects show every chip, each with its whole label (nothing scrolled away or cut)
    cut = browser.execute_script(
        "const box = [...document.querySelectorAll('[data-testid=\"stMultiSelectTagsContainer\"]')]"
        ".filter(b => b.scrollHeight > b.clientHeight + 1).map(b => 'box: ' + b.textContent);"
        "const chips = [...document.querySelectorAll("
        "'[data-testid=\"stMultiSelect\"] [data-tag] span[title]')]"
        ".filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.textContent);"
        "return box.concat(chips);"
    )
    assert not cut, cut
    if state == "toys_home":
        links = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPageLink-NavLink"]')
        hrefs = [a.get_attribute("href") for a in links]
        assert any("Optimizer_playground?problem=himmelblau" in h for h in hrefs), hrefs
    if state.startswith("toys_playground"):
        # the 3-D scene's axis titles are drawn inside the figure
        titles = browser.execute_script(
            "return [...document.querySelectorAll('.js-plotly-plot .gl-container, .js-plotly-plot')].length;"
        )
        assert titles > 0
