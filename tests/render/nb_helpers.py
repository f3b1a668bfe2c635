"""Notebooks for the display tests: one that a kernel runs cheaply (the bundled example trace,
analysed without torch), the outputs a live kernel publishes, and ``nbconvert --execute``.

Also the GitHub-like sanitiser the static paths are checked against (see :func:`github_like`).
"""

from __future__ import annotations

import html.parser
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Cells of the cheap notebook: load the extension, then display a report of the bundled example
#: trace (analysed offline, no torch), exactly as a ``%%gpuprofile`` cell displays its report.
CHEAP_CELLS = (
    "%load_ext gpumagic",
    "import gpumagic\nimport gpumagic.examples\nrep = gpumagic.analyze(gpumagic.examples.trace_path())\ndisplay(rep)",
    "print('after the report')",
)


def notebook(cells=CHEAP_CELLS) -> dict:
    """An nbformat 4.5 notebook with code cells ``cells`` and no outputs."""
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
    }


def kernel_env() -> dict[str, str]:
    """The environment for kernels and Jupyter servers: this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("GPUMAGIC_WIDGETS", None)
    return env


def nbconvert_execute_html(src: Path, out_dir: Path, timeout_s: int = 240) -> Path:
    """``jupyter nbconvert --execute --to html`` (nbconvert saves the widget state it sees)."""
    cmd = [sys.executable, "-m", "nbconvert", "--execute", "--to", "html", f"--ExecutePreprocessor.timeout={timeout_s}",
           "--output-dir", str(out_dir), str(src)]
    done = subprocess.run(cmd, env=kernel_env(), capture_output=True, text=True, timeout=timeout_s + 60)
    assert done.returncode == 0, done.stderr[-3000:]
    return out_dir / (src.stem + ".html")


def nbconvert_html(src: Path, out_dir: Path) -> Path:
    """``jupyter nbconvert --to html`` of a saved notebook, without executing it."""
    cmd = [sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out_dir), str(src)]
    done = subprocess.run(cmd, env=kernel_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return out_dir / (src.stem + ".html")


# -- a GitHub-like renderer -----------------------------------------------------------------------

#: Elements dropped with their content. GitHub's renderers sanitise HTML "aggressively removing
#: things that could harm you ... such as script tags, inline-styles, and class or id attributes"
#: (github/markup README; the allowlist is html-pipeline's SanitizationFilter). Emulated here, on
#: the strict side: no <script>, <style>, <iframe>, <object>, <embed>, <form>, <input>, <link>,
#: <meta>, <svg>; no ``class``, ``id``, ``style`` or ``on*`` attributes; ``src``/``href`` only
#: with http(s) or relative URLs (so ``data:`` images are dropped, leaving their ``alt`` text);
#: no widget state and no widget views. Outputs without ``text/html`` show their ``text/plain``.
DROPPED = {"script", "style", "iframe", "object", "embed", "form", "input", "link", "meta", "svg", "button", "select"}
VOID = {"br", "hr", "img", "wbr", "col", "area", "source"}
KEPT_ATTRS = {"href", "src", "alt", "title", "open", "colspan", "rowspan", "align"}


class _Sanitiser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.out: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in DROPPED:
            self.skip += tag not in VOID
            return
        if self.skip:
            return
        kept = []
        for name, value in attrs:
            if name not in KEPT_ATTRS or (value is None and name != "open"):
                continue
            if name in ("href", "src") and not (value.startswith(("http://", "https://")) or ("://" not in value
                                               and not value.startswith(("data:", "javascript:")))):
                continue
            kept.append(name if value is None else f'{name}="{html.escape(value, quote=True)}"')
        if tag == "img" and not any(k.startswith("src=") for k in kept):
            alt = dict(attrs).get("alt") or ""
            self.out.append(f"<span>[image: {html.escape(alt)}]</span>")
            return
        self.out.append(f"<{tag}{''.join(' ' + k for k in kept)}>")

    def handle_endtag(self, tag):
        if tag in DROPPED:
            self.skip = max(0, self.skip - 1)
            return
        if not self.skip and tag not in VOID:
            self.out.append(f"</{tag}>")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)

    def handle_entityref(self, name):
        if not self.skip:
            self.out.append(f"&{name};")

    def handle_charref(self, name):
        if not self.skip:
            self.out.append(f"&#{name};")


def sanitise(fragment: str) -> str:
    """``fragment`` through the GitHub-like rules above."""
    parser = _Sanitiser()
    parser.feed(fragment)
    parser.close()
    return "".join(parser.out)


def github_like(nb: dict) -> str:
    """A page showing each output the way a renderer limited to sanitised ``text/html`` does."""
    parts = []
    for cell in nb["cells"]:
        parts.append(f"<pre>{html.escape(''.join(cell['source']))}</pre>")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/html" in data:
                parts.append(f"<div>{sanitise(''.join(data['text/html']))}</div>")
            elif "text/plain" in data or out.get("output_type") == "stream":
                text = "".join(data.get("text/plain", out.get("text", "")))
                parts.append(f"<pre>{html.escape(text)}</pre>")
    return '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"></head><body>' + "".join(parts) + "</body></html>"


def read_notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
