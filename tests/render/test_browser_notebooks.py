"""Every place a notebook is opened shows exactly one report: a real browser on each path.

One Jupyter server (JupyterLab, plus Notebook 7 from the ``notebook`` package) runs a cheap
notebook: ``%load_ext gpumagic``, then ``display()`` of a report of the bundled example trace
(analysed without torch), displayed exactly as ``%%gpuprofile`` displays its report. Paths:

- JupyterLab and Notebook 7 with a live kernel: the live widget shows, the static report under it
  is hidden, the tab names are whole at an 800 px window, nothing is clipped;
- the same notebook saved, its kernel shut down, and reopened (a new kernel starts; ipywidgets
  then has no model for the saved view): the static report shows, no "model not found";
- ``jupyter nbconvert --execute --to html`` (which saves the widget state) opened with every
  network request refused, and ``nbconvert`` of the notebook saved from JupyterLab;
- a GitHub-like page: the saved notebook's ``text/html`` outputs through the sanitiser of
  ``nb_helpers.py`` (no scripts, no styles, no classes, no widget state).

On each, the top finding's title is asserted visible in the rendered DOM, one report header is
visible (never two, never none), and no widget error text is visible. Screenshots go to
``$GPUMAGIC_TEST_ARTIFACTS`` (see browser_helpers.py).
"""

from __future__ import annotations

import json
import time

import pytest
from browser_helpers import (
    ARTIFACTS,
    CLIPPED_JS,
    CONTRAST_JS,
    TIMELINE_TEXT_JS,
    VISIBLE_REPORTS_JS,
    WIDGET_ERROR_JS,
    chromium,
    offline,
    shutdown_kernels,
    skip_unless_ready,
)
from nb_helpers import github_like, nbconvert_execute_html, nbconvert_html, notebook, read_notebook

pytestmark = pytest.mark.browser

skip_unless_ready("notebook", "nbconvert")

TOP_FINDING = "The training loop waits for the data loader"
TAB_TITLES = ("Checklist", "Timeline", "Breakdown", "Kernels", "Memory", "Notes")
WIDTH = 800
KERNEL_IDLE_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle'; }"""
#: ipywidgets' error text is in the DOM (visible or not): the reopened notebook hit "model not found".
MODEL_NOT_FOUND_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .some(o => /Error displaying widget: model not found/.test(o.textContent))"""
#: A cheap notebook's cells run in a fresh kernel on 2 slow cores.
RUN_MS = 150_000


FOLDER = "notebooks"


@pytest.fixture(scope="module")
def server(shared_lab):
    """The session's Jupyter server (conftest.py, shared with the other browser modules) and this
    module's folder in it, holding its notebooks."""
    root = shared_lab.folder(FOLDER)
    for name in ("lab.ipynb", "nb7.ipynb", "widths.ipynb"):
        (root / name).write_text(json.dumps(notebook()))
    yield shared_lab, root
    shutdown_kernels(shared_lab.url)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _page(browser):
    return browser.new_page(viewport={"width": WIDTH, "height": 1000})


