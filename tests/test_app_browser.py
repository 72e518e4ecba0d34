"""Real-browser test: start the dashboard server, open every page and the states that matter (each
playground problem, all optimizers at once on the playground and the network page, the
edge-of-stability preset) through their URLs in headless Chromium, and save a full-page screenshot
of each.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and selenium.
Run with ``python -m pytest -m browser``; screenshots go to ``$SCREENSHOT_DIR`` (default
``out/screenshots``), one PNG per state named after it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from dashboard import toy  # noqa: E402

#: state name -> (page path, query string); every page and the states the URL parameters select
STATES: dict[str, tuple[str, str]] = {
    "home": ("", ""),
    "playground": ("Optimizer_playground", ""),
    "playground_all_optimizers": ("Optimizer_playground", "optimizers=all"),
    **{
        f"playground_{p}": ("Optimizer_playground", f"problem={p}")
        for p in toy.playground_problems()[0]
        if p != "gaussian_mixture"  # the default: "playground" above
    },
    "smoothed": ("Smoothed_objectives", ""),
    "bayes": ("Bayesian_view", ""),
    "network": ("Network_landscape", "epochs=2"),
    "network_all_optimizers": ("Network_landscape", "optimizers=all&epochs=2"),
    "network_all_analyses": ("Network_landscape", "epochs=2&analyses=surface,spectrum,sharpness"),
    "experiments": ("Experiments", ""),
    "monitor": ("Curvature_monitor", ""),
    "monitor_edge_of_stability": ("Curvature_monitor", "preset=edge_of_stability"),
    "paths": ("Paths_between_minima", ""),
    "study": ("Flatness_study", ""),
}
#: a URL with values the page cannot use: a warning, the default view, no error
INVALID = ("Optimizer_playground", "problem=two_moons&optimizers=GD,nope")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH = 1500


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the README's two digits experiments (the clean config and 40 % label noise), in one runs/
EXPERIMENTS = {"digits_label_noise_40": ["data.label_noise=0.4"], "digits_sam_vs_sgd": []}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """The README's two experiments, shortened, in one directory: 3 methods x 2 seeds each; budget
    0.05 makes it 3 epochs on 5 % of the data."""
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from experiments.cli import main

    out = tmp_path_factory.mktemp("runs")
    overrides = ["train.epochs=60", "seeds=[0,1]", "budget=0.05", "evaluation.sharpness=[]", f"out_dir={out}"]
    config = str(ROOT / "configs" / "digits_sam_vs_sgd.toml")
    for name, extra in EXPERIMENTS.items():
        assert main(["run", config, f"name={name}", *extra, *overrides, "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def server(runs_dir):
    pytest.importorskip("selenium")
    port = _free_port()
    env = {**os.environ, "SHARPSCAPE_RUNS": str(runs_dir)}
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
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


@pytest.fixture
def browser():
    """A fresh headless Chromium per state: a renderer that hangs (seen once on a loaded machine)
    costs one state, not the rest of the run."""
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
        "--hide-scrollbars",
        f"--window-size={WIDTH},1100",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _wait_until_idle(driver, timeout: float = 500.0) -> None:
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


def _full_page_screenshot(driver, path: Path) -> None:
    """Grow the window to the height of streamlit's scrolling main area, save, and shrink back."""
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]')"
        " || document.querySelector('section.main');"
        "return Math.max(m ? m.scrollHeight : 0, document.body.scrollHeight);"
    )
    driver.set_window_size(WIDTH, min(int(height) + 120, 5000))
    time.sleep(1.5)  # plotly re-lays out its figures for the new size
    driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 1100)


def _alerts(driver, kind: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, f'[data-testid="stAlertContent{kind}"]')]


def _open(server: str, browser, page: str, query: str) -> None:
    browser.get(f"{server}/{page}" + (f"?{query}" if query else ""))
    _wait_until_idle(browser)


