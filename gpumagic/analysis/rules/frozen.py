"""``frozen-forward``: a part of the model that does not train (a frozen backbone, a teacher)
runs its forward pass every step and takes much of the step's time."""

from __future__ import annotations

import re

import numpy as np

from gpumagic._arrays import median_of
from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.gpubound import gpu_time_gain
from gpumagic.analysis.inference import outermost_ops
from gpumagic.analysis.phases import LAYER_OPS, outer_calls, phase_intervals
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.analysis.rules.loopwork import IN_PLACE, RANDOM_OPS, ZEROING
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding
from gpumagic.trace.model import EventTable

#: A finding from this share of the window: the TensorBoard profiler plugin's 5 % line for a
#: bottleneck worth naming, doubled (caching a part's outputs changes the data pipeline: worth it
#: only for a large share).
MIN_FRAC = 0.10
#: Of the time that built no autograd node in the forward passes, layers' operators
#: (:data:`~gpumagic.analysis.phases.LAYER_OPS`: a matmul, a convolution, an embedding,
#: attention) must hold at least this share: a model's computation, not the preparation of its
#: inputs (a cast, a normalization) or of the loss's targets.
MIN_LAYER_SHARE = 0.5
#: In-place writes outside the optimizer — after its step, before the next forward — from this
#: many calls in a step (a ``torch._foreach_`` one counts as many: it writes a list) mean the loop
#: updates weights itself: an EMA teacher (BYOL, DINO, MoCo, a mean teacher: ``mul_``/``add_``,
#: ``lerp_``, ``torch._foreach_lerp_``), a target network synced with ``load_state_dict``
#: (``copy_`` per tensor). A part whose weights change is no fixed feature extractor: silent.
MIN_WRITES = 4
FOREACH_IN_PLACE = re.compile(r"^aten::_foreach_[a-z0-9_]*[a-z0-9]_$")
#: The data pipeline's stages (gpumagic's loader stage timers, ``host.loader_stages``) named like
#: random augmentations (torchvision's ``RandomResizedCrop``, ``RandomHorizontalFlip``,
#: ``RandAugment``, ``TrivialAugmentWide``, ``AutoAugment``, ``AugMix``, ``ColorJitter``, and
#: ``v2.MixUp``/``CutMix``): each epoch's inputs differ, so nothing can be computed once: silent.
AUGMENTING_STAGE = re.compile(r"(Random|Rand[A-Z]|TrivialAugment|AutoAugment|AugMix|ColorJitter|MixUp|CutMix)")
DOC = "https://pytorch.org/tutorials/beginner/transfer_learning_tutorial.html#convnet-as-fixed-feature-extractor"
#: benchmarks/frozen_features.py on this project's 2-core machine, alternated rounds.
MEASURED = ("benchmarks/frozen_features.py: a frozen 2-layer convolutional backbone and a linear head on the CPU, "
            "see docs/performance.md")
#: The frozen part's outputs computed once, under torch.no_grad() (not inference_mode: a tensor
#: made in inference mode cannot be saved for the head's backward later), then a loader over them.
CACHE_CODE = """
# once, before training: the frozen part's outputs for every sample, in a fixed order, without augmentation
backbone.eval()                                   # the frozen part (its BatchNorm and Dropout in eval mode)
features, targets = [], []
with torch.no_grad():
    for xb, yb in torch.utils.data.DataLoader(dataset, batch_size=batch_size):
        features.append(backbone(xb.to(device)).cpu())   # a Hugging Face model returns a ModelOutput:
        # keep the tensor the head reads, e.g. backbone(...).last_hidden_state[:, 0]
        targets.append(yb)
cached = torch.utils.data.TensorDataset(torch.cat(features), torch.cat(targets))
train_loader = torch.utils.data.DataLoader(cached, batch_size=batch_size, shuffle=True)
# the training loop: only the part that trains runs
for epoch in range(epochs):
    for fb, yb in train_loader:
        loss = loss_fn(head(fb.to(device)), yb.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

#: The part draws random numbers itself (a VAE encoder's sampled latent: mean + std × randn): what
#: can be stored is what comes before the draw, the distribution, and the draw stays in the loop.
#: diffusers' ``DiagonalGaussianDistribution`` splits the encoder's output into mean and
#: log-variance with ``torch.chunk(parameters, 2, dim=1)`` and clamps the log-variance to
#: [-30, 20]; its ``std`` is ``exp(0.5 * logvar)``.
SAMPLED_CODE = """
# once, before training: the encoder's distribution for every sample (mean and std), not a draw from it
encoder.eval()
means, stds, targets = [], [], []
with torch.no_grad():
    for xb, yb in torch.utils.data.DataLoader(dataset, batch_size=batch_size):
        moments = encoder(xb.to(device))   # diffusers' AutoencoderKL: vae.encode(xb).latent_dist.parameters
        mean, logvar = moments.chunk(2, dim=1)
        means.append(mean.cpu())
        stds.append(torch.exp(0.5 * logvar.clamp(-30.0, 20.0)).cpu())
        targets.append(yb)
