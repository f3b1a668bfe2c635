"""``graph-breaks`` and ``recompiles``: what torch.compile did in the cell (``metrics.compile``)."""

from __future__ import annotations

from gpumagic.analysis.compile import SIZE_GUARD, plain_name
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for
from gpumagic.report.metrics import CompileMetrics, CompileReason, Metrics
from gpumagic.report.model import Finding, Fix

#: PyTorch's guides: "Working with Graph Breaks" (fullgraph=True, torch.compiler.disable,
#: TORCH_LOGS="graph_breaks") and "Dealing with Recompilations" (dynamic=True, mark_dynamic,
#: TORCH_LOGS="recompiles"); the fixes name what they apply from each.
GRAPH_BREAKS_DOC = "https://docs.pytorch.org/docs/stable/compile/programming_model.graph_breaks_index.html"
RECOMPILES_DOC = "https://docs.pytorch.org/docs/stable/compile/programming_model.recompilation.html"
#: At most this many reasons are quoted in a finding's summary.
QUOTED = 3
FULLGRAPH_CODE = """
# fullgraph=True makes torch.compile raise at the first graph break, with its reason and line
# (torch.compile's docs); fix it, run again, until the model compiles as one graph.
compiled = torch.compile(model, fullgraph=True)"""
EXPLAIN_CODE = """
# Every graph break at once, without stopping at the first: run one batch through explain(),
# which prints the graph count, the graph-break count and each break's reason and user stack
explanation = torch._dynamo.explain(model)(x)
print(explanation)"""
DYNAMIC_CODE = """
# Compile shape-generic code up front instead of recompiling when a size changes
compiled = torch.compile(model, dynamic=True)"""


DTYPE_CODE = """
# one dtype into the compiled model: each new dtype compiles a graph of its own (dtypes are never
# made dynamic); a NumPy array or torch.from_numpy(array) is float64
x = x.to(torch.float32)
out = compiled(x)"""


def _fixes(c: CompileMetrics, sizes: bool = True) -> list[Fix]:
    """``mark_dynamic`` on the first size guard that failed, then ``dynamic=True`` (``sizes``: some
    recompilation may be about a size or integer); one dtype into the compiled code when a dtype
    guard failed."""
    fixes: list[Fix] = []
    sizes_seen = (g for g in (SIZE_GUARD.search(r.reason) for r in c.recompile_reasons) if g)
    size = next((g for g in sizes_seen if plain_name(g.group("name"))), None)  # an argument the caller passes
    if size is not None:
        name, dim = plain_name(size.group("name")), size.group("dim")
        fixes.append(pytorch(
            f"Dimension {dim} of {name} changes between calls: mark it dynamic before the first call, so that one "
            "compilation serves every size",
            f"compiled = torch.compile(model)\n"
            f"torch._dynamo.mark_dynamic({name}, {dim})  # {name}: the tensor the compiled code takes as {name}; "
            "mark it before its first call"))
    if c.recompiles_dtype:
        fixes.append(pytorch("Give the compiled code one dtype: a second dtype compiles a second graph", DTYPE_CODE))
    if sizes:
        fixes.append(pytorch("Compile shape-generic code from the start (torch.compile's dynamic=True)", DYNAMIC_CODE))
    return fixes


LOG_FIX = pytorch("See the guard each recompilation failed, as it happens (TORCH_LOGS=\"recompiles\" from Python)",
                  "torch._logging.set_logs(recompiles=True)   # before the compiled calls; prints each failed guard",
                  diagnostic=True)