def _run_all(page) -> None:
    page.wait_for_function(KERNEL_IDLE_JS, timeout=RUN_MS)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _save(page, path, timeout_s: float = 30) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "gm-static-" in path.read_text(encoding="utf-8"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{path.name} was not saved with its outputs")


def _settle(page, ms: int = 3000) -> None:
    """Let the widget manager finish (restore, 'model not found') before measuring."""
    page.wait_for_timeout(ms)


def _assert_one_report(page, where: str) -> None:
    assert page.evaluate(VISIBLE_REPORTS_JS) == 1, f"{where}: a person must see exactly one report"
    assert page.evaluate(WIDGET_ERROR_JS) == [], f"{where}: widget error text is visible"
    assert page.get_by_text(TOP_FINDING).filter(visible=True).count() >= 1, f"{where}: the top finding is not visible"


def _live(page, url: str, shot: str) -> None:
    page.goto(url)
    _run_all(page)
    widget = page.locator(".gpumagic-widget")
    widget.wait_for(state="visible", timeout=RUN_MS)
    page.get_by_text("after the report").first.wait_for(state="visible", timeout=RUN_MS)
    _settle(page, 1500)
    _assert_one_report(page, shot)
    assert page.locator(".gpumagic-static").count() == 1 and not page.locator(".gpumagic-static").is_visible()
    labels = widget.locator(".lm-TabBar-tabLabel")
    assert labels.all_inner_texts() == list(TAB_TITLES)
    cut = labels.evaluate_all("els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)")
    assert cut == [], f"tab names cut off: {cut}"
    assert page.evaluate(CLIPPED_JS, ".gpumagic-widget") == []
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"{shot}_live_{WIDTH}.png"))
    widget.get_by_role("tab", name="Timeline").click()
    chart = widget.locator("svg.gm-tl")
    chart.wait_for(state="visible", timeout=10_000)
    assert chart.get_attribute("aria-label").startswith("Timeline")
    texts = page.evaluate(TIMELINE_TEXT_JS)
    assert texts and min(t["px"] for t in texts) >= 10 and all(t["inside"] for t in texts), texts[:5]
    widget.get_by_role("tab", name="Checklist").click()
    if shot == "jupyterlab":
        _dark_theme_contrast(page, widget)


def _dark_theme_contrast(page, widget) -> None:
    """Switch JupyterLab to its Dark theme: the live report follows it, text stays ≥ 4.5:1."""
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    _settle(page, 1500)
    results = page.evaluate(CONTRAST_JS, ".gpumagic-widget")
    widget.get_by_role("tab", name="Timeline").click()  # the SVG's labels follow the theme too
    _settle(page, 500)
    results += page.evaluate(CONTRAST_JS, ".gpumagic-widget")
    widget.get_by_role("tab", name="Checklist").click()
    background = widget.locator(".gpumagic-report").first.evaluate("e => getComputedStyle(e).backgroundColor")
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"jupyterlab_live_dark_{WIDTH}.png"))
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
    assert background == "rgb(17, 17, 17)"  # JupyterLab Dark's --jp-layout-color0: no white card on a dark page
    assert len(results) > 20
    low = [f"{r['ratio']:.2f}:1 {r['text']!r}" for r in results if r["ratio"] < 4.5]
    assert low == [], f"low contrast in JupyterLab Dark: {low[:8]}"


def _reopen(browser, url: str, shot: str) -> None:
    page = _page(browser)
    try:
        page.goto(url)
        page.locator(".gpumagic-report header").first.wait_for(state="visible", timeout=RUN_MS)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=RUN_MS)  # a new kernel: the saved view's model is gone
        page.wait_for_function(MODEL_NOT_FOUND_JS, timeout=30_000)  # ipywidgets wrote its error: the case is real
        _settle(page)
        _assert_one_report(page, f"{shot} reopened")
        assert page.locator(".gpumagic-widget").count() == 0
        page.locator(".gpumagic-static").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{shot}_reopened.png"))
    finally:
        page.close()


@pytest.fixture(scope="module")
def saved_from_lab(server, browser):
    """Run the notebook live in JupyterLab, check it, save it, stop its kernel."""
    lab, root = server
    page = _page(browser)
    try:
        _live(page, lab.lab_url(FOLDER, "lab.ipynb"), "jupyterlab")
        _save(page, root / "lab.ipynb")
    finally:
        page.close()
    shutdown_kernels(lab.url)
    return root / "lab.ipynb"


def test_jupyterlab_live_shows_the_widget_only(saved_from_lab):
    nb = read_notebook(saved_from_lab)
    kinds = [set(o.get("data", {})) for o in nb["cells"][1]["outputs"]]
    assert kinds == [{"text/html", "text/plain"}, {"application/vnd.jupyter.widget-view+json", "text/plain"}]


