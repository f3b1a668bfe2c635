"""huggingface_fixes: findings' fixes phrased as TrainingArguments, checked against a version."""

from __future__ import annotations

import dataclasses
import functools
import os
from types import SimpleNamespace

import msgspec
import pytest
from tracebuilder import DATA

import gpumagic
from gpumagic.integrations.huggingface import arguments_code, huggingface_fixes, installed_schema
from gpumagic.report.model import Evidence, Finding, Fix, Report

#: TrainingArguments fields of a transformers 4.x-like version (before the v5 renames), for the
#: settings gpumagic suggests; dataloader_prefetch_factor left out to play an older release.
OLD_FIELDS = {"dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "bf16", "fp16",
              "tf32", "torch_compile", "optim", "group_by_length", "gradient_checkpointing",
              "per_device_train_batch_size", "gradient_accumulation_steps"}


@pytest.fixture(scope="module")
def w0():
    return gpumagic.analyze(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))


def _finding(fid: str, **numbers) -> Finding:
    return Finding(id=fid, severity="medium", title=fid, why="why", evidence=Evidence("s", numbers), est_gain=0.1,
                   gain_method="m", fixes=(Fix("huggingface", "rule's own", "TrainingArguments(..., x=1)"),
                                           Fix("pytorch", "p", "torch.thing()")), doc_url="https://example.org")


def _report(*findings: Finding, **sections) -> Report:
    """A report of ``findings``; ``sections`` (e.g. ``memory={"peak_frac": 0.2}``) set those metrics
    fields of a real report's metrics (none given: a report that measured nothing)."""
    if not sections:
        return Report(metrics=None, findings=list(findings), notes=[])
    metrics = _w0_metrics()
    changed = {name: msgspec.structs.replace(getattr(metrics, name), **fields) for name, fields in sections.items()}
    return Report(metrics=msgspec.structs.replace(metrics, **changed), findings=list(findings), notes=[])


@functools.cache
def _w0_metrics():
    return gpumagic.analyze(os.path.join(DATA, "resnet50_v100_workers0.json.gz")).metrics


def test_dataloader_fix_comes_first_and_drops_fields_the_version_lacks(w0):
    out = huggingface_fixes(w0, "4.30.0", fields=OLD_FIELDS)
    f = out.finding("dataloader-bound")
    first = f.fixes[0]
    assert first.flavor == "huggingface"
    assert first.code == ("TrainingArguments(..., dataloader_num_workers=4, dataloader_pin_memory=True,\n"
                          "                  dataloader_persistent_workers=True)")
    assert "transformers 4.30.0 has no TrainingArguments field for dataloader_prefetch_factor" in first.description
    assert [x.flavor for x in f.fixes[1:]] == ["pytorch"]
    assert "Fixes are phrased as TrainingArguments for transformers 4.30.0." in out.notes


def test_original_report_is_untouched_and_rewriting_is_idempotent(w0):
    before = [f.fixes for f in w0.findings]
    once = huggingface_fixes(w0, fields=OLD_FIELDS)
    twice = huggingface_fixes(once, fields=OLD_FIELDS)
    assert [f.fixes for f in w0.findings] == before
    assert [f.fixes for f in twice.findings] == [f.fixes for f in once.findings]
    assert len(twice.notes) == len(once.notes)
    assert once.finding_ids == w0.finding_ids and once.metrics is w0.metrics


def test_precision_by_compute_capability():
    volta = huggingface_fixes(_report(_finding("mixed-precision-off", compute_capability=7.0)), fields=OLD_FIELDS)
    assert volta.findings[0].fixes[0].code == "TrainingArguments(..., fp16=True)"
    ampere = huggingface_fixes(_report(_finding("mixed-precision-off", compute_capability=8.0)), fields=OLD_FIELDS)
    assert ampere.findings[0].fixes[0].code == "TrainingArguments(..., bf16=True, tf32=True)"


def test_renamed_settings_use_the_spelling_the_version_has():
    memory = _finding("memory-pressure")
    old = huggingface_fixes(_report(memory), fields=OLD_FIELDS).findings[0]
    assert old.fixes[0].code == "TrainingArguments(..., gradient_checkpointing=True)"
    assert "extra forward pass" in old.fixes[0].description  # the trade-off is stated
    # group_by_length is a padding/speed setting (longest batch first), never memory advice
    assert not any("group_by_length" in fx.code for fx in old.fixes)
    v5 = OLD_FIELDS - {"group_by_length"} | {"activation_checkpointing", "train_sampling_strategy"}
    new = huggingface_fixes(_report(memory), fields=v5).findings[0]
    assert new.fixes[0].code == "TrainingArguments(..., activation_checkpointing=True)"
    neither = huggingface_fixes(_report(memory), fields={"bf16"}).findings[0]
    assert [fx.flavor for fx in neither.fixes] == ["pytorch"]  # nothing this version can express


