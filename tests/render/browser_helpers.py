"""Shared pieces of the browser tests: a token-less Jupyter server (JupyterLab, and Notebook 7
when the ``notebook`` package is installed) on 127.0.0.1, Debian's Chromium through Playwright,
and measurements taken in the rendered page (visibility, clipping, contrast).

Needs ``/usr/bin/chromium`` and ``pip install jupyterlab notebook playwright``; the tests skip with
the reason when something is missing. Playwright's own browser download is not used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from nb_helpers import kernel_env

#: Screenshots and exported pages, for a person (or CI) to look at: ``GPUMAGIC_TEST_ARTIFACTS``,
#: else a folder in the system's temporary directory, never the checkout (the suite must leave
#: ``git status`` unchanged).
ARTIFACTS = Path(os.environ.get("GPUMAGIC_TEST_ARTIFACTS") or Path(tempfile.gettempdir()) / "gpumagic-test-artifacts")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SERVER_START_S = 60


#: ``GPUMAGIC_REQUIRE_BROWSER=1`` (set by .ci/run): a missing browser piece fails the run instead
#: of skipping the browser tests, so that CI cannot pass without running them.
REQUIRE_ENV = "GPUMAGIC_REQUIRE_BROWSER"


def skip_unless_ready(*modules: str) -> None:
    """At a browser test module's top: skip the module, with the reason, when something it needs
    is missing, or fail when :data:`REQUIRE_ENV` says the browser tests must run."""
    import pytest

    why = missing(*modules)
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but the browser tests cannot run: {why}", pytrace=False)
    pytest.skip(f"browser test: {why}", allow_module_level=True)


def missing(*modules: str) -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    for module in ("playwright", "jupyterlab", *modules):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install jupyterlab notebook playwright)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_lab_settings(settings_dir: Path) -> None:
    """No news fetch, no update check: nothing reaches for the network, no pop-ups."""
    path = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@contextlib.contextmanager
def jupyter_server(home: Path, root: Path):
    """JupyterLab's server on a free loopback port, serving ``root``; yields its URL.

    With Notebook 7 installed the same server also serves ``/notebooks/<path>``.
    """
    _quiet_lab_settings(home / "settings")
    port = free_port()
    env = {
        **kernel_env(),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True",
        "--LabApp.news_url=", "--LabApp.extension_manager=readonly", "--ServerApp.port_retries=0",
        "--ServerApp.disable_check_xsrf=True",  # loopback, token-less: lets the tests stop kernels over REST
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    log_path = home / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(url, proc, log_path)
        yield url
    finally:
        shutdown_kernels(url)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Jupyter server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the Jupyter server did not answer within {SERVER_START_S} s: {log.read_text()[-2000:]}")


def shutdown_kernels(url: str) -> None:
    """Stop every kernel of the server (the "kernel stopped" half of reopen-after-shutdown)."""
    try:
        with urllib.request.urlopen(f"{url}/api/kernels", timeout=5) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(f"{url}/api/kernels/{k['id']}", method="DELETE")
            urllib.request.urlopen(req, timeout=10).close()
    except urllib.error.HTTPError:
        raise  # the server refused: a test that relies on stopped kernels must not go on
    except OSError:
        pass  # the server is gone already


@contextlib.contextmanager
def chromium():
    """A headless Debian Chromium driven by Playwright; yields the browser."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def offline(page) -> list[str]:
    """Refuse every http(s) request of ``page`` (as with no network); returns the refused URLs."""
    refused: list[str] = []

    def handle(route):
        if route.request.url.startswith(("http://", "https://")):
            refused.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route("**/*", handle)
    return refused


# -- measurements in the page ---------------------------------------------------------------------

#: How many gpumagic report headers a person can see (live widget and static report alike).
VISIBLE_REPORTS_JS = """() => [...document.querySelectorAll('.gpumagic-report header')]
    .filter(h => h.checkVisibility() && h.getBoundingClientRect().height > 0).length"""

#: Visible text of the page that says a widget failed or is still loading.
WIDGET_ERROR_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output, .output_subarea')]
    .filter(o => o.checkVisibility() && /Error displaying widget|model not found|Loading widget/.test(o.innerText))
    .map(o => o.innerText.slice(0, 80))"""

#: Elements of the report whose box pokes out of the report to the right, outside a box that
#: scrolls on its own (a code block, a table's wrapper): text that a reader would lose.
CLIPPED_JS = """(sel) => {
  const out = [];
  for (const root of document.querySelectorAll(sel)) {
    if (!root.checkVisibility()) continue;
    const right = root.getBoundingClientRect().right + 1;
    for (const el of root.querySelectorAll('*')) {
      if (!el.checkVisibility() || el.closest('.gm-scroll, pre, .lm-TabBar')) continue;
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > right) out.push(el.tagName + '.' + el.className + ' ' + Math.round(r.right - right) + 'px');
    }
    if (root.scrollWidth > root.clientWidth + 1) out.push('report scrolls sideways by ' + (root.scrollWidth - root.clientWidth) + 'px');
  }
  return out.slice(0, 10);
}"""

#: WCAG 2 contrast of every text element of the report (HTML and SVG ``<text>``, whose colour is
#: its ``fill``) against the colour behind it (the first ancestor with an opaque background, alpha
#: composited), from getComputedStyle.
CONTRAST_JS = """(sel) => {
  const parse = c => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const lum = ([r, g, b]) => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const over = (top, under) => { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)).concat([1]); };
  const background = el => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let bg = [255, 255, 255, 1]; if (layers.length && layers[layers.length - 1][3] >= 1) bg = layers.pop();
    while (layers.length) bg = over(layers.pop(), bg); return bg; };
  const results = [];
  for (const root of document.querySelectorAll(sel)) {
    for (const el of root.querySelectorAll('*')) {
      if (!el.checkVisibility()) continue;
      const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
      if (!own) continue;
      // SVG text is painted with its fill, HTML text with its colour
      const paint = el instanceof SVGElement ? getComputedStyle(el).fill : getComputedStyle(el).color;
      const bg = background(el); const fg = over(parse(paint), bg);
      const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
      results.push({ratio: (a + 0.05) / (b + 0.05), text: el.textContent.trim().slice(0, 40), tag: el.tagName,
                    color: paint, bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')'});
    }
  }
  return results;
}"""


#: The timeline chart's text as a person sees it: each ``<text>``'s computed font size and whether
#: its box lies inside the chart horizontally (a lane label cut on the left would start before it).
TIMELINE_TEXT_JS = """() => [...document.querySelectorAll('svg.gm-tl')].filter(s => s.checkVisibility()).flatMap(svg => {
  const box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll('text')].filter(t => t.checkVisibility()).map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent.slice(0, 40), cls: t.getAttribute('class') || '', px: parseFloat(getComputedStyle(t).fontSize),
            inside: r.left >= box.left - 1 && r.right <= box.right + 1};
  });
})"""