cached = torch.utils.data.TensorDataset(torch.cat(means), torch.cat(stds), torch.cat(targets))
train_loader = torch.utils.data.DataLoader(cached, batch_size=batch_size, shuffle=True)
# the training loop: a new draw every step, as the encoder made it (times your scaling factor, if any)
for epoch in range(epochs):
    for mean, std, yb in train_loader:
        latents = (mean + std * torch.randn_like(mean)).to(device)
        loss = loss_fn(head(latents), yb.to(device))   # the part that trains, on the latents
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
#: Draws of indices (which stored samples to take: a replay buffer's ``torch.randint``, a
#: shuffle's ``randperm``; a diffusion loop's timesteps) make no new inputs for the part: what it
#: computes for each stored sample can be kept all the same. Only the other draws (noise: a GAN's
#: ``randn``) silence the rule when they come before the part.
INDEX_DRAWS = frozenset({"aten::randint", "aten::randint_like", "aten::randperm", "aten::multinomial",
                         "aten::random_"})
#: A dropout's mask (``aten::bernoulli_``) is no sample of the part's output to keep: the stored
#: outputs are computed in eval mode, without it.
MASK_OPS = frozenset({"aten::bernoulli", "aten::bernoulli_"})


@rule("frozen-forward")
def frozen_forward(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: in a training window (its steps run a backward pass), the forward passes' outermost
    operators on the main thread that built no autograd node — run under ``torch.no_grad()``
    (the profiler records no ``Sequence number`` for them) or on parameters that do not require
    grad (the thread's autograd counter, which numbers each node built, does not advance across
    them: :mod:`gpumagic.analysis.inference`) — take ≥ 10 % of the window (host time on a CPU;
    on a GPU, the kernels they launched), layers' operators hold ≥ half of that time, and in
    most steps no random-number operator (outermost: the loop's own draw, not a dropout's mask
    inside the model; not a draw of indices, :data:`INDEX_DRAWS`, which picks stored samples)
    ran before them in the step (noise fed to a GAN's generator: inputs new every step). That is a
    part of the model that does not train: a frozen backbone under a trained head, a teacher in
    distillation. Gain, an estimate: that time's share, which computing the part's outputs once
    and training on them saves where its inputs repeat each epoch (no random augmentation
    before it). Silent where the trace records no sequence numbers (it cannot tell). False
    positives: a frozen part whose inputs change every step (augmented images, a target
    network's next states) must run every step; the why says so. Silent where the loop writes
    tensors in place after its optimizer (≥ 4 calls, a ``torch._foreach_`` one counting 4: an EMA
    teacher, a synced target network: the weights change) and where gpumagic's loader stage
    timers name a random augmentation (``RandomResizedCrop``, ``ColorJitter``...). Silent, too,
    where in most steps with the part its layers' calls all lie in repeats of the very sequence
    of calls (two layers' at least) of a forward that built nodes in the same step
    (:func:`_runs_trained`): the trained network itself, or a copy of it, run without grad — a
    policy acting in a reinforcement-learning rollout, a DQN's target network on replayed states,
    the model's loss on a fixed batch under no_grad — whose weights change (a teacher of the
    student's very architecture, born-again distillation, is missed so)."""
    if not ctx.step_bounds or m.phases is None or not m.phases.found.backward:
        return None
    ev, mk = ctx.trace.events, ctx.masks
    parts = phase_intervals(ctx)
    fwd = iv.union_of([p["forward"] for p in parts])
    if not fwd[0].size:
        return None
    calls = outer_calls(ctx)
    if not calls.any_numbers:
        return None  # no sequence numbers recorded: grad mode cannot be told
    inside = iv.contains(fwd, ev.ts_ns[calls.rows])  # the steps' forward passes lie in the window
    top, idle, numbered = calls.rows[inside], calls.idle[inside], calls.numbered[inside]
    if top.size == 0:
        return None
    t_s, t_e = ev.ts_ns[top], ev.ts_ns[top] + ev.dur_ns[top]
    frozen = idle | ~numbered  # built no node: grad mode on and nothing needed grad, or grad mode off
    if np.all(frozen):
        return None  # nothing in the forward built a node: no part trains, none is frozen beside it
    ops = np.flatnonzero(ctx.events_in_window(mk["cpu_op"] & mk["host"] & (ev.lane == ctx.main_lane)))
    layer = ctx.host_name_ids(LAYER_OPS.__contains__)
    in_layer = _encloses(ops, layer[ev.name[ops]], t_s, t_e, ev)
    f_rows = top[frozen]
    if f_rows.size == 0:
        return None
    # each run of such calls, from its first to its last: the Python between them (the frozen
    # modules' own calls) is the part's time too; only the forward's time
    edge = np.flatnonzero(np.diff(np.concatenate([[0], frozen.astype(np.int8), [0]])))
    first, last = edge[0::2], edge[1::2] - 1
    f_iv = iv.intersect(iv.union(t_s[first], t_e[last]), fwd)
    layer_iv = iv.union(t_s[frozen & in_layer], t_e[frozen & in_layer])
    host_ns, layer_ns = iv.total(f_iv), iv.total(layer_iv)
    if host_ns == 0 or layer_ns < MIN_LAYER_SHARE * host_ns:
        return None
    steps = [(lo, hi) for (lo, hi), p in zip(ctx.step_bounds, parts, strict=True) if p["backward"][0].size]
    with_frozen, drawn = 0, 0
    outer = outermost_ops(ctx, ctx.main_lane)  # the loop's draws, not a dropout's mask inside the model
    random_rows = outer[ctx.host_name_ids(lambda n: n in RANDOM_OPS and n not in INDEX_DRAWS)[ev.name[outer]]]
    r_ts = np.sort(ev.ts_ns[random_rows])
    per_step = []
    for lo, hi in steps:
        mine = layer_iv[0][(layer_iv[0] >= lo) & (layer_iv[0] < hi)]
        per_step.append(iv.total(iv.clip(f_iv, lo, hi)) / 1e6)
        if mine.size == 0:
            continue
        with_frozen += 1
        k = np.searchsorted(r_ts, lo)
        if k < r_ts.size and r_ts[k] < mine[0]:
            drawn += 1
    if with_frozen * 2 < len(steps) or drawn * 2 >= with_frozen or _writes_weights(ctx, parts):
        return None
    stages = m.host.loader_stages or []
    if any(AUGMENTING_STAGE.search(st.name) for st in stages):
        return None  # the loader augments: the part's inputs change every epoch
    if 2 * _runs_trained(ctx, top, frozen, in_layer, fwd, steps) >= with_frozen:
        return None  # the trained network's own forward run again without grad: acting, a target network
    gpu = ctx.device >= 0
    if gpu:
        kernels = ctx.launched_by_main()
        kernels = kernels[iv.contains(f_iv, ctx.launch_ts[kernels])]
        if kernels.size == 0:
            return None
        gain, method = gpu_time_gain(ctx, kernels, 1.0, _method("GPU kernels"))
        measured_ns = iv.total(iv.clip(iv.union(ev.ts_ns[kernels], ev.ts_ns[kernels] + ev.dur_ns[kernels]),
                                       ctx.lo, ctx.hi))
    else:
        gain, method, measured_ns = ctx.frac(host_ns), _method("operators"), host_ns
    share = ctx.frac(measured_ns)
    if share < MIN_FRAC:
        return None
    names = _top_names(ctx, f_rows)
    sampled = _draws_inside(ctx, f_iv, steps) * 2 >= with_frozen  # its output is a random draw (a VAE's latent)
    # the same layer types also built nodes in the same steps: perhaps one module run twice
    built_layers = {int(n) for n in ev.name[top[~frozen & in_layer]].tolist()}
    frozen_layers = [int(n) for n in ev.name[top[frozen & in_layer]].tolist()]
    also = sum(n in built_layers for n in frozen_layers)
    shared = ("" if 2 * also < len(frozen_layers) else """ The same layer types also ran with autograd in these
        steps: if this is one module run twice — a perceptual loss's feature network on the output and on the
        target, a GAN's generator under no_grad for the discriminator's step and again for its own — only its
        outputs on inputs that repeat (the targets' features) can be stored, and a module that trains cannot be
        cached at all.""")
    return finding(
        severity=severity_for(gain),
        title=f"A part of the model that does not train takes {pct(share)} of the time, every step",
        why=f"""In {with_frozen} of the {len(steps)} training steps, the forward pass ran layers that built no autograd
        node — under torch.no_grad(), or with parameters that do not require grad: a frozen backbone under a trained
        head, a teacher in distillation. They took {pct(share)} of the window ({'the GPU kernels they launched' if gpu
        else 'their time on the CPU'}). Such a part computes the same output for the same input every time, so
        where each sample reaches it unchanged every epoch — no random augmentation before it, the part in eval
        mode — its outputs can be computed once and stored, and the training loop runs only the part that
        trains (the PyTorch transfer-learning tutorial's "ConvNet as fixed feature extractor"; a teacher's
        logits likewise). The stored outputs take memory or disk: their size times the number of samples. Where
        the inputs change each step (random augmentation in the DataLoader's workers, which a trace cannot show;
        fresh noise) or its weights do (an EMA teacher, a target network synced now and then: no such
        update was seen in this window) the part must run every step: then this is the step's own work; run it in
        lower precision (autocast) if its accuracy allows.{shared}"""
        + (""" The part draws random numbers itself in most of these steps (a VAE encoder's latent sampled as
        mean + std × noise): storing its output would keep one draw for good. Store what comes before the draw —
        the distribution's mean and standard deviation — and draw from them in the training loop, each step as
        now.""" if sampled else ""),
        summary=(f"{pct(share)} of the window ({measured_ns / 1e6:.1f} ms; median {median_of(per_step):.2f} ms a step "
                 f"on the host) went to forward operators that built no autograd node, in {with_frozen} of "
                 f"{len(steps)} steps; layers' operators hold {pct(layer_ns / host_ns)} of their host time. Most "
                 f"time: {names}."),
        numbers={"frozen_frac": round(share, 4), "frozen_step_ms": round(median_of(per_step), 4),
                 "layer_share": round(layer_ns / host_ns, 4), "steps_with_frozen": with_frozen,
                 "steps": len(steps), "measured_on": "GPU kernels" if gpu else "host",
                 "threshold_frac": MIN_FRAC, "threshold_layer_share": MIN_LAYER_SHARE},
        windows=windows(f_iv[0], f_iv[1], "cpu", label="a forward that trains nothing"),
        est_gain=gain,
        gain_method=method,
        fixes=((pytorch("Compute the frozen encoder's distribution (mean and std) once, before training, and draw "
                        "the sample from it each step (inputs that repeat each epoch: no random augmentation "
                        "before it)", SAMPLED_CODE),) if sampled else
               (pytorch("Compute the frozen part's outputs once, before training, and train on them (inputs "
                        "that repeat each epoch: no random augmentation before it)", CACHE_CODE),)),
        doc_url=DOC,
    )


def _writes_weights(ctx: Context, parts: list[dict[str, iv.Intervals]]) -> bool:
    """Whether some step writes tensors in place outside its optimizer and its model (before its
    forward, after its last optimizer step: where a loop updates an EMA teacher or syncs a target
    network) at least :data:`MIN_WRITES` times; zeroing (``zero_``, ``fill_``) and the gaps
    between the backward and the optimizer (gradient clipping scales gradients in place) left out."""
    ev = ctx.trace.events
    top = outermost_ops(ctx, ctx.main_lane)
    one = ctx.host_name_ids(lambda n: bool(IN_PLACE.match(n)) and n not in ZEROING)[ev.name[top]]
    many = ctx.host_name_ids(lambda n: bool(FOREACH_IN_PLACE.match(n)))[ev.name[top]]
    weight = np.where(many, MIN_WRITES, one.astype(np.int64))
    keep = weight > 0
    top, weight = top[keep], weight[keep]
    if not top.size:
        return False
    t = ev.ts_ns[top]
    for (lo, hi), p in zip(ctx.step_bounds, parts, strict=True):
        fwd_start = int(p["forward"][0][0]) if p["forward"][0].size else hi
        opt_end = int(p["optimizer"][1][-1]) if p["optimizer"][0].size else hi
        outside = iv.union(np.array([lo, opt_end], np.int64), np.array([fwd_start, hi], np.int64))
        model = iv.merge(iv.merge(p["forward"], p["backward"]), iv.merge(p["optimizer"], p["evaluation"]))
        where = iv.intersect(outside, iv.gaps(iv.merge(model, p["data"]), lo, hi))
        if int(weight[iv.contains(where, t)].sum()) >= MIN_WRITES:
            return True
    return False


def _draws_inside(ctx: Context, f_iv: iv.Intervals, steps: list[tuple[int, int]]) -> int:
    """How many of ``steps`` draw random numbers (not a dropout's mask) inside the frozen part's
    spans ``f_iv``, on the main thread: the part's output is a sample."""
    ev = ctx.trace.events
    rows = np.flatnonzero(ctx.events_in_window(ctx.masks["cpu_op"] & (ev.lane == ctx.main_lane) & ctx.host_name_ids(
        lambda n: n in RANDOM_OPS and n not in MASK_OPS)[ev.name]))
    ts = np.sort(ev.ts_ns[rows[iv.contains(f_iv, ev.ts_ns[rows])]])
    return sum(int(np.searchsorted(ts, hi) > np.searchsorted(ts, lo)) for lo, hi in steps)


def _runs_trained(ctx: Context, top: np.ndarray, frozen: np.ndarray, in_layer: np.ndarray, fwd: iv.Intervals,
                  steps: list[tuple[int, int]]) -> int:
    """How many of ``steps`` run no layer without grad but inside a repeat of a forward that built
    nodes in the same step: the very sequence of that forward's calls, from its first layer's call
    to its last (two layers' at least), found one after another (not overlapping) among the calls
    that built nothing, covers each of their layers' calls. That is the trained network run again
    without grad — a policy acting in its rollout, a DQN's target network (a copy of the online
    one), the model's own loss on a fixed batch under no_grad — not a frozen part beside it. A
    deeper network of the same layer types (a teacher a layer deeper than the student) leaves layers
    uncovered unless its depth is a whole multiple of the student's (then it is missed)."""
    ev = ctx.trace.events
    if not top.size:
        return 0
    names = ev.name[top].astype(np.int64)
    piece = np.searchsorted(fwd[0], ev.ts_ns[top], side="right")  # which forward interval each call is in
    cut = np.flatnonzero((np.diff(frozen.astype(np.int8)) != 0) | (np.diff(piece) != 0)) + 1
    starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [top.size]])
    done: list[tuple[int, np.ndarray, np.ndarray]] = []  # (start, names, layer mask) of the runs that built nothing
    built: list[tuple[int, bytes]] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        layers = np.flatnonzero(in_layer[a:b])
        if frozen[a]:
            done.append((int(ev.ts_ns[top[a]]), names[a:b], in_layer[a:b]))
        elif layers.size >= 2:
            built.append((int(ev.ts_ns[top[a]]), names[a + layers[0]:a + layers[-1] + 1].tobytes()))
    matched = 0
    for lo, hi in steps:
        runs = [(n, lay) for t, n, lay in done if lo <= t < hi and lay.any()]
        mine = [seq for t, seq in built if lo <= t < hi]
        if runs and any(all(_covered(n, lay, seq) for n, lay in runs) for seq in mine):
            matched += 1
    return matched


def _covered(names: np.ndarray, layer: np.ndarray, part: bytes) -> bool:
    """Whether repeats of ``part`` (item ids as bytes), found left to right without overlapping in
    ``names``, hold every position that ``layer`` marks."""
    seq, width = names.tobytes(), names.itemsize
    size = len(part) // width
    hit = np.zeros(names.size, dtype=bool)
    at = seq.find(part)
    while at >= 0:
        if at % width:
            at = seq.find(part, at + 1)
            continue
        k = at // width
        hit[k:k + size] = True
        at = seq.find(part, at + len(part))
    return bool(np.all(hit[layer]))


def _method(what: str) -> str:
    return (f"estimate: the share of the window in the forward's {what} that built no autograd node, which "
            f"computing that part's outputs once saves ({MEASURED})")


def _encloses(rows: np.ndarray, marked: np.ndarray, s: np.ndarray, e: np.ndarray, ev: EventTable) -> np.ndarray:
    """Per span ``[s, e)``: whether one of ``rows`` marked by ``marked`` starts inside it."""
    ts = np.sort(ev.ts_ns[rows[marked]])
    return np.searchsorted(ts, e) > np.searchsorted(ts, s)


def _top_names(ctx: Context, rows: np.ndarray) -> str:
    ev = ctx.trace.events
    by: dict[str, int] = {}
    for n, d in zip(ev.name[rows].tolist(), ev.dur_ns[rows].tolist(), strict=True):
        name = ctx.trace.names[n]
        by[name] = by.get(name, 0) + d
    top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{n} {d / 1e6:.2f} ms" for n, d in top)


__all__ = ["frozen_forward"]