def test_turning_checkpointing_off_uses_the_spelling_the_version_has():
    """activation-recompute's advice sets the same renamed field, to False."""
    recompute = _finding("activation-recompute")
    old = huggingface_fixes(_report(recompute), fields=OLD_FIELDS).findings[0]
    assert old.fixes[0].code == "TrainingArguments(..., gradient_checkpointing=False)"
    v5 = OLD_FIELDS | {"activation_checkpointing"}
    new = huggingface_fixes(_report(recompute), fields=v5).findings[0]
    assert new.fixes[0].code == "TrainingArguments(..., activation_checkpointing=False)"


def test_non_blocking_copies_need_accelerator_config_checked_against_the_installed_version():
    import transformers  # noqa: F401  (the installed version is the one checked)
    from transformers.trainer_pt_utils import AcceleratorConfig

    f = huggingface_fixes(_report(_finding("pageable-memcpy"))).findings[0]
    has_key = "non_blocking" in {x.name for x in dataclasses.fields(AcceleratorConfig)}
    assert ("accelerator_config={'non_blocking': True}" in f.fixes[0].code) == has_key
    assert "pinned memory alone leaves accelerate's copies blocking" in f.fixes[0].description
    # a version without the field says so instead of suggesting it
    old = huggingface_fixes(_report(_finding("pageable-memcpy")), fields=OLD_FIELDS).findings[0]
    assert "no TrainingArguments field for accelerator_config" in old.fixes[0].description


def test_launch_advice_names_the_compile_mode_and_skips_installed_defaults():
    schema = installed_schema()
    f = huggingface_fixes(_report(_finding("launch-bound"))).findings[0]
    assert "torch_compile_mode='reduce-overhead'" in f.fixes[0].code
    optim_default = schema.fields["optim"].default
    if optim_default == "adamw_torch_fused":  # recent transformers: already the default, not suggested
        assert "optim=" not in f.fixes[0].code and "optim='adamw_torch_fused' (the default)" in f.fixes[0].description
    else:
        assert "optim='adamw_torch_fused'" in f.fixes[0].code
    old = huggingface_fixes(_report(_finding("launch-bound")), fields=OLD_FIELDS).findings[0]
    assert "no TrainingArguments field for torch_compile_mode" in old.fixes[0].description


def test_training_args_build_on_current_values():
    current = SimpleNamespace(dataloader_num_workers=2, dataloader_pin_memory=True, dataloader_persistent_workers=False,
                              per_device_train_batch_size=16)
    roomy = {"peak_allocated_bytes": 4 * 2**30, "capacity_bytes": 32 * 2**30}  # 4 GiB of 32 at batch 16
    out = huggingface_fixes(_report(_finding("dataloader-bound"), _finding("low-gpu-utilization"), memory=roomy),
                            fields=OLD_FIELDS, training_args=current)
    dl, low = out.findings
    assert dl.fixes[0].code == "TrainingArguments(..., dataloader_num_workers=4, dataloader_persistent_workers=True)"
    assert "Already set: dataloader_pin_memory=True." in dl.fixes[0].description
    assert low.fixes[0].code == "TrainingArguments(..., per_device_train_batch_size=32)"
    assert "a batch of 115 is estimated to fit" in low.fixes[0].description  # floor(0.9 * 32 / (4 / 16))


def test_a_larger_batch_is_suggested_only_as_far_as_memory_allows():
    current = SimpleNamespace(per_device_train_batch_size=16)
    tight = {"peak_allocated_bytes": 20 * 2**30, "capacity_bytes": 32 * 2**30}  # 0.9 * 32 / (20 / 16) = 23.04
    low = huggingface_fixes(_report(_finding("low-gpu-utilization"), memory=tight), fields=OLD_FIELDS,
                            training_args=current).findings[0]
    assert low.fixes[0].code == "TrainingArguments(..., per_device_train_batch_size=23)"
    full = {"peak_allocated_bytes": 30 * 2**30, "capacity_bytes": 32 * 2**30}  # no room
    for memory in (full, {"peak_allocated_bytes": None, "capacity_bytes": None}):  # no room; not recorded
        f = huggingface_fixes(_report(_finding("low-gpu-utilization"), memory=memory), fields=OLD_FIELDS,
                              training_args=current).findings[0]
        assert "per_device_train_batch_size" not in "".join(x.code for x in f.fixes)
    # cpu-bound keeps torch.compile and drops only the unchecked batch
    cpu = huggingface_fixes(_report(_finding("cpu-bound"), memory=full), fields=OLD_FIELDS,
                            training_args=current).findings[0]
    assert cpu.fixes[0].code == "TrainingArguments(..., torch_compile=True)"
    assert "no room for a larger batch" in cpu.fixes[0].description
    # a rule's own static Trainer fix naming a batch size is not kept unchecked either
    own = _finding("too-small-for-gpu")
    own = dataclasses.replace(own, fixes=(Fix("huggingface", "own", "TrainingArguments(..., per_device_train_batch_size=64)"),))
    assert huggingface_fixes(_report(own), fields=OLD_FIELDS).findings[0].fixes == ()


