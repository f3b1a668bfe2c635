"""Hugging Face ``Trainer`` advice: each finding's fixes phrased as ``TrainingArguments`` settings.

::

    from gpumagic.integrations.huggingface import huggingface_fixes

    report = huggingface_fixes(report, training_args=trainer.args)   # Trainer fixes first

:data:`ADVICE` maps a finding id to the ``TrainingArguments`` settings that act on it, built from
the finding's evidence and the run's current arguments. ``huggingface_fixes(report)`` rewrites a
report's fixes with it, checked against the installed transformers (a setting the version lacks
is dropped and said so). It needs transformers only to check; without it the settings are left
unchecked, with a note.

This is domain knowledge, so it lives in the analysis layer; the rules' own ``Fix("huggingface",
...)`` entries are the static form (written without the run's ``TrainingArguments``), which this
table replaces where it has advice for a finding. The ``GpuProfileCallback`` that applies it to a
``Trainer`` run is a shell: :mod:`gpumagic.shells.hf_callback` (public path
:mod:`gpumagic.integrations.huggingface`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumagic.report.model import Fix

if TYPE_CHECKING:  # pragma: no cover
    from gpumagic.report.model import Finding, Report

#: The settings' spellings across transformers versions, newest first: (field, value). transformers
#: 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name is a
#: deprecated alias).
SPELLINGS: dict[str, tuple[str, ...]] = {
    "gradient_checkpointing": ("activation_checkpointing", "gradient_checkpointing"),
}
#: Data-loader workers suggested when the Trainer uses none (the dataloader-bound rule's default;
#: ``gpumagic.tune_dataloader(trainer.get_train_dataloader())`` measures the best value).
DEFAULT_WORKERS = 4
#: Activation checkpointing recomputes the forward pass of each checkpointed block during the
#: backward pass: about one extra forward, i.e. ~20-30 % more compute per step (Chen et al. 2016,
#: "Training Deep Nets with Sublinear Memory Cost"; the transformers docs quote ~20 %).
CHECKPOINTING_COST = "recomputing activations costs about one extra forward pass (~20-30 % longer steps)"
#: Below this peak share of GPU memory, activation checkpointing buys nothing the run needs.
LOW_MEMORY_FRAC = 0.5


@dataclass(frozen=True)
class Advice:
    """One TrainingArguments suggestion: settings by their canonical name, and a trade-off."""

    description: str
    settings: dict[str, Any]
    caveat: str = ""


# -- what to suggest per finding ------------------------------------------------------------------


def _dataloader(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    workers = _current(current, "dataloader_num_workers", 0)
    suggested = f.evidence.numbers.get("suggested_num_workers")  # from the usable cores (analysis.hostcpu)
    settings: dict[str, Any] = {"dataloader_num_workers": int(suggested) if suggested
                                else DEFAULT_WORKERS if not workers else 2 * workers}
    if not cpu_only:  # pinned memory only speeds up copies to a GPU
        settings["dataloader_pin_memory"] = True
    settings.update(dataloader_persistent_workers=True, dataloader_prefetch_factor=2)
    return [Advice("Load batches in worker processes" + ("," if cpu_only else ", pinned,") + " kept alive between epochs",
                   settings, "gpumagic.tune_dataloader(trainer.get_train_dataloader()) measures the best num_workers")]


def _pinned(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    # Pinning alone does not make the Trainer's copies asynchronous: accelerate moves batches with
    # non_blocking=False unless accelerator_config={"non_blocking": True} (transformers'
    # AcceleratorConfig docs; the key exists in recent versions only, checked below).
    return [Advice("Pin the Trainer's batches and copy them without blocking the host",
                   {"dataloader_pin_memory": True, "accelerator_config": {"non_blocking": True}},
                   "pinned memory alone leaves accelerate's copies blocking; non_blocking frees the host, the "
                   "copy still runs before the step's kernels on the same stream; tensors created outside "
                   "the DataLoader (in compute_loss or a callback) stay pageable")]


def _precision(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    from gpumagic.analysis.rules.precision import BF16_MIN_CC, TENSOR_CORE_MIN_CC

    numbers = f.evidence.numbers
    cc = numbers.get("compute_capability")
    if not isinstance(cc, (int, float)):
        return []
    # float64 matmuls: the cast to float32 (a code change, the rule's first fix) must come first, since
    # autocast skips float64 tensors; without tensor cores there is no Trainer setting to add
    first = "After the cast to float32 below (autocast skips float64 tensors), t" if "fp64_share_of_matmul" in numbers \
        else "T"
    if first != "T" and cc < TENSOR_CORE_MIN_CC:
        return []
    if cc >= BF16_MIN_CC and numbers.get("vendor") == "AMD":
        # transformers' is_torch_tf32_available() needs CUDA: tf32=True raises ValueError on ROCm
        return [Advice(f"{first}rain in bfloat16 mixed precision (no tf32 on ROCm: the Trainer refuses it there)",
                       {"bf16": True})]
    if cc >= BF16_MIN_CC:
        return [Advice(f"{first}rain in bfloat16 mixed precision, with TF32 for the remaining FP32 matmuls",
                       {"bf16": True, "tf32": True})]
    return [Advice(f"{first}rain in float16 mixed precision (this GPU has no bf16 tensor cores; the Trainer adds the "
                   "loss scaler)", {"fp16": True})]


def _launch(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    # torch_compile=True alone is torch.compile's default mode, without CUDA graphs; the Trainer's
    # twin of mode="reduce-overhead" is torch_compile_mode (TrainingArguments docs).
    return [Advice("Fuse kernels with torch.compile and replay them as CUDA graphs, with a fused optimizer",
                   {"torch_compile": True, "torch_compile_mode": "reduce-overhead", "optim": "adamw_torch_fused"},
                   "the first steps compile the model: profile after them (skip=)")]


def _cpu(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    settings: dict[str, Any] = {"torch_compile": True}
    batch = _current(current, "per_device_train_batch_size", None)
    if isinstance(batch, int) and batch > 0:
        settings["per_device_train_batch_size"] = 2 * batch
    return [Advice("Cut Python overhead per step with torch.compile" +
                   ("" if "per_device_train_batch_size" in settings else ", and give each step more work "
                    "(a larger per_device_train_batch_size)"), settings)]


def _op_overhead(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    from gpumagic.analysis.rules.opoverhead import MIN_PASSES_PER_STEP

    out = []
    # a step of many passes, each a micro-batch of gradient accumulation: the same effective batch
    # in one pass (the rule's first PyTorch fix, as the Trainer's settings)
    passes = f.evidence.numbers.get("passes_per_step")
    batch = _current(current, "per_device_train_batch_size", None)
    steps = _current(current, "gradient_accumulation_steps", 1)
    if (isinstance(passes, (int, float)) and passes >= MIN_PASSES_PER_STEP and isinstance(batch, int) and batch >= 1
            and isinstance(steps, int) and steps > 1):
        out.append(Advice(f"Run each update's {steps} micro-batches as one batch: one forward and backward, not {steps}",
                          {"per_device_train_batch_size": batch * steps, "gradient_accumulation_steps": 1},
                          "the same effective batch; the step then holds the whole batch's activations at once"))
    # torch_compile=True compiles the model with torch.compile's default mode (TrainingArguments docs)
    out.append(Advice("Compile the model: its many small operators become a few fused loops", {"torch_compile": True},
                      "the first steps compile the model: profile after them (skip=)"))
    return out


def _memory(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    # group_by_length is a padding/speed setting, not a memory one: it puts the longest batch first.
    return [Advice("Trade compute for memory: recompute activations in the backward pass",
                   {"gradient_checkpointing": True}, CHECKPOINTING_COST)]


def _recompute(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    return [Advice("Keep the activations instead of recomputing them in the backward pass",
                   {"gradient_checkpointing": False},
                   "memory grows by the activations the checkpoints dropped: watch the peak in the next profile")]


def _empty_cache(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    # torch_empty_cache_steps: "Number of steps to wait before calling torch.<device>.empty_cache()
    # ... If None, cache will not be emptied" (TrainingArguments); None is its default
    if _current(current, "torch_empty_cache_steps", None) is None:
        return []  # the Trainer does not empty it: the rule's own fixes stand
    return [Advice("Stop the Trainer emptying the GPU memory cache every few steps", {"torch_empty_cache_steps": None},
                   "only if memory does not run out without it: the allocator then reuses its cached blocks")]


def _bigger_batch(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    batch = _current(current, "per_device_train_batch_size", None)
    if not isinstance(batch, int) or batch < 1:
        return []  # the current batch size is unknown: the PyTorch fix says what to do
    return [Advice("Give the GPU more work per step", {"per_device_train_batch_size": 2 * batch},
                   "scale the learning rate with the batch size, or keep the effective batch with "
                   "gradient_accumulation_steps")]


def _out_of_memory(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    batch = _current(current, "per_device_train_batch_size", None)
    steps = _current(current, "gradient_accumulation_steps", 1)
    settings: dict[str, Any] = {"gradient_checkpointing": True}
    if isinstance(batch, int) and batch > 1 and isinstance(steps, int) and steps >= 1:
        fits = f.evidence.numbers.get("largest_batch_estimate")
        smaller = fits if isinstance(fits, int) and 0 < fits < batch else batch // 2
        settings.update(per_device_train_batch_size=smaller, gradient_accumulation_steps=steps * -(-batch // smaller))
    if not cpu_only:
        settings["bf16"] = True
    return [Advice("Fit the step in memory: recompute activations, a smaller micro-batch with the same effective batch"
                   + ("" if cpu_only else ", bf16 activations"), settings,
                   CHECKPOINTING_COST + "; bf16 needs an Ampere or newer GPU (fp16=True before it)")]


def _communication(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    return [Advice("Let DDP all-reduce larger gradient buckets, overlapped with the backward pass",
                   {"ddp_bucket_cap_mb": 100},
                   "measure it: a bigger bucket also starts the first all-reduce later in the backward pass; "
                   "with gradient_accumulation_steps > 1 the Trainer already skips the all-reduce between micro-batches")]


def _host_sync(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    # The Trainer's NaN/inf filter syncs twice a step (analysis.rules.sync.TRAINER_NAN_CHECK_FIX).
    # With fp16=True its GradScaler reads found_inf with .item() before each step of an unfused
    # optimizer (rules.sync.SCALER_SHARE); the fused AdamW takes it on the GPU.
    scaler: list[Advice] = []
    optim = _current(current, "optim", None)
    share = f.evidence.numbers.get("grad_scaler_frac")
    if isinstance(share, (int, float)) and share >= 0.5 and getattr(optim, "value", optim) != "adamw_torch_fused":
        scaler = [Advice("Use the fused AdamW: the fp16 GradScaler then checks for inf/NaN gradients on the GPU, "
                         "without the .item() before each step", {"optim": "adamw_torch_fused"},
                         "on an Ampere or later GPU, bf16=True instead of fp16=True needs no GradScaler at all")]
    return [*scaler, Advice("Stop the Trainer testing each step's loss for NaN/inf on the host "
                            "(logging_nan_inf_filter=True, the default: two syncs a step, whatever logging_steps is)",
                            {"logging_nan_inf_filter": False},
                            "it changes only the logged loss, not training; include_num_input_tokens_seen reads a "
                            "count with .item() every step too")]


def _step_outliers(f: Finding, current: Any, cpu_only: bool) -> list[Advice]:
    """Saves and evaluations that stalled steps, made half as often: the Trainer saves a checkpoint
    every ``save_steps`` and evaluates every ``eval_steps`` optimizer steps when the strategy is
    ``"steps"`` (TrainingArguments docs, "Checkpointing & Saving", "Evaluation"); a number below 1
    is a share of the total steps. ``load_best_model_at_end=True`` needs ``save_steps`` a multiple
    of ``eval_steps`` (unless ``save_strategy="best"``): doubling both keeps it. Nothing without the run's arguments, or with an
    ``"epoch"``/``"best"`` strategy (the interval is not a number to change). Steps stalled by the
    DataLoader's workers stopping and starting for a new epoch, or starting inside the step at all
    (``workers_started``): ``dataloader_persistent_workers=True`` (also without the run's
    arguments; not where they say it is on already)."""
    numbers = f.evidence.numbers
    saves, evals = numbers.get("explained_by_torch_save"), numbers.get("explained_by_eval")
    # steps the workers' restart explains, or where they started again at all (their start is timed,
    # not the new workers' first batches made beside the step)
    restarts = max(numbers.get("explained_by_loader") or 0, numbers.get("workers_started") or 0)
    save_every = _doubled(current, "save_strategy", "save_steps")
    eval_every = _doubled(current, "eval_strategy", "eval_steps")
    save_strategy = _current(current, "save_strategy", None)
    load_best = (_current(current, "load_best_model_at_end", False) is True
                 and getattr(save_strategy, "value", save_strategy) != "best")  # "best" needs no multiple
    out = []
    if restarts and _current(current, "dataloader_persistent_workers", False) is not True:
        out.append(Advice(f"A DataLoader's workers stopped and started again for a new pass (an epoch, an evaluation) in "
                          f"{restarts} of these steps: keep them between passes", {"dataloader_persistent_workers": True},
                          "the workers and their copies of the dataset stay in memory between epochs"))
    if saves and save_every is not None:
        out.append(Advice(f"Checkpoint saves stalled {saves} of these steps: save half as often (save_steps counts "
                          "optimizer steps)", {"save_steps": save_every},
                          "a crash then loses up to twice as many steps; save_only_model=True writes a smaller "
                          "checkpoint (no optimizer, scheduler or RNG state), but training cannot resume from it"))
    if evals and eval_every is not None and (not load_best or save_every is not None):
        settings: dict[str, Any] = {"eval_steps": eval_every}
        if load_best:
            settings["save_steps"] = save_every  # load_best_model_at_end: save_steps a multiple of eval_steps
        out.append(Advice(f"Evaluation ran inside {evals} of these steps: evaluate half as often (eval_steps counts "
                          "optimizer steps)", settings,
                          "the evaluation metrics come half as often; a smaller eval_dataset (a fixed subset) "
                          "shortens each evaluation" + ("; save_steps doubles with it, as load_best_model_at_end "
                                                        "needs it a multiple of eval_steps" if load_best else "")))
    return out


def _doubled(current: Any, strategy: str, steps: str) -> int | float | None:
    """Twice the run's ``steps`` interval where ``strategy`` is ``"steps"``: an integer number of
    steps, or a share of the run below 1 (None when doubling would reach the whole run)."""
    chosen = _current(current, strategy, None)
    value = _current(current, steps, None)
    if getattr(chosen, "value", chosen) != "steps" or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value >= 1 and value == int(value):
        return 2 * int(value)
    return 2 * value if 0 < value < 0.5 else None


ADVICE = {
    "dataloader-bound": _dataloader,
    "pageable-memcpy": _pinned,
    "transfer-bound": _pinned,
    "mixed-precision-off": _precision,
    "launch-bound": _launch,
    "cpu-bound": _cpu,
    "memory-pressure": _memory,
    "out-of-memory": _out_of_memory,
    "low-gpu-utilization": _bigger_batch,
    "communication-heavy": _communication,
    "host-sync": _host_sync,
    "small-transfers": _pinned,
    "elementwise-bound": _launch,
    "low-compute-efficiency": _bigger_batch,
    "too-small-for-gpu": _bigger_batch,
    "step-outliers": _step_outliers,
    "cpu-op-overhead": _op_overhead,
    "activation-recompute": _recompute,
    "allocator-churn": _empty_cache,
}


def _current(training_args: Any, name: str, default: Any) -> Any:
    return getattr(training_args, name, default) if training_args is not None else default


# -- the installed TrainingArguments --------------------------------------------------------------


@dataclass(frozen=True)
class ArgsSchema:
    """The TrainingArguments fields to check against (``None``: unchecked) and their version."""

    fields: dict[str, Any] | None
    version: str

    def spelling(self, name: str, value: Any) -> tuple[str, Any] | None:
        """The first spelling of setting ``name`` that this version accepts, or None."""
        for field in SPELLINGS.get(name, (name,)):
            if self.fields is None or (field in self.fields and self.accepts(field, value)):
                return field, value
        return None

    def accepts(self, field: str, value: Any) -> bool:
        """A value outside the field's declared choices (or an unknown optimizer) is refused."""
        spec = self.fields.get(field) if self.fields else None
        choices = getattr(spec, "metadata", {}).get("choices") if spec is not None else None
        if choices and isinstance(value, str):
            return value in choices
        if field == "optim" and isinstance(value, str):
            return value in _optimizer_names()
        if field == "accelerator_config" and isinstance(value, dict) and self.fields is not None and spec is not None:
            return set(value) <= _accelerator_config_keys()
        return True

    def default(self, field: str) -> Any:
        """The field's default in this version, or a sentinel when unknown."""
        spec = self.fields.get(field) if self.fields else None
        return getattr(spec, "default", _UNKNOWN) if spec is not None else _UNKNOWN


