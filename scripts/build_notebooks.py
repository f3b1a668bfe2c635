"""Write the example notebooks from the Python source below, execute them, and store their outputs.

::

    python scripts/build_notebooks.py              # build and execute all six (about a minute on 2 cores)
    python scripts/build_notebooks.py 2 5          # only notebooks 2 and 5
    python scripts/build_notebooks.py --no-execute # write the cells only (no outputs)

Each notebook is a list of cells made by :func:`md` and :func:`code`, so the teaching material is
reviewed as code. Execution uses nbclient with the ``python3`` kernel in ``example_notebooks/``
(the notebooks import ``nbdata.py`` from there and read ``../tests/data``), with
``GPUMAGIC_WIDGETS=0`` in the kernel's environment so that reports are saved as static HTML and
text rather than widget views without state. Cell ids are stable and volatile metadata (timings,
kernel versions) is dropped, so a rebuild changes only what the run changed.

``tests/notebooks/test_example_notebooks.py`` executes the committed notebooks and checks that
their cells are still the ones this script writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from textwrap import dedent

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "example_notebooks"
KERNEL = "python3"
#: Seconds one cell may run before execution fails (the slowest cell, %gputune, takes ~10 s on 2 cores).
CELL_TIMEOUT_S = 180
#: Committed notebooks stay small enough to read well on GitHub (issue 5).
MAX_NOTEBOOK_BYTES = 400_000
#: The kernel's environment: static reports, no widget views (see gpumagic.report.mimebundle).
KERNEL_ENV = {"GPUMAGIC_WIDGETS": "0"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(dedent(text).strip())


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(dedent(text).strip())


# -- 1. Quickstart --------------------------------------------------------------------------------


def quickstart() -> list:
    return [
        md("""
        # 1 · Quickstart: profile a training loop and read the report

        gpumagic answers one question: **why is my GPU waiting, and what should I change?** Put
        `%%gpuprofile` on top of a cell that trains. It records a few training steps with PyTorch's own
        profiler (`torch.profiler`), measures where the time went, and shows a checklist of fixes, each
        with the evidence behind it.

        This notebook profiles a small training loop (on the GPU if there is one, otherwise on the CPU),
        walks through the report, and then opens a report recorded on a real GPU that ships with
        gpumagic. It runs anywhere in well under a minute.
        """),
        code("""
        %load_ext gpumagic
        """),
        md("""
        ## A small training loop

        Synthetic data for a two-class problem, a small MLP, AdamW. Nothing here is specific to gpumagic:
        it is the kind of loop you already have.
        """),
        code("""
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)

        features = torch.randn(8192, 128)
        labels = (features[:, :16].sum(dim=1) > 0).long()
        loader = DataLoader(TensorDataset(features, labels), batch_size=256, shuffle=True)

        model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()


        def train_one_epoch():
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()


        print(f"training on {device}: {len(loader)} steps per epoch")
        """),
        md("""
        ## Profile it

        `%%gpuprofile` on the first line of the cell is all it takes. What happens:

        - gpumagic finds the training steps through the optimizer: a global post-hook on
          `optimizer.step()` marks the end of each step, so plain loops, the Hugging Face `Trainer` and
          Lightning work unchanged.
        - It **skips the first step** and records the next five (`--skip 1 --steps 5`, the defaults).
          The first step pays one-off costs (creating the CUDA context, growing the memory allocator,
          autotuning kernels) that would hide the steady state. After the recorded steps the profiler
          stops and the rest of the cell runs at full speed.
        - It samples GPU utilisation and memory through NVML (on NVIDIA GPUs) and the host's CPU use
          every 100 ms, analyses the trace, and displays the report. `-o report` also keeps it in a
          variable.
        """),
        code("""
        %%gpuprofile -o report
        train_one_epoch()
        """),
        md("""
        ## Reading the report

        From the top:

        - **Header**: the wall time of the recorded window, the steps recorded, the median step time,
          *GPU busy* (the share of the window in which at least one kernel, copy or memset ran) and the
          top finding.
        - **Checklist**: the findings, biggest estimated gain first. Each one gives
          - a severity and an **estimated gain**: an *upper bound* on the share of step time the fix could
            save, and how it was estimated. Gains can overlap (the same idle time may have two causes),
            so do not add them up;
          - the **evidence**: the numbers, and the time windows where it happens (highlighted on the
            timeline);
          - **why**: the mechanism, in plain words;
          - **fixes**: the code to change, for plain PyTorch and, where it applies, as Hugging Face
            `TrainingArguments`.
        - **Timeline**: the main Python thread, other threads or DataLoader workers, and each GPU stream.
          Dashed lines are step boundaries; shaded spans are GPU idle time, coloured by cause.
        - **Breakdown** (*where the time went*): every moment of the window is counted once, under the
          first category that was active (GPU kernels, then copies, memsets, communication, CUDA runtime
          calls, data-loader wait, CPU ops, other), so the shares add up to 100 %.
        - **Notes**: what was not recorded or what was tolerated. Without a GPU the report covers CPU
          activity only and says so here.

        On the CPU even this in-memory `TensorDataset` can show up as `dataloader-bound`: each batch indexes
        256 items one by one in Python and stacks them, which takes about as long as this tiny model's step.

        Everything in the report is also plain data: `report.findings` (typed records), `report.metrics`
        (a dict; the keys are documented in `docs/metrics.md`) and `report.notes`.
        """),
        code("""
        steps = report.metrics["steps"]
        busy = report.metrics["gpu"]["busy_frac"]
        print(f"{steps['count']} steps recorded, median {steps['median_ms']:.1f} ms")
        print("GPU busy:", "no GPU in this run" if busy is None else f"{busy:.0%}")
        print("findings:")
        for f in report.findings:
            print(f"  [{f.severity}] {f.id}: {f.title} (up to {f.est_gain:.0%} of step time)")
        """),
        md("""
        The same report as text (for logs and terminals) with `report.to_text()`, as JSON with
        `report.to_json()`, or as one self-contained HTML file with `report.save_html("report.html")`.

        ## A report from a real GPU

        gpumagic ships one recorded trace: ResNet-50 trained on a Tesla V100 with
        `DataLoader(num_workers=0)`, from the samples of PyTorch's Kineto project. `gpumagic.analyze`
        reads any saved `torch.profiler` trace (Kineto JSON, plain or gzip), offline and without torch.
        """),
        code("""
        import gpumagic
        import gpumagic.cli

        example = gpumagic.analyze(gpumagic.cli.example_trace_path(), label="ResNet-50, V100, num_workers=0")
        example
        """),
        md("""
        Read the checklist from the top:

        - **`dataloader-bound`**: a large share of every step is the main thread waiting in
          `DataLoader.__next__` while the GPU has nothing queued. With `num_workers=0` each batch is read,
          decoded and augmented on the main thread between steps. → [notebook 2](02_dataloader_bottleneck.ipynb)
        - **`mixed-precision-off`**: a V100 has tensor cores (compute capability 7.0), but every matmul and
          convolution runs in FP32, which cannot use them. → [notebook 6](06_settings_to_kernels.ipynb)
        - **`pageable-memcpy`**: the batches reach the GPU from pageable memory, so each copy is staged
          through the CPU and cannot overlap computation. → [notebook 3](03_transfers_and_syncs.ipynb)

        Each finding carries the code of its fix:
        """),
        code("""
        top = example.findings[0]
        print(top.title)
        print("evidence:", top.evidence.summary)
        print(f"estimated gain: up to {top.est_gain:.0%} of step time ({top.gain_method})")
        print()
        print("#", top.fixes[0].description)
        print(top.fixes[0].code)
        """),
        md("""
        ## Next

        | notebook | what it shows |
        |---|---|
        | [2 · The data-loader bottleneck](02_dataloader_bottleneck.ipynb) | find it, measure `num_workers` (`%gputune`), compare before/after |
        | [3 · Transfers and host syncs](03_transfers_and_syncs.ipynb) | pinned memory, `non_blocking`, and what `.item()` in the loop costs |
        | [4 · Hugging Face Trainer](04_huggingface_trainer.ipynb) | `GpuProfileCallback`, fixes phrased as `TrainingArguments` |
        | [5 · Offline analysis](05_offline_analysis.ipynb) | saved traces, comparing runs, HTML export, the `gpumagic` command line |
        | [6 · From settings to kernels](06_settings_to_kernels.ipynb) | mixed precision, `torch.compile`, CUDA graphs, custom kernels |

        `%%gpuprofile?` lists every option of the magic.
        """),
    ]


# -- 2. The data-loader bottleneck ----------------------------------------------------------------


def dataloader_bottleneck() -> list:
    return [
        md("""
        # 2 · The data-loader bottleneck: find it, fix it, measure the fix

        A GPU can only work on batches it has. When preparing the next batch (reading, decoding,
        augmenting, collating) takes longer than the training step that consumes it, the loop waits for
        data and the GPU idles. It is the most common reason for a slow training run, and one of the
        cheapest to fix.

        Here a dataset that is slow to load starves a training loop. We profile it, apply the fix the
        checklist gives, measure which DataLoader setting is best, and compare before and after.

        The model trains **on the CPU on purpose**: the notebook then runs, and shows the same effect, on
        any machine. The mechanism is the same on a GPU, where it matters more (see the end).
        """),
        md("""
        ## The mechanism

        With `num_workers=0` (the default), `for x, y in loader` builds each batch on the main thread:
        `batch_size` calls of `dataset[i]`, then `collate_fn`. Nothing else runs meanwhile, so a step costs
        *load time + compute time*:

        ```
        num_workers=0   main thread  [load 1][step 1][load 2][step 2][load 3][step 3]

        num_workers=4   worker 1     [load 1       ][load 5       ]
                        worker 2     [load 2       ][load 6       ]
                        worker 3     [load 3       ][load 7       ]
                        worker 4     [load 4       ][load 8       ]
                        main thread  [wait         ][step 1][step 2][step 3][step 4][step 5]...
        ```

        Each worker process builds whole batches, up to `prefetch_factor` of them ahead, and the main
        thread only picks up a finished one (passed through shared memory). Once the pipeline is full a
        step costs *max(compute, load time ÷ workers)* instead of the sum.
        """),
        code("""
        %load_ext gpumagic
        """),
        code("""
        import warnings

        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        import gpumagic
        from nbdata import SlowImages  # a .py module, so that DataLoader workers can import it (see the end)

        # torch warns when num_workers exceeds the CPU count. These items *wait* (see below) rather than
        # compute, so more workers than cores still help here; with CPU-heavy decoding they would not.
        warnings.filterwarnings("ignore", message="This DataLoader will create")

        dataset = SlowImages(item_s=0.003)  # 3×32×32 "images"; each takes 3 ms to "decode and augment"
        BATCH = 64

        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 2),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


        def train(loader, steps=7):
            \"\"\"A few training steps from `loader` (gpumagic records steps 2 to 6).\"\"\"
            for step, (x, y) in enumerate(loader, start=1):
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step == steps:
                    break
        """),
        md("""
        `SlowImages` (in [`nbdata.py`](nbdata.py)) makes each item cost 3 ms with `time.sleep`: a stand-in
        for JPEG decoding and augmentation, which typically cost a few milliseconds per image. A sleep
        runs in parallel across worker processes whatever the number of cores, so the lesson holds on a
        2-core laptop; real decoding needs a core per worker (more on that at the end).

        ## 1. Profile, and label the run `before`

        `--label before` remembers the report under that name, so that a later cell can compare with it.
        """),
        code("""
        %%gpuprofile --label before -o before
        train(DataLoader(dataset, batch_size=BATCH, shuffle=True))
        """),
        md("""
        The top finding is **`dataloader-bound`**. Its evidence is the share of the window the main thread
        spent waiting in `DataLoader.__next__`, and, from the CPU sampler, how busy the host and the
        loader's worker processes were (no workers yet). On the timeline the main thread alternates
        between waiting for data and running the step.

        The checklist's fix:
        """),
        code("""
        finding = before.finding("dataloader-bound")
        print(finding.evidence.summary)
        print()
        print(finding.fixes[0].code)
        """),
        md("""
        ## 2. Measure the setting instead of guessing it

        The fix suggests worker processes (4 as a starting point), pinned memory, persistent workers and
        prefetching. How many workers is right depends on the dataset, the machine and the step: too few
        and the loop still waits; too many cost memory (each worker holds its own copy of the dataset
        object) and CPU time the main process needs.

        `%gputune` measures it. For each setting it reads the dataset through a fresh DataLoader for about
        a second (`--seconds`), counts batches per second without training, and recommends the fastest
        setting, preferring fewer workers when two are within 5 % of each other. `gpumagic.tune_dataloader`
        is the same from Python.
        """),
        code("""
        %gputune dataset --batch-size 64 --workers 0,2,4,8 --seconds 1 -o tuned
        """),
        md("""
        How to read the table: *batches/s* is the loader's throughput on its own; *first batch* is the
        start-up cost (workers are processes that start and import before they deliver anything);
        *new epoch* is the time to the first batch of the next epoch, which `persistent_workers=True` keeps
        short by not restarting the workers every epoch. `pin_memory=True` is only measured where there is
        a CUDA device, since pinning only speeds up copies to a GPU.

        The loader does not need to be infinitely fast, only faster than the training step consumes it.
        """),
        code("""
        print(tuned.recommended_kwargs)
        """),
        md("""
        ## 3. Apply the fix and compare

        `--compare before` shows this run's report, then the comparison with the run labelled `before`.
        """),
        code("""
        %%gpuprofile --label after --compare before -o after
        train(DataLoader(dataset, shuffle=True, **tuned.recommended_kwargs))
        """),
        md("""
        The comparison gives the median step before and after (the *step-time ratio*, after ÷ before, and
        the speed-up), the time per step by category, and which findings were **resolved**, which are
        **new** and which **persist**. The same from Python, on Reports, runs, trace files or labels:
        """),
        code("""
        comparison = gpumagic.compare("before", "after")
        print(f"speed-up: {comparison.speedup:.2f}× (the median step is {comparison.step_time_ratio:.0%} of what it was)")
        print("resolved:", ", ".join(comparison.resolved) or "none")
        print("new:", ", ".join(comparison.new) or "none")
        print("persisting:", ", ".join(comparison.persisting) or "none")
        """),
        md("""
        ## Why it works, and where it stops working

        - **Parallel loading.** *W* workers keep up to *W* × `prefetch_factor` batches in flight; the main
          thread only receives finished batches. The step time falls to the compute time once the loader
          delivers faster than the step consumes.
        - **Cores.** Real decoding keeps a core busy per worker. Beyond the number of free cores, more
          workers stop helping and start taking CPU time from the main process (the comparison's *CPU ops*
          per step shows it when the step itself gets slower). Then make loading cheaper:
          store pre-resized images, cache decoded data, decode on the GPU (NVIDIA DALI,
          `torchvision.io.decode_jpeg(..., device="cuda")`), or move augmentation to the GPU.
        - **Pinned memory.** On a GPU, `pin_memory=True` makes the loader hand out page-locked batches so
          `.to("cuda", non_blocking=True)` copies asynchronously ([notebook 3](03_transfers_and_syncs.ipynb)).
        - **Workers import the dataset.** On macOS and Windows workers start with `spawn`, and on Linux from
          Python 3.14 with `forkserver`: either way each one imports the dataset's class by module and name.
          A class defined in a notebook cell lives in `__main__`, which the workers cannot import, and the
          loader fails; keep
          datasets in a `.py` module like [`nbdata.py`](nbdata.py). `%gputune` warns when it sees this.
        - **On a GPU the step is much shorter**, often a few milliseconds, so the loader must be that much
          faster. The same loop on a GPU may still be data-bound after this fix: profile again, and the
          comparison says what persists.
        """),
    ]


# -- 3. Transfers and host syncs ------------------------------------------------------------------


def transfers_and_syncs() -> list:
    return [
        md("""
        # 3 · Transfers and host syncs: pinned memory, `non_blocking`, and `.item()`

        Two ways the host makes the GPU wait even when data loading is fast:

        1. **Copies from pageable memory**: slower, and they block the host while they are staged.
        2. **Host synchronisations**: `.item()`, printing a loss, `if tensor:` on a CUDA tensor — the host
           stops until the GPU has finished everything queued, and then the GPU waits for new work.

        The GPU cells run when CUDA is available and print a skip message otherwise. The second half shows
        the same lessons on traces recorded on real V100 and A100 GPUs, and runs anywhere.
        """),
        md("""
        ## How a host→device copy works

        - The GPU's copy engines move data by DMA, which needs **page-locked (pinned)** host memory: the
          operating system must not move or swap those pages while the copy runs.
        - From ordinary **pageable** memory the CUDA driver first copies the data, chunk by chunk, into a
          pinned staging buffer on the CPU, then DMAs it. That is an extra pass through the CPU, and the
          call returns only once the data is staged, so in practice the copy is synchronous with respect to
          the host even with `non_blocking=True`.
        - From pinned memory, `tensor.to("cuda", non_blocking=True)` enqueues the DMA and returns at once.
          The host goes on launching kernels while the copy runs; kernels queued after it on the same
          stream still see the copied data (a stream runs its work in order).
        - `DataLoader(pin_memory=True)` pins each batch in a background thread; `t.pin_memory()` pins a
          tensor you own. Pinned memory cannot be swapped out: pin the batches in flight, not a whole
          dataset.
        - The other direction needs care: after `y = x_gpu.to("cpu", non_blocking=True)`, `y` is only valid
          after a synchronisation (`torch.cuda.current_stream().synchronize()`).
        """),
        code("""
        from pathlib import Path

        import torch
        import torch.nn.functional as F
        from IPython.display import Image, display

        import gpumagic

        GPU = torch.cuda.is_available()
        SKIP = "No CUDA device here: this cell is skipped. The recorded traces below show the same lesson."
        print(f"CUDA device: {torch.cuda.get_device_name()}" if GPU else "No CUDA device: the GPU cells will be skipped.")
        """),
        md("""
        ### Pageable vs pinned, measured (GPU)

        The same eight batches copied to the GPU twice: from pageable memory with a blocking copy, then
        from pinned memory with `non_blocking=True`. There are no optimizer steps here, so each profile
        records the whole block.
        """),
        code("""
        def copy_to_gpu(batches, non_blocking):
            \"\"\"Copy each batch to the GPU and reduce it there, as a training step would use it.\"\"\"
            total = torch.zeros((), device="cuda")
            for batch in batches:
                total += batch.to("cuda", non_blocking=non_blocking).mean()
            torch.cuda.synchronize()
            return total


        def describe_copies(report):
            for g in report.metrics["copies"]["groups"]:
                rate = f"{g['gbps']:.1f} GB/s" if g.get("gbps") else "rate unknown"
                print(f"  {g['count']} {g['direction']} copies from {g['memory']} memory: {g['bytes'] / 1e6:.0f} MB at {rate}")
            print(f"  window {report.metrics['window']['dur_ms']:.1f} ms; findings: {', '.join(report.finding_ids) or 'none'}")


        if GPU:
            pageable = [torch.randn(32, 3, 224, 224) for _ in range(8)]  # 19 MB each, ordinary memory
            pinned = [b.pin_memory() for b in pageable]  # page-locked copies of the same data
            copy_to_gpu(pageable[:1], non_blocking=False)  # warm-up: CUDA context and allocator
            with gpumagic.profile(label="pageable", display=False) as pageable_run:
                copy_to_gpu(pageable, non_blocking=False)
            with gpumagic.profile(label="pinned", display=False) as pinned_run:
                copy_to_gpu(pinned, non_blocking=True)
            for run in (pageable_run, pinned_run):
                print(run.report.label)
                describe_copies(run.report)
        else:
            print(SKIP)
        """),
        md("""
        ### `.item()` in the loop (GPU)

        CUDA work is asynchronous: the host queues kernels and runs ahead while the GPU works through the
        queue. Anything that needs a GPU value *on the host* stops that: `.item()`, `print(loss)`,
        `float(t)`, `if (t > 0).any():`, `torch.nonzero`, a copy to the CPU. The host waits until the
        queue drains; then the GPU waits while the host does its own work and queues the next kernels.

        Below, each step also does a few milliseconds of host-side work (a `time.sleep` standing for
        preparing the next batch, logging, Python). Reading the loss with `.item()` every step serialises
        host and GPU; keeping the running loss on the GPU lets them overlap.
        """),
        code("""
        import time

        HOST_WORK_S = 0.003  # per step: preparing the next batch, logging, Python


        def make_model():
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                torch.nn.Linear(4096, 10)).cuda()
            return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


        def train_reading_loss_every_step(model, opt, batches):
            losses = []
            for x, y in batches:
                time.sleep(HOST_WORK_S)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())  # the host waits here for the whole step
            return sum(losses) / len(losses)


        def train_keeping_loss_on_gpu(model, opt, batches):
            total = torch.zeros((), device="cuda")
            for x, y in batches:
                time.sleep(HOST_WORK_S)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                total += loss.detach()  # stays on the GPU: no wait
            return (total / len(batches)).item()  # one synchronisation, at the end


        if GPU:
            batches = [(torch.randn(512, 4096, device="cuda"), torch.randint(0, 10, (512,), device="cuda")) for _ in range(10)]
            model, opt = make_model()
            train_keeping_loss_on_gpu(model, opt, batches[:2])  # warm-up
            with gpumagic.profile(label=".item() every step", display=False) as sync_run:
                train_reading_loss_every_step(model, opt, batches)
            with gpumagic.profile(label="loss kept on the GPU", display=False) as async_run:
                train_keeping_loss_on_gpu(model, opt, batches)
            display(gpumagic.compare(sync_run, async_run))
        else:
            print(SKIP)
        """),
        md("""
        To find hidden synchronisations in your own code, make PyTorch warn at each one:

        ```python
        torch.cuda.set_sync_debug_mode("warn")   # "error" raises instead; 0 turns it off
        ```
        """),
        code("""
        if GPU:
            import warnings

            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    loss_value = batches[0][0].sum().item()
                print("\\n".join(str(w.message).splitlines()[0] for w in caught) or "no warning")
            finally:
                torch.cuda.set_sync_debug_mode(0)
        else:
            print(SKIP)
        """),
        md("""
        ## The same lessons on recorded traces

        These traces were recorded on real GPUs by other projects (their sources and licences are in
        `tests/data/MANIFEST.md`). The notebook reads them from the repository's `tests/data` folder.
        """),
        code("""
        DATA = Path("../tests/data")
        if not (DATA / "MANIFEST.md").exists():
            raise FileNotFoundError(
                f"The recorded traces are not at {DATA.resolve()}: run this notebook from example_notebooks/ "
                "in a checkout of the gpumagic repository.")
        """),
        md("""
        ### Pageable copies: ResNet-50 on a V100

        The ResNet-50 run with `num_workers=0` (the bundled example of notebook 1) copies every batch from
        pageable memory:
        """),
        code("""
        resnet = gpumagic.analyze(DATA / "resnet50_v100_workers0.json.gz", label="ResNet-50, V100")
        describe_copies(resnet)
        copies = resnet.finding("pageable-memcpy")
        print()
        print(copies.evidence.summary)
        print(f"estimated gain: up to {copies.est_gain:.1%} of step time ({copies.gain_method})")
        print()
        print(copies.fixes[0].code)
        """),
        md("""
        Here the gain is small: the copies are a small part of a step dominated by data loading and FP32
        compute. The finding is still worth its one-line fix, because pinned, non-blocking copies also
        stop blocking the host, and that matters more once the other bottlenecks are gone. The checklist's
        order (by estimated gain) says what to fix first.

        ### Host syncs: one rank of a 16-GPU job on A100s
        """),
        code("""
        a100 = gpumagic.analyze(DATA / "a100_training_rank0.json.gz", label="A100, rank 0 of 16")
        syncs = a100.metrics["syncs"]
        print("synchronising CUDA calls:", {name: v["count"] for name, v in syncs["by_name"].items()})
        print("operators that synchronise:", syncs.get("sync_ops"))
        host_sync = a100.finding("host-sync")
        print()
        print(host_sync.evidence.summary)
        print(f"estimated gain: up to {host_sync.est_gain:.1%} of step time")
        """),
        md("""
        `aten::item` is what `.item()` runs: somewhere in the training code a loss is logged, a metric read,
        or a Python `if` tests a tensor. On a CUDA tensor it waits for the GPU (the `cudaStreamSynchronize`
        calls); on a CPU tensor it costs nothing, which is why the operators outnumber the synchronising
        calls. What a sync costs is not the number of calls but the GPU idle time after it, until the host
        has queued new work: that is what the finding adds up into its estimated gain. The timeline of one
        step, with those moments highlighted:
        """),
        code("""
        display(Image(a100.timeline_png(step=0, finding="host-sync")))
        """),
        md("""
        ## What to remember

        - Batches: `DataLoader(..., pin_memory=True)` and `x.to("cuda", non_blocking=True)`.
        - Tensors you build on the host each step: allocate them pinned once and reuse them, or build them
          on the GPU directly (`torch.randn(..., device="cuda")`).
        - Keep per-step values on the GPU (`running_loss += loss.detach()`) and read them every *N* steps.
        - `torch.cuda.set_sync_debug_mode("warn")` points at every hidden synchronisation.
        """),
    ]


# -- 4. Hugging Face Trainer ----------------------------------------------------------------------


def huggingface_trainer() -> list:
    return [
        md("""
        # 4 · Hugging Face `Trainer`: profile a few steps with a callback

        `gpumagic.integrations.huggingface.GpuProfileCallback` is a `transformers.TrainerCallback`. Add it
        to a `Trainer` and it profiles a few optimizer steps of `trainer.train()` after a warm-up, then
        displays the report. Its fixes come phrased as `TrainingArguments` (`dataloader_num_workers`,
        `bf16`, `torch_compile`, ...), checked against the installed transformers version.

        The model is a tiny BERT built from a config (random weights, nothing downloaded); it trains for a
        few steps on the CPU, or on the GPU when there is one. Needs `pip install 'gpumagic[hf]'`.
        """),
        code("""
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: never contact the Hub
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

        import tempfile
        import warnings

        import torch

        try:
            import transformers
        except ImportError as exc:
            raise ImportError("This notebook needs transformers: pip install 'gpumagic[hf]'") from exc
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

        import gpumagic
        from gpumagic.integrations.huggingface import GpuProfileCallback
        from nbdata import RandomTokens

        warnings.filterwarnings("ignore", message="This DataLoader will create")  # workers wait, not compute
        print(f"transformers {transformers.__version__}, training on {'CUDA' if torch.cuda.is_available() else 'the CPU'}")
        """),
        md("""
        ## A tiny model and a slow dataset

        One BERT layer, 256 wide. `RandomTokens` (in [`nbdata.py`](nbdata.py)) yields tokenised sentences
        and spends 6 ms per item, standing for tokenisation or augmentation done on the fly in
        `__getitem__`. `make_trainer` builds a fresh model and `Trainer` for each run so that runs compare
        like with like.
        """),
        code("""
        config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=512, max_position_embeddings=128, num_labels=2)
        train_data = RandomTokens(seq_len=64, vocab_size=config.vocab_size, item_s=0.006)
        output_dir = tempfile.mkdtemp(prefix="gpumagic-hf-")


        def make_trainer(callback, **settings):
            torch.manual_seed(0)
            args = TrainingArguments(
                output_dir=output_dir, max_steps=8, per_device_train_batch_size=32, learning_rate=1e-3,
                use_cpu=not torch.cuda.is_available(), report_to=[], save_strategy="no", logging_strategy="no",
                disable_tqdm=True, seed=0, **settings)
            return Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=train_data,
                           callbacks=[callback])
        """),
        md("""
        ## Profile with the callback

        `skip=2` leaves two optimizer steps out as warm-up, `steps=4` records the next four; training then
        goes on unprofiled. `label=` remembers the report for comparisons. In a notebook the report is
        displayed when the recorded steps are done; `callback.report` keeps it. (The dictionary printed at
        the end is the `Trainer`'s own summary.)
        """),
        code("""
        callback = GpuProfileCallback(skip=2, steps=4, label="hf before")
        make_trainer(callback).train();
        """),
        md("""
        The loop waits for its data: **`dataloader-bound`**. Its first fix is written as `TrainingArguments`,
        and the report's notes name the transformers version the argument names were checked against (a
        setting that version lacks is dropped, and the notes say so). Without a GPU the fix leaves out
        `dataloader_pin_memory`, which only speeds up copies to a GPU. The plain PyTorch fix follows it,
        for code that builds its own DataLoader.
        """),
        code("""
        report = callback.report
        for fix in report.finding("dataloader-bound").fixes:
            print(f"# {fix.flavor}: {fix.description}")
            print(fix.code, end="\\n\\n")
        print("\\n".join(report.notes))
        """),
        md("""
        ## Apply the fix, profile again, compare

        The same settings, passed to `TrainingArguments`:
        """),
        code("""
        after = GpuProfileCallback(skip=2, steps=4, label="hf after", display=False)
        make_trainer(after, dataloader_num_workers=4, dataloader_persistent_workers=True, dataloader_prefetch_factor=2).train()
        comparison = gpumagic.compare("hf before", "hf after")
        comparison
        """),
        code("""
        print(f"speed-up: {comparison.speedup:.2f}×; resolved: {', '.join(comparison.resolved) or 'none'}; "
              f"still there: {', '.join(comparison.persisting) or 'none'}")
        """),
        md("""
        On a GPU the step takes a few milliseconds instead of a hundred, so four workers may not keep up:
        `dataloader-bound` then persists with a smaller gain, and
        `gpumagic.tune_dataloader(trainer.get_train_dataloader())` measures how many workers it takes.

        ## Other ways in

        - `%%gpuprofile` around `trainer.train()` works too: it finds the steps through the optimizer, and
          when the kernel has imported the `Trainer` its fixes come as `TrainingArguments` first.
        - `huggingface_fixes(report, training_args=args)` rephrases any report, e.g. one analysed offline.
        - In a distributed run the callback profiles rank 0 only; `all_ranks=True` profiles every process.
        - Other options: `save="run.json.gz"` writes the trace bundle for `gpumagic analyze`,
          `display=False`, and the capture options of `gpumagic.profile`.
        """),
    ]


# -- 5. Offline analysis --------------------------------------------------------------------------


def offline_analysis() -> list:
    return [
        md("""
        # 5 · Offline analysis: saved traces, comparisons, HTML, the command line

        Traces often come from elsewhere: a cluster job, a CI run, a colleague. gpumagic analyses any
        trace written by `torch.profiler` (Kineto JSON, plain or `.json.gz`) and its own bundles (a Kineto
        trace plus NVML and CPU samples), **without torch** and without a GPU.

        This notebook uses the recorded traces in the repository's `tests/data` folder (sources and
        licences in `tests/data/MANIFEST.md`). It writes only to a temporary folder, outside the
        repository.
        """),
        code("""
        import json
        import tempfile
        from pathlib import Path

        import gpumagic

        DATA = Path("../tests/data")
        if not (DATA / "MANIFEST.md").exists():
            raise FileNotFoundError(
                f"The recorded traces are not at {DATA.resolve()}: run this notebook from example_notebooks/ "
                "in a checkout of the gpumagic repository.")
        OUT = Path(tempfile.mkdtemp(prefix="gpumagic-offline-"))  # where this notebook writes its files
        for path in sorted(DATA.glob("*.json.gz")):
            print(f"{path.name:40} {path.stat().st_size / 1e6:5.1f} MB")
        """),
        md("""
        ## Load and analyse

        `gpumagic.load_trace` reads a file into gpumagic's columnar trace (numpy columns, one row per
        event); `gpumagic.analyze` takes a path, a loaded trace or a parsed dict and returns the Report.
        """),
        code("""
        trace = gpumagic.load_trace(DATA / "resnet50_v100_workers0.json.gz")
        print(f"{len(trace.events):,} events; devices: {', '.join(sorted({d.name for d in trace.devices}))}")

        before = gpumagic.analyze(trace, label="num_workers=0")
        after = gpumagic.analyze(DATA / "resnet50_v100_workers4.json.gz", label="num_workers=4")
        for report in (before, after):
            print(f"{report.label}: median step {report.metrics['steps']['median_ms']:.0f} ms, "
                  f"GPU busy {report.metrics['gpu']['busy_frac']:.0%}, findings: {', '.join(report.finding_ids)}")
        """),
        md("""
        Text is the quickest way to read a report outside a notebook, or to paste it into an issue:
        """),
        code("""
        print(after.to_text())
        """),
        md("""
        ## Compare two runs

        The two traces are the same ResNet-50 job on the same V100, before and after setting
        `num_workers=4`. `gpumagic.compare(before, after)` takes Reports, runs from `gpumagic.profile()`,
        trace paths, or labels remembered by `%%gpuprofile --label`.
        """),
        code("""
        comparison = gpumagic.compare(before, after)
        comparison
        """),
        md("""
        Reading it: the median step is the headline (steps vary, and the median ignores a slow one); the
        breakdown per step shows *where* the time went: data-loader wait almost vanished, and the GPU
        kernels take as long as before. The findings tell what the change resolved and what is left to do
        next: mixed precision, the remaining idle gaps, pinned copies.

        A finding can also *grow* after a fix (compare the estimated gains): once a step is shorter, what
        remains takes a larger share of it.

        Everything is data as well, e.g. for a regression check in CI:
        """),
        code("""
        data = comparison.to_dict()
        print({key: data[key] for key in ("step_time_ratio", "speedup", "resolved", "new", "persisting")})
        assert data["step_time_ratio"] < 1 and "dataloader-bound" in data["resolved"]
        """),
        md("""
        ## Export HTML

        `save_html` writes one self-contained file (styles and images inline, no network access), to open
        in a browser or attach to a ticket. Reports and comparisons both have it.
        """),
        code("""
        for name, obj in (("workers0.html", before), ("workers4.html", after), ("comparison.html", comparison)):
            path = obj.save_html(OUT / name)
            print(f"{path.name:16} {path.stat().st_size / 1024:6.0f} KiB")
        """),
        md("""
        ## Record once, analyse anywhere

        `%%gpuprofile --save run.json.gz` (or `gpumagic.profile(save=...)`) writes a **bundle**: the Kineto
        trace plus the NVML and CPU samples, the label and library versions — nothing from the environment.
        A tiny CPU run here, just to have a file:
        """),
        code("""
        import torch

        model = torch.nn.Linear(64, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        bundle = OUT / "tiny_run.json.gz"
        with gpumagic.profile(label="tiny run", save=str(bundle), display=False):
            for _ in range(8):
                model(torch.randn(32, 64)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        print(f"{bundle.name}: {bundle.stat().st_size / 1024:.0f} KiB")
        saved = gpumagic.analyze(bundle)
        print(f"label {saved.label!r}, {saved.metrics['steps']['count']} steps; notes: {saved.notes}")
        """),
        md("""
        ## The command line

        The same from a shell, on a machine without torch, a GPU or Jupyter:
        `gpumagic analyze TRACE [--format text|json|html] [-o FILE]` and
        `gpumagic compare BEFORE AFTER [...]`. `example` names the bundled example trace.
        """),
        code("""
        !gpumagic analyze ../tests/data/h100_bert_small_inference.json.gz | head -n 12
        """),
        code("""
        BEFORE, AFTER = DATA / "resnet50_v100_workers0.json.gz", DATA / "resnet50_v100_workers4.json.gz"
        !gpumagic compare {BEFORE} {AFTER} --format json > {OUT}/comparison.json
        cli = json.loads((OUT / "comparison.json").read_text())
        print(cli["step_time_ratio"], cli["resolved"])
        """),
        code("""
        !cd {OUT} && gpumagic analyze example --format html -o example.html
        """),
        md("""
        A file that is missing, empty, truncated or not a trace exits with status 2 and one line on stderr,
        so scripts can rely on it:
        """),
        code("""
        !gpumagic analyze no_such_trace.json.gz
        """),
    ]


# -- 6. From settings to kernels ------------------------------------------------------------------


def settings_to_kernels() -> list:
    return [
        md("""
        # 6 · From settings to kernels: mixed precision, `torch.compile`, CUDA graphs, custom kernels

        Once the input pipeline keeps the GPU fed (notebooks 2 and 3), the GPU's own time is what is left.
        Work down this ladder, measuring at each rung, and stop when the profile says the GPU is no longer
        the bottleneck:

        1. **Settings** — mixed precision (tensor cores), TF32, fused optimizers, `channels_last`: one line
           each, large gains on GPU-bound code.
        2. **Fewer launches** — `torch.compile` and CUDA graphs, for code whose kernels are too small to keep
           the GPU busy (*launch-bound*).
        3. **A custom kernel** — only when one operation dominates the step and no fused version exists.

        The first half reads traces recorded on a V100 and an H100 and runs anywhere; the GPU cells after it
        run when CUDA is available and print a skip message otherwise.
        """),
        code("""
        import contextlib
        import time
        from pathlib import Path

        import torch
        import torch.nn.functional as F
        from IPython.display import display

        import gpumagic

        GPU = torch.cuda.is_available()
        SKIP = "No CUDA device here: this cell is skipped (the recorded traces above show the lesson)."
        DATA = Path("../tests/data")
        if not (DATA / "MANIFEST.md").exists():
            raise FileNotFoundError(
                f"The recorded traces are not at {DATA.resolve()}: run this notebook from example_notebooks/ "
                "in a checkout of the gpumagic repository.")
        """),
        md("""
        ## 1. A GPU-bound ResNet in FP32 (V100)

        This ResNet keeps the GPU busy almost all the time: no data-loader, copy or launch problem. Its only
        finding is about precision.
        """),
        code("""
        resnet = gpumagic.analyze(DATA / "v100_resnet_ns_timestamps.json.gz", label="ResNet, V100, FP32")
        k = resnet.metrics["kernels"]
        print(f"GPU busy {resnet.metrics['gpu']['busy_frac']:.0%}; findings: {', '.join(resnet.finding_ids)}")
        print(f"matmul/conv kernels: {k['matmul_ms']:.0f} ms of {k['total_ms']:.0f} ms kernel time; "
              f"on tensor cores: {k['matmul_tensor_core_ms']:.0f} ms")
        precision = resnet.finding("mixed-precision-off")
        print()
        print(precision.why)
        print()
        print(f"estimated gain: up to {precision.est_gain:.0%} ({precision.gain_method})")
        print(precision.fixes[0].code)
        """),
        md("""
        Tensor cores multiply small matrix tiles in one instruction, in FP16, BF16 or TF32 with FP32
        accumulation, at several times the FP32 rate. FP32 matmuls cannot use them. `torch.autocast` runs
        matmuls and convolutions in the lower precision and keeps precision-sensitive operations (softmax,
        reductions, losses) in FP32; the weights stay FP32.

        - **bfloat16** (Ampere and newer: A100, H100, RTX 30xx and later) has FP32's range: no loss scaling.
        - **float16** (Volta, Turing: V100, T4) has a narrow range: small gradients underflow to zero, so
          `GradScaler` multiplies the loss before `backward()` and unscales before the step.
        - **TF32** for the remaining FP32 matmuls on Ampere and newer: `torch.set_float32_matmul_precision("high")`.

        Mixed precision also halves the bytes that memory-bound kernels (elementwise, normalisation) move,
        which is why it helps even a network whose top kernels are not matmuls.

        ## 2. Launch-bound: BERT inference at batch size 1 (H100)
        """),
        code("""
        bert = gpumagic.analyze(DATA / "h100_bert_small_inference.json.gz", label="BERT, H100, batch 1")
        k = bert.metrics["kernels"]
        print(f"GPU busy {bert.metrics['gpu']['busy_frac']:.0%}; {k['count']} kernels, median {k['median_us']:.1f} µs, "
              f"{k['short_frac']:.0%} of them under {k['short_kernel_us']:.0f} µs")
        launch = bert.finding("launch-bound")
        print()
        print(launch.why)
        print()
        for fix in launch.fixes[:2]:
            print("#", fix.description)
            print(fix.code, end="\\n\\n")
        """),
        md("""
        Each kernel launch costs the host microseconds: Python, the PyTorch dispatcher, the CUDA driver.
        When kernels finish faster than the host can launch the next one, the GPU idles between them, and
        a faster GPU changes nothing. The remedies cut the number of launches:

        - **`torch.compile`** traces the model and fuses chains of elementwise and normalisation operations
          into a few generated (Triton) kernels.
        - **CUDA graphs** record a whole sequence of launches once and replay it with a single call.
          `torch.compile(mode="reduce-overhead")` does this for you; `torch.cuda.CUDAGraph` does it by hand.
          Graphs need static shapes and memory addresses: inputs are copied into the same tensors each time.
        - **More work per launch**: a bigger batch, when the application allows it.

        ## 3. When is a custom kernel worth it? Amdahl's law on the kernel table

        Making one kernel *s* times faster shortens the step by at most that kernel's share of the step ×
        (1 − 1/*s*). The kernel tables of the two traces, with the most a 2× faster version of each kernel
        could save:
        """),
        code("""
        def kernel_bounds(report, top=3, speedup=2.0):
            window_ms = report.metrics["window"]["dur_ms"]
            print(f"{report.label} (window {window_ms:.1f} ms, GPU busy {report.metrics['gpu']['busy_frac']:.0%})")
            for kernel in report.metrics["kernels"]["top"][:top]:
                share = kernel["total_ms"] / window_ms
                name = kernel["name"].removeprefix("void ").split("(")[0]
                print(f"  {share:6.1%} of the window; {speedup:g}× faster saves ≤ {share * (1 - 1 / speedup):5.1%}:  {name[:64]}")


        kernel_bounds(resnet)
        kernel_bounds(bert)
        """),
        md("""
        In the GPU-bound ResNet no single kernel takes more than a few percent of the step, so a custom
        kernel for any one of them saves little; mixed precision speeds up a large share of them at once.
        In the launch-bound BERT the GPU is idle most of the time, so even an infinitely fast kernel saves
        almost nothing: the launches are the problem.

        A custom kernel pays off when
        1. the profile shows one operation (or a chain of them) taking a large share of the step **after**
           the settings and `torch.compile`,
        2. no fused implementation exists already — check first: `F.scaled_dot_product_attention`
           (FlashAttention), fused optimizers (`fused=True`), `torch.compile`'s generated kernels, and
        3. you know what limits it — memory bandwidth (fuse to read the data once) or compute (use tensor
           cores) — and can measure the kernel against that limit.

        Triton is the usual way to write one in Python; `torch.compile` already writes Triton kernels for
        elementwise chains, so write your own for what it cannot fuse (custom attention variants, fused
        reductions, quantised matmuls).

        ## 4. The same, measured on your GPU

        The cells below run only with CUDA. Each pair of runs is profiled with `gpumagic.profile` and
        compared.
        """),
        md("""
        ### Mixed precision (GPU)
        """),
        code("""
        def make_mlp(width=4096, depth=4):
            torch.manual_seed(0)
            layers = []
            for _ in range(depth):
                layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
            model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda()
            return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


        def train(model, opt, batches, amp_dtype=None, scaler=None):
            for x, y in batches:
                precision = torch.autocast("cuda", dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
                with precision:
                    loss = F.cross_entropy(model(x), y)
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:  # float16: scale the loss so that small gradients do not underflow
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                opt.zero_grad(set_to_none=True)


        if GPU:
            batches = [(torch.randn(1024, 4096, device="cuda"), torch.randint(0, 10, (1024,), device="cuda")) for _ in range(10)]
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
            model, opt = make_mlp()
            train(model, opt, batches[:2])  # warm-up
            with gpumagic.profile(label="FP32", display=False) as fp32_run:
                train(model, opt, batches)
            model, opt = make_mlp()
            train(model, opt, batches[:2], amp_dtype, scaler)
            with gpumagic.profile(label=f"autocast {str(amp_dtype).removeprefix('torch.')}", display=False) as amp_run:
                train(model, opt, batches, amp_dtype, scaler)
            display(gpumagic.compare(fp32_run, amp_run))
        else:
            print(SKIP)
        """),
        md("""
        ### A launch-bound model: eager, CUDA graph, `torch.compile` (GPU)

        A small MLP at batch size 8: dozens of tiny kernels per call. The same forward pass three ways.
        """),
        code("""
        def time_per_call_us(fn, x, calls=200):
            for _ in range(10):
                fn(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / calls * 1e6


        def graphed(model, example):
            \"\"\"`model` captured in a CUDA graph: one replay launches every kernel of the forward pass.\"\"\"
            static_x = example.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up on a side stream before capturing, as the CUDA graph docs require
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = model(static_x)

            def run(x):
                static_x.copy_(x)
                graph.replay()
                return static_y

            return run


        if GPU:
            torch.manual_seed(0)
            layers = []
            for _ in range(12):
                layers += [torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.nn.GELU()]
            small = torch.nn.Sequential(*layers).cuda().eval()
            x = torch.randn(8, 256, device="cuda")
            with torch.no_grad():
                variants = {"eager": small, "CUDA graph": graphed(small, x)}
                try:
                    compiled = torch.compile(small, mode="reduce-overhead")
                    compiled(x)  # compiles now (tens of seconds), not inside the measurement
                    variants["torch.compile reduce-overhead"] = compiled
                except Exception as exc:  # e.g. no C compiler for Triton: say so and go on with the others
                    print(f"torch.compile is not usable here ({type(exc).__name__}: {str(exc).splitlines()[0]})")
                for name, fn in variants.items():
                    with gpumagic.profile(label=name, display=False) as run:
                        for _ in range(50):
                            fn(x)
                        torch.cuda.synchronize()
                    r = run.report
                    print(f"{name:30} {time_per_call_us(fn, x):7.1f} µs per call; GPU busy {r.metrics['gpu']['busy_frac']:.0%}; "
                          f"findings: {', '.join(r.finding_ids) or 'none'}")
        else:
            print(SKIP)
        """),
        md("""
        ### A fused kernel that already exists: attention (GPU)

        Attention written out materialises the *L × L* score matrix in GPU memory and runs several kernels;
        `F.scaled_dot_product_attention` dispatches to a fused kernel (FlashAttention or a memory-efficient
        variant) that never writes it. Check for a fused version like this before writing your own.
        """),
        code("""
        def attention_by_hand(q, k, v):
            scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
            return scores.softmax(dim=-1) @ v


        def time_ms(fn, *args, calls=20):
            fn(*args)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / calls * 1e3


        if GPU:
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            q, k, v = (torch.randn(2, 16, 2048, 64, device="cuda", dtype=dtype) for _ in range(3))
            diff = (attention_by_hand(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
            print(f"largest difference between the two: {diff:.3g} ({str(dtype).removeprefix('torch.')} rounding)")
            for name, fn in (("by hand", attention_by_hand), ("scaled_dot_product_attention", F.scaled_dot_product_attention)):
                torch.cuda.reset_peak_memory_stats()
                ms = time_ms(fn, q, k, v)
                print(f"{name:30} {ms:6.2f} ms per call, peak memory {torch.cuda.max_memory_allocated() / 2**20:6.0f} MiB")
        else:
            print(SKIP)
        """),
        md("""
        ## Summary

        | the profile says | first try | then |
        |---|---|---|
        | `mixed-precision-off` | `torch.autocast` (bf16 on Ampere+, fp16 + `GradScaler` before), TF32 | `channels_last` for convolutions |
        | `launch-bound` | `torch.compile(mode="reduce-overhead")`, fused optimizer, bigger batch | a CUDA graph by hand |
        | GPU busy, one kernel dominates | an existing fused kernel (SDPA, `fused=True`) | a custom (Triton) kernel, measured against its limit |
        """),
    ]


NOTEBOOKS: dict[str, Callable[[], list]] = {
    "01_quickstart": quickstart,
    "02_dataloader_bottleneck": dataloader_bottleneck,
    "03_transfers_and_syncs": transfers_and_syncs,
    "04_huggingface_trainer": huggingface_trainer,
    "05_offline_analysis": offline_analysis,
    "06_settings_to_kernels": settings_to_kernels,
}


# -- building -------------------------------------------------------------------------------------


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (a key of :data:`NOTEBOOKS`), without outputs, with stable cell ids."""
    nb = nbformat.v4.new_notebook()
    nb.cells = NOTEBOOKS[name]()
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i:02d}"
    nb.metadata = {
        "kernelspec": {"name": KERNEL, "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    return nb


def kernel_env() -> dict[str, str]:
    """The environment for the notebook kernel: this one plus :data:`KERNEL_ENV`."""
    return {**os.environ, **KERNEL_ENV}


def execute(nb: nbformat.NotebookNode, timeout_s: int = CELL_TIMEOUT_S, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run ``nb`` top to bottom in ``example_notebooks/``; raises nbclient's CellExecutionError on an error.

    ``env`` adds to the kernel's environment (see :func:`kernel_env`)."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout_s, kernel_name=KERNEL, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute(env={**kernel_env(), **(env or {})})
    return nb


def tidy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes from run to run without meaning anything: kernel versions, cell timings."""
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def problems(nb: nbformat.NotebookNode, size_bytes: int) -> list[str]:
    """What makes an executed notebook unfit to commit."""
    found = []
    if size_bytes > MAX_NOTEBOOK_BYTES:
        found.append(f"{size_bytes:,} bytes, over the {MAX_NOTEBOOK_BYTES:,}-byte limit")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {cell.id} has an error output")
            if WIDGET_MIME in out.get("data", {}):
                found.append(f"cell {cell.id} has a widget view without state (run with GPUMAGIC_WIDGETS=0)")
    return found


def write(name: str, run: bool) -> int:
    """Build notebook ``name``, execute it if ``run``, write it; returns the number of problems found."""
    nb = build(name)
    t0 = time.perf_counter()
    if run:
        tidy(execute(nb))
    path = NOTEBOOK_DIR / f"{name}.ipynb"
    text = nbformat.writes(nb) + "\n"
    path.write_text(text, encoding="utf-8")
    found = problems(nb, len(text.encode()))
    print(f"{path.relative_to(ROOT)}: {len(text.encode()) / 1024:.0f} KiB"
          + (f", executed in {time.perf_counter() - t0:.1f} s" if run else ""))
    for p in found:
        print(f"  problem: {p}", file=sys.stderr)
    return len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("numbers", nargs="*", type=int, help="notebooks to build (1-6; default all)")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = parser.parse_args(argv)
    names = list(NOTEBOOKS)
    bad = [n for n in args.numbers if not 1 <= n <= len(names)]
    if bad:
        parser.error(f"notebook numbers are 1 to {len(names)}, not {bad}")
    chosen = [names[n - 1] for n in args.numbers] or names
    failures = sum(write(name, run=not args.no_execute) for name in chosen)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