def _one_time(c: CompileMetrics, share: float) -> Finding:
    """Every recompilation met a size (or integer) changing for the first time, which dynamo then
    compiles as dynamic, or a new value of a property with few values (a dtype, grad mode, eval
    mode: ``recompiles_few_values``), whose entry dynamo reuses: none recurs. ``share``: the
    window's compile share."""
    n, first, few = c.recompiles, c.recompiles_first_change, c.recompiles_few_values
    quoted = "; ".join(f"{_where(r)}: {r.reason}" for r in c.recompile_reasons[:QUOTED])
    times = "once" if n == 1 else f"{n} times"
    what = ("when a size (or integer) first changed" if not few else
            "for a dtype or mode it had not compiled for" if not first else
            "when a size (or integer) first changed or a dtype or mode was new")
    sizes_why = """With torch.compile's default (dynamic=None), the first time a tensor's
        size (or an integer argument) changes, dynamo recompiles with that size as a symbol, and that one graph
        then serves every later size (0 and 1 aside, which dynamo still specialises). (With dynamic=False, each
        new size compiles an entry of its own, up to torch._dynamo.config.recompile_limit, after which the
        function runs eagerly.) Marking the dimension dynamic before the first call saves that one compilation,
        which matters in short runs and in notebooks that recompile on every run of the cell."""
    few_why = f"""{"A" if not first else "And a"} guard on a property with few values (a tensor's dtype, device or
        requires_grad, grad mode or autocast, a module's training flag) compiles each new value once: dynamo keeps
        every compiled entry (up to torch._dynamo.config.recompile_limit) and runs the one whose guards pass, so
        switching between training and no_grad evaluation, or back to a dtype, reuses an entry. Only a dtype
        changed by accident (a float64 batch from NumPy) is worth fixing."""
    return finding(
        severity="low",
        title=f"torch.compile recompiled {times}, {what}, and not after: a one-time cost",
        why=f"""Compiled code is guarded: dynamo checks that the inputs still look as they did when it compiled, and
        compiles again when a guard fails. {sizes_why if first else ""} {few_why if few else ""} No recompilation
        here recurred, so it is start-up cost, not time each step loses.""",
        summary=(f"{n} recompilation(s) in the cell, each {what}{_compile_time(c, share)}: {quoted}; none after it."),
        numbers={"recompiles": n, "recompiles_first_change": first, "recompiles_few_values": few,
                 "compile_ms": c.compile_ms, "compile_frac": round(share, 4)},
        est_gain=0.0,
        gain_method=("not a speed gain: each recompilation met a size or integer changing for the first time, which "
                     "dynamo then compiles as dynamic (dynamic=None, the default), or a new dtype or mode whose "
                     "compiled entry is reused; none recurred (a one-time cost, like the first compilation)"),
        fixes=tuple(_fixes(c, sizes=first > 0)) + ((LOG_FIX,) if few else ()), doc_url=RECOMPILES_DOC,
    )


def _compile_time(c: CompileMetrics, share: float) -> str:
    cell = f"; dynamo compiled its frames for {c.cell_compile_ms:.0f} ms over the whole cell" if c.cell_compile_ms else ""
    inside = f", compiling {pct(share)} of the recorded window" if share > 0 else ", none of it inside the recorded window"
    return inside + cell


def _where(r: CompileReason) -> str:
    return r.place or "unknown line"