def transformers_source(path: str) -> str | None:
    """The text of the installed transformers' file ``path`` (under its package folder), None
    without transformers or that file. Read as text: analysing a saved trace never imports
    transformers or torch, and which names a fix spells depends on the version installed."""
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path
    try:
        return Path(str(distribution("transformers").locate_file(f"transformers/{path}"))).read_text(encoding="utf-8")
    except (PackageNotFoundError, OSError):
        return None


def installed_schema() -> ArgsSchema | None:
    """The installed transformers' TrainingArguments, or None when transformers is missing."""
    try:
        import transformers
        from transformers import TrainingArguments
    except ImportError:
        return None
    return ArgsSchema({f.name: f for f in dataclasses.fields(TrainingArguments)}, transformers.__version__)


_UNKNOWN = object()


def _accelerator_config_keys() -> set[str]:
    """The keys ``TrainingArguments(accelerator_config=...)`` accepts in the installed version."""
    try:
        from transformers.trainer_pt_utils import AcceleratorConfig
    except ImportError:
        return set()
    return {f.name for f in dataclasses.fields(AcceleratorConfig)}


def _optimizer_names() -> set[str]:
    try:
        from transformers.training_args import OptimizerNames
    except ImportError:
        return set()
    return {o.value for o in OptimizerNames}


