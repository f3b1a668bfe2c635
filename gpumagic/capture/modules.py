"""Module ranges: one ``record_function`` range per ``nn.Module`` call while recording (``--modules``).

torch.profiler does not say which module an eager-mode operator ran in (``with_modules`` covers
TorchScript only: torch/profiler/profiler.py, ``profile``'s docstring), so while recording every
module call is wrapped in a range named ``gpumagic::module PATH (Type)``, from global forward
hooks (``torch.nn.modules.module.register_module_forward_pre_hook`` and
``register_module_forward_hook(always_call=True)``, which runs even when ``forward`` raises).
The analysis (:mod:`gpumagic.analysis.modules`) reads forward time from these ranges and
attributes backward time through the trace's own forward→backward links, not through the ranges.

``PATH`` is the module's dotted name under the outermost module called (``named_modules()``),
prefixed by the name of a variable that holds that module in the namespaces given (the notebook's
user namespace, looked up at its first call), else by its class name: ``model.encoder.layer.3.attention``. A module called
inside another but not registered under it gets its caller's path and its class name.

Cost: a global hook makes every module call take ``Module._call_impl``'s slow path, and each
range costs a profiler event; ``benchmarks/bench_modules.py`` measures it, hence opt-in. While
dynamo traces a compiled module the hooks do nothing (``torch.compiler.is_compiling()``), so they
add no graph break, and a compiled module shows as one row (its ``OptimizedModule``): its
submodules run inside the graph. Installing them makes dynamo recompile a module compiled
earlier, since it guards on the number of global hooks; the analysis leaves that recompilation
out of ``metrics.compile`` (it is gpumagic's, not the code's).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from typing import Any

from gpumagic.trace.links import MODULE_PREFIX

#: The prefix of every module range's name; the analysis parses ``PREFIX + "PATH (Type)"``.
PREFIX = MODULE_PREFIX


#: torch/_dynamo/eval_frame.py warns so when a torch.compile'd module is called with global hooks set.
COMPILED_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def range_name(path: str, type_name: str) -> str:
    return f"{PREFIX}{path} ({type_name})"


class ModuleRanges:
    """Global forward hooks that open and close one range per module call (per thread)."""

    def __init__(self, *namespaces: dict[str, Any] | None) -> None:
        self._namespaces = [ns for ns in namespaces if ns]  # read when a root is first called, not copied
        self._paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._handles: list[Any] = []
        self._open: list[list] = []  # every thread's stack, to close what is left at removal
        self._lock = threading.Lock()
        self._filter: tuple | None = None

    def install(self) -> ModuleRanges:
        import torch
        from torch.nn.modules import module as nn_module

        self._torch = torch
        self._compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)  # torch >= 2.3
        # record_function: a user_annotation in the trace. torch's faster _RecordFunctionFast
        # (~5 µs a range against ~27 µs) records a cpu_op, which the analysis would count as an
        # operator (the Operators table, model-on-cpu's operator count).
        self._range = torch.autograd.profiler.record_function
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        # torch warns at each compiled module's call that global hooks fire for its OptimizedModule
        # too: they are ours, and that row is what --modules shows of a compiled module
        warnings.filterwarnings("ignore", message=COMPILED_HOOKS_WARNING, category=UserWarning)
        self._filter = warnings.filters[0]
        return self

    def remove(self) -> None:
        """Remove the hooks and close every range still open (a forward interrupted by the end
        of recording). Idempotent."""
        while self._handles:
            self._handles.pop().remove()
        if self._filter is not None:
            with contextlib.suppress(ValueError):  # the user reset the filters meanwhile
                warnings.filters.remove(self._filter)
                mutated = getattr(warnings, "_filters_mutated", None)  # what warnings.filterwarnings calls
                if mutated is not None:
                    mutated()
            self._filter = None
        with self._lock:
            stacks, self._open = self._open, []
        for stack in stacks:
            while stack:
                _close(stack.pop()[1])

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            with self._lock:
                self._open.append(stack)
        return stack

    def _pre(self, module, args) -> None:
        if self._compiling():
            return
        stack = self._stack()
        path = self._path(module, stack)
        rf = self._range(range_name(path, type(module).__name__))
        rf.__enter__()
        stack.append((module, rf, path))

    def _post(self, module, args, output) -> None:
        if self._compiling():
            return
        stack = self._stack()
        if not any(entry[0] is module for entry in stack):
            return  # entered before the hooks were installed
        while stack:
            entry = stack.pop()
            _close(entry[1])
            if entry[0] is module:
                break

    def _path(self, module, stack: list) -> str:
        try:
            known = self._paths.get(module)
        except TypeError:  # not weak-referenceable: name it every time
            known = None
        if known is not None:
            return known
        if stack:
            path = f"{stack[-1][2]}.{type(module).__name__}"
            self._remember(module, path)
            return path
        root = self._root_name(module)
        for name, sub in module.named_modules():
            self._remember(sub, f"{root}.{name}" if name else root)
        return root

    def _remember(self, module, path: str) -> None:
        with contextlib.suppress(TypeError):
            self._paths.setdefault(module, path)

    def _root_name(self, module) -> str:
        for ns in reversed(self._namespaces):  # the cell's locals first
            for name, value in list(ns.items()):
                if value is module and isinstance(name, str) and name.isidentifier() and not name.startswith("_"):
                    return name
        return type(module).__name__


def _close(rf) -> None:
    with contextlib.suppress(Exception):  # the profiler already stopped: nothing left to close
        rf.__exit__(None, None, None)
