"""What a finding id means, read from the rule that produces it — never a second copy of the text.

::

    explain("host-sync")["threshold"]   # 'harmful syncs block the host for ≥ 2 % of the window ...'

Each rule (:mod:`gpumagic.analysis.rules`) is one function whose docstring states its signal,
threshold, gain and false positives, whose thresholds are named module constants with their
source in a ``#:`` comment, and whose ``finding(...)`` call carries the ``why`` text, the fixes
and a documentation link. :func:`explain` reads those pieces from the rule's source (Python's
``ast``), so the explanation stays what the code does:

- ``summary``: the rule module's first docstring line (``host-sync: the host waits ...``);
- ``signal``, ``threshold``, ``gain``, ``false_positives``: the sections of the rule's docstring;
- ``why``: the text a report shows under "Why it matters" (parts computed from the trace as ``…``);
- ``thresholds``: every named number the rule reads (also through the helpers it calls), with
  its value and the comment above it that names its source;
- ``fixes``: the fixes the rule can suggest (``flavor``, ``description``, ``code``, ``diagnostic``; parts built
  from the trace as ``…``), in the order they appear in its source, ``pytorch`` and ``huggingface``;
- ``sources``: the documentation links the rule cites.

The finding ids and their rules are looked up by name (``host-sync`` is ``host_sync``). A finding
that is no rule over the trace but is added after the analysis (:data:`LATE_FINDINGS`:
``out-of-memory``, from the code's error alone) is explained the same way from the function that
makes it, whose ``Finding(...)`` call and ``Fix(flavor, description, code)`` calls are read like a
rule's ``finding(...)`` and ``pytorch(...)``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from functools import cache
from types import FunctionType, ModuleType
from typing import Any

#: What stands for a piece of text the rule computes from the trace (a count, a name).
ELIDED = "…"
#: The docstring headings, as the rules write them (rules/__init__.py: "signal, threshold, gain, false positives").
SECTIONS = {"Signal": "signal", "Threshold": "threshold", "Gain": "gain", "False positives": "false_positives"}
_SECTION = re.compile(r"(?:^|(?<=[.)\]]\s))(" + "|".join(SECTIONS) + r"):\s*")
_URL = re.compile(r"https?://[^\s)\"'>]+")
_FIX_HELPERS = ("pytorch", "huggingface")
#: Findings added after the analysis, not by a rule: finding id → the function that makes it
#: (``"module:function"``, imported on use; see :func:`gpumagic.analysis.analyze`).
LATE_FINDINGS = {"out-of-memory": "gpumagic.analysis.oom:out_of_memory"}


class UnknownFindingError(LookupError):
    """No rule produces that finding id."""


def finding_ids() -> tuple[str, ...]:
    """Every finding id the analysis can report."""
    from gpumagic.analysis.rules import FINDING_IDS

    return (*FINDING_IDS, *LATE_FINDINGS)


def rule_for(finding_id: str) -> Any:
    """The rule function that reports ``finding_id`` (for a finding of :data:`LATE_FINDINGS`, the
    function that makes it)."""
    from gpumagic.analysis import rules

    if finding_id not in finding_ids():
        known = ", ".join(sorted(finding_ids()))
        raise UnknownFindingError(f"no finding is called {finding_id!r}; the finding ids are: {known}")
    if finding_id in LATE_FINDINGS:
        module, _, function = LATE_FINDINGS[finding_id].partition(":")
        return getattr(importlib.import_module(module), function)
    name = finding_id.replace("-", "_")
    for fn in (*rules.CAUSE_RULES, rules.low_gpu_utilization):
        if fn.__name__ == name:
            return fn
    raise UnknownFindingError(f"finding {finding_id!r} has no rule function named {name}")  # pragma: no cover


def explain(finding_id: str) -> dict[str, Any]:
    """What ``finding_id`` means, its signal, thresholds, fixes and sources (JSON-ready; see the module docstring)."""
    fn = rule_for(finding_id)
    return dict(_explain(fn))


@cache
def _explain(fn: FunctionType) -> tuple[tuple[str, Any], ...]:
    module = sys.modules[fn.__module__]
    doc = " ".join((inspect.getdoc(fn) or "").split())
    sections = _sections(doc)
    tree = _function_tree(fn)
    call = _finding_call(tree)
    reached = _reached_functions(module, fn)
    thresholds = _thresholds(module, reached)
    fixes = [fix for f in reached for fix in _fixes(module, _function_tree(f))]
    sources = _sources(module, call, thresholds)
    out = {
        "id": _finding_id(fn),
        "rule": f"{fn.__module__}.{fn.__name__}",
        "summary": _summary(module),
        "why": _prose(module, call["why"]) if "why" in call else "",
        **{key: sections.get(key, "") for key in SECTIONS.values()},
        "docstring": doc,
        "thresholds": thresholds,
        "fixes": fixes,
        "sources": sources,
    }
    return tuple(out.items())


def _finding_id(fn: FunctionType) -> str:
    return fn.__name__.replace("_", "-")


def _summary(module: ModuleType) -> str:
    first = (inspect.getdoc(module) or "").strip().splitlines()
    return first[0].replace("``", "") if first else ""


def _sections(doc: str) -> dict[str, str]:
    """``{"signal": ..., "threshold": ..., ...}`` from a docstring written ``Signal: ... Threshold: ...``."""
    parts = _SECTION.split(doc)
    out = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        out[SECTIONS[heading]] = body.strip()
    return out


@cache
def _module_tree(module: ModuleType) -> ast.Module:
    return ast.parse(inspect.getsource(module))


def _function_tree(fn: FunctionType) -> ast.FunctionDef:
    for node in _module_tree(sys.modules[fn.__module__]).body:
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            return node
    raise LookupError(f"no source for {fn.__qualname__}")  # pragma: no cover


def _finding_call(tree: ast.FunctionDef) -> dict[str, ast.expr]:
    """The keyword arguments of the rule's ``finding(...)`` call (or ``Finding(...)``, for a
    finding made outside the rules)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("finding", "Finding"):
            return {k.arg: k.value for k in node.keywords if k.arg}
    return {}


