"""Lesson 01 in JupyterLab in a real browser: headless Chromium (Debian's package) driven by
Playwright's Python API opens the notebook, runs every cell, and the ipywidgets explorer
renders and redraws its figure when the layer and head sliders move.

Skips, on one line saying why, where Playwright or a Chromium binary is missing (``.ci/run``
installs both: ``apt-get install chromium`` and ``pip install -e .[dev]``). Playwright never
downloads a browser here: it is handed the system binary (``executable_path``);
``CODEX_LAB_CHROMIUM`` names another one.

Why it used to stall (fixed here): it waited for ``.jp-Notebook-ExecutionIndicator
[data-status='idle']``, which JupyterLab shows *before* a kernel exists, then sent run-all
through ``page.evaluate`` and awaited the command's promise. Run-all sent before the
notebook's session is ready executes nothing and its promise never settles, and
``page.evaluate`` has no timeout, so the test hung forever, before any of its own timeouts
could fire (by hand one waits for the kernel before pressing run-all, so it worked). Now the
test waits for the session's kernel to be connected and idle, fires run-all without awaiting
it, and polls the notebook model (every code cell has an execution count, or one has an
error) under a timeout.

Screenshots go to ``build/test-artifacts/`` (``CODEX_LAB_ARTIFACTS`` overrides); with
``CODEX_LAB_UPDATE_SCREENSHOT=1`` the explorer's screenshot is also written to
``docs/lesson01_explorer.png`` (the README's picture).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/01_attention_patterns.ipynb"
pytestmark = pytest.mark.slow

# Timeouts are generous on purpose: the suite runs on 2 shared, busy cores, and a timeout
# here only bounds a failure (a pass takes ~60 s in all, under load). Each is in ms.
START_S = 120  # JupyterLab's server start: ~7 s idle; its import and extension scan slow down most under load
PAGE_MS = 120_000  # the lab's page, its ~10 MB of JavaScript and the notebook: ~10 s idle
KERNEL_MS = 120_000  # a Python kernel start and its websocket: ~5 s idle
RUN_MS = 300_000  # lesson 01's nine cells in fast mode: 10 s on 2 idle cores, 35 s seen under load
REDRAW_MS = 60_000  # one redraw of the explorer's figure: ~1 s idle (matplotlib, one 10x4 in figure)
ACTION_MS = 30_000  # anything else (a click, a key press, a screenshot)

# The session's kernel, the notebook's code cells and their errors, read from JupyterLab's
# own model (not the DOM, which may not hold cells scrolled out of view).
_STATE_JS = """(path) => {
    const app = window.jupyterapp;
    if (!app) return null;
    const panel = [...app.shell.widgets('main')].find(w => w.context && w.context.path === path);
    if (!panel || !panel.content || !panel.content.model) return null;
    const sc = panel.sessionContext, kernel = sc.session && sc.session.kernel;
    const cells = panel.content.model.cells, code = [];
    for (let i = 0; i < cells.length; i++) {
        const c = cells.get(i);
        if (c.type !== 'code') continue;
        const outs = c.outputs.toJSON();
        const err = outs.find(o => o.output_type === 'error');
        code.push({count: c.executionCount,
                   error: err ? err.ename + ': ' + err.evalue : null,
                   stderr: outs.filter(o => o.output_type === 'stream' && o.name === 'stderr')
                               .map(o => o.text).join('')});
    }
    return {ready: sc.isReady, status: kernel ? kernel.status : null,
            connection: kernel ? kernel.connectionStatus : null, code: code};
}"""
# JupyterLab settings for a quiet, deterministic page: no autosave (nothing writes the copy
# while the test reads it), every cell in the DOM, no news/update fetch (no network).
_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                       "checkForUpdates": False},
}


def _find_browser() -> tuple[str | None, str]:
    """(Chromium's path, "") or (None, the one-line reason to skip)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None, "Playwright is not installed: pip install -e '.[dev]' (or pip install playwright)"
    named = os.environ.get("CODEX_LAB_CHROMIUM")
    if named:
        exe = shutil.which(named)
        if exe is None:
            return None, f"CODEX_LAB_CHROMIUM={named} is not an executable file"
        return exe, ""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name), ""
    return None, "no Chromium binary: apt-get install chromium (Debian), or set CODEX_LAB_CHROMIUM=/path/to/chrome"


