"""Issue 29: ``metrics.host.loader_stages`` from a bundle's ``"loader_stages"`` block, and the
``dataloader-bound`` finding naming the dominant stage with the fix that fits it."""

from __future__ import annotations

import copy

import pytest
import test_diagnoses as td

from gpumagic import analyze
from gpumagic.analysis.loaderstages import kind
from gpumagic.report.model import report_from_dict


def stage_block(top: str, where: str = "worker") -> dict:
    """A bundle's block: ``top`` takes 80 ms of 100 over 4 batches."""
    rows = [(top, 80_000_000, 16), ("MyDataset.__getitem__", 12_000_000, 16), ("default_collate", 5_000_000, 4),
            ("other", 3_000_000, 4)]
    if top == "MyDataset.__getitem__":
        rows = [(top, 80_000_000, 16), ("Normalize", 17_000_000, 16), ("other", 3_000_000, 4)]
    return {"batches": 4, "workers": 2 if where == "worker" else 0,
            "stages": [{"name": n, "where": where, "self_ns": ns, "calls": c} for n, ns, c in rows]}


def bundle(tb, block) -> dict:
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "loader_stages": block}
    return d


def loader_finding(report):
    return next(f for f in report.findings if f.id == "dataloader-bound")


def test_the_stages_are_typed_largest_first_and_their_shares_add_up_to_one():
    r = analyze(bundle(td._loader_trace(True), stage_block("RandomResizedCrop")))
    stages = r.metrics.host.loader_stages
    assert [s.name for s in stages] == ["RandomResizedCrop", "MyDataset.__getitem__", "default_collate", "other"]
    assert [s.ms_per_batch for s in stages] == [20.0, 3.0, 1.25, 0.75]  # self ns ÷ 4 batches
    assert [s.share for s in stages] == [0.8, 0.12, 0.05, 0.03] and {s.where for s in stages} == {"worker"}
    again = report_from_dict(r.to_dict())  # the JSON round trip keeps them
    assert again.metrics.host.loader_stages == stages


def test_a_plain_trace_has_no_stages():
    assert analyze(td._loader_trace(True).to_dict()).metrics.host.loader_stages is None


@pytest.mark.parametrize(("top", "expect", "gpu"), [
    ("RandomResizedCrop", "augment on the GPU", True),
    ("RandomResizedCrop", "a cheaper transform", False),
    ("ImageFolder.load_image", "decode on the GPU", True),
    ("default_loader", "preprocess once and cache", False),
    ("MyDataset.__getitem__", "__getitems__", True),
    ("TensorDataset.__getitem__", "a whole list of indices", True),
    ("MyDataset.__getitems__", "already makes the batch in one call", False),
    ("MyStream.__iter__", "yield whole batches", False),
    ("my_collate", "make the whole batch", True),  # a bundle from before the role was named: stacking
    ("pad_batch (collate_fn)", "pad the whole dataset once", False),
    ("DataCollatorWithPadding (collate_fn)", "pad the whole dataset once", True),
    ("pin_memory", "pin fewer bytes", True),
])
def test_the_finding_names_the_dominant_stage_and_a_fix_that_fits_it(top, expect, gpu):
    r = analyze(bundle(td._loader_trace(True, gpu), stage_block(top)))
    f = loader_finding(r)
    assert f.evidence.numbers["slowest_stage"] == top and f.evidence.numbers["slowest_stage_share"] == 0.8
    assert f"{top} takes the largest share of each batch, 80.0 %" in f.evidence.summary
    staged = [fx for fx in f.fixes if "slowest stage" in fx.description]
    assert staged and expect in staged[0].description and "source: https://" in staged[0].description
    assert all("source: https://" in fx.description for fx in staged)
    assert f.fixes[0].description.startswith("Load batches in worker processes")  # the workers fix stays first
    if not gpu:
        assert not any("cuda" in fx.code for fx in staged)


def test_other_leading_says_so_and_adds_no_stage_fix():
    block = stage_block("other")
    block["stages"] = [{"name": "other", "where": "main", "self_ns": 90, "calls": 4},
                       {"name": "default_collate", "where": "main", "self_ns": 10, "calls": 4}]
    f = loader_finding(analyze(bundle(td._loader_trace(True), block)))
    assert "outside every timed stage" in f.evidence.summary
    assert not any("slowest stage" in fx.description for fx in f.fixes)