# -- rewriting a report ---------------------------------------------------------------------------


def huggingface_fixes(report: Report, transformers_version: str | None = None, *, training_args: Any = None,
                      fields: Any = None) -> Report:
    """A new Report whose findings put ``TrainingArguments`` fixes first.

    Fixes are checked against the installed transformers' ``TrainingArguments`` (or ``fields``,
    a collection of field names, when given): a setting that version lacks is dropped, and the fix
    says so. ``transformers_version`` names the version in messages; when it differs from the
    installed one, a note says which version was checked. ``training_args`` (the run's
    ``TrainingArguments``) lets suggestions build on current values and skip settings already
    made. Findings without a Trainer equivalent keep their fixes, Trainer ones first.
    """
    schema = _schema(fields, transformers_version)
    notes = list(report.notes)
    cpu_only = report.metrics is not None and report.metrics.trace.cpu_only
    largest = _largest_batch(report, training_args)
    findings = [_rephrase(f, schema, training_args, cpu_only, largest) for f in report.findings]
    notes += _version_notes(schema, transformers_version, notes)
    notes += _checkpointing_note(report, training_args)
    return dataclasses.replace(report, findings=findings, notes=notes)


def _schema(fields: Any, version: str | None) -> ArgsSchema:
    if fields is not None:
        return ArgsSchema({name: None for name in fields}, version or "given")
    installed = installed_schema()
    return installed if installed is not None else ArgsSchema(None, version or "not installed")


