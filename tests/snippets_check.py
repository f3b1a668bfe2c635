"""Static proof of a fix's code: it compiles, and every API it names exists in the installed
torch / transformers (module attributes resolved by getattr, methods looked up on the types a
fix works with, keyword arguments checked against signatures). Shared by tests/test_snippets.py
and scripts/gpu_check.py."""

from __future__ import annotations

import ast
import importlib
import inspect

from snippets_collect import known_roots


#: Types whose methods fixes call on objects they made (a tensor, a model, a stream, a cache path...).
def _method_types():
    import concurrent.futures
    import threading
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader

    types = [torch.Tensor, torch.nn.Module, torch.nn.parallel.DistributedDataParallel, torch.optim.Optimizer,
             torch.amp.GradScaler, DataLoader, Path, str, list, dict, tuple, threading.Thread,
             concurrent.futures.ThreadPoolExecutor, torch.distributions.Distribution]
    types += [getattr(torch.cuda, n) for n in ("Stream", "Event", "CUDAGraph")]
    try:  # a tokenizer and a model that generates (the generation fix)
        import transformers

        types += [transformers.PreTrainedTokenizerBase, transformers.GenerationMixin]
    except ImportError:  # pragma: no cover - transformers is a test dependency
        pass
    from gpumagic.tuning.tuner import TuneResult  # what gpumagic.tune_dataloader returns

    return [*types, TuneResult]


#: Documented attributes an optimizer sets on each instance (not on its class, where ``hasattr``
#: looks): torch.optim.Optimizer's ``param_groups``, ``state`` and ``defaults``; and a tokenizer's
#: special tokens, which transformers 5 resolves per instance (``pad_token``, ``eos_token`` and
#: their ``_id``: PreTrainedTokenizerBase's documented attributes; checked on an instance by the
#: generation fix's run in tests/test_snippets.py).
INSTANCE_ATTRIBUTES = frozenset({"param_groups", "state", "defaults", "pad_token", "eos_token", "pad_token_id",
                                 "eos_token_id",
                                 # a generating model's config and its cache setting, set per instance
                                 # (tests/test_cpu_op_overhead.py runs the static-cache fix on one)
                                 "generation_config", "cache_implementation",
                                 # a transformers model's output (its logits and key/value cache: ``cache``
                                 # in 5.25, ``past_key_values`` before), and a nanoGPT-style attention's
                                 # layers and sizes (tests/test_decoding.py runs both decoding fixes)
                                 "logits", "cache", "past_key_values", "c_attn", "c_proj", "n_embd", "n_head",
                                 # a pipeline's tokenizer and the side it pads on (tests/test_cpu_op_overhead.py
                                 # runs the text-generation pipeline fix)
                                 "tokenizer", "padding_side",
                                 # a generation config's cache switch (tests/test_decoding.py)
                                 "use_cache"})


