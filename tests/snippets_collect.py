"""Every fix gpumagic can print, collected by running the analysis over every fixture trace in
tests/data and built traces that fire each rule (with training/inference and GPU-generation
variants), then the Hugging Face rephrasing of each report. tests/test_snippets.py proves them;
a new rule is covered as soon as a fixture or a builder here fires it."""

from __future__ import annotations

import glob
import os
from functools import lru_cache

import test_allocator_churn as tac
import test_compute as tc
import test_cpu_low_precision as tlp
import test_cpu_op_overhead as tco
import test_diagnoses as td
import test_frequent_evaluation as tfe
import test_gradients_never_reset as tgr
import test_gradients_reset_mid_accumulation as trm
import test_inference_mode as tim
import test_layout_conversions as tlc
import test_loader_demand as tld
import test_loader_stages_analysis as tls
import test_loop_host_work as tlw
import test_memory_growth as tmg
import test_no_grad_train_mode as tng
import test_optimizer_state_reset as tos
import test_rules as trl
import test_training_in_eval_mode as tem
import test_unused_gradients as tun
import test_updates_without_gradients as tug
from everystep_blocks import outlier_bundle
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.integrations.huggingface import huggingface_fixes


def _transfer_trace(training: bool, cc: tuple[int, int] = (8, 0)):
    tb = TraceBuilder(cc=cc)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.memcpy("Memcpy HtoD (Pinned -> Device)", t + 100, 3_000, 64 << 20, launch_ts=t + 90)
        tb.kernel("ampere_sgemm_128x64_nn", t + 3_200, 6_000, launch_ts=t + 3_150)
        if training:
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 9_000, 500)
            tb.op("Optimizer.step#AdamW.step", t + 9_600, 300)
    return tb


def _memory_trace(training: bool, cc: tuple[int, int] = (8, 0)):
    tb = _transfer_trace(training, cc)
    tb.memory(5_000, allocated=int(0.95 * 80 * 2**30), reserved=int(0.97 * 80 * 2**30))
    return tb


def _matmul_trace(cc: tuple[int, int], name: str, training: bool, kernel: str = "sgemm_128x64_nn"):
    tb = TraceBuilder(cc=cc, gpu_name=name)
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel(kernel, t + 100, 8_000, launch_ts=t + 50)
        if training:
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", t + 9_000, 500)
            tb.op("Optimizer.step#AdamW.step", t + 9_600, 300)
    return tb


def _cold_trace():
    tb = TraceBuilder()
    for i, dur in enumerate((30_000, 10_000, 10_000, 10_000)):
        t = 0 if i == 0 else 30_000 + (i - 1) * 10_000
        tb.step(i + 1, t, dur)
        tb.kernel("k", t + 100, dur - 500, launch_ts=t + 50)
    return tb


def _launch_trace(training: bool):
    tb = td._tiny_kernels(False)
    if training:
        tb.op("autograd::engine::evaluate_function: AddmmBackward0", 100, 5)
        tb.op("Optimizer.step#AdamW.step", 200, 5)
    return tb


def _model_on_cpu_trace():
    """Issue 31: the CUDA runtime recorded, the operators on the CPU."""
    tb = TraceBuilder()
    tb.runtime("cudaGetDeviceCount", 0, 5)
    tb.runtime("cudaGetDeviceProperties_v2", 10, 5)
    for i in range(60):
        tb.op("aten::addmm", 100 + i * 100, 90)
    return tb


def _host_creation_trace():
    """Issue 31: the host builds tensors on the CPU and copies them (cpu-bound, create on device)."""
    tb = TraceBuilder()
    for i in range(4):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.op("aten::normal_", t, 4_000)
        tb.memcpy("Memcpy HtoD (Pageable -> Device)", t + 4_020, 50, 4 << 20, launch_ts=t + 4_005)
        tb.kernel("k_big", t + 4_100, 5_800, launch_ts=t + 4_010)
    return tb


def _compiled_trace():
    """Issue 30: a cell whose compiled code broke its graph and recompiled on a new size."""
    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 40_000, 40_000)
        tb.kernel("k", i * 40_000 + 100, 5_000)
    tb.op("entire_frame_compile", 6_000, 30_000, cat="user_annotation")
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "capture": {"dynamo": {
        "graph_breaks": 1, "break_logs": [{"reason": "Failed to trace builtin operator", "file": "train.py", "line": 3}],
        "recompiles": [{"reason": "tensor 'x' size mismatch at index 0. expected 4, actual 5", "file": "train.py",
                        "line": 1}]}}}
    return d