def _version_notes(schema: ArgsSchema, asked: str | None, existing: list[str]) -> list[str]:
    if schema.fields is None:
        note = ("transformers is not installed: the TrainingArguments fixes were not checked against a version "
                "(pip install 'gpumagic[hf]').")
    elif asked and asked != schema.version and schema.version != "given":
        note = (f"TrainingArguments fixes were checked against the installed transformers {schema.version}, "
                f"not {asked}.")
    else:
        note = f"Fixes are phrased as TrainingArguments for transformers {schema.version}."
    return [] if note in existing else [note]


def _rephrase(f: Finding, schema: ArgsSchema, training_args: Any, cpu_only: bool, largest: int | None = None) -> Finding:
    """Trainer fixes first. A finding with no advice here (or none for this run) keeps the rule's
    own Trainer fixes; advice whose settings this version entirely lacks is dropped. A larger
    ``per_device_train_batch_size`` is suggested only up to ``largest`` (:func:`_largest_batch`)."""
    pytorch = tuple(x for x in f.fixes if x.flavor == "pytorch")
    advice = ADVICE[f.id](f, training_args, cpu_only) if f.id in ADVICE else []
    advice = [a for a in (_batch_checked(a, training_args, largest) for a in advice) if a is not None]
    if not advice:
        own = tuple(x for x in f.fixes if x.flavor == "huggingface" and _batch_fits(x.code, largest))
        return dataclasses.replace(f, fixes=own + pytorch)
    fixes = tuple(fx for fx in (_fix(a, schema, training_args) for a in advice) if fx is not None)
    return dataclasses.replace(f, fixes=fixes + pytorch)


