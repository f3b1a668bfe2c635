"""A real browser: JupyterLab on loopback, headless Chromium (Debian's) driven by Playwright.

A notebook runs ``%load_ext gpumagic`` and ``%%gpuprofile`` on a small CPU training loop whose
data loader is slow; the test asserts that the live widget shows the checklist and, in its
Timeline tab, the SVG timeline with labels of at least 10 px, that the static report is hidden
under it, and that zooming to a step and the zoom-in button redraw it through the kernel. It also opens the exported HTML file.
Screenshots go to ``$GPUMAGIC_TEST_ARTIFACTS`` (default: ``gpumagic-test-artifacts`` in the temporary folder).

Needs: ``/usr/bin/chromium`` (``apt-get install chromium``), ``pip install jupyterlab playwright``
(see browser_helpers.py). Skipped, with the reason, when any is missing.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
from browser_helpers import (
    ARTIFACTS,
    CLIPPED_JS,
    SERVER_START_S,
    TIMELINE_TEXT_JS,
    VISIBLE_REPORTS_JS,
    chromium,
    shutdown_kernels,
    skip_unless_ready,
)
from nb_helpers import notebook
from render_helpers import analysed

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1400, "height": 1000}
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


skip_unless_ready()


def _notebook() -> dict:
    return notebook(("%load_ext gpumagic", PROFILED_CELL, 'rep.save_html("exported.html")\nrep.finding_ids'))


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The session's JupyterLab (conftest.py), with this module's notebook in a folder of its own."""
    root = shared_lab.folder("browser")
    (root / "gpumagic_report.ipynb").write_text(json.dumps(_notebook()))
    yield shared_lab.lab_url("browser", "gpumagic_report.ipynb"), root
    shutdown_kernels(shared_lab.url)


@pytest.fixture(autouse=True)
def _screenshot_on_failure(request):
    """Keep what the browser showed when a test fails (ARTIFACTS/<test>_failure.png); the
    ``rep_call`` attribute is set by the hook in this directory's conftest.py."""
    yield
    report = getattr(request.node, "rep_call", None)
    page = request.node.funcargs.get("page")
    if page is not None and report is not None and report.failed:
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}_failure.png"))


@pytest.fixture(scope="module")
def page():
    with chromium() as browser:
        yield browser.new_page(viewport=VIEWPORT)


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
    page.goto(url)
    _run_all_cells(page)

    widget = page.locator(".gpumagic-widget")
    widget.wait_for(state="visible", timeout=CELL_RUN_MS)
    header = widget.locator(".gpumagic-report header").text_content()
    assert "Median step" in header and "Top finding:" in header

    # Which finding leads depends on the machine: the slow loader on an idle one, the saturated
    # host when other processes keep the cores busy. The checklist must show whichever the header names.
    top_title = widget.locator(".gpumagic-report header .gm-top b").text_content()
    assert top_title
    finding_title = widget.get_by_text(top_title).first
    finding_title.wait_for(state="visible", timeout=10_000)
    assert widget.get_by_text("Why it matters").first.is_visible()
    assert page.evaluate(VISIBLE_REPORTS_JS) == 1, "the static report is shown beside the widget"
    _scroll_into_view(page, widget)
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_checklist.png"))

    widget.get_by_role("tab", name="Timeline").click()
    chart = widget.locator("svg.gm-tl")
    chart.wait_for(state="visible", timeout=10_000)
    sizes = page.evaluate(TIMELINE_TEXT_JS)
    assert sizes and min(t["px"] for t in sizes) >= 10 and all(t["inside"] for t in sizes), sizes[:5]
    changed = ("label => { const s = document.querySelector('.gpumagic-widget svg.gm-tl');"
               " return s && s.getAttribute('aria-label') !== label; }")
    before = chart.get_attribute("aria-label")
    widget.locator("select").first.select_option(index=2)  # zoom to the second recorded step
    page.wait_for_function(changed, arg=before, timeout=60_000)
    before = widget.locator("svg.gm-tl").get_attribute("aria-label")
    widget.get_by_role("button", name="+ zoom in").click()  # the kernel redraws half the range
    page.wait_for_function(changed, arg=before, timeout=60_000)
    _scroll_into_view(page, widget.locator("svg.gm-tl"))
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_timeline.png"))
    # JupyterLab's default 800 px window with the file browser open: an output about 370 px wide
    page.set_viewport_size({"width": 800, "height": 1000})
    page.wait_for_timeout(800)
    output_px = widget.evaluate("w => w.getBoundingClientRect().width")
    narrow = page.evaluate(TIMELINE_TEXT_JS)
    clipped = page.evaluate(CLIPPED_JS, ".gpumagic-widget")
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_timeline_800.png"))
    page.set_viewport_size(VIEWPORT)
    assert output_px < 600 and narrow and min(t["px"] for t in narrow) >= 10, (output_px, narrow[:5])
    assert all(t["inside"] for t in narrow) and clipped == [], clipped

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
    assert page.locator("svg.gm-tl text.gm-tl-lane").count() >= 3  # the vector timeline, labelled
    assert page.locator("details.gm-finding[open]").count() == 1
    page.screenshot(path=str(ARTIFACTS / "exported_report.png"), full_page=True)