def test_jupyterlab_reopened_after_shutdown_shows_the_static_report(server, browser, saved_from_lab):
    lab, _ = server
    _reopen(browser, lab.lab_url(FOLDER, "lab.ipynb"), "jupyterlab")


def test_notebook7_live_then_reopened_after_shutdown(server, browser):
    lab, root = server
    page = _page(browser)
    try:
        _live(page, f"{lab.url}/notebooks/{FOLDER}/nb7.ipynb", "notebook7")
        _save(page, root / "nb7.ipynb")
    finally:
        page.close()
    shutdown_kernels(lab.url)
    _reopen(browser, f"{lab.url}/notebooks/{FOLDER}/nb7.ipynb", "notebook7")


def _open_offline(browser, path, shot: str) -> list[str]:
    page = _page(browser)
    try:
        refused = offline(page)
        page.goto(path.as_uri())
        page.get_by_text(TOP_FINDING).filter(visible=True).first.wait_for(state="visible", timeout=30_000)
        _settle(page, 1000)
        _assert_one_report(page, shot)
        page.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
        return refused
    finally:
        page.close()


def test_nbconvert_execute_html_offline(browser, tmp_path):
    src = tmp_path / "executed.ipynb"
    src.write_text(json.dumps(notebook()))
    out = nbconvert_execute_html(src, tmp_path)
    assert "application/vnd.jupyter.widget-state+json" in out.read_text(encoding="utf-8")
    refused = _open_offline(browser, out, "nbconvert_execute_offline")
    assert refused, "the page asked for nothing on the network: the offline check proved nothing"


def test_nbconvert_of_a_notebook_saved_from_jupyterlab(browser, saved_from_lab, tmp_path):
    out = nbconvert_html(saved_from_lab, tmp_path)
    _open_offline(browser, out, "nbconvert_saved_from_jupyterlab")


def test_github_like_renderer(browser, saved_from_lab, tmp_path):
    page_path = tmp_path / "github_like.html"
    page_path.write_text(github_like(read_notebook(saved_from_lab)), encoding="utf-8")
    page = _page(browser)
    try:
        offline(page)
        page.goto(page_path.as_uri())
        title = page.get_by_text(TOP_FINDING).first
        title.wait_for(state="visible", timeout=10_000)
        assert page.get_by_role("heading", name="Checklist — what to change, biggest gain first").is_visible()
        assert page.locator("script, style, [class]").count() == 0
        page.screenshot(path=str(ARTIFACTS / "github_like.png"), full_page=True)
    finally:
        page.close()


#: (theme, width of the widget's output) of the live widget, light first: the theme changes once,
#: not per case. 360 px is issue 26's narrow output (JupyterLab's 800 px window with the file
#: browser open gives about 370); the window is sized to give it. 244 px: where a review found
#: "step 5" half outside the chart.
LIVE_CASES = [("light", 244), ("light", 360), ("light", 1400), ("dark", 360), ("dark", 1400)]
LAB_THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


@pytest.fixture(scope="module")
def live_widget(server, browser):
    """One page of JupyterLab with the cheap notebook run live, kept open for every width and
    theme below (each test sets its own, so none depends on another's), the side bars closed."""
    lab, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(lab.lab_url(FOLDER, "widths.ipynb"))
        _run_all(page)
        # the file browser closed, as a person on a narrow window would (open, it keeps its 250 px
        # and leaves a 360 px window's notebook 32 px)
        page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); window.jupyterapp.shell.collapseRight(); }")
        page.locator(".gpumagic-widget").wait_for(state="visible", timeout=RUN_MS)
        page.get_by_text("after the report").first.wait_for(state="visible", timeout=RUN_MS)
        yield page
    finally:
        page.close()