def _fix(advice: Advice, schema: ArgsSchema, training_args: Any) -> Fix | None:
    """The advice as a Fix: settings this version lacks are named, settings already made skipped."""
    kwargs: dict[str, Any] = {}
    missing, already = [], []
    for name, value in advice.settings.items():
        spelled = schema.spelling(name, value)
        if spelled is None:
            missing.append(name)
        elif training_args is not None and getattr(training_args, spelled[0], object()) == spelled[1]:
            already.append(f"{spelled[0]}={spelled[1]!r}")
        elif training_args is None and schema.default(spelled[0]) == spelled[1]:
            already.append(f"{spelled[0]}={spelled[1]!r} (the default)")
        else:
            kwargs[spelled[0]] = spelled[1]
    if not kwargs and not already:
        return None
    text = advice.description + (f" ({advice.caveat})" if advice.caveat else "") + "."
    if missing:
        text += f" transformers {schema.version} has no TrainingArguments field for {', '.join(missing)}."
    if already:
        text += f" Already set: {', '.join(already)}."
    code = arguments_code(kwargs) if kwargs else "# already set in your TrainingArguments: " + ", ".join(already)
    return Fix("huggingface", text, code)


def _largest_batch(report: Report, training_args: Any) -> int | None:
    """The largest per-device batch estimated to fit with a 10 % margin (:func:`gpumagic.analysis.oom.fit_for`),
    or None when the report's memory cannot say (no allocator peak, no capacity, batch unknown)."""
    from gpumagic.analysis.oom import fit_for

    batch = _current(training_args, "per_device_train_batch_size", None)
    return fit_for(report.metrics, batch if isinstance(batch, int) and batch > 0 else None)


