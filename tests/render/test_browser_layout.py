"""Any width, any theme, measured in a real browser on the static pages (cheap: no kernel).

Pages: the saved report (``save_html``) and the saved comparison, which follow the reader's
``prefers-color-scheme``; and the same reports inside nbconvert's ``lab`` template, which carries
JupyterLab's own CSS and its Light or Dark theme variables (``--jp-*``) — the styling a report
meets in JupyterLab and Notebook 7. Each page is shown at 360, 800 and 1,400 px in both themes:

- nothing inside a report reaches past its right edge except inside a box that scrolls on its own
  (code blocks, tables), and the page never scrolls sideways;
- every piece of text has a contrast of at least 4.5:1 (WCAG 2 AA) against what is behind it,
  computed from ``getComputedStyle`` in the rendered page.

Screenshots: ``$GPUMAGIC_TEST_ARTIFACTS/layout_<page>_<theme>_<width>.png``.
"""

from __future__ import annotations

import itertools

import pytest
from browser_helpers import ARTIFACTS, CLIPPED_JS, CONTRAST_JS, TIMELINE_TEXT_JS, chromium, skip_unless_ready
from render_helpers import analysed

pytestmark = pytest.mark.browser

skip_unless_ready()

nbformat = pytest.importorskip("nbformat")
nbconvert = pytest.importorskip("nbconvert")

WIDTHS = (360, 800, 1400)
THEMES = ("light", "dark")
#: WCAG 2 AA for body text.
MIN_CONTRAST = 4.5
#: Smallest computed font size of the timeline's labels at 100 % zoom (issue 26).
MIN_TIMELINE_FONT_PX = 10


def _comparison():
    from gpumagic.tuning.comparison import compare

    before, after = analysed("resnet50_v100_workers0"), analysed("resnet50_v100_workers4")
    return compare(before, after), after


def _tuning():
    from gpumagic.capture.dataloader import TuneConfig, TuneResult, TuneRow

    rows = [TuneRow(TuneConfig(w, p), batches=40, seconds=2.0, batches_per_s=b, samples_per_s=b * 64, startup_s=0.2)
            for w, p, b in ((0, False, 20.0), (2, True, 48.5), (4, True, 61.2))]
    return TuneResult(rows=rows, batch_size=64, notes=["measured on 2 cores"], elapsed_s=6.1)


def _fragments() -> dict[str, str]:
    from gpumagic.render.comparison import render_fragment
    from gpumagic.render.html import report_html

    comparison, after = _comparison()
    return {
        "report": report_html(analysed("resnet50_v100_workers0")),
        "comparison": render_fragment(comparison.to_dict(), full_report_html=report_html(after)),
        "tuner": _tuning()._repr_mimebundle_()["text/html"],
    }


