"""A real browser: JupyterLab on loopback, headless Chromium (Debian's) driven by Playwright.

A notebook runs ``%load_ext gpumagic`` and ``%%gpuprofile`` on a small CPU training loop whose
data loader is slow; the test asserts that the live widget shows the checklist and, in its
Timeline tab, the timeline image, that the static HTML is not shown beside it, and that zooming
to a step redraws the image through the kernel. It also opens the exported HTML file.
Screenshots go to ``artifacts/`` (gitignored).

Needs: ``/usr/bin/chromium`` (``apt-get install chromium``), ``pip install jupyterlab playwright``.
Playwright's own browser download is not used. Skipped, with the reason, when any is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from render_helpers import analysed

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
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
VIEWPORT = {"width": 1400, "height": 1000}
SERVER_START_S = 60
#: Importing torch, profiling the loop and analysing it in a fresh kernel on 2 slow cores.
CELL_RUN_MS = 180_000

PROFILED_CELL = """\
%%gpuprofile --label cpu-demo -o rep
import time
import torch
from torch.utils.data import DataLoader, Dataset

class SlowDataset(Dataset):
    def __len__(self):
        return 384
    def __getitem__(self, i):
        time.sleep(0.0005)  # a slow decode: the main process waits for each batch
        return torch.randn(256), i % 10

model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(SlowDataset(), batch_size=32):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    for module in ("playwright", "jupyterlab"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install jupyterlab playwright)"
    return None


if _missing():
    pytest.skip(_missing(), allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook() -> dict:
    code = ["%load_ext gpumagic", PROFILED_CELL, 'rep.save_html("exported.html")\nrep.finding_ids']
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
            for i, src in enumerate(code)
        ],
    }


def _quiet_lab_settings(settings_dir: Path) -> None:
    """No news fetch, no update check: nothing reaches for the network, no pop-ups."""
    path = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A token-less JupyterLab on 127.0.0.1 serving a temp root holding the notebook."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    root.mkdir()
    (root / "gpumagic_report.ipynb").write_text(json.dumps(_notebook()))
    _quiet_lab_settings(home / "settings")
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    env.pop("GPUMAGIC_WIDGETS", None)
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
        "--ServerApp.port_retries=0",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    log = (home / "server.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(url, proc, home / "server.log")
        yield url, root
    finally:
        _shutdown_kernels(url)
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
            pytest.fail(f"JupyterLab exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s: {log.read_text()[-2000:]}")


def _shutdown_kernels(url: str) -> None:
    try:
        with urllib.request.urlopen(f"{url}/api/kernels", timeout=5) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(f"{url}/api/kernels/{k['id']}", method="DELETE")
            urllib.request.urlopen(req, timeout=10).close()
    except OSError:
        pass  # the server is going down anyway; terminate() below stops what is left


@pytest.fixture(autouse=True)
def _screenshot_on_failure(request):
    """Keep what the browser showed when a test fails (artifacts/<test>_failure.png); the
    ``rep_call`` attribute is set by the hook in this directory's conftest.py."""
    yield
    report = getattr(request.node, "rep_call", None)
    page = request.node.funcargs.get("page")
    if page is not None and report is not None and report.failed:
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}_failure.png"))


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport=VIEWPORT)
        finally:
            browser.close()


def _run_all_cells(page) -> None:
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle'; }",
        timeout=SERVER_START_S * 1000,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _scroll_into_view(page, locator) -> None:
    locator.scroll_into_view_if_needed()
    page.wait_for_timeout(300)


def test_live_widget_shows_checklist_and_timeline(lab, page):
    from gpumagic.report.model import Report

    if not hasattr(Report, "_repr_mimebundle_"):
        pytest.skip("Report._repr_mimebundle_ is not wired to gpumagic.render.display yet")
    url, root = lab
    page.goto(f"{url}/lab/tree/gpumagic_report.ipynb")
    _run_all_cells(page)

    widget = page.locator(".gpumagic-widget")
    widget.wait_for(state="visible", timeout=CELL_RUN_MS)
    header = widget.locator(".gpumagic-report header").text_content()
    assert "Median step" in header and "Top finding:" in header

    finding_title = page.get_by_text("The training loop waits for the data loader").first
    finding_title.wait_for(state="visible", timeout=10_000)
    assert widget.get_by_text("Why it matters").first.is_visible()
    assert page.locator(".gpumagic-static").count() == 0, "the static HTML is shown beside the widget"
    _scroll_into_view(page, widget)
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_checklist.png"))

    widget.get_by_role("tab", name="Timeline").click()
    image = widget.locator("img.widget-image")
    image.wait_for(state="visible", timeout=10_000)
    assert image.evaluate("img => img.complete && img.naturalWidth") >= 1000
    before = image.get_attribute("src")
    widget.locator("select").first.select_option(index=2)  # zoom to the second recorded step
    page.wait_for_function("([img, src]) => img.getAttribute('src') !== src", arg=[image.element_handle(), before],
                           timeout=60_000)
    _scroll_into_view(page, image)
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_timeline.png"))

    exported = root / "exported.html"
    deadline = time.monotonic() + 30
    while not exported.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert exported.exists(), "the notebook's rep.save_html() wrote nothing"
    shutil.copy(exported, ARTIFACTS / "notebook_export.html")


def test_exported_html_renders_on_its_own(page, tmp_path):
    from gpumagic.render.display import save_html

    path = save_html(analysed("resnet50_v100_workers0"), tmp_path / "report.html")
    page.goto(path.as_uri())
    page.get_by_role("heading", name="Checklist — what to change, biggest gain first").wait_for(state="visible")
    timeline = page.locator("img.gm-timeline")
    assert timeline.evaluate("img => img.complete && img.naturalWidth") >= 1000
    assert page.locator("details.gm-finding[open]").count() == 1
    page.screenshot(path=str(ARTIFACTS / "exported_report.png"), full_page=True)