def _reached_functions(module: ModuleType, fn: FunctionType) -> list[FunctionType]:
    """``fn`` and the functions of its own module it calls, transitively, in order of first use."""
    seen: list[FunctionType] = []
    todo = [fn]
    while todo:
        f = todo.pop(0)
        if f in seen:
            continue
        seen.append(f)
        for name in _names(_function_tree(f)):
            value = getattr(module, name, None)
            if isinstance(value, FunctionType) and value.__module__ == module.__name__ and value not in seen:
                todo.append(value)
    return seen


def _names(tree: ast.AST) -> list[str]:
    """The names a tree reads, each once, in the order the source reads them (the rule's first
    test first), not the order of the tree's levels."""
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return list(dict.fromkeys(n.id for n in found))


def _thresholds(module: ModuleType, functions: list[FunctionType]) -> list[dict[str, Any]]:
    """The named numbers (UPPER_CASE module constants, wherever defined) the functions read."""
    out: list[dict[str, Any]] = []
    for f in functions:
        for name in _names(_function_tree(f)):
            value = getattr(module, name, None)
            if not name.isupper() or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if any(t["name"] == name for t in out):
                continue
            home = _defining_module(module, name)
            out.append({"name": name, "value": value, "source": _comment_above(home, name),
                        "defined_in": home.__name__})
    return out


def _defining_module(module: ModuleType, name: str) -> ModuleType:
    """The module that assigns ``name`` (it may be imported into ``module`` from a sibling rule)."""
    for node in _module_tree(module).body:
        if isinstance(node, ast.ImportFrom) and node.module and any((a.asname or a.name) == name for a in node.names):
            return _defining_module(importlib.import_module(node.module), name)
    return module


