"""Regenerate the README's screenshots of the exported report (headless Chromium via Playwright).

    python docs/screenshots/make.py [OUT_DIR]

Exports the report of tests/data/resnet50_v100_workers0.json.gz with ``save_html`` and shoots
its timeline at 1,400 px (light), at 360 px (dark, the width of JupyterLab's default window
with the file browser open) and its first finding's evidence at 800 px (dark). Needs
``/usr/bin/chromium`` and ``pip install playwright``; writes into ``docs/screenshots`` by default.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SHOTS = (  # (file, width, colour scheme, CSS selector of the element shot)
    ("timeline_light_1400.png", 1400, "light", ".gm-section.gm-timeline"),
    ("timeline_dark_360.png", 360, "dark", ".gm-section.gm-timeline"),
    ("evidence_dark_800.png", 800, "dark", "details.gm-finding[open]"),
)


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    import gpumagic
    from gpumagic.render.display import save_html

    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    report = gpumagic.analyze(str(REPO / "tests" / "data" / "resnet50_v100_workers0.json.gz"))
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        page_path = save_html(report, Path(tmp) / "report.html")
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        for name, width, scheme, selector in SHOTS:
            page = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=scheme)
            page.goto(page_path.as_uri())
            page.locator(selector).first.screenshot(path=str(out / name))
            page.close()
            print(out / name, (out / name).stat().st_size, "bytes")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