_BATCH_SETTING = re.compile(r"per_device_train_batch_size\s*=\s*(\d+)")


def _batch_fits(code: str, largest: int | None) -> bool:
    """Whether a rule's own Trainer fix may stay: it sets no batch size, or one the memory check
    allows (the rule's static fixes are written without the run's memory; a batch it names is kept
    only when at most ``largest``; a smaller batch with accumulation, as for memory, always)."""
    hit = _BATCH_SETTING.search(code)
    return hit is None or "gradient_accumulation_steps" in code or (largest is not None and int(hit.group(1)) <= largest)


def _batch_checked(advice: Advice, training_args: Any, largest: int | None) -> Advice | None:
    """``advice`` with a larger ``per_device_train_batch_size`` only where the memory check allows
    it: capped at ``largest``, or left out (with the reason) when the check cannot be made or
    leaves no room. None when nothing is left to suggest."""
    batch = _current(training_args, "per_device_train_batch_size", None)
    asked = advice.settings.get("per_device_train_batch_size")
    if not isinstance(asked, int) or not isinstance(batch, int) or asked <= batch:
        return advice
    if advice.settings.get("gradient_accumulation_steps") == 1 and asked == batch * _current(
            training_args, "gradient_accumulation_steps", 1):
        return advice  # the micro-batches of an update as one batch: the effective batch is the same
    settings = dict(advice.settings)
    if largest is not None and largest > batch:
        settings["per_device_train_batch_size"] = min(asked, largest)
        caveat = (f"{advice.caveat}; " if advice.caveat else "") + (
            f"a batch of {largest} is estimated to fit with a 10 % margin (peak memory scaled with the batch)")
        return dataclasses.replace(advice, settings=settings, caveat=caveat)
    del settings["per_device_train_batch_size"]
    why = ("GPU memory leaves no room for a larger batch (estimate with a 10 % margin)" if largest is not None
           else "a larger batch is not suggested: whether it fits needs the peak memory (profile with memory=True)")
    if not settings:
        return None
    return dataclasses.replace(advice, settings=settings, caveat=(f"{advice.caveat}; " if advice.caveat else "") + why)