@pytest.mark.parametrize("mutate", [
    lambda b: b.update(batches=0), lambda b: b.update(batches="4"), lambda b: b.pop("stages"),
    lambda b: b["stages"][0].update(where="gpu"), lambda b: b["stages"][0].update(self_ns=-1),
    lambda b: b["stages"][0].update(name=""), lambda b: b.update(stages={"a": 1}),
])
def test_a_bad_block_is_ignored_with_a_note(mutate):
    block = copy.deepcopy(stage_block("Normalize"))
    mutate(block)
    r = analyze(bundle(td._loader_trace(True), block))
    assert r.metrics.host.loader_stages is None
    assert any("loader_stages are not valid" in n for n in r.notes)


@pytest.mark.parametrize(("name", "expected"), [
    ("other", "other"), ("pin_memory", "pin"), ("Subset.__getitem__", "dataset"), ("Stream.__iter__", "dataset"),
    ("default_collate", "collate"), ("PILToTensor", "decode"), ("Loader.decode_jpeg", "decode"),
    ("RandomHorizontalFlip", "transform"), ("Normalize", "transform"), ("read_file", "decode"),
    ("pad_batch (collate_fn)", "collate"), ("DataCollatorWithPadding (collate_fn)", "collate"),
])
def test_stage_kinds(name, expected):
    assert kind(name) == expected


def test_the_capture_names_a_collate_function_of_your_own_by_its_role():
    """A collate function named pad_batch read as a transform ("v2 transforms on uint8 tensors"), and
    one named collate as default_collate's stacking ("let the dataset make the whole batch"): the
    capture names the role, and padding once fits what such a function does."""
    from torch.utils.data import default_collate

    from gpumagic.analysis.loaderstages import CUSTOM_COLLATE
    from gpumagic.capture.stages import COLLATE_ROLE, collate_stage

    def pad_batch(batch):
        return batch

    assert COLLATE_ROLE == CUSTOM_COLLATE  # the bundle's spelling, written by one side and read by the other
    assert collate_stage(default_collate) == "default_collate"
    assert collate_stage(pad_batch).endswith("pad_batch (collate_fn)")


def test_a_recorded_padding_collate_gets_the_pad_once_fix():
    """tests/data/cpu_collate_pad.json.gz: token sequences padded by a collate_fn of the loop's own."""
    import os

    from tracebuilder import DATA

    r = analyze(os.path.join(DATA, "cpu_collate_pad.json.gz"))
    f = loader_finding(r)
    assert f.evidence.numbers["slowest_stage"] == "pad_batch (collate_fn)"
    staged = [fx for fx in f.fixes if "slowest stage" in fx.description]
    assert staged and "pad the whole dataset once" in staged[0].description and "pad_sequence(sequences" in staged[0].code
    assert not any("BatchSampler" in fx.code or "v2 transforms" in fx.description for fx in f.fixes)


def test_padding_once_gives_the_batches_padding_each_batch_gives():
    import torch
    from torch.nn.utils.rnn import pad_sequence

    from gpumagic.analysis.rules.stagefixes import PAD_ONCE_CODE

    torch.manual_seed(0)
    sequences = [torch.randint(1, 50, (n,)) for n in (3, 9, 1, 12, 5, 7, 2, 4)]
    ns = {"torch": torch, "sequences": sequences, "labels": list(range(8)), "epochs": 1, "batch_size": 3}
    exec(PAD_ONCE_CODE, ns)
    idx = ns["idx"].tolist()  # the last batch: two samples
    assert torch.equal(ns["x"], pad_sequence([sequences[i] for i in idx], batch_first=True))
    assert ns["y"].tolist() == idx and ns["x"].shape[1] == max(len(sequences[i]) for i in idx)
    # the mask a tokenizer's padding gives: ones on each sequence's tokens, zeros on its padding
    lengths = [len(sequences[i]) for i in idx]
    assert ns["attention_mask"].tolist() == [[j < n for j in range(ns["x"].shape[1])] for n in lengths]


