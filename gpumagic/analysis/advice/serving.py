"""Fixes for a serving engine's window: engine arguments, not training-loop code.

When the trace shows a serving engine (``Context.workload == "serving"``: vLLM's or SGLang's own
frames and annotations, ``names.ENGINE_RE``), the user does not write the loop the generic fixes
change: there is no ``DataLoader`` to widen, no ``model`` to wrap in ``torch.compile``, no batch
size in their code. The engine exposes those choices as arguments. :data:`SERVING_FIXES` gives,
per finding id, the fix in the engine's terms, each with its public source (vLLM's documentation
pages, named in the code's first comment line); :func:`for_serving` puts it in place of the
finding's fixes. A finding with no entry keeps its own fixes (they do not assume a training loop,
or the rule already words them for inference).

Sources: vLLM documentation, "Engine Arguments" (``enforce_eager``, ``max_num_seqs``,
``max_num_batched_tokens``, ``dtype``, ``compilation_config``;
https://docs.vllm.ai/en/stable/configuration/engine_args.html), ``vllm.config.compilation``
(``CompilationConfig.cudagraph_capture_sizes``, ``cudagraph_mode``;
https://docs.vllm.ai/en/stable/api/vllm/config/compilation/), and "Profiling vLLM"
(``VLLM_TORCH_PROFILER_DIR``, ``LLM.start_profile``/``stop_profile``).
"""

from __future__ import annotations

from dataclasses import replace

from gpumagic.report.model import Finding, Fix

ENGINE_ARGS_DOC = "https://docs.vllm.ai/en/stable/configuration/engine_args.html"
COMPILATION_DOC = "https://docs.vllm.ai/en/stable/api/vllm/config/compilation/"

_GRAPHS = Fix("pytorch", "A serving engine replays CUDA graphs only for the batch sizes it captured: keep graphs on "
              "(no enforce_eager) and make the capture sizes cover the batch sizes you serve",
              """# vLLM docs, "Engine Arguments" and CompilationConfig: graphs on, capture sizes covering your batches
from vllm import LLM
llm = LLM(model=model_name, enforce_eager=False,
          compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]})
# the server: vllm serve MODEL --compilation-config '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]}'""")
_BATCH = Fix("pytorch", "Give each engine step more work: let the scheduler batch more sequences and tokens per step, "
             "and send requests concurrently (each extra sequence holds KV-cache memory)",
             """# vLLM docs, "Engine Arguments": raise these above the values you run with now
from vllm import LLM
llm = LLM(model=model_name, max_num_seqs=512, max_num_batched_tokens=16384)
outputs = llm.generate(prompts)   # all prompts in one call: the engine batches them; not one call per prompt
# the server: vllm serve MODEL --max-num-seqs 512 --max-num-batched-tokens 16384; clients send in parallel""")
_PROFILE = Fix("pytorch", "Profile more engine steps, after start-up: the engine's own profiler records every "
               "step it serves, so what the queue waited on is in the window",
               """# vLLM docs, "Profiling vLLM": in the shell before the engine starts
#   export VLLM_TORCH_PROFILER_DIR=./vllm_profile
from vllm import LLM
llm = LLM(model=model_name)    # returns once the engine has loaded and captured its graphs
llm.generate(prompts[:8])      # a few warm-up requests, not profiled
llm.start_profile()
outputs = llm.generate(prompts)
llm.stop_profile()""", diagnostic=True)
_DTYPE = Fix("pytorch", "Serve in 16-bit: the engine's dtype argument (FP32 weights run FP32 matmuls only when "
             "float32 was asked for)",
             """# vLLM docs, "Engine Arguments" (--dtype): bfloat16 on Ampere and later, float16 before
from vllm import LLM
llm = LLM(model=model_name, dtype="bfloat16")
# the server: vllm serve MODEL --dtype bfloat16""")
_COMPILED = Fix("pytorch", "The engine fuses kernels through its own torch.compile pass and replays them as graphs: "
                "keep both on (enforce_eager=True turns CUDA graphs off)",
                """# vLLM docs, "Engine Arguments": the default is compiled and graph-replayed
from vllm import LLM
llm = LLM(model=model_name, enforce_eager=False)""")

#: Finding id → the fixes a serving engine's user can apply, in order.
SERVING_FIXES: dict[str, tuple[Fix, ...]] = {
    "launch-bound": (_GRAPHS, _BATCH),
    "cpu-bound": (_GRAPHS, _BATCH),
    "too-small-for-gpu": (_BATCH, _GRAPHS),
    "low-gpu-utilization": (_BATCH, _GRAPHS),
    "low-compute-efficiency": (_BATCH, _DTYPE),
    "gpu-idle-gaps": (_PROFILE, _BATCH),
    "mixed-precision-off": (_DTYPE,),
    "elementwise-bound": (_COMPILED,),
}
#: Each entry's page, used as the finding's link when its fixes are replaced.
SERVING_DOCS: dict[str, str] = {"launch-bound": COMPILATION_DOC, "cpu-bound": COMPILATION_DOC}


#: Findings whose idle time is start-up when ``warmup-in-window`` fires beside them: then the fix
#: is to profile after start-up, not to batch more.
STARTUP_IDLE = frozenset({"gpu-idle-gaps", "low-gpu-utilization"})


def for_serving(findings: list[Finding]) -> list[Finding]:
    """The findings with the fixes of :data:`SERVING_FIXES` in place of their own (call it on a
    serving engine's window only); the others unchanged. Beside ``warmup-in-window`` (the engine
    starting, capturing its graphs), the idle-time findings get only the profiling fix."""
    startup = any(f.id == "warmup-in-window" for f in findings)

    def fixes(fid: str) -> tuple[Fix, ...]:
        return (_PROFILE,) if startup and fid in STARTUP_IDLE else SERVING_FIXES[fid]

    return [replace(f, fixes=fixes(f.id), doc_url=SERVING_DOCS.get(f.id, ENGINE_ARGS_DOC))
            if f.id in SERVING_FIXES else f for f in findings]