def _set_theme(page, theme: str) -> None:
    light = "true" if theme == "light" else "false"
    if page.evaluate("() => document.body.dataset.jpThemeLight") != light:
        page.evaluate("t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", LAB_THEMES[theme])
        page.wait_for_function("v => document.body.dataset.jpThemeLight === v", arg=light, timeout=30_000)


@pytest.mark.parametrize(("theme", "width"), LIVE_CASES, ids=[f"{t}-{w}" for t, w in LIVE_CASES])
def test_live_widget_reads_at_each_width_and_theme(live_widget, theme, width):
    """Issue 26 in the live JupyterLab widget: in a 360 px and a 1,400 px output, in Light and Dark, nothing of the widget reaches past
    its right edge, the timeline's labels are at least 10 px and inside the chart, and every text
    has a contrast of at least 4.5:1 on both the Checklist and the Timeline tab."""
    page = live_widget
    _set_theme(page, theme)
    widget = page.locator(".gpumagic-widget")
    window = width
    for _ in range(2):  # the notebook's margins and prompts take the same pixels at any width
        page.set_viewport_size({"width": window, "height": 1000})
        _settle(page, 300)
        window += width - round(widget.evaluate("w => w.getBoundingClientRect().width"))
    widget.get_by_role("tab", name="Checklist").click()
    _settle(page, 800)  # the theme's CSS and the new width applied
    box = widget.evaluate("w => { const r = w.getBoundingClientRect(); return [r.left, r.right, r.width, innerWidth]; }")
    clipped = page.evaluate(CLIPPED_JS, ".gpumagic-widget")
    contrast = page.evaluate(CONTRAST_JS, ".gpumagic-widget")
    widget.get_by_role("tab", name="Timeline").click()
    widget.locator("svg.gm-tl").wait_for(state="visible", timeout=10_000)
    _settle(page, 300)
    texts = page.evaluate(TIMELINE_TEXT_JS)
    contrast += page.evaluate(CONTRAST_JS, ".gpumagic-widget")
    clipped += page.evaluate(CLIPPED_JS, ".gpumagic-widget")
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"jupyterlab_live_{theme}_{width}.png"))
    widget.get_by_role("tab", name="Checklist").click()
    where = f"live widget, {theme}, {width} px"
    assert abs(box[2] - width) <= 2, f"{where}: the output is {box[2]} px wide"
    assert box[0] >= 0 and box[1] <= box[3], f"{where}: the widget [left, right, width, window] {box} is outside the window"
    assert clipped == [], f"{where}: {clipped}"
    assert texts and min(t["px"] for t in texts) >= 10 and all(t["inside"] for t in texts), f"{where}: {texts[:5]}"
    assert len(contrast) > 20  # the page really was measured
    low = [f"{r['ratio']:.2f}:1 {r['text']!r} ({r['color']} on {r['bg']})" for r in contrast if r["ratio"] < 4.5]
    assert low == [], f"{where}: low contrast: {low[:8]}"


#: The zoomable chart's state in the page: the range the kernel drew (``data-lo``/``data-hi``, ns
#: after the window's start), the request it answers, the axis' tick labels and the title.
ZOOM_STATE_JS = """() => { const w = document.querySelector('.gm-zoom .gm-zoom-chart');
  if (!w) return null;
  return {lo: Number(w.dataset.lo), hi: Number(w.dataset.hi), answered: Number(w.dataset.answered),
          ticks: [...w.querySelectorAll('.gm-tl-ticklabel')].map(t => t.textContent),
          title: w.querySelector('.gm-tl-title').textContent}; }"""


def _zoom_state_after(page, before: dict, answered: int) -> dict:
    """The chart once the kernel has drawn the answer to request ``answered`` (the wheel's or the
    drag's), or once a kernel-side redraw changed the range (a window button)."""
    page.wait_for_function(
        """([b, n]) => { const w = document.querySelector('.gm-zoom .gm-zoom-chart');
          return !!w && Number(w.dataset.answered) >= n && (Number(w.dataset.lo) !== b.lo || Number(w.dataset.hi) !== b.hi); }""",
        arg=[before, answered], timeout=30_000)
    return page.evaluate(ZOOM_STATE_JS)