def test_padding_once_gives_what_a_tokenizing_collate_gives():
    """A collate that tokenizes and pads (a transformers tokenizer, ``padding=True``), against the
    fix with the texts tokenized once and the tokenizer's pad id: the same ids and mask a batch."""
    pytest.importorskip("transformers")
    import snippets_collect as sc
    import torch

    from gpumagic.analysis.rules.stagefixes import PAD_ONCE_CODE

    tokenizer = sc._language_model("cpu")["tokenizer"]
    texts = ["hello world", "the cat sat on the mat", "the mat", "hello cat", "on the mat"]
    code = PAD_ONCE_CODE.replace("pad_id = 0 ", "pad_id = tokenizer.pad_token_id ")
    code = code.replace("#   sequences = [", "sequences = [")
    torch.manual_seed(0)
    ns = {"torch": torch, "tokenizer": tokenizer, "texts": texts, "labels": list(range(5)), "epochs": 1,
          "batch_size": 2}
    exec(code, ns)
    idx = ns["idx"].tolist()
    enc = tokenizer([texts[i] for i in idx], padding=True, return_tensors="pt")
    assert tokenizer.pad_token_id != 0
    assert torch.equal(ns["x"], enc["input_ids"]) and torch.equal(ns["attention_mask"].long(), enc["attention_mask"])


def test_with_the_cores_saturated_the_stage_fix_comes_first():
    d = bundle(td._loader_trace(True), stage_block("RandomResizedCrop"))
    times = list(range(0, 40_001_000, 2_000_000))
    d["gpumagic"]["machine"] = {"cpu_count": 2, "cpu_affinity": [0, 1], "cpu_quota_cores": None,
                                "usable_cores": 2.0, "usable_cores_source": "affinity"}
    d["gpumagic"]["samples"] = {"cpu": {"t_epoch_ns": times, "total": [95.0] * len(times),
                                        "per_core": [[95.0] * 2] * len(times), "main": [100.0] * len(times),
                                        "workers": [0.0] * len(times), "worker_count": [0] * len(times)}}
    r = analyze(d)
    f = next(f for f in r.findings if f.id == "host-cpu-saturated")
    assert f.evidence.numbers["slowest_stage"] == "RandomResizedCrop"
    assert "RandomResizedCrop takes the largest share" in f.evidence.summary
    assert "slowest stage" in f.fixes[0].description


@pytest.mark.parametrize("top", ["MyDataset.__getitem__", "TensorDataset.__getitem__", "my_collate", "MyStream.__iter__",
                                 "MyDataset.__getitems__"])
@pytest.mark.parametrize("training", [True, False])
def test_the_dataset_fixes_compile_keep_dtypes_and_keep_the_order_outside_training(top, training):
    """The code a user pastes: valid Python; a batched __getitems__ that keeps each tensor's dtype
    (token ids stay integers for an embedding); batches drawn at random only when training, so
    that evaluation's predictions stay in the dataset's order."""
    r = analyze(bundle(td._loader_trace(training, False), stage_block(top, "main")))
    staged = [fx for fx in loader_finding(r).fixes if "slowest stage" in fx.description]
    assert staged
    for fx in staged:
        compile(fx.code, "<fix>", "exec")
        assert ".float()" not in fx.code
        assert ("RandomSampler" in fx.code or "shuffle=True" in fx.code) == (
            training and top not in ("MyStream.__iter__", "MyDataset.__getitems__"))
        if not training and "BatchSampler" in fx.code:
            assert "SequentialSampler(dataset)" in fx.code


def test_collation_after_an_iterable_dataset_gets_whole_batches_not_a_sampler():
    """No sampler can drive an IterableDataset (``BatchSampler(RandomSampler(stream))`` raises on
    its missing ``len``): where collation leads after ``Stream.__iter__``, the fix yields whole
    batches from ``__iter__`` with automatic batching off."""
    block = stage_block("default_collate")
    block["stages"] = [{"name": "default_collate", "where": "worker", "self_ns": 80_000_000, "calls": 4},
                       {"name": "Stream.__iter__", "where": "worker", "self_ns": 17_000_000, "calls": 64},
                       {"name": "other", "where": "worker", "self_ns": 3_000_000, "calls": 4}]
    f = loader_finding(analyze(bundle(td._loader_trace(True), block)))
    staged = [fx for fx in f.fixes if "slowest stage" in fx.description]
    assert staged and "after Stream.__iter__" in staged[0].description
    assert "BatchSampler" not in staged[0].code and "batch_size=None" in staged[0].code


def test_the_batched_getitems_fix_says_what_it_saves():
    """The per-call cost (Python, the loader's indexing), not each sample's own work: a dataset that
    decodes a file per sample keeps the decoding."""
    f = loader_finding(analyze(bundle(td._loader_trace(True), stage_block("MyDataset.__getitem__"))))
    staged = next(fx for fx in f.fixes if "slowest stage" in fx.description)
    assert "not the work each sample needs on its own, such as decoding a file" in staged.description