def built_reports():
    """(label, Report) for the built traces."""
    yield "transfer-train", analyze(_transfer_trace(True).to_dict())
    yield "transfer-infer", analyze(_transfer_trace(False).to_dict())
    yield "memory-train", analyze(_memory_trace(True).to_dict())
    yield "memory-infer", analyze(_memory_trace(False).to_dict())
    for training in (True, False):  # Volta: fp16, not bf16
        yield f"memory-volta-{training}", analyze(_memory_trace(training, (7, 0)).to_dict())
    for cc, name in (((7, 0), "Tesla V100-SXM2-32GB"), ((8, 0), "NVIDIA A100-SXM4-80GB"), ((8, 9), "NVIDIA L4"),
                     ((8, 6), "Unknown GPU")):
        for training in (True, False):
            yield f"matmul-{name}-{training}", analyze(_matmul_trace(cc, name, training).to_dict())
    yield "cold", analyze(_cold_trace().to_dict())
    yield "launch-train", analyze(_launch_trace(True).to_dict())
    yield "launch-infer", analyze(_launch_trace(False).to_dict())
    yield "sync", analyze(td._sync_step_trace(20, 1_990).to_dict())
    yield "sync-gradscaler", analyze(td._scaler_step_trace().to_dict())
    yield "sync-gradscaler-rmsprop", analyze(td._scaler_step_trace(opt="RMSprop").to_dict())
    yield "sync-gradscaler-bf16", analyze(td._scaler_step_trace(kernel="ampere_bf16_s16816gemm_bf16_128x128_nn").to_dict())
    for training in (True, False):
        yield f"loader-{training}", analyze(td._loader_trace(training).to_dict())
    yield "loader-cpu", analyze(td._loader_trace(True, False).to_dict())
    yield "saturated", td._with_samples(td._loader_trace(training=True), 95.0, main_pct=100.0)
    for top in ("RandomResizedCrop", "default_loader", "MyDataset.__getitem__", "my_collate", "pad_batch (collate_fn)",
                "pin_memory"):
        for gpu in (True, False):  # issue 29: the fix that fits the pipeline's slowest stage
            yield f"loader-stage-{top}-{gpu}", analyze(tls.bundle(td._loader_trace(True, gpu), tls.stage_block(top)))
    yield "tiny", analyze(tc.tiny_trace(1e7).to_dict())
    yield "copies", analyze(tc.copies_trace(20).to_dict())
    yield "attention", analyze(tc.attention_trace().to_dict())
    yield "elementwise", analyze(tc.elementwise_trace(6_000, 1_000).to_dict())
    yield "efficiency", analyze(tc.efficiency_trace(1e9).to_dict())
    yield "model-on-cpu", analyze(_model_on_cpu_trace().to_dict())
    yield "host-creation", analyze(_host_creation_trace().to_dict())
    yield "dataloader-bound-later", analyze(tld._with_later_waits(tld._no_wait_trace(), 5.0))
    for kind in ("gc", "torch.save", "compile", "eval", "loader", "data", None):
        yield f"step-outliers-{kind}", analyze(outlier_bundle(kind))
    yield "frequent-evaluation", analyze(tfe.evaluating([10.0] * 30, 5.0))
    yield "compile", analyze(_compiled_trace())
    for training in (True, False):
        yield f"cpu-fp16-cast-{training}", analyze(tlp.bundle(tlp.ZEN4, autocast=False, typed="c10::Half",
                                                               training=training))
        yield f"cpu-autocast-{training}", analyze(tlp.bundle(tlp.AVX2, training=training))
        yield f"cpu-float64-typed-{training}", analyze(tlp.bundle(tlp.AVX2, autocast=False, typed="double",
                                                                  training=training))
    yield "allocator-churn", analyze(tac._loop())
    yield "allocator-churn-near-limit", analyze(tac._loop(peak=78 * 2**30))
    yield "allocator-churn-no-cache", analyze(tac._loop(mallocs=200))
    yield "layout-conversions", analyze(tlc._convnet())
    yield "gradients-never-reset", analyze(tgr._loop())
    yield "optimizer-state-reset", analyze(tos._loop())
    yield "optimizer-state-reset-other", analyze(tos._loop(wrapper="Lookahead"))
    yield "updates-without-gradients-order", analyze(tug._loop(reset="between"))
    yield "updates-without-gradients-other", analyze(tug._loop(reset="none"))
    yield "gradients-reset-mid-accumulation", analyze(trm._built())
    yield "unused-gradients", analyze(tun._loop())
    yield "training-in-eval-mode", analyze(tem._loop())
    yield "inference-train-mode-in-training", tng._recorded("validation without eval()")
    yield "inference-grad-enabled-in-training", analyze(tim._training(evaluation=8))
    yield "inference-grad-enabled-acting", analyze(tim._training(evaluation=8, pick=True))
    yield "loop-host-work-tensors", analyze(tlw._training(2000, per_tensor=("aten::mul_", "aten::add_"), tensors=26))
    yield "loop-host-work-from-python", analyze(tlw._training(2000, from_python_us=400))
    yield "loop-host-work-waiting", analyze(tlw._sampled(35.0))
    yield "cpu-op-overhead-rollout", analyze(tco._steps(1200, 2.0, name="aten::multinomial", every=12))
    for kind in ("aten::zero_", "aten::clamp_"):
        yield f"loop-host-work-{kind}", analyze(tlw._training(2000, per_tensor=(kind,), tensors=26))
    yield "memory-growth-gpu", analyze(tmg._gpu_loop([2**30 + i * 2**26 for i in range(6)]))
    yield "memory-growth-cpu", analyze(tmg._cpu_loop([2**20 + i * 8192 for i in range(6)]))
    yield "launch-bound-generation", analyze(trl._decoding(trl._launch_trace(4)).to_dict())
    yield "custom-matmul", analyze(_matmul_trace((8, 0), "NVIDIA A100-SXM4-80GB", False, "my_fp32_gemm_kernel").to_dict())