def test_live_timeline_zooms_on_the_wheel_pans_on_a_drag_and_zooms_to_a_findings_window(live_widget):
    """Issue 26's wheel/drag zoom in JupyterLab: anywidget's front end is loaded (the chart is its
    view); a wheel over the chart zooms in around the pointer and the kernel re-draws the axis
    for the new range; a drag pans to later times; a finding's window button zooms to that
    window and outlines it."""
    page = live_widget
    _set_theme(page, "light")
    page.set_viewport_size({"width": 1100, "height": 1000})
    widget = page.locator(".gpumagic-widget")
    widget.get_by_role("tab", name="Timeline").click()
    widget.locator("svg.gm-tl").first.wait_for(state="visible", timeout=30_000)
    assert widget.locator(".gm-zoom").count() == 1, "the chart is not anywidget's view: is its labextension loaded?"
    chart = widget.locator(".gm-zoom svg.gm-tl")
    start = page.evaluate(ZOOM_STATE_JS)
    full = start["hi"] - start["lo"]
    box = chart.bounding_box()
    x, y = box["x"] + box["width"] * 0.75, box["y"] + 60
    page.mouse.move(x, y)
    page.mouse.wheel(0, -400)  # towards the reader: zoom in, around the pointer
    zoomed = _zoom_state_after(page, start, 1)
    span = zoomed["hi"] - zoomed["lo"]
    assert span < full / 2 and zoomed["ticks"] != start["ticks"] and zoomed["title"] != start["title"], zoomed
    pointer_t = start["lo"] + 0.75 * full  # the time under the pointer stays under it
    assert abs(zoomed["lo"] + 0.75 * span - pointer_t) < 0.02 * full, (zoomed, pointer_t)
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - 120, y, steps=6)
    page.mouse.move(x - 240, y, steps=6)
    page.mouse.up()
    panned = _zoom_state_after(page, zoomed, 2)
    assert panned["lo"] > zoomed["lo"] and abs((panned["hi"] - panned["lo"]) - span) <= 2, (zoomed, panned)
    assert panned["ticks"] != zoomed["ticks"]
    widget.locator("select").nth(1).select_option(label="\u2716 High \u00b7 The training loop waits for the data loader")
    window_button = widget.locator(".widget-button", has_text=" ms").last  # the finding's last window
    window_button.wait_for(state="visible", timeout=30_000)
    before = page.evaluate(ZOOM_STATE_JS)
    window_button.click()
    shown = _zoom_state_after(page, before, 2)
    band = widget.locator(".gm-zoom rect.gm-hl.gm-hl-on").first
    band.wait_for(state="visible", timeout=10_000)
    b, c = band.bounding_box(), chart.bounding_box()
    assert shown["hi"] - shown["lo"] < full / 2
    # the window with half its length as margin each side: the band is the middle half of the chart
    assert c["x"] - 1 <= b["x"] and b["x"] + b["width"] <= c["x"] + c["width"] + 1 and b["width"] >= 0.3 * c["width"], (b, c)
    # hovering a bar inside the outlined window still names its event (the band lets the pointer through)
    hover = page.evaluate("""([x, y]) => { const e = document.elementFromPoint(x, y);
      const t = e && e.closest('.gm-zoom') && e.querySelector(':scope > title'); return t ? t.textContent : null; }""",
                          [b["x"] + b["width"] / 2, b["y"] + b["height"] - 8])
    assert hover and " \u00b7 main thread \u00b7 " in hover, hover  # name · duration · lane · category
    widget.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_live_zoomed.png"))
    widget.locator("select").nth(1).select_option(label="nothing")
    widget.get_by_role("button", name="whole window").click()
    widget.get_by_role("tab", name="Checklist").click()
