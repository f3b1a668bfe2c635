"""The house plan, checked: arrows point down only, and no import cycle inside the package.

Layers, lowest first (README "Layers", docs/architecture.md): the shared exceptions, array
helpers and the bundled example; the trace model and loaders; the report model (plain data); analysis; the tuning features
built on reports; the views (``render``); capture; the shells. A module may import its own layer
and the layers below it, never above — function-level (late) imports included, since a late
import still ties the lower layer to the upper one. Capture may call analysis but never a view.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpumagic"

#: (layer name, module-name prefixes), lowest first.
LAYERS = (
    ("base", ("gpumagic.errors", "gpumagic._allocator", "gpumagic._arrays", "gpumagic._atomic", "gpumagic._env",
              "gpumagic._forked", "gpumagic._origin", "gpumagic.examples")),
    ("trace", ("gpumagic.trace",)),
    ("report", ("gpumagic.report",)),
    ("analysis", ("gpumagic.analysis",)),
    ("tuning", ("gpumagic.tuning", "gpumagic.jobs")),
    ("render", ("gpumagic.render",)),
    ("capture", ("gpumagic.capture",)),
    ("shells", ("gpumagic.shells", "gpumagic.integrations", "gpumagic.__main__", "gpumagic")),
)
#: Pairs that the rank order allows but the plan forbids: capture produces traces and reports (and the
#: DataLoader tuner's plain TuneResult, gpumagic.tuning.tuner), never views.
FORBIDDEN = {("capture", "render")}
#: Packages that analysing a saved trace must not need: never imported at module level below the views.
HEAVY = ("torch", "IPython", "ipywidgets", "matplotlib", "pynvml")
LIGHT_LAYERS = ("base", "trace", "report", "analysis")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> tuple[int, str]:
    for rank, (name, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "gpumagic"):
            return rank, name
    if module == "gpumagic":
        return len(LAYERS) - 1, "shells"
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in tests/test_layers.py")


def resolve(target: str) -> str | None:
    """The package module that ``target`` (a dotted name, maybe module.attribute) refers to."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every gpumagic import in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            found.append((name, node.lineno, id(node) in top_level))
    return found


def package_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for name, _, _ in imports_of(m):
            target = resolve(name) if name.split(".")[0] == "gpumagic" else None
            # a package re-exporting its own submodules is not a dependency on itself
            if target and target != m and not target.startswith(m + ".") and target != m.rpartition(".")[0]:
                edges[m].add(target)
    return edges


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_import_cycle_inside_the_package():
    assert find_cycles(package_edges()) == []


def test_arrows_point_down_only():
    wrong = []
    for m, targets in package_edges().items():
        rank, name = layer_of(m)
        for t in sorted(targets):
            t_rank, t_name = layer_of(t)
            if t_rank > rank or (name, t_name) in FORBIDDEN:
                wrong.append(f"{m} ({name}) imports {t} ({t_name})")
    assert wrong == []


@pytest.mark.parametrize("module", [m for m in MODULES if layer_of(m)[1] in LIGHT_LAYERS])
def test_analysis_side_imports_no_heavy_package_at_load_time(module):
    heavy = [f"{name} (line {line})" for name, line, top in imports_of(module)
             if top and name.split(".")[0] in HEAVY]
    assert heavy == []


def test_the_checker_sees_cycles_and_upward_arrows():
    """The checks above would catch what they are for (a self-test on made-up edges)."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("gpumagic.render.text")[0] > layer_of("gpumagic.report.model")[0]
    assert layer_of("gpumagic.shells.cli.analyze")[1] == "shells" and layer_of("gpumagic")[1] == "shells"


def test_the_text_view_does_not_import_the_html_view():
    """What text and HTML share (page kit aside) lives in render/_format.py, not in either view."""
    edges = package_edges()
    assert "gpumagic.render.html" not in edges["gpumagic.render.text"]
    assert "gpumagic.render.text" not in edges["gpumagic.render.html"]
