"""The rules: one small pure function per finding id, ``rule(ctx, metrics) -> Finding | None``.

The ids are a contract (other tools and tests use them). Each rule's docstring states its
signal, threshold (a named constant with its source), how the gain is estimated, and its known
false positives.
"""

from __future__ import annotations

from gpumagic.analysis.rules.accumreset import gradients_reset_mid_accumulation
from gpumagic.analysis.rules.allocchurn import allocator_churn
from gpumagic.analysis.rules.anomaly import anomaly_detection_on
from gpumagic.analysis.rules.base import RULES, Rule
from gpumagic.analysis.rules.checkpoints import frequent_checkpoints
from gpumagic.analysis.rules.chunks import small_transfers
from gpumagic.analysis.rules.communication import communication_heavy
from gpumagic.analysis.rules.compile import graph_breaks, recompiles
from gpumagic.analysis.rules.compute import low_compute_efficiency, too_small_for_gpu
from gpumagic.analysis.rules.concat import growing_concatenation
from gpumagic.analysis.rules.contention import host_contended
from gpumagic.analysis.rules.cpu import host_cpu_saturated
from gpumagic.analysis.rules.cpudouble import cpu_float64
from gpumagic.analysis.rules.cpuhalf import cpu_low_precision_slow
from gpumagic.analysis.rules.dataloader import dataloader_bound
from gpumagic.analysis.rules.decoding import decoding_without_cache
from gpumagic.analysis.rules.embeddings import dense_embedding_grad
from gpumagic.analysis.rules.emptyupdates import updates_without_gradients
from gpumagic.analysis.rules.evalmode import training_in_eval_mode
from gpumagic.analysis.rules.evaluation import frequent_evaluation
from gpumagic.analysis.rules.frozen import frozen_forward
from gpumagic.analysis.rules.gradreset import gradients_never_reset
from gpumagic.analysis.rules.inference import inference_grad_enabled, inference_train_mode
from gpumagic.analysis.rules.kernels import elementwise_bound, unfused_attention
from gpumagic.analysis.rules.l2penalty import l2_penalty_in_loss
from gpumagic.analysis.rules.launch import cpu_bound, launch_bound
from gpumagic.analysis.rules.layout import layout_conversions
from gpumagic.analysis.rules.loaderlater import dataloader_bound_later
from gpumagic.analysis.rules.loopwork import loop_host_work
from gpumagic.analysis.rules.memgrowth import memory_growth
from gpumagic.analysis.rules.memory import memory_pressure
from gpumagic.analysis.rules.opoverhead import cpu_op_overhead
from gpumagic.analysis.rules.optimizer import unfused_optimizer
from gpumagic.analysis.rules.optstate import optimizer_state_reset
from gpumagic.analysis.rules.outliers import step_outliers
from gpumagic.analysis.rules.placement import model_on_cpu
from gpumagic.analysis.rules.precision import mixed_precision_off
from gpumagic.analysis.rules.recompute import activation_recompute
from gpumagic.analysis.rules.restarts import dataloader_worker_restarts
from gpumagic.analysis.rules.sync import host_sync
from gpumagic.analysis.rules.threads import host_cores_idle, threads_oversubscribed
from gpumagic.analysis.rules.transfers import pageable_memcpy, transfer_bound
from gpumagic.analysis.rules.unusedgrads import unused_gradients
from gpumagic.analysis.rules.utilization import gpu_idle_gaps, low_gpu_utilization
from gpumagic.analysis.rules.warmup import warmup_in_window

#: Rules that name a cause, run first; ``low-gpu-utilization`` then reports the idle time they
#: leave unexplained (``analysis.gains`` counts overlapping time once).
CAUSE_RULES: tuple[Rule, ...] = (
    host_cpu_saturated, dataloader_bound, dataloader_bound_later, pageable_memcpy, host_sync, launch_bound, cpu_bound, gpu_idle_gaps,
    mixed_precision_off, transfer_bound, memory_pressure, communication_heavy, warmup_in_window,
    small_transfers, too_small_for_gpu, low_compute_efficiency, unfused_attention, elementwise_bound,
    model_on_cpu, step_outliers, graph_breaks, recompiles, host_cores_idle, cpu_low_precision_slow,
    frequent_checkpoints, dataloader_worker_restarts, unfused_optimizer, host_contended, anomaly_detection_on,
    loop_host_work, cpu_op_overhead, activation_recompute, allocator_churn, layout_conversions,
    inference_grad_enabled, inference_train_mode, memory_growth, gradients_never_reset, optimizer_state_reset,
    updates_without_gradients, gradients_reset_mid_accumulation, unused_gradients, training_in_eval_mode,
    dense_embedding_grad, threads_oversubscribed,
    cpu_float64, l2_penalty_in_loss, decoding_without_cache, frequent_evaluation, growing_concatenation,
    frozen_forward,
)
#: Every finding id a rule can make (each written once, in its rule's ``@rule(...)``).
FINDING_IDS: tuple[str, ...] = tuple(RULES)
#: The residual rule: run after the others, it reports the idle time they leave unexplained.
RESIDUAL_RULE: Rule = low_gpu_utilization
if set(FINDING_IDS) != {getattr(r, "finding_id", "") for r in (*CAUSE_RULES, RESIDUAL_RULE)}:  # pragma: no cover
    raise ImportError("every registered rule must run: add it to CAUSE_RULES")

#: Rules that judge a steady loop: they run on the steady part of the window only
#: (``analysis.segments``), never on a cold start, a capture or a compilation. The others judge
#: the whole window: ``low-gpu-utilization`` and ``gpu-idle-gaps`` name each gap's segment, and
#: what-ran rules (precision, attention, elementwise, pageable copies, communication) hold in
#: any segment.
STEADY_RULES: tuple[Rule, ...] = (launch_bound, cpu_bound, host_sync, memory_pressure, low_compute_efficiency,
                                  dataloader_bound, too_small_for_gpu, unfused_optimizer, loop_host_work,
                                  cpu_op_overhead, activation_recompute, allocator_churn, memory_growth,
                                  frozen_forward)
STEADY_IDS: frozenset[str] = frozenset(getattr(r, "finding_id", "") for r in STEADY_RULES)

__all__ = ["CAUSE_RULES", "FINDING_IDS", "RESIDUAL_RULE", "RULES", "STEADY_IDS", "STEADY_RULES", "low_gpu_utilization"]
