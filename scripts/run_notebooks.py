"""Execute the example notebooks in place and store their outputs.

::

    python scripts/run_notebooks.py              # run them all (a few minutes on 2 cores)
    python scripts/run_notebooks.py 2 5          # only notebooks 2 and 5

The notebooks in ``example_notebooks/`` are the source: edit the teaching text and code there (in
JupyterLab or any notebook editor), then run this script so the committed outputs match the cells.
Execution uses nbclient with the ``python3`` kernel in ``example_notebooks/`` (the notebooks import
``nbdata.py`` from there and read ``../tests/data``), with ``GPUMAGIC_WIDGETS=0`` in the kernel's
environment so that reports are saved as static HTML and text rather than widget views without
state. Volatile metadata (timings, kernel versions) is dropped and cell ids are kept, so a rerun
changes only what the run changed.

``tests/notebooks/test_example_notebooks.py`` executes the committed notebooks and checks their lessons.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "example_notebooks"
KERNEL = "python3"
#: Seconds one cell may run before execution fails (the slowest cell, %gputune, takes ~10 s on 2 cores).
CELL_TIMEOUT_S = 180
#: Committed notebooks stay small enough to read well on GitHub (issue 5).
MAX_NOTEBOOK_BYTES = 400_000
#: The kernel's environment: static reports, no widget views (see gpumagic.render.display).
KERNEL_ENV = {"GPUMAGIC_WIDGETS": "0"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def kernel_env() -> dict[str, str]:
    """The environment for the notebook kernel: this one plus :data:`KERNEL_ENV`."""
    return {**os.environ, **KERNEL_ENV}


def execute(nb: nbformat.NotebookNode, timeout_s: int = CELL_TIMEOUT_S, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run ``nb`` top to bottom in ``example_notebooks/``; raises nbclient's CellExecutionError on an error.

    ``env`` adds to the kernel's environment (see :func:`kernel_env`). The run history starts
    empty in a temporary ``GPUMAGIC_HOME`` (unless ``env`` names one), so the outputs show the
    notebook's own runs (r1, r2, ...) and nothing is written to the real home folder."""
    import tempfile

    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout_s, kernel_name=KERNEL, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    with tempfile.TemporaryDirectory(prefix="gpumagic-home-") as home:
        client.execute(env={**kernel_env(), "GPUMAGIC_HOME": home, **(env or {})})
    return nb


def tidy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes from run to run without meaning anything: kernel versions, cell timings."""
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def problems(nb: nbformat.NotebookNode, size_bytes: int) -> list[str]:
    """What makes an executed notebook unfit to commit."""
    found = []
    if size_bytes > MAX_NOTEBOOK_BYTES:
        found.append(f"{size_bytes:,} bytes, over the {MAX_NOTEBOOK_BYTES:,}-byte limit")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {cell.id} has an error output")
            if WIDGET_MIME in out.get("data", {}):
                found.append(f"cell {cell.id} has a widget view without state (run with GPUMAGIC_WIDGETS=0)")
    return found


def names() -> list[str]:
    """The example notebooks, in their numbered order."""
    return sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def write(name: str) -> int:
    """Execute notebook ``name`` and write it back with its outputs; returns the number of problems found."""
    path = NOTEBOOK_DIR / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    tidy(execute(nb))
    text = nbformat.writes(nb) + "\n"
    path.write_text(text, encoding="utf-8")
    found = problems(nb, len(text.encode()))
    print(f"{path.relative_to(ROOT)}: {len(text.encode()) / 1024:.0f} KiB, executed in {time.perf_counter() - t0:.1f} s")
    for p in found:
        print(f"  problem: {p}", file=sys.stderr)
    return len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("numbers", nargs="*", type=int, help="notebooks to run (their number; default all)")
    args = parser.parse_args(argv)
    known = {int(n[:2]): n for n in names()}
    bad = [n for n in args.numbers if n not in known]
    if bad:
        parser.error(f"no notebook numbered {bad}; there are {sorted(known)}")
    chosen = [known[n] for n in args.numbers] or list(known.values())
    failures = sum(write(name) for name in chosen)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