def test_a_missing_browser_is_a_one_line_skip_reason(monkeypatch) -> None:
    """The skip path, cheaply: a named binary that does not exist gives a reason naming it."""
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the other reason)")
    monkeypatch.setenv("CODEX_LAB_CHROMIUM", "/nonexistent/chromium")
    exe, reason = _find_browser()
    assert exe is None
    assert "/nonexistent/chromium" in reason and "\n" not in reason
    monkeypatch.setenv("CODEX_LAB_CHROMIUM", sys.executable)  # any executable file is taken as given
    assert _find_browser() == (sys.executable, "")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Chromium's path; skips the module's browser test (one line, why) when there is none."""
    exe, reason = _find_browser()
    if exe is None:
        pytest.skip(reason)
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it and its kernel), SIGKILL it if still there after 10 s:
    jupyter_server can hang at exit on AnyIO's non-daemon worker threads (seen with 2.21)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """A headless JupyterLab on a free loopback port with a random token: (base url, token).

    It serves a temporary copy of the lesson with its own settings folder, so the repository
    is never written (the jupytext contents manager writes the paired .py beside the copy).
    """
    work = tmp_path_factory.mktemp("lab")
    (work / "notebooks").mkdir()
    shutil.copy(ROOT / NOTEBOOK, work / NOTEBOOK)
    for rel, value in _SETTINGS.items():
        f = work / "settings" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "CODEX_LAB_FAST": "1", "CODEX_LAB_PROGRESS": "0", "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={work / 'settings'}", f"--LabApp.workspaces_dir={work / 'workspaces'}",
           "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = work / "jupyterlab.log"
    with open(log_path, "wb") as log:  # a file, not a pipe: an unread pipe fills and blocks the server
        # its own process group, so that stopping it also stops its kernel
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start within {START_S} s: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, token
    finally:
        _stop(proc)
        shutil.copy(log_path, _artifacts() / "jupyterlab.log")


def _artifacts() -> Path:
    d = Path(os.environ.get("CODEX_LAB_ARTIFACTS", ROOT / "build" / "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _img_digest(explorer) -> str:
    """sha256 of the PNG bytes the explorer's output shows (its <img> is a data: URL)."""
    src = explorer.locator("img").first.get_attribute("src")
    assert src and src.startswith("data:image/png;base64,"), f"not an inline PNG: {str(src)[:80]}"
    return hashlib.sha256(base64.b64decode(src.split(",", 1)[1])).hexdigest()


def _move(page, explorer, slider: int, name: str) -> None:
    """Press → on the explorer's `slider`-th slider (labelled `name`) and wait for the redraw."""
    sliders = explorer.locator(".widget-slider")
    assert sliders.nth(slider).locator(".widget-label").inner_text() == name
    old = explorer.locator("img").first.get_attribute("src")
    sliders.nth(slider).locator(".noUi-handle").first.press("ArrowRight")
    # the output is cleared, then the new figure drawn: wait for an <img> with another src
    page.wait_for_function(
        "([el, old]) => { const i = el.querySelector('img'); return !!i && i.src.length > 100 && i.src !== old; }",
        arg=[explorer.element_handle(), old], timeout=REDRAW_MS)
    assert sliders.nth(slider).locator(".widget-readout").inner_text().strip() == "1"


def test_lesson01_explorer_in_jupyterlab(chromium, lab) -> None:
    from playwright.sync_api import sync_playwright

    url, token = lab
    out = _artifacts()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(ACTION_MS)
        try:
            page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}", timeout=PAGE_MS)
            page.wait_for_function(f"() => ({_STATE_JS})({json.dumps(NOTEBOOK)}) !== null", timeout=PAGE_MS)
            # the session's kernel must be connected and idle before run-all (see the docstring)
            page.wait_for_function(
                f"""() => {{ const s = ({_STATE_JS})({json.dumps(NOTEBOOK)});
                    return s.ready && s.status === 'idle' && s.connection === 'connected'; }}""",
                timeout=KERNEL_MS)
            # fire and forget: the command's promise is not awaited (page.evaluate has no timeout)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            # done: every code cell ran (run-all stops at an error, so an error also ends the wait)
            page.wait_for_function(
                f"""() => {{ const s = ({_STATE_JS})({json.dumps(NOTEBOOK)});
                    return s.status === 'idle' && (s.code.every(c => c.count !== null) || s.code.some(c => c.error)); }}""",
                timeout=RUN_MS, polling=500)
            state = page.evaluate(f"() => ({_STATE_JS})({json.dumps(NOTEBOOK)})")
            errors = [f"cell {i}: {c['error']}" for i, c in enumerate(state["code"]) if c["error"]]
            assert not errors, f"lesson 01 raised in JupyterLab: {errors}"
            assert len(state["code"]) >= 5 and all(c["count"] is not None for c in state["code"])
            assert not any("Traceback" in c["stderr"] for c in state["code"]), state["code"]
            # the ipywidgets explorer: three sliders (layer, head, snippet) and a figure
            explorer = page.locator(".widget-interact").first
            explorer.wait_for(state="visible", timeout=REDRAW_MS)
            explorer.scroll_into_view_if_needed()
            sliders = explorer.locator(".widget-slider")
            assert sliders.count() == 3
            assert [sliders.nth(i).locator(".widget-label").inner_text() for i in range(3)] == \
                ["layer", "head", "snippet"]
            explorer.locator("img").first.wait_for(state="visible", timeout=REDRAW_MS)
            start = _img_digest(explorer)
            explorer.screenshot(path=str(out / "lesson01_explorer_layer0_head0.png"))
            # layer 0 -> 1, then head 0 -> 1: each must redraw a different figure
            _move(page, explorer, 0, "layer")
            after_layer = _img_digest(explorer)
            assert after_layer != start, "moving the layer slider did not change the figure"
            explorer.screenshot(path=str(out / "lesson01_explorer_layer1_head0.png"))
            _move(page, explorer, 1, "head")
            after_head = _img_digest(explorer)
            assert after_head not in (start, after_layer), "moving the head slider did not change the figure"
            explorer.screenshot(path=str(out / "lesson01_explorer.png"))
            page.screenshot(path=str(out / "lesson01_page.png"))
            if os.environ.get("CODEX_LAB_UPDATE_SCREENSHOT") == "1":
                shutil.copy(out / "lesson01_explorer.png", ROOT / "docs" / "lesson01_explorer.png")
        except Exception:
            try:
                page.screenshot(path=str(out / "lesson01_failure.png"), timeout=ACTION_MS)
            except Exception:  # the failure itself is what matters; a screenshot is a bonus
                pass
            raise
        finally:
            browser.close()