@rule("graph-breaks")
def graph_breaks(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: dynamo's ``graph_break`` counter rose during the cell (``metrics.compile.graph_breaks``
    ≥ 1; the capture reads the counter before and after, and the reasons with their lines from
    dynamo's ``graph_breaks`` log). Every break splits the compiled code in two graphs with Python
    in between: a fusion lost across it, a return to the interpreter, and one more frame to guard.
    Gain: not estimated — what a break costs depends on what the graph around it would have
    fused, which the trace does not show. False positives: a deliberate break
    (``torch.compiler.disable`` around logging), which the fix list says is fine to keep."""
    c = m.compile
    if c is None or c.graph_breaks < 1:
        return None
    top = c.break_reasons[:QUOTED]
    quoted = "; ".join(f"{_where(r)}: {r.reason} ({r.count}×)" for r in top) or "reasons not logged"
    fixes: list[Fix] = [
        pytorch("Find each break with fullgraph=True: compilation then fails at the first one, naming it",
                FULLGRAPH_CODE, diagnostic=True),
        pytorch("List every break, with its reason and user stack, with torch._dynamo.explain", EXPLAIN_CODE,
                diagnostic=True),
    ]
    if top and top[0].file:
        fixes.append(pytorch(
            "Move the call that breaks the graph out of the compiled code (print, .item(), NumPy, data-dependent "
            "Python), or keep it eager on purpose with torch.compiler.disable: one break instead of many",
            f"# {_where(top[0])}: {top[0].reason[:200]}\n"
            "@torch.compiler.disable  # runs eagerly: the graph breaks once, here, and nowhere inside\n"
            "def log_step(loss):\n    print(float(loss))"))
    return finding(
        severity="medium" if c.graph_breaks >= 2 else "low",
        title=f"torch.compile broke the graph {c.graph_breaks} time(s)",
        why="""A graph break is where TorchDynamo could not trace the code: it compiles the graph so far, runs
        the rest in Python, and resumes in a new graph. Each break costs the fusions and launch savings
        that one graph would have had, and adds a frame to guard and maybe recompile; PyTorch's guide
        recommends checking for graph breaks first when torch.compile gives less speed-up than expected.""",
        summary=f"{c.graph_breaks} graph break(s) in the cell: {quoted}.",
        numbers={"graph_breaks": c.graph_breaks, "reasons": len(c.break_reasons), "compile_ms": c.compile_ms},
        est_gain=0.0, gain_method="not estimated: the fusions a break prevents are not in the trace",
        fixes=tuple(fixes), doc_url=GRAPH_BREAKS_DOC,
    )


@rule("recompiles")
def recompiles(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: dynamo recompiled a function during the cell (``metrics.compile.recompiles`` ≥ 1: a
    call failed the guards of every compiled entry, recorded by dynamo in ``guard_failures``).
    Gain: the share of the window spent compiling (``compile_ms``, the window's compile segments),
    an upper bound: avoiding recompiles can save at most the compile time. When every
    recompilation met the first change of a size or an integer (``recompiles_first_change``), dynamo
    (``dynamic=None``, the default) compiled it as dynamic and will not recompile for it again: a
    one-time cost, like the first compilation, claimed as no speed gain and low; marking the
    dimension dynamic up front saves that one compilation. So is a recompilation whose failed guards
    are all on properties with few values (``recompiles_few_values``: a dtype, device,
    requires_grad, grad mode or autocast, a module's training flag): dynamo keeps each compiled
    entry and reuses it when the value returns. False positives: a recompilation for a change that
    does not recur by any other guard (a Python object's identity replaced once) reads as recurring."""
    c = m.compile
    if c is None or c.recompiles < 1:
        return None
    share = min(1.0, c.compile_ms * 1e6 / ctx.window_ns)
    if c.recompiles_first_change + c.recompiles_few_values >= c.recompiles:
        return _one_time(c, share)
    top = c.recompile_reasons[:QUOTED]
    quoted = "; ".join(f"{_where(r)}: {r.reason}" + (f" ({r.count}×)" if r.count > 1 else "") for r in top)
    fixes = _fixes(c)
    return finding(
        severity=severity_for(share) if share > 0 else "low",
        title=f"torch.compile recompiled {c.recompiles} time(s)",
        why="""Compiled code is guarded: dynamo checks that the inputs still look as they did when it compiled
        (sizes, dtypes, Python constants), and compiles again when a guard fails. Every recompilation
        costs compile time, and past torch._dynamo.config.recompile_limit the function falls back to
        eager; sizes that vary are the usual cause, fixed by marking them dynamic.""",
        summary=(f"{c.recompiles} recompilation(s) in the cell{_compile_time(c, share)}: {quoted}."
                 + (f" {c.recompiles - c.recompiles_first_change} of them came after the first change of what they "
                    "guard: a size or value that keeps changing, or a change dynamo does not make dynamic (a dtype, a "
                    "flag)" if c.recompiles_first_change else "")),
        numbers={"recompiles": c.recompiles, "recompiles_first_change": c.recompiles_first_change,
                 "compile_ms": c.compile_ms, "compile_frac": round(share, 4)},
        est_gain=share, gain_method="share of the window spent compiling (an upper bound)",
        fixes=tuple(fixes), doc_url=RECOMPILES_DOC,
    )