def _notebook_page(fragment: str, theme: str) -> str:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("%%gpuprofile\n...")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": fragment, "text/plain": "report"})]
    nb.cells = [cell]
    body, _ = nbconvert.HTMLExporter(theme=theme).from_notebook_node(nb)
    return body


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{(page, kind): path}: saved documents and nbconvert lab pages of each fragment."""
    from gpumagic.render.page import document

    root = tmp_path_factory.mktemp("pages")
    out = {}
    for kind, fragment in _fragments().items():
        path = root / f"document_{kind}.html"
        path.write_text(document(kind, fragment), encoding="utf-8")
        out[("document", kind, None)] = path
        for theme in THEMES:
            path = root / f"notebook_{kind}_{theme}.html"
            path.write_text(_notebook_page(fragment, theme), encoding="utf-8")
            out[("notebook", kind, theme)] = path
    return out


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _open(browser, pages, where: str, kind: str, theme: str, width: int):
    page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=theme)
    path = pages[(where, kind, None if where == "document" else theme)]
    page.goto(path.as_uri())
    page.locator(".gpumagic-report").first.wait_for(state="visible")
    return page


@pytest.mark.parametrize("where", ["document", "notebook"])
@pytest.mark.parametrize("kind", ["report", "comparison", "tuner"])
def test_nothing_is_clipped_at_any_width(browser, pages, where, kind):
    for theme in THEMES:
        for width in WIDTHS:
            page = _open(browser, pages, where, kind, theme, width)
            try:
                for details in page.locator("details.gm-full").all():  # the collapsed report, opened
                    details.evaluate("d => d.open = true")
                clipped = page.evaluate(CLIPPED_JS, ".gpumagic-report")
                sideways = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
                page.screenshot(path=str(ARTIFACTS / f"layout_{where}_{kind}_{theme}_{width}.png"), full_page=True)
            finally:
                page.close()
            assert clipped == [], f"{where}/{kind}, {theme}, {width} px: {clipped}"
            if where == "document":  # nbconvert's own page has fixed-width prompts of its own
                assert sideways <= 0, f"{where}/{kind}, {theme}, {width} px: the page scrolls sideways by {sideways} px"


@pytest.mark.parametrize("where", ["document", "notebook"])
@pytest.mark.parametrize("kind", ["report", "comparison", "tuner"])
@pytest.mark.parametrize("theme", THEMES)
def test_text_contrast_is_at_least_4_5_to_1(browser, pages, where, kind, theme):
    page = _open(browser, pages, where, kind, theme, 800)
    try:
        for details in page.locator("details").all():
            details.evaluate("d => d.open = true")
        results = page.evaluate(CONTRAST_JS, ".gpumagic-report")
    finally:
        page.close()
    assert len(results) > 20  # the page really was measured
    low = [r for r in results if r["ratio"] < MIN_CONTRAST]
    assert low == [], f"{where}/{kind}, {theme}: " + "; ".join(
        f"{r['ratio']:.2f}:1 {r['tag']} {r['text']!r} ({r['color']} on {r['bg']})" for r in low[:8])


@pytest.mark.parametrize(("where", "theme", "red"), [("document", "light", "rgb(207, 34, 46)"),
                                                     ("notebook", "dark", "rgb(248, 81, 73)")])
def test_severity_stripes_are_coloured_in_the_rendered_page(browser, pages, where, theme, red):
    page = _open(browser, pages, where, "report", theme, 800)
    try:
        stripes = page.locator("details.gm-finding").evaluate_all(
            "els => els.map(e => [e.className, getComputedStyle(e).borderLeftColor])")
    finally:
        page.close()
    assert [c for cls, c in stripes if "gm-sev-high" in cls] and all(c == red for cls, c in stripes if "gm-sev-high" in cls)
    assert len({c for _, c in stripes}) > 1  # high, medium and low differ: not one grey for all


@pytest.mark.parametrize("where", ["document", "notebook"])
def test_timeline_labels_read_at_every_width_and_a_window_link_highlights_its_band(browser, pages, where):
    """The vector timeline at 360/800/1,400 px in both themes: every label (lanes, ticks, steps)
    at least 10 px and inside the chart (no lane label cut), the page not scrolling sideways; then
    a click on a finding's window link scrolls to the chart and shows that window's band."""
    for theme in THEMES:
        for width in WIDTHS:
            page = _open(browser, pages, where, "report", theme, width)
            try:
                texts = page.evaluate(TIMELINE_TEXT_JS)
                sideways = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
                link = page.locator("a.gm-win").first
                target = link.get_attribute("href")[1:]
                band = page.locator(f"[id='{target}']")
                hidden = band.evaluate("e => getComputedStyle(e).opacity")
                link.click()
                page.wait_for_function("id => location.hash === '#' + id", arg=target)
                shown = band.evaluate("e => getComputedStyle(e).opacity")
                in_view = band.evaluate("e => { const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; }")
                if width == 360:
                    page.screenshot(path=str(ARTIFACTS / f"timeline_{where}_{theme}_{width}.png"))
            finally:
                page.close()
            lanes = [t for t in texts if "gm-tl-lane" in t["cls"]]
            assert lanes and any(t["text"].startswith("GPU0") for t in lanes), texts[:5]
            small = [t for t in texts if t["px"] < MIN_TIMELINE_FONT_PX]
            assert small == [], f"{where}, {theme}, {width} px: labels under {MIN_TIMELINE_FONT_PX} px: {small[:4]}"
            cut = [t["text"] for t in texts if not t["inside"]]
            assert cut == [], f"{where}, {theme}, {width} px: labels cut by the chart's edge: {cut[:4]}"
            if where == "document":
                assert sideways <= 0, f"{theme}, {width} px: the page scrolls sideways by {sideways} px"
            assert (hidden, shown) == ("0", "1") and in_view, f"{where}, {theme}, {width} px: the window link did not show its band"


@pytest.fixture(scope="module")
def job_page(tmp_path_factory):
    """The job's self-contained HTML page (``Job.to_html``) of 4 A100 ranks with a straggler and a
    missing rank, built from tests/data as tests/jobs/test_job_render.py builds it."""
    from jobbuilder import DELAY_US, JITTER_US, STRAGGLER, build_job

    from gpumagic.jobs import analyze_job

    root = tmp_path_factory.mktemp("job")
    paths = build_job(root / "ranks", ranks=4, straggler=STRAGGLER, delay_us=DELAY_US, jitter_us=JITTER_US)
    job = analyze_job([*map(str, paths), str(root / "missing" / "rank4.json.gz")], jobs=1, label="nightly")
    path = root / "job.html"
    path.write_text(job.to_html(), encoding="utf-8")
    return path, len(job.ranks)


#: Per rank row of the job's table: the boxes of its cells, and whether the column headers show.
JOB_TABLE_JS = """() => { const t = document.querySelector('table.gm-stack');
  return {head: t.tHead.checkVisibility(), rows: [...t.tBodies[0].rows].map(tr => [...tr.cells].map(td => {
    const r = td.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, label: getComputedStyle(td, '::before').content}; }))}; }"""


@pytest.mark.parametrize("theme", THEMES)
def test_job_page_at_360_px_stacks_its_rank_table_and_reads(browser, job_page, theme):
    """Issue 26 on the job's HTML page at 360 px: the per-rank table stacks (no column headers,
    one card per rank, each cell under the one before it and labelled with its column), nothing
    reaches past the report's edge, the page does not scroll sideways, every text is ≥ 4.5:1."""
    path, ranks = job_page
    page = browser.new_page(viewport={"width": 360, "height": 900}, color_scheme=theme)
    try:
        page.goto(path.as_uri())
        page.locator(".gpumagic-report").first.wait_for(state="visible")
        for details in page.locator("details").all():
            details.evaluate("d => d.open = true")
        table = page.evaluate(JOB_TABLE_JS)
        clipped = page.evaluate(CLIPPED_JS, ".gpumagic-report")
        sideways = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        results = page.evaluate(CONTRAST_JS, ".gpumagic-report")
        page.screenshot(path=str(ARTIFACTS / f"layout_job_{theme}_360.png"), full_page=True)
    finally:
        page.close()
    assert not table["head"] and len(table["rows"]) == ranks, table
    for cells in table["rows"]:
        assert all(b["top"] >= a["bottom"] - 1 for a, b in itertools.pairwise(cells)), f"{theme}: a rank's cells side by side: {cells}"
        assert all(c["label"] not in ("none", "normal", "") for c in cells), f"{theme}: a stacked cell does not name its column: {cells}"
    assert clipped == [], f"job, {theme}, 360 px: {clipped}"
    assert sideways <= 0, f"job, {theme}, 360 px: the page scrolls sideways by {sideways} px"
    assert len(results) > 20
    low = [r for r in results if r["ratio"] < MIN_CONTRAST]
    assert low == [], f"job, {theme}: " + "; ".join(
        f"{r['ratio']:.2f}:1 {r['tag']} {r['text']!r} ({r['color']} on {r['bg']})" for r in low[:8])