def test_a_step_of_many_micro_batches_becomes_one_batch_of_the_same_size():
    """cpu-op-overhead with 16 passes a step under a Trainer of batch 1 × 16 accumulation steps (a
    tiny BERT on this project's machine: 3.2 s for 12 steps, 0.29 s with batch 16 × 1): the same
    effective batch in one pass, whether or not the memory could be checked; compiling stays."""
    current = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=16)
    f = huggingface_fixes(_report(_finding("cpu-op-overhead", passes_per_step=16.0)), fields=OLD_FIELDS,
                          training_args=current).findings[0]
    assert f.fixes[0].code == "TrainingArguments(..., per_device_train_batch_size=16, gradient_accumulation_steps=1)"
    assert "16 micro-batches as one batch" in f.fixes[0].description
    assert f.fixes[1].code == "TrainingArguments(..., torch_compile=True)"
    # one pass a step, or no accumulation to merge: compiling alone
    for numbers, args in (({"passes_per_step": 1.0}, current),
                          ({"passes_per_step": 16.0}, SimpleNamespace(per_device_train_batch_size=8,
                                                                        gradient_accumulation_steps=1))):
        f = huggingface_fixes(_report(_finding("cpu-op-overhead", **numbers)), fields=OLD_FIELDS,
                              training_args=args).findings[0]
        assert f.fixes[0].code == "TrainingArguments(..., torch_compile=True)"


def test_everything_already_set_says_so_in_the_code():
    current = SimpleNamespace(dataloader_pin_memory=True)
    f = huggingface_fixes(_report(_finding("pageable-memcpy")), fields=OLD_FIELDS, training_args=current).findings[0]
    assert f.fixes[0].code == "# already set in your TrainingArguments: dataloader_pin_memory=True"


def test_findings_without_advice_keep_their_trainer_fixes_first():
    f = _finding("unfused-attention")
    f = dataclasses.replace(f, fixes=tuple(reversed(f.fixes)))  # pytorch first
    out = huggingface_fixes(_report(f), fields=OLD_FIELDS).findings[0]
    assert [x.flavor for x in out.fixes] == ["huggingface", "pytorch"]
    low = huggingface_fixes(_report(_finding("low-gpu-utilization")), fields=OLD_FIELDS).findings[0]
    assert low.fixes[0].description == "rule's own"  # batch size unknown without training_args


def test_host_sync_advice_turns_off_the_trainers_per_step_nan_inf_test():
    out = huggingface_fixes(_report(_finding("host-sync")), fields=OLD_FIELDS | {"logging_nan_inf_filter"}).findings[0]
    assert out.fixes[0].code == "TrainingArguments(..., logging_nan_inf_filter=False)"
    assert "two syncs a step" in out.fixes[0].description
    already = huggingface_fixes(_report(_finding("host-sync")), fields=OLD_FIELDS | {"logging_nan_inf_filter"},
                                training_args=SimpleNamespace(logging_nan_inf_filter=False)).findings[0]
    assert "Already set: logging_nan_inf_filter=False" in already.fixes[0].description


def test_cpu_only_reports_get_no_pinning_advice():
    out = huggingface_fixes(_report(_finding("dataloader-bound"), trace={"cpu_only": True}), fields=OLD_FIELDS)
    assert "pin_memory" not in out.findings[0].fixes[0].code


def test_checkpointing_trade_off_note_when_memory_is_plentiful():
    current = SimpleNamespace(gradient_checkpointing=True)
    out = huggingface_fixes(_report(memory={"peak_frac": 0.2}), fields=OLD_FIELDS, training_args=current)
    assert any(n.startswith("Gradient (activation) checkpointing is on while GPU memory peaks at 20 %") for n in out.notes)
    full = huggingface_fixes(_report(memory={"peak_frac": 0.9}), fields=OLD_FIELDS, training_args=current)
    assert not any("checkpointing is on" in n for n in full.notes)
    told = huggingface_fixes(_report(_finding("activation-recompute"), memory={"peak_frac": 0.2}), fields=OLD_FIELDS,
                             training_args=current)
    assert not any("checkpointing is on" in n for n in told.notes)  # the finding says it, with its time


