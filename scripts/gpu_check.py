"""End-to-end check on a CUDA machine: profile known-bad workloads and assert the findings.

Run from the repository root on a machine with a CUDA GPU::

    python scripts/gpu_check.py --out artifacts/gpu_check

Each workload runs under ``gpumagic.profile`` (defaults: skip 1 optimizer step, record 5) and
saves its bundle as ``<out>/<name>.json.gz`` (small, gzip; fit to commit as test fixtures):

- ``starved_loader``: a DataLoader without workers whose items cost ~2 ms of host time each,
  feeding a small CNN: expects ``dataloader-bound``;
- ``pageable_item``: each step builds a batch in pageable host memory, copies it with a plain
  ``.to("cuda")`` and reads the loss with ``.item()``: expects ``pageable-memcpy`` and
  ``host-sync``;
- ``fp32_matmul``: an MLP of 4096-wide layers in FP32, TF32 off, no autocast: expects
  ``mixed-precision-off``;
- ``empty_cache_loop``: residual MLP blocks with ``torch.cuda.empty_cache()`` after every step:
  expects ``allocator-churn``;
- ``amp_nchw_convnet``: seven 3×3 convolutions on 64×3×112×112 NCHW batches under autocast
  (bf16, or fp16 before Ampere): expects ``layout-conversions``;
- ``gradscaler_unfused``: fp16 autocast with a GradScaler and the default (foreach) AdamW:
  expects ``host-sync`` naming GradScaler's ``found_inf`` read;
- ``checkpointed_blocks``: six residual MLP blocks under ``torch.utils.checkpoint``: expects
  ``activation-recompute``;
- ``inference_grad_train_mode``: an inference loop (no optimizer: no steps) over MLP blocks with
  dropout, the model left in training mode and no ``torch.no_grad()``: expects
  ``inference-grad-enabled`` and ``inference-train-mode`` (on a GPU a training-mode dropout calls
  ``aten::native_dropout`` inside ``aten::dropout``);
- ``kept_validation_loss``: residual MLP blocks trained with SGD, a validation loss computed after
  each step without ``torch.no_grad()`` and kept as a tensor (profiled with ``memory=True``):
  expects ``memory-growth`` and ``inference-grad-enabled``;
- ``rebuilt_optimizer``: residual MLP blocks trained by an AdamW built anew every step (the
  default foreach implementation on CUDA): expects ``optimizer-state-reset``, and the step window
  still bounded (the step count passes to each new optimizer);
- ``late_zero_grad``: the same blocks with ``optimizer.zero_grad()`` between ``backward()`` and
  ``step()``: expects ``updates-without-gradients`` naming the misplaced reset;
- ``head_only_tuning``: an AdamW given only the head of the residual blocks, the blocks left
  trainable: expects ``unused-gradients`` (the backward runs on CUDA's autograd thread there);
- ``eval_mode_training``: blocks with dropout put in eval mode before the loop and trained so
  (profiled with ``shapes=True``): expects ``training-in-eval-mode``;
- ``validation_train_mode``: the same blocks trained in training mode, each step followed by a
  validation under ``torch.no_grad()`` without ``model.eval()`` (CUDA's fused dropout,
  ``aten::native_dropout``, inside each call): expects ``inference-train-mode``.

The last eleven check rules built on traces made by hand or recorded on a CPU
(tests/test_allocator_churn.py, test_layout_conversions.py, test_diagnoses.py,
test_activation_recompute.py, test_inference_mode.py, test_memory_growth.py,
test_optimizer_state_reset.py, test_updates_without_gradients.py, test_unused_gradients.py,
test_training_in_eval_mode.py, test_no_grad_train_mode.py); no GPU recording of them has been made yet.

With ``--snippets`` it runs instead every fix whose code needs CUDA (the ones
``tests/test_snippets.py`` can only compile and resolve on a CPU machine) on the GPU, with the
same tiny model and loader in scope, and checks that the ``transfer-bound`` prefetcher trains
every batch once, in order; fixes that need another process group or a package not installed
(torch.distributed, torchvision) are listed as not run.

With ``--timeit`` it checks ``%gputimeit``'s measurement on the GPU instead: a 4096² FP32 matmul
timed by the host clock around the call (the launch) against ``capture.timeit.measure`` (CUDA
events): the events must see at least 10× the launch time and agree with a synchronised wall
clock within 20 %.

It also checks that NVML samples were recorded for the device the trace shows and lie inside
the recording, and that nothing (profiler, gpumagic thread) outlives a capture. Exit status: 0
when every check passes (or when there is no CUDA device: nothing to check, said on stdout),
1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Milliseconds of host work per DataLoader item in the starved workload (32 items a batch).
ITEM_HOST_MS = 2.0
#: Slack when checking that samples lie inside the recording (samplers start just before it).
SAMPLE_SLACK_NS = 200_000_000


def _import_gpumagic():
    try:
        import gpumagic
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import gpumagic
    return gpumagic


# ------------------------------------------------------------------------------- workloads
def _steps(opt, loss_of: Callable, after: Callable | None = None, steps: int = 10) -> Callable[[], None]:
    """A run of ``steps`` training steps: ``loss_of()``, its backward and an optimizer step, then
    ``after(loss)`` when given."""
    def run():
        for _ in range(steps):
            loss = loss_of()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if after is not None:
                after(loss)

    return run


def starved_loader(torch) -> Callable[[], None]:
    from torch.utils.data import DataLoader, Dataset

    class SlowImages(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, i):
            time.sleep(ITEM_HOST_MS / 1000)  # stands for JPEG decoding and augmentation
            return torch.randn(3, 64, 64), i % 10

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowImages(), batch_size=32, num_workers=0)

    def run():
        for i, (x, y) in enumerate(loader):
            x, y = x.cuda(), y.cuda()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 9:
                break

    return run


def pageable_item(torch) -> Callable[[], None]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 7, stride=2, padding=3), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []

    def loss_of():
        x = torch.randn(64, 3, 224, 224)  # pageable host memory, ~38 MB
        y = torch.randint(0, 10, (64,))
        return torch.nn.functional.cross_entropy(model(x.to("cuda")), y.to("cuda"))

    return _steps(opt, loss_of, lambda loss: losses.append(loss.item()))  # a host sync every step


def fp32_matmul(torch) -> Callable[[], None]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    width = 4096
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(4096, width, device="cuda")
    return _steps(opt, lambda: model(x).square().mean())


def _mlp(torch, width: int, blocks: int):
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
        for _ in range(blocks)).cuda()


def _residual(blocks, h, call=None):
    """``h`` through the residual ``blocks`` (``h + block(h)`` each), a block called by ``call(block, h)`` when given."""
    for b in blocks:
        h = h + (call(b, h) if call else b(h))
    return h


def empty_cache_loop(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 1024, 4)  # small steps: the driver's allocations are a visible share
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-4)
    x = torch.randn(1024, 1024, device="cuda")
    # empty_cache() hands the freed activations back to the driver every step
    return _steps(opt, lambda: _residual(blocks, x).square().mean(), lambda _loss: torch.cuda.empty_cache())


def amp_nchw_convnet(torch) -> Callable[[], None]:
    layers: list = [torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU()]
    for _ in range(6):
        layers += [torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 112, 112, device="cuda")  # PyTorch's default NCHW layout
    y = torch.randint(0, 10, (64,), device="cuda")
    low = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def loss_of():
        with torch.autocast("cuda", dtype=low):  # tensor-core convolutions, NHWC inside cuDNN
            return torch.nn.functional.cross_entropy(model(x), y)

    return _steps(opt, loss_of)


def gradscaler_unfused(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 2048, 4)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4)  # foreach on CUDA, not fused: GradScaler reads found_inf
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(2048, 2048, device="cuda")

    def run():
        for _ in range(10):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = _residual(blocks, x).float().square().mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)  # .item() on found_inf before the step
            scaler.update()

    return run


def checkpointed_blocks(torch) -> Callable[[], None]:
    from torch.utils.checkpoint import checkpoint

    blocks = _mlp(torch, 2048, 6)
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-4)
    x = torch.randn(2048, 2048, device="cuda")

    def recomputed(block, h):
        return checkpoint(block, h, use_reentrant=False)  # recomputed in the backward

    return _steps(opt, lambda: _residual(blocks, x, recomputed).square().mean())


def kept_validation_loss(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 1024, 4)
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-4)
    x, val = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    kept = []
    # after each step a validation loss without torch.no_grad(), kept as a tensor: its graph and activations stay
    return _steps(opt, lambda: _residual(blocks, x).square().mean(),
                  lambda _loss: kept.append(_residual(blocks, val).square().mean()))


def inference_grad_train_mode(torch) -> Callable[[], None]:
    width = 1024
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                                      torch.nn.Dropout(0.1)) for _ in range(6))).cuda()
    x = torch.randn(256, width, device="cuda")

    def run():
        for _ in range(20):  # model.train() (the default) and grad mode on: both mistakes at once
            model(x).argmax(dim=1)
        torch.cuda.synchronize()

    return run


def rebuilt_optimizer(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 1024, 4)
    x = torch.randn(512, 1024, device="cuda")

    def run():
        for _ in range(10):
            opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4)  # built every step: empty state each time
            opt.zero_grad()
            _residual(blocks, x).square().mean().backward()
            opt.step()

    return run


def late_zero_grad(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 1024, 4)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4)
    x = torch.randn(512, 1024, device="cuda")

    def run():
        for _ in range(10):
            _residual(blocks, x).square().mean().backward()
            opt.zero_grad()  # between backward() and step(): the step finds no gradient
            opt.step()

    return run


def head_only_tuning(torch) -> Callable[[], None]:
    blocks = _mlp(torch, 1024, 4)
    head = torch.nn.Linear(1024, 10).cuda()
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)  # the head only; the blocks stay trainable
    x, y = torch.randn(512, 1024, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    return _steps(opt, lambda: torch.nn.functional.cross_entropy(head(_residual(blocks, x)), y))


def eval_mode_training(torch) -> Callable[[], None]:
    width = 1024
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                                      torch.nn.Dropout(0.1)) for _ in range(4))).cuda()
    model.eval()  # left from a validation: trained in eval mode
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, width, device="cuda")
    return _steps(opt, lambda: model(x).square().mean())


def validation_train_mode(torch) -> Callable[[], None]:
    width = 1024
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                                      torch.nn.Dropout(0.1)) for _ in range(4))).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, width, device="cuda")

    def run():
        for _ in range(10):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            with torch.no_grad():  # a validation without model.eval(): dropout stays on
                model(x).square().mean()

    return run


WORKLOADS = {
    "starved_loader": (starved_loader, {"dataloader-bound"}),
    "pageable_item": (pageable_item, {"pageable-memcpy", "host-sync"}),
    "fp32_matmul": (fp32_matmul, {"mixed-precision-off"}),
    "empty_cache_loop": (empty_cache_loop, {"allocator-churn"}),
    "amp_nchw_convnet": (amp_nchw_convnet, {"layout-conversions"}),
    "gradscaler_unfused": (gradscaler_unfused, {"host-sync"}),
    "checkpointed_blocks": (checkpointed_blocks, {"activation-recompute"}),
    "inference_grad_train_mode": (inference_grad_train_mode, {"inference-grad-enabled", "inference-train-mode"}),
    "kept_validation_loss": (kept_validation_loss, {"memory-growth", "inference-grad-enabled"}),
    "rebuilt_optimizer": (rebuilt_optimizer, {"optimizer-state-reset"}),
    "late_zero_grad": (late_zero_grad, {"updates-without-gradients"}),
    "head_only_tuning": (head_only_tuning, {"unused-gradients"}),
    "eval_mode_training": (eval_mode_training, {"training-in-eval-mode"}),
    "validation_train_mode": (validation_train_mode, {"inference-train-mode"}),
}
#: Workloads without optimizer steps: the profile records the whole call, and no step count is checked.
STEPLESS = frozenset({"inference_grad_train_mode"})
#: Profile options a workload needs beyond the defaults (``memory-growth`` reads the allocator's records).
PROFILE_OPTIONS: dict[str, dict] = {"kept_validation_loss": {"memory": True}, "eval_mode_training": {"shapes": True}}
#: What a workload's findings must also say (the finding id, a phrase of its evidence).
EVIDENCE = {"gradscaler_unfused": ("host-sync", "GradScaler's"),
            "late_zero_grad": ("updates-without-gradients", "zero_grad() ran between backward() and step()")}


# ---------------------------------------------------------------------------------- checks
def check_run(name: str, run, expected: set[str]) -> list[str]:
    """Problems with one run; empty when it is as expected."""
    problems = []
    report = run.report
    if report is None:
        return [f"{name}: no report"]
    missing = expected - set(report.finding_ids)
    if missing:
        problems.append(f"{name}: expected {sorted(missing)}, found {report.finding_ids}")
    if name in EVIDENCE:
        fid, phrase = EVIDENCE[name]
        f = report.finding(fid)
        if f is not None and phrase not in f.evidence.summary:
            problems.append(f"{name}: {fid}'s evidence does not say {phrase!r}: {f.evidence.summary}")
    if name not in STEPLESS and report.metrics["steps"]["count"] != 5:
        problems.append(f"{name}: {report.metrics['steps']['count']} steps recorded, expected 5")
    if report.metrics["trace"]["cpu_only"]:
        problems.append(f"{name}: the trace has no GPU activity")
    problems += _check_samples(name, run)
    return problems


def _check_samples(name: str, run) -> list[str]:
    samples = run.trace.samples
    gpu = samples.gpu if samples is not None else {}
    if "gpu_util" not in gpu or len(gpu["t_ns"]) < 2:
        return [f"{name}: no NVML samples recorded (notes: {run.report.notes})"]
    problems = []
    if ("power_w" in gpu or "energy_mj" in gpu) and not (run.report.metrics.gpu.energy_j or 0) > 0:
        problems.append(f"{name}: NVML power or energy was sampled, yet metrics.gpu.energy_j is {run.report.metrics.gpu.energy_j}")
    trace_devices = {int(d) for d in set(run.trace.events.device.tolist()) if d >= 0}
    sampled = {int(d) for d in gpu["device"].tolist()}
    if not trace_devices <= sampled:
        problems.append(f"{name}: trace devices {sorted(trace_devices)} but NVML sampled {sorted(sampled)}")
    end_ns = int((run.trace.events.ts_ns + run.trace.events.dur_ns).max())
    t = gpu["t_ns"]
    if t.min() < -SAMPLE_SLACK_NS or t.max() > end_ns + SAMPLE_SLACK_NS:
        problems.append(f"{name}: samples span {t.min()}..{t.max()} ns, recording 0..{end_ns} ns: misaligned")
    return problems


def check_timing(torch) -> list[str]:
    """``%gputimeit``'s clock on CUDA (issue 30): events time the work, not the launch."""
    from gpumagic.capture.timeit import measure

    g = torch.randn(4096, 4096, device="cuda")

    def matmul():
        g @ g

    result = measure("g @ g", matmul, max_seconds=3.0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    matmul()
    launch = time.perf_counter() - t0
    torch.cuda.synchronize()
    walls = []
    for _ in range(20):
        t0 = time.perf_counter()
        matmul()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    wall = sorted(walls)[len(walls) // 2]
    print(f"timeit: {result.line()}; launch {launch * 1e6:.0f} µs; synchronised wall clock {wall * 1e3:.3f} ms")
    problems = []
    if not result.device.startswith("cuda"):
        problems.append(f"timeit: timed on {result.device}, not with CUDA events")
    if not result.median_s or result.median_s < 10 * launch:
        problems.append(f"timeit: median {result.median_s} s is not well above the launch ({launch} s)")
    if result.median_s and abs(result.median_s - wall) > 0.2 * wall:
        problems.append(f"timeit: events say {result.median_s} s, the synchronised wall clock {wall} s")
    return problems


def check_clean(name: str) -> list[str]:
    from gpumagic.capture.recorder import profiler_active

    threads = [t.name for t in threading.enumerate() if t.name.startswith("gpumagic-")]
    problems = [f"{name}: gpumagic threads left alive: {threads}"] if threads else []
    if profiler_active():
        problems.append(f"{name}: a torch profiler is still active")
    return problems


def summary(name: str, run) -> str:
    m = run.report.metrics
    util = (m.get("samples") or {}).get("gpu_util_mean")
    return (f"{name}: findings {run.report.finding_ids}; GPU busy {m['gpu']['busy_frac']:.1%}, "
            f"step median {m['steps']['median_ms']} ms, NVML util mean {util}")


def check_snippets(torch) -> list[str]:
    """Run the CUDA-only fixes on the GPU; returns the problems found."""
    sys.path.insert(0, str(ROOT / "tests"))
    import snippets_check as ck
    import snippets_collect as sc

    problems: list[str] = []
    for code, (fid, fx, _label) in sc.all_fixes().items():
        if fx.flavor != "pytorch" or not ck.needs_cuda(code) or not ck.has_statements(code):
            continue
        static, missing = ck.check(code)
        problems += [f"{fid}: {p}" for p in static]
        if missing or ck.magic_lines(code)[1] or "dist." in code or "DistributedDataParallel" in code:
            print(f"snippet {fid}: not run here ({', '.join(missing) or 'needs a process group or IPython'})")
            continue
        calls: list = []
        ns = sc.harness("cuda", calls)
        if "encoded_batch" in code:  # the user's JPEG bytes, as torchvision.io.decode_jpeg takes them
            try:
                import torchvision
            except ImportError:
                print(f"snippet {fid}: not run here (needs torchvision)")
                continue
            images = [torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8) for _ in range(4)]
            ns["encoded_batch"] = [torchvision.io.encode_jpeg(img) for img in images]
        if "def prefetch" in code:  # sample i holds the value i: the trained order can be read back
            from torch.utils.data import TensorDataset
            ns["dataset"] = TensorDataset(torch.arange(20.0).unsqueeze(1).repeat(1, 8), torch.zeros(20, dtype=torch.long))
        try:
            ck.run(code, ns, "cuda")
            torch.cuda.synchronize()
        except Exception as exc:  # report every failing snippet, not only the first
            problems.append(f"{fid}: {type(exc).__name__}: {exc}"[:300])
            continue
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if "def prefetch" in code:
            trained = [int(t[0][0, 0].item()) for t in calls]  # each batch's first sample
            if trained != [0, 4, 8, 12, 16]:
                problems.append(f"{fid}: prefetcher trained batches starting at {trained}, not [0, 4, 8, 12, 16]")
            print(f"snippet {fid}: prefetcher trained batches starting at samples {trained}")
        print(f"snippet {fid}: ran on {torch.cuda.get_device_name(0)}: {fx.description[:60]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile known-bad workloads on a CUDA GPU and check the findings.")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "gpu_check", help="folder for the .json.gz bundles")
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append", help="run only this workload (repeatable)")
    parser.add_argument("--snippets", action="store_true", help="run the CUDA-only fix snippets instead of the workloads")
    parser.add_argument("--timeit", action="store_true", help="check %%gputimeit's CUDA-event timing instead of the workloads")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; nothing to check.")
        return 0
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}); nothing to check. "
              "Run it on a machine with an NVIDIA GPU.")
        return 0
    gpumagic = _import_gpumagic()
    if args.snippets:
        problems = check_snippets(torch)
        for p in problems:
            print(f"FAIL {p}")
        print("gpu_check --snippets: " + ("all ran" if not problems else f"{len(problems)} failed"))
        return 1 if problems else 0
    if args.timeit:
        problems = check_timing(torch)
        for p in problems:
            print(f"FAIL {p}")
        print("gpu_check --timeit: " + ("passed" if not problems else f"{len(problems)} failed"))
        return 1 if problems else 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    problems: list[str] = []
    for name in args.only or WORKLOADS:
        build, expected = WORKLOADS[name]
        workload = build(torch)
        path = args.out / f"{name}.json.gz"
        with gpumagic.profile(label=name, save=str(path), display=False, **PROFILE_OPTIONS.get(name, {})) as run:
            workload()
        found = check_run(name, run, expected) + check_clean(name)
        print(summary(name, run) + f"; saved {path} ({path.stat().st_size / 1024:.0f} KiB)")
        for note in run.report.notes:
            print(f"    note: {note}")
        problems += found
        torch.cuda.empty_cache()
    for p in problems:
        print(f"FAIL {p}")
    print("gpu_check: " + ("all checks passed" if not problems else f"{len(problems)} check(s) failed"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
