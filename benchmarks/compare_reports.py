"""Are this checkout's reports the same as another version's? A guard for speed work.

Runs ``python -m gpumagic analyze FILE --format json`` with a reference checkout's code
(``--ref``: run in that folder, and put first on ``PYTHONPATH``; the script checks which code
each side imported) and with this checkout's, on every trace in
``tests/data`` (or the files given, e.g. larger inputs built with
``analyze_speed.repeat_trace``), and compares the two JSON reports value by value. No field of a
report measures time or the machine today (the analysis is deterministic), so nothing is ignored
unless ``--ignore KEY`` names it (a key anywhere in the tree). Prints each difference's path and
both values, and exits 1 when any report differs.

Run: ``python benchmarks/compare_reports.py --ref /work/main [--python PY] [--format json,text] [FILES...]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data")


def checkout_env(checkout: str) -> dict[str, str]:
    """The environment of a run that imports ``checkout``'s gpumagic (with ``cwd=checkout``:
    ``python -m`` and ``-c`` put the working directory first on ``sys.path``, before
    ``PYTHONPATH``, so from another checkout's root a run would import that checkout's code
    whatever ``PYTHONPATH`` says)."""
    return dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get("PYTHONPATH", ""))


def checkout_run(py: str, checkout: str, args: list[str]) -> subprocess.CompletedProcess:
    """``py ARGS`` importing ``checkout``'s gpumagic, run in that folder (:func:`checkout_env`)."""
    return subprocess.run([py, *args], capture_output=True, text=True, env=checkout_env(checkout), cwd=checkout)


def imported_from(py: str, checkout: str) -> str:
    """The folder whose ``gpumagic`` package a run in ``checkout`` imports."""
    p = checkout_run(py, checkout, ["-c", "import gpumagic, os; print(os.path.dirname(os.path.dirname(gpumagic.__file__)))"])
    return os.path.realpath(p.stdout.strip()) if p.returncode == 0 else f"<exit {p.returncode}: {p.stderr.strip()[-200:]}>"


def report(py: str, checkout: str, trace: str, fmt: str, extra: list[str]) -> str:
    p = checkout_run(py, checkout, ["-m", "gpumagic", "analyze", trace, "--format", fmt, *extra])
    if p.returncode:
        return f"<exit {p.returncode}: {p.stderr.strip()[-300:]}>"
    return p.stdout


def differences(a: Any, b: Any, ignore: set[str], path: str = "") -> list[str]:
    """Paths (``metrics.gpu.busy_ms``) where ``a`` and ``b`` differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k in ignore:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'reference' if k in a else 'this checkout'}")
            else:
                out += differences(a[k], b[k], ignore, f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, ignore, f"{path}[{i}]")]
    if a != b or type(a) is not type(b):
        return [f"{path}: {a!r:.120} vs {b!r:.120}"]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--ref", required=True, help="the reference checkout (a folder holding gpumagic/)")
    ap.add_argument("--ref-python", default=sys.executable, help="interpreter for the reference (default: this one)")
    ap.add_argument("--format", default="json", help="comma-separated: json (compared value by value), text (line by line)")
    ap.add_argument("--ignore", action="append", default=[], help="a key to leave out of the comparison (repeatable)")
    ap.add_argument("-j", "--jobs", default=None, help="passed on as -j to both")
    args = ap.parse_args()
    files = [os.path.abspath(f) for f in args.files] or sorted(glob.glob(os.path.join(DATA, "*.json.gz")), key=os.path.getsize)
    ref_root = os.path.abspath(args.ref)
    # a comparison of a checkout with itself would pass whatever changed: make sure it is not one
    sources = {"reference": imported_from(args.ref_python, ref_root), "this checkout": imported_from(sys.executable, ROOT)}
    print(f"reference code: {sources['reference']}; this checkout's: {sources['this checkout']}")
    if sources["reference"] != os.path.realpath(ref_root) or sources["this checkout"] != os.path.realpath(ROOT):
        sys.exit(f"compare_reports: a run did not import the checkout it was meant to ({sources})")
    extra = ["-j", args.jobs] if args.jobs else []
    ignore = set(args.ignore)
    failed = 0
    for f in files:
        for fmt in args.format.split(","):
            ref = report(args.ref_python, ref_root, f, fmt, extra)
            new = report(sys.executable, ROOT, f, fmt, extra)
            if fmt == "json":
                try:
                    diffs = differences(json.loads(ref), json.loads(new), ignore)
                except json.JSONDecodeError:
                    diffs = [] if ref == new else [f"not JSON: {ref[:200]!r} vs {new[:200]!r}"]
            else:
                diffs = [f"line {i}: {x!r:.120} vs {y!r:.120}" for i, (x, y) in
                         enumerate(zip(ref.splitlines(), new.splitlines())) if x != y]
                if len(ref.splitlines()) != len(new.splitlines()):
                    diffs.append(f"{len(ref.splitlines())} lines vs {len(new.splitlines())}")
            status = "same" if not diffs else f"{len(diffs)} difference(s)"
            print(f"{os.path.basename(f):48s} {fmt:5s} {status}", flush=True)
            for d in diffs[:20]:
                print(f"    {d}")
            failed += bool(diffs)
    print(f"\n{failed} report(s) differ" if failed else "\nall reports are the same")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