def test_every_fixture_report_stays_well_formed():
    for name in ("a100_training_rank0.json.gz", "h100_bert_small_inference.json.gz", "v100_large_216k_events.json.gz"):
        out = huggingface_fixes(gpumagic.analyze(os.path.join(DATA, name)), fields=OLD_FIELDS | {"ddp_bucket_cap_mb"})
        for f in out.findings:
            assert f.fixes and all(fx.code.strip() and fx.flavor in ("pytorch", "huggingface") for fx in f.fixes)
            flavors = [fx.flavor for fx in f.fixes]
            assert flavors == sorted(flavors)  # "huggingface" sorts before "pytorch": Trainer fixes first
        out.to_json()


def test_arguments_code_wraps_under_the_parenthesis():
    code = arguments_code({"a_long_setting_name": 1, "another_long_setting": True, "third": "x"}, width=60)
    assert code == ("TrainingArguments(..., a_long_setting_name=1,\n"
                    "                  another_long_setting=True, third='x')")


def test_against_the_installed_transformers(hf, w0):
    schema = installed_schema()
    assert schema is not None and schema.version == hf.__version__
    out = huggingface_fixes(w0, transformers_version="0.0.1")
    assert f"checked against the installed transformers {hf.__version__}, not 0.0.1" in out.notes[-1]
    code = out.finding("dataloader-bound").fixes[0].code
    assert ("dataloader_prefetch_factor=2" in code) == ("dataloader_prefetch_factor" in schema.fields)
    launch = huggingface_fixes(_report(_finding("launch-bound"))).findings[0].fixes[0]
    assert launch.code.startswith("TrainingArguments(..., torch_compile=True, torch_compile_mode='reduce-overhead'")
    assert schema.spelling("optim", "no_such_optimizer") is None


def test_without_transformers_the_settings_are_unchecked(monkeypatch, w0):
    import gpumagic.analysis.advice.huggingface as hfmod

    monkeypatch.setattr(hfmod, "installed_schema", lambda: None)
    out = huggingface_fixes(w0)
    assert "transformers is not installed" in out.notes[-1]
    assert "dataloader_prefetch_factor=2" in out.finding("dataloader-bound").fixes[0].code


def test_issue14_findings_have_trainer_settings():
    out = huggingface_fixes(_report(_finding("small-transfers"), _finding("elementwise-bound")), fields=OLD_FIELDS)
    assert "dataloader_pin_memory=True" in out.finding("small-transfers").fixes[0].code
    assert "torch_compile=True" in out.finding("elementwise-bound").fixes[0].code


def test_step_outliers_from_saves_and_evaluations_become_save_and_eval_steps(tmp_path):
    """A step stalled by a checkpoint save or an evaluation: save_steps / eval_steps doubled, and the
    settings pasted into the installed transformers' TrainingArguments pass its own checks (with
    load_best_model_at_end, save_steps must stay a multiple of eval_steps)."""
    from everystep_blocks import outlier_bundle

    transformers = pytest.importorskip("transformers")

    def args(**kw):
        return transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)

    saved = gpumagic.analyze(outlier_bundle("torch.save"))
    assert saved.finding("step-outliers").evidence.numbers["explained_by_torch_save"] == 1
    f = huggingface_fixes(saved, training_args=args(save_strategy="steps", save_steps=250)).finding("step-outliers")
    assert f.fixes[0].flavor == "huggingface" and f.fixes[0].code == "TrainingArguments(..., save_steps=500)"
    assert "save_only_model=True" in f.fixes[0].description
    assert [x.flavor for x in f.fixes[1:]] == ["pytorch"]  # the threaded save stays for a plain loop
    best = dict(eval_strategy="steps", eval_steps=100, save_strategy="steps", save_steps=300, load_best_model_at_end=True)
    f = huggingface_fixes(gpumagic.analyze(outlier_bundle("eval")), training_args=args(**best)).finding("step-outliers")
    assert f.fixes[0].code == "TrainingArguments(..., eval_steps=200, save_steps=600)"
    args(**{**best, "eval_steps": 200, "save_steps": 600})  # accepted: 600 is a multiple of 200
    plain = dict(eval_strategy="steps", eval_steps=0.1)
    f = huggingface_fixes(gpumagic.analyze(outlier_bundle("eval")), training_args=args(**plain)).finding("step-outliers")
    assert f.fixes[0].code == "TrainingArguments(..., eval_steps=0.2)"
    for kind, kw in (("eval", {"eval_strategy": "epoch"}), ("torch.save", {"save_strategy": "epoch"}),
                     ("gc", {"save_strategy": "steps", "save_steps": 250})):
        f = huggingface_fixes(gpumagic.analyze(outlier_bundle(kind)), training_args=args(**kw)).finding("step-outliers")
        assert [x.flavor for x in f.fixes] == ["pytorch"] * len(f.fixes)  # no interval to change, or no save
    f = huggingface_fixes(saved).finding("step-outliers")  # without the run's arguments: nothing to double
    assert all(x.flavor == "pytorch" for x in f.fixes)