@pytest.mark.parametrize("state", list(STATES))
def test_state_renders_without_errors(server, browser, state):
    from selenium.webdriver.common.by import By

    page, query = STATES[state]
    _open(server, browser, page, query)
    out = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "out" / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    _full_page_screenshot(browser, out / f"{state}.png")
    exceptions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not exceptions, [e.text for e in exceptions]
    assert not _alerts(browser, "Error"), _alerts(browser, "Error")
    assert not _alerts(browser, "Warning"), _alerts(browser, "Warning")  # valid URLs, stable defaults
    assert browser.find_elements(By.CSS_SELECTOR, "h1")[0].text, "page has no title"
    if state != "home":
        assert browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"), "no Plotly figure rendered"
    # the address bar keeps what the URL asked for (the page writes its selection back)
    shown = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).query, keep_blank_values=True)
    for key, values in urllib.parse.parse_qs(query).items():
        assert shown.get(key) == values, (key, shown)


def test_invalid_url_warns_and_shows_the_default(server, browser):
    from selenium.webdriver.common.by import By

    _open(server, browser, *INVALID)
    out = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "out" / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    _full_page_screenshot(browser, out / "playground_invalid_url.png")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not _alerts(browser, "Error")
    text = "\n".join(_alerts(browser, "Warning"))
    assert "problem='two_moons'" in text and "Bayesian view" in text and "optimizers='nope'" in text
    shown = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).query)
    assert shown["problem"] == ["gaussian_mixture"] and shown["optimizers"] == ["GD"]
    assert browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")


def _page_text(driver) -> str:
    """The text of streamlit's main area, hidden parts (collapsed expanders) included."""
    return driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;return m.textContent;"
    )


def _chips(driver) -> list[str]:
    """The text of every multiselect chip on the page (hidden ones included)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "'[data-testid=\"stMultiSelectTagsContainer\"] [data-tag]')).map(e => e.getAttribute('aria-label'));"
    )


def _open_expanders(driver) -> None:
    """Open every collapsed expander (so its widgets show in the screenshot)."""
    from selenium.webdriver.common.by import By

    for summary in driver.find_elements(
        By.CSS_SELECTOR, '[data-testid="stExpander"] details:not([open]) > summary'
    ):
        summary.click()
    time.sleep(1.0)


def test_experiments_two_experiments_then_another_directory(server, browser, runs_dir, tmp_path):
    """Issue 29: after the README's two digits runs the page shows one table per experiment (no
    "same seed twice" box) and curves per (experiment, method); typing another directory replaces
    every chip and table (none of the previous directory's stays on screen)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    out = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "out" / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    _open(server, browser, "Experiments", "")
    _open_expanders(browser)
    _full_page_screenshot(browser, out / "experiments_two_experiments.png")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not _alerts(browser, "Error") and not _alerts(browser, "Warning")
    text = _page_text(browser)
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h3")]
    assert "Experiment digits_label_noise_40" in heads and "Experiment digits_sam_vs_sgd" in heads
    assert "twice" not in text and "same seed" not in text
    assert "Differs from the other experiments shown in: data.label_noise=0.4" in text
    assert "6 runs in 3 rows, 2 completed seed(s) per row" in text
    assert len(browser.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')) >= 3
    assert "digits_label_noise_40 · sgd" in text and "digits_sam_vs_sgd · sgd" in text  # curve legend
    chips = _chips(browser)
    assert (
        "digits_label_noise_40 (data.label_noise=0.4)" in chips and "digits_label_noise_40/sgd/seed1" in chips
    )

    other = tmp_path / "other"
    shutil.copytree(runs_dir / "digits_sam_vs_sgd", other / "digits_sam_vs_sgd")
    box = browser.find_element(By.CSS_SELECTOR, '[data-testid="stTextInput"] input')
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(str(other), Keys.ENTER)
    time.sleep(1.0)
    _wait_until_idle(browser)
    _open_expanders(browser)
    _full_page_screenshot(browser, out / "experiments_another_directory.png")
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not _alerts(browser, "Error")
    text = _page_text(browser)
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h3")]
    assert "Experiment digits_sam_vs_sgd" in heads and "Experiment digits_label_noise_40" not in heads
    chips = _chips(browser)
    assert chips and not any("label_noise" in c for c in chips), chips
    assert "digits_sam_vs_sgd/sgd/seed1" in chips and "digits_sam_vs_sgd/sgd/seed0" in chips
    assert "digits_label_noise_40" not in text