def arguments_code(kwargs: dict[str, Any], width: int = 88) -> str:
    """``TrainingArguments(..., a=1, b=True)``, wrapped under the parenthesis at ``width``."""
    head, indent = "TrainingArguments(...", " " * len("TrainingArguments(")
    lines, line = [], head
    for k, v in kwargs.items():
        item = f"{k}={v!r}"
        if len(line) + len(item) + 3 > width:
            lines.append(line + ",")
            line = indent + item
        else:
            line += ", " + item
    return "\n".join([*lines, line + ")"])


def _checkpointing_note(report: Report, training_args: Any) -> list[str]:
    """The gradient-checkpointing trade-off, when it is on although memory is plentiful (not when
    ``activation-recompute`` already says so, with the time the recomputation took)."""
    on = any(getattr(training_args, n, None) is True for n in ("activation_checkpointing", "gradient_checkpointing"))
    peak = None if report.metrics is None else report.metrics.memory.peak_frac
    if not on or peak is None or peak >= LOW_MEMORY_FRAC or "activation-recompute" in report.finding_ids:
        return []
    return [f"Gradient (activation) checkpointing is on while GPU memory peaks at {peak * 100:.0f} % of capacity: "
            f"{CHECKPOINTING_COST}. Turning it off, or using the memory for a larger batch, is likely faster."]


__all__ = ["ADVICE", "Advice", "ArgsSchema", "arguments_code", "huggingface_fixes", "installed_schema",
           "transformers_source"]