@lru_cache(maxsize=1)
def all_reports():
    out = [(os.path.basename(p), analyze(p)) for p in sorted(glob.glob(os.path.join(DATA, "*.json.gz")))]
    out += list(built_reports())
    return tuple(out)


#: Reports recorded live while collecting (label → the one finding they are there for): the
#: others in them depend on the machine's timing (a warm-up, the loop's own code), and pytest-xdist
#: needs every worker to collect the same snippets.
LIVE_ONLY = {"inference-train-mode-in-training": "inference-train-mode"}


@lru_cache(maxsize=1)
def all_fixes():
    """{code: (finding id, Fix, where)} for every distinct fix code, HF rephrasings included."""
    seen = {}
    for label, report in all_reports():
        for r in (report, huggingface_fixes(report)):
            for f in r.findings:
                if label in LIVE_ONLY and f.id != LIVE_ONLY[label]:
                    continue
                for fx in f.fixes:
                    seen.setdefault(fx.code, (f.id, fx, label))
    return seen


# ---- running a snippet ----------------------------------------------------------------------------

#: Roots a snippet may use without importing them (the names the fixes assume in scope).
def known_roots():
    import os as _os
    import time as _time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    roots = {"torch": torch, "F": F, "os": _os, "time": _time, "DataLoader": DataLoader}
    try:
        import transformers
        roots.update(TrainingArguments=transformers.TrainingArguments, AutoModel=transformers.AutoModel)
    except ImportError:  # pragma: no cover - transformers is a test dependency
        pass
    # Not Triton: a fix that uses it imports it (``import triton``), so that it works when pasted.
    return roots


def _cartpole():
    """One environment for the vector-of-environments fix (gymnasium's CartPole: 4 observations, 2 actions)."""
    import gymnasium

    return gymnasium.make("CartPole-v1")


def _language_model(device: str) -> dict:
    """A causal language model and its tokenizer built from a config (no hub): a 1-layer GPT-2 and
    a word-level tokenizer, for the generation fix; none without transformers."""
    import torch
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - transformers is a test dependency
        return {}
    words = ["<unk>", "<pad>", "hello", "world", "the", "cat", "sat", "on", "mat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(words), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                    bos_token_id=0, eos_token_id=0)).to(device).eval()
    from transformers import BertConfig, BertForSequenceClassification, pipeline

    classifier = BertForSequenceClassification(BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32)).eval()
    pipe = pipeline("text-classification", model=classifier, tokenizer=tokenizer, device=device)
    return {"lm": lm, "tokenizer": tokenizer, "prompts": ["hello world", "the cat sat on the mat"],
            "ids": torch.tensor([[2, 3, 4]], device=device), "max_new_tokens": 3,  # token ids to decode from
            "pipe": pipe, "texts": ["the cat sat", "hello world", "on the mat"]}