def _comment_above(module: ModuleType, name: str) -> str:
    """The ``#:`` comment lines right above ``NAME = ...`` in ``module``, joined."""
    lines = inspect.getsource(module).splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"{re.escape(name)}\s*(:[^=]*)?=", line):
            comment: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#:"):
                comment.insert(0, lines[j].lstrip()[2:].strip())
                j -= 1
            return " ".join(comment)
    return ""


def _fixes(module: ModuleType, tree: ast.FunctionDef) -> list[dict[str, Any]]:
    """The ``pytorch(description, code)`` and ``huggingface(...)`` calls in a function, its
    ``Fix("pytorch", description, code)`` calls, and the module-level fixes it names
    (``TRAINING_FIX``), in source order."""
    from gpumagic.report.model import Fix

    found: list[tuple[tuple[int, int], dict[str, Any]]] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FIX_HELPERS
                and len(node.args) >= 2):
            found.append(((node.lineno, node.col_offset), {
                "flavor": node.func.id, "description": _prose(module, node.args[0]),
                "code": _text(module, node.args[1]).strip("\n"), "diagnostic": _diagnostic(node, 2)}))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Fix"
              and len(node.args) >= 3 and isinstance(node.args[0], ast.Constant) and node.args[0].value in _FIX_HELPERS):
            found.append(((node.lineno, node.col_offset), {
                "flavor": str(node.args[0].value), "description": _prose(module, node.args[1]),
                "code": _text(module, node.args[2]).strip("\n"), "diagnostic": _diagnostic(node, 3)}))
        elif isinstance(node, ast.Name) and isinstance(fix := getattr(module, node.id, None), Fix):
            found.append(((node.lineno, node.col_offset), {
                "flavor": fix.flavor, "description": " ".join(fix.description.split()), "code": fix.code.strip("\n"),
                "diagnostic": fix.diagnostic}))
    return [f for _, f in sorted(found, key=lambda x: x[0])]


def _diagnostic(call: ast.Call, position: int) -> bool:
    """The ``diagnostic`` argument of a fix call, given by keyword or as argument ``position``
    (literal ``True`` only: anything computed reads as a change)."""
    value = next((k.value for k in call.keywords if k.arg == "diagnostic"),
                 call.args[position] if len(call.args) > position else None)
    return isinstance(value, ast.Constant) and value.value is True


def _prose(module: ModuleType, node: ast.expr) -> str:
    """:func:`_text` with its white space collapsed, as ``finding()`` does to ``why``."""
    return " ".join(_text(module, node).split())


def _text(module: ModuleType, node: ast.expr) -> str:
    """The text an expression builds, literal parts kept, computed parts as :data:`ELIDED`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else ELIDED for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _join(_text(module, node.left), _text(module, node.right))
    if isinstance(node, ast.Name):
        value = getattr(module, node.id, None)
        return value if isinstance(value, str) else ELIDED
    return ELIDED


def _join(a: str, b: str) -> str:
    return a[:-1] + b if a.endswith(ELIDED) and b.startswith(ELIDED) else a + b


def _sources(module: ModuleType, call: dict[str, ast.expr], thresholds: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    doc_url = call.get("doc_url")
    if doc_url is not None:
        found.append(_text(module, doc_url))
        if found[-1] == ELIDED:  # a page chosen at run time (``DOCS.get(cause, DOC)``): every page it can be
            for name in (n.id for n in ast.walk(doc_url) if isinstance(n, ast.Name)):
                value = getattr(module, name, None)
                pages = value.values() if isinstance(value, dict) else [value]
                found += [v for v in pages if isinstance(v, str) and v.startswith("https://")]
    for t in thresholds:
        found += _URL.findall(t["source"])
    return [s for i, s in enumerate(found) if s and s != ELIDED and s not in found[:i]]


__all__ = ["LATE_FINDINGS", "UnknownFindingError", "explain", "finding_ids", "rule_for"]