def magic_lines(code: str) -> tuple[str, list[str]]:
    """The snippet without IPython magic lines (``%%gpuprofile --skip 3``), and those lines."""
    keep, magics = [], []
    for line in code.splitlines():
        (magics if line.lstrip().startswith("%") else keep).append(line)
    return "\n".join(keep), magics


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the root is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _imports(tree: ast.AST) -> tuple[dict, list[str]]:
    """Names the snippet imports, resolved; modules not installed here go to ``missing`` and the
    names they bind to ``found`` as None (unchecked, not wrong)."""
    found, missing = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                try:
                    mod = importlib.import_module(a.name)
                except ImportError:
                    missing.append(a.name)
                    found[a.asname or a.name.split(".")[0]] = None
                    continue
                if a.asname:
                    found[a.asname] = mod
                else:
                    found[a.name.split(".")[0]] = importlib.import_module(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            try:
                mod = importlib.import_module(node.module)
            except ImportError:
                missing.append(node.module)
                found.update({a.asname or a.name: None for a in node.names})
                continue
            for a in node.names:
                found[a.asname or a.name] = getattr(mod, a.name, None) or importlib.import_module(f"{node.module}.{a.name}")
    return found, missing


def check(code: str) -> tuple[list[str], list[str]]:
    """(problems, modules not installed here). A problem is an API the installed packages lack."""
    body, _ = magic_lines(code)
    tree = ast.parse(body)  # a syntax error fails the caller
    roots = known_roots()
    imported, missing = _imports(tree)
    roots.update(imported)
    for node in ast.walk(tree):  # ``llm = LLM(...)`` with LLM from a module not installed: llm is unchecked too
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            chain = _chain(node.value.func) if isinstance(node.value.func, ast.Attribute) else (
                [node.value.func.id] if isinstance(node.value.func, ast.Name) else None)
            if chain and chain[0] in roots and roots[chain[0]] is None:
                roots.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
    problems: list[str] = []
    resolved: dict[int, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is None or chain[0] not in roots:
                continue
            obj = roots[chain[0]]
            if obj is None:
                resolved[id(node)] = None  # from a module not installed here: unchecked
                continue
            for i, name in enumerate(chain[1:], 1):
                try:
                    obj = getattr(obj, name)
                except AttributeError:
                    try:
                        obj = importlib.import_module(".".join([obj.__name__, name]))
                    except (ImportError, AttributeError):
                        problems.append(f"{'.'.join(chain[:i + 1])} does not exist")
                        break
            else:
                resolved[id(node)] = obj
    method_types = _method_types()
    in_kernel = _triton_kernel_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in resolved and id(node) not in in_kernel:
            chain = _chain(node)
            if chain is not None and chain[0] in roots:
                continue  # reported above
            if not any(hasattr(t, node.attr) for t in method_types) and node.attr not in INSTANCE_ATTRIBUTES:
                problems.append(f".{node.attr} is not a method of a tensor, module, optimizer, stream or loader")
        if isinstance(node, ast.Call):
            target = resolved.get(id(node.func))
            if target is None and isinstance(node.func, ast.Name):
                target = roots.get(node.func.id)
            problems += _keywords(target, node)
    return problems, missing


def _triton_kernel_nodes(tree: ast.AST) -> set[int]:
    """The nodes inside ``@triton.jit`` functions: there ``x.to(...)`` or ``p.dtype.element_ty`` are
    Triton's language, not tensor methods (``tl.*`` names are still resolved above; the kernel's
    typing is proven by running it under TRITON_INTERPRET=1, tests/test_snippets.py)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(_chain(d) == ["triton", "jit"] for d in node.decorator_list):
            found.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return found


def _keywords(target, call: ast.Call) -> list[str]:
    if target is None or not callable(target):
        return []
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # a C builtin without a signature: its names were resolved above
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return []
    out = [f"{getattr(target, '__name__', target)}() has no argument {kw.arg!r}"
           for kw in call.keywords if kw.arg is not None and kw.arg not in sig.parameters]
    for kw in call.keywords:  # TrainingArguments(accelerator_config={...}): the keys must exist too
        if kw.arg == "accelerator_config" and isinstance(kw.value, ast.Dict):
            import dataclasses

            from transformers.trainer_pt_utils import AcceleratorConfig
            keys = {f.name for f in dataclasses.fields(AcceleratorConfig)}
            out += [f"accelerator_config has no key {k.value!r}" for k in kw.value.keys
                    if isinstance(k, ast.Constant) and k.value not in keys]
    return out


def needs_cuda(code: str) -> bool:
    """Whether the snippet can only run with CUDA (or a package absent on a CPU machine): it names
    ``torch.cuda``, Triton, torchvision, torch.distributed, a Hub model, or is a magic line."""
    body, magics = magic_lines(code)
    if magics:
        return True
    tree = ast.parse(body)
    if _imports(tree)[1]:  # imports a package not installed here (a serving engine: vLLM)
        return True
    for node in ast.walk(tree):
        chain = _chain(node) if isinstance(node, ast.Attribute) else None
        if chain and (chain[:2] == ["torch", "cuda"] or chain[0] in ("triton", "tl", "torchvision", "dist", "AutoModel")):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchvision":
            return True  # from torchvision.transforms import v2: a package the CPU test machine lacks
        if isinstance(node, ast.Name) and node.id in ("encoded_batch",):
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("DistributedDataParallel", "pin_memory"):
            return True  # pinning needs an accelerator
    return False


def has_statements(code: str) -> bool:
    """False for a fix whose code is only comments (advice without code to run)."""
    return bool(ast.parse(magic_lines(code)[0]).body)


class _OnDevice(ast.NodeTransformer):
    def __init__(self, device: str):
        self.device = device

    def visit_Constant(self, node: ast.Constant):
        if node.value == "cuda":
            return ast.copy_location(ast.Constant(self.device), node)
        return node


def run(code: str, ns: dict, device: str) -> dict:
    """Execute the snippet in ``ns`` with every ``"cuda"`` literal made ``device``."""
    tree = _OnDevice(device).visit(ast.parse(code))
    ast.fix_missing_locations(tree)
    exec(compile(tree, _source_file(ast.unparse(tree)), "exec"), ns)
    return ns


#: The source files :func:`_source_file` wrote, removed by :func:`remove_source_files`.
_SOURCE_FILES: list[str] = []


def _source_file(source: str) -> str:
    """A real ``.py`` file holding ``source``, kept until :func:`remove_source_files` (the snippet
    tests' module fixture) or the interpreter's exit: code that reads its own source (Triton's
    ``@triton.jit`` uses ``inspect.getsource``) needs one, as pasted code has. An xdist worker
    leaves without running ``atexit`` handlers, which left 42 files in the temporary folder per run."""
    import atexit
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix="gpumagic_fix_", suffix=".py")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(source)
    if not _SOURCE_FILES:  # registering again after a removal is harmless: it removes what is left
        atexit.unregister(remove_source_files)
        atexit.register(remove_source_files)
    _SOURCE_FILES.append(path)
    return path


def remove_source_files() -> None:
    """Remove every file :func:`_source_file` wrote so far."""
    import os

    while _SOURCE_FILES:
        path = _SOURCE_FILES.pop()
        if os.path.exists(path):
            os.unlink(path)