def harness(device: str, calls: list | None = None) -> dict:
    """A tiny model, loader and batch in scope under the names the fixes use, on ``device``.
    ``train_step`` appends what it was given to ``calls``."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    torch.manual_seed(0)
    calls = [] if calls is None else calls
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(6, 8, device=device)
    y = torch.randint(0, 4, (6,), device=device)

    def train_step(*tensors):
        xb = tensors[0].to(device)
        out = model(xb.float())
        loss = out.float().sum() if len(tensors) < 2 else loss_fn(out, tensors[1].to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        calls.append(tensors)

    ns = dict(known_roots())
    with torch.no_grad():  # no live autograd graph: make_graphed_callables must not see one
        loss = loss_fn(model(x), y)
    dataset = TensorDataset(torch.randn(20, 8), torch.randint(0, 4, (20,)))
    ns.update(
        model=model, optimizer=opt, opt=opt, loss_fn=loss_fn, x=x, y=y, loss=loss.requires_grad_(), lr=1e-3,
        raw_inputs=torch.randint(0, 256, (20, 8), dtype=torch.uint8),  # a dataset as stored (images: uint8)
        # meta-learning tasks' support and query batches, stacked: (tasks, samples, ...)
        tasks_support_x=torch.stack([x, x.flip(0)]), tasks_support_y=torch.stack([y, y.flip(0)]),
        tasks_query_x=torch.stack([x.flip(0), x]), tasks_query_y=torch.stack([y.flip(0), y]),
        dataset=dataset, batch_size=4, loader=torch.utils.data.DataLoader(dataset, batch_size=4),
        train_step=train_step, batch=(x, y), block=nn.Linear(8, 8).to(device), batch_shape=(4, 8),
        blocks=nn.ModuleList(nn.Linear(8, 8) for _ in range(3)).to(device),
        images=torch.randn(2, 3, 8, 8, device=device),
        batches=[torch.randn(4, 8, device=device) for _ in range(3)],
        host_batches=[torch.randn(4, 8) for _ in range(3)],
        samples=[torch.randn(8) for _ in range(4)], requests=[torch.randn(8, device=device) for _ in range(3)],
        device=device, q=torch.randn(2, 2, 4, 8, device=device), k=torch.randn(2, 2, 4, 8, device=device),
        v=torch.randn(2, 2, 4, 8, device=device), p=0.1, training=False, d=8, scale=8 ** -0.5,
        mask=torch.tensor([[False, False, True, True]] * 4, device=device),  # masked_fill style: True = hidden
        bias=torch.randn(8, device=device),
        weight=torch.ones(8, device=device), logits=torch.randn(4, 4, device=device), step=100,
        targets=torch.randint(0, 4, (4,), device=device),
        running_loss=torch.zeros((), device=device), log=lambda m: calls.append(("log", m)), metrics={},
        all_inputs=torch.randn(20, 8), all_targets=torch.randint(0, 4, (20,)),
        val_loader=torch.utils.data.DataLoader(dataset, batch_size=4), inputs=x,
        backbone=nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1)).to(device), head=nn.Linear(8, 4).to(device),
        encoder=nn.Linear(8, 16).to(device),  # a VAE encoder: mean and log-variance, 8 each
        cell=nn.GRUCell(8, 16).to(device), step_inputs=torch.randn(4, 5, 8, device=device),
        h0=torch.zeros(4, 16, device=device), augment=lambda xb: xb.flip(-1),
        generator=nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU()).to(device),
        noise=torch.randn(6, 4, device=device),
        policy=nn.Linear(4, 2).to(device), observation=torch.randn(4, device=device), rollout_steps=3,
        make_env=_cartpole,
        data=[[0.5] * 8 for _ in range(10)], labels=[i % 4 for i in range(10)], epochs=2,
        sequences=[torch.randint(1, 8, (n,)) for n in (3, 5, 2, 7, 4, 6, 1, 8, 3, 5)],  # token ids, one per label
        ema_model=nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device), decay=0.999, c=0.01,
        num_embeddings=100, embedding_dim=8, lam=1e-4, wd=0.01, accumulation_steps=2,
    )
    ns.update(_language_model(device))
    return ns


def trainer_host_checks(out_dir: str, steps: int = 4, **settings) -> int:
    """Host-side truth tests of a tensor (``aten::is_nonzero``: ``bool(t)``, a host sync on CUDA)
    during ``steps`` optimizer steps of a Hugging Face ``Trainer`` on a tiny BERT built from a
    config, counted with the CPU profiler. ``settings`` go to ``TrainingArguments``; logging_steps
    stays far above ``steps``, so no logging step falls in the run."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(4 * steps)]
    args = TrainingArguments(out_dir, max_steps=steps, per_device_train_batch_size=4, logging_steps=500,
                             report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True, **settings)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train()
    return sum(e.name == "aten::is_nonzero" for e in prof.events())