def test_step_outliers_from_worker_restarts_keep_the_workers(tmp_path):
    """A step stalled by the DataLoader's workers stopping and starting for a new epoch:
    dataloader_persistent_workers=True, accepted by the installed TrainingArguments; not where the
    run's arguments have it on already."""
    from everystep_blocks import outlier_bundle

    transformers = pytest.importorskip("transformers")
    restarted = gpumagic.analyze(outlier_bundle("loader"))
    assert restarted.finding("step-outliers").evidence.numbers["explained_by_loader"] == 1
    f = huggingface_fixes(restarted).finding("step-outliers")
    assert f.fixes[0].flavor == "huggingface" and f.fixes[0].code == "TrainingArguments(..., dataloader_persistent_workers=True)"
    assert "persistent_workers=True" in f.fixes[1].code and f.fixes[1].flavor == "pytorch"
    on = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", dataloader_num_workers=2,
                                        dataloader_persistent_workers=True)
    f = huggingface_fixes(restarted, training_args=on).finding("step-outliers")
    assert all(x.flavor == "pytorch" for x in f.fixes)


def test_step_outliers_where_the_workers_started_again_keep_them_too():
    """The workers' start timed at 30 ms of a 240 ms excess: not "explained", yet the start's
    aftermath is untimed (a Trainer's epoch boundary: 174-209 ms, 68-73 with persistent workers)."""
    import everystep_blocks as blocks

    pytest.importorskip("transformers")
    steps = [10.0] * 30
    steps[20] = 250.0
    b = blocks.block(steps)
    b["events"] = [{"kind": "loader", "start_ms": b["start_ms"][20] + 1, "dur_ms": 30.0, "detail": "2 worker(s)"}]
    r = gpumagic.analyze(blocks.with_every_step(b))
    assert "explained_by_loader" not in r.finding("step-outliers").evidence.numbers
    f = huggingface_fixes(r).finding("step-outliers")
    assert f.fixes[0].flavor == "huggingface" and f.fixes[0].code == "TrainingArguments(..., dataloader_persistent_workers=True)"


def test_a_trainer_that_empties_the_cache_is_told_to_stop():
    """allocator-churn: torch_empty_cache_steps set → unset it; not set → the rule's own fixes stand."""
    from types import SimpleNamespace

    churn = _finding("allocator-churn")
    fields = OLD_FIELDS | {"torch_empty_cache_steps"}
    told = huggingface_fixes(_report(churn), training_args=SimpleNamespace(torch_empty_cache_steps=1),
                             fields=fields).findings[0]
    assert told.fixes[0].code == "TrainingArguments(..., torch_empty_cache_steps=None)"
    unset = huggingface_fixes(_report(churn), training_args=SimpleNamespace(torch_empty_cache_steps=None),
                              fields=fields).findings[0]
    assert unset.fixes == churn.fixes


def test_gradscalers_sync_gets_the_fused_adamw_first():
    """host-sync whose blocked time is mostly GradScaler's found_inf read (fp16=True)."""
    from types import SimpleNamespace

    sync = _finding("host-sync", grad_scaler_frac=0.9)
    fields = OLD_FIELDS | {"optim", "logging_nan_inf_filter"}
    told = huggingface_fixes(_report(sync), training_args=SimpleNamespace(optim="adamw_torch"), fields=fields)
    codes = [fx.code for fx in told.findings[0].fixes]
    assert codes[0] == "TrainingArguments(..., optim='adamw_torch_fused')"
    already = huggingface_fixes(_report(sync), training_args=SimpleNamespace(optim="adamw_torch_fused"), fields=fields)
    assert not any("adamw_torch_fused" in fx.code for fx in already.findings[0].fixes)
    plain = huggingface_fixes(_report(_finding("host-sync", grad_scaler_frac=0.0)), fields=fields)
    assert not any("adamw_torch_fused" in fx.code for fx in plain.findings[0].fixes)
