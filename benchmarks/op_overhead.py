"""Does ``cpu-op-overhead`` hold? A recurrent cell written as a Python loop over 64 time steps
(hidden size 32, a batch of 8, SGD) trained on the CPU: eager, compiled with ``torch.compile``
(the finding's first fix) and as ``nn.RNN`` (its second). Then a step that runs its batch of 32
a sample at a time (a forward and a backward per sample through a 3-layer MLP, one optimizer
step): as it is, and as one forward and backward on the whole batch (the fix the finding puts
first for such a loop), and a step that calls the model per sample and adds the losses up before
one backward (the same fix, put first when the loss is computed 8 or more times a step). Last,
PyTorch's own ``nn.GRU`` (hidden 64, 20 time steps, Adam), whose CPU
kernel runs each time step as small operators: a batch of 8 sequences eager and compiled, and of
64 sequences eager, per sequence (the finding suggests more sequences a step there). And an
inference loop with no step: a 3-layer MLP called on 300 samples one at a time, each result read
with ``.item()``, against one call on the stacked samples (the first fix for such a window). Last,
generation (with transformers installed): a 2-layer GPT-2 of 64 units built from a config, 8
prompts of 8 tokens, 40 new tokens each (greedy), one ``generate`` call a prompt, the same with
the model's forward compiled (the finding's fix), through the wrapper ``torch.compile(model)``
returns (its ``generate`` is the module's own: nothing compiled), and one call for all 8 prompts;
and the same model in a text-generation pipeline, 16 prompts of 3 to 11 words, 20 new tokens,
called once per prompt against the finding's pipeline fix run as given (the same texts)
(``--generation`` times these alone). Then MAML (a 1 → 40 → 40 → 1 MLP,
sine-regression tasks of 10 points, one inner step of ``autograd.grad(create_graph=True)``, Adam):
a Python loop over 4 and over 16 tasks against torch.func's vmap over the tasks (the finding's
first fix there; the gradients checked equal), and the loop with the model compiled, which
torch.compile refuses (double backward). The LBFGS case, recorded only: a 8 → 32 → 32 → 1 tanh MLP
fitted with ``LBFGS(max_iter=20, line_search_fn="strong_wolfe")`` on 512 points, whose closure
passes run inside the optimizer's step. And (with transformers installed) a text-classification
pipeline on BERTs built from a config (2 layers of 64 units, 4 of 256) over 64 texts of 10-29
words: called once per text, and on the whole list with ``batch_size=16`` (the finding's Hugging
Face fix for an inference window; the predictions checked equal).

The eager loop is profiled by ``gpumagic.profile()`` and the finding's gain read (the forward and
backward's share of the window, an upper bound); then the three are timed unprofiled, alternated
round by round, and each saving (1 − time per step ÷ the eager loop's) printed beside it. The
first compiled call compiles (seconds), before the timing. Numbers depend on the machine and on
what else runs on it: this prints, it asserts nothing. ``--record DIR`` instead records the
bundles tests/data keeps (``cpu_rnn_loop.json.gz``: three steps of 32 time steps, a smaller
file; ``cpu_per_sample.json.gz``: three steps of the per-sample loop; ``cpu_gru.json.gz``: three
steps of the GRU with 8 sequences; ``cpu_infer_per_sample.json.gz``: the inference loop over 100
samples; ``cpu_generate.json.gz``: one prompt, 24 new tokens; ``cpu_maml.json.gz``: the MAML loop
over 4 tasks; ``cpu_summed_losses.json.gz``: three steps of the summed per-sample losses;
``cpu_lbfgs.json.gz``: one LBFGS step) and exits.

    python benchmarks/op_overhead.py [--rounds 5] [--steps 30] [--record DIR] [--generation]
"""

from __future__ import annotations

import argparse
import os

import torch
from steptime import alternated, medians, profile_steps

T, B, D = 64, 8, 32


class LoopCell(torch.nn.Module):
    """h ← tanh(W_ih x_t + W_hh h), one time step at a time in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh, self.out = torch.nn.Linear(D, D), torch.nn.Linear(D, D), torch.nn.Linear(D, 4)

    def forward(self, x):
        h = torch.zeros(x.shape[1], D)
        for t in range(x.shape[0]):
            h = torch.tanh(self.ih(x[t]) + self.hh(h))
        return self.out(h)


class FusedCell(torch.nn.Module):
    """The same recurrence as PyTorch's fused layer."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = torch.nn.RNN(D, D), torch.nn.Linear(D, 4)

    def forward(self, x):
        return self.out(self.rnn(x)[1][0])


def _step(model, call=None, time_steps: int = T):
    torch.manual_seed(0)
    x, y = torch.randn(time_steps, B, D), torch.randint(0, 4, (B,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    call = model if call is None else call

    def step():
        loss = torch.nn.functional.cross_entropy(call(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


SAMPLES = 32


def _per_sample_step(how: str):
    """One optimizer step on a batch of 32: a forward and backward per sample (``"per sample"``, each
    loss divided by the batch size, so the gradients add up to the batch mean's), a forward per
    sample and one backward of the losses' mean (``"summed"``), or one on the whole batch
    (``"batched"``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(SAMPLES, 64), torch.randint(0, 10, (SAMPLES,))
    loss_fn = torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        if how == "batched":
            loss_fn(model(x), y).backward()
        elif how == "summed":
            (sum(loss_fn(model(x[i:i + 1]), y[i:i + 1]) for i in range(SAMPLES)) / SAMPLES).backward()
        else:
            for i in range(SAMPLES):
                (loss_fn(model(x[i:i + 1]), y[i:i + 1]) / SAMPLES).backward()
        opt.step()
    return step


class GRUModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.head = torch.nn.GRU(32, 64, batch_first=True), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _gru_step(sequences: int, compiled: bool = False):
    """One Adam step of a GRU predicting the next of 20 time steps, for ``sequences`` sequences."""
    torch.manual_seed(0)
    model = GRUModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    call = torch.compile(model) if compiled else model
    x = torch.randn(sequences, 21, 32)

    def step():
        loss = torch.nn.functional.mse_loss(call(x[:, :20]), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _inference(samples: int = 300):
    """(the loop calling the model once per sample, the call on the stack of them): each returns
    the predicted classes, the same."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    inputs = [torch.randn(64) for _ in range(samples)]

    def one_by_one():
        with torch.no_grad():
            return [model(x.unsqueeze(0)).argmax().item() for x in inputs]

    def stacked():
        with torch.inference_mode():
            return model(torch.stack(inputs)).argmax(dim=1).tolist()
    return one_by_one, stacked


def _profile_inference(path: str | None, samples: int):
    import gpumagic

    loop, _ = _inference(samples)
    loop()
    with gpumagic.profile(save=path, display=False) as run:
        loop()
    return run.report


def _generation(prompts: int = 8, new_tokens: int = 40):
    """(one generate call a prompt, the same with the forward compiled, one call for all, the same
    as the first through the wrapper ``torch.compile(model)`` returns): each returns the tokens;
    None without transformers."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    model, compiled, wrapped = (GPT2LMHeadModel(config).eval() for _ in range(3))
    compiled.load_state_dict(model.state_dict())
    wrapped.load_state_dict(model.state_dict())
    compiled.forward = torch.compile(compiled.forward)
    wrapper = torch.compile(wrapped)  # its .generate() is the module's own: generate() never calls the wrapper
    inputs = [torch.randint(1, 1000, (1, 8)) for _ in range(prompts)]
    settings = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}

    def each(m):
        def run():
            with torch.inference_mode():
                return [m.generate(x, **settings)[0].tolist() for x in inputs]
        return run

    def together():
        with torch.inference_mode():
            return model.generate(torch.cat(inputs), attention_mask=torch.ones(prompts, 8, dtype=torch.long),
                                  **settings).tolist()
    return each(model), each(compiled), together, each(wrapper)


def _generation_pipeline(prompts: int = 16, new_tokens: int = 20):
    """(each prompt through a text-generation pipeline, the finding's pipeline fix run as given on
    the whole list): each returns the texts; a 2-layer GPT-2 of 64 units and a word-level
    tokenizer built here. None without transformers."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, pipeline
    except ImportError:
        return None
    from gpumagic.analysis.rules.opoverhead import PIPELINE_GENERATE_CODE

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>"] + [f"w{i}" for i in range(200)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_positions=256, n_embd=64, n_layer=2, n_head=2, bos_token_id=1,
                        eos_token_id=1)
    texts = [" ".join(f"w{(i * 7 + j) % 200}" for j in range(3 + i % 9)) for i in range(prompts)]
    settings = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    each_pipe = pipeline("text-generation", model=GPT2LMHeadModel(config).eval(), tokenizer=tokenizer, device=-1)
    space = {"pipe": pipeline("text-generation", model=each_pipe.model, tokenizer=tokenizer.__class__(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>"), device=-1), "prompts": texts}
    fix = PIPELINE_GENERATE_CODE.replace("max_new_tokens=40", "**settings")

    def each():
        return [each_pipe(t, **settings)[0]["generated_text"] for t in texts]

    def batched():
        exec(fix, {**space, "settings": settings}, local := {})
        return [o[0]["generated_text"] for o in local["outputs"]]
    return each, batched


def _time_generation(generation, rounds: int) -> None:
    """The generation cases alternated: the forward compiled in place (the finding's fix), and the
    wrapper ``torch.compile(model)``, through which ``generate()`` compiles no frame."""
    from torch._dynamo.utils import counters

    each, each_compiled, together, each_wrapped = generation
    counters.clear()
    wrapped_tokens = each_wrapped()
    wrapper_frames = counters["frames"]["total"]  # what generate() through the wrapper compiled
    assert each() == each_compiled() == together() == wrapped_tokens  # the same tokens (greedy, no padding)
    frames = counters["frames"]["total"] - wrapper_frames
    cases = {"one call a prompt": each, "forward compiled": each_compiled, "torch.compile(model)": each_wrapped,
             "one call": together}
    med, line = medians(alternated(cases, rounds, 1))
    print(line)
    print(f"generation saved: forward compiled {1 - med['forward compiled'] / med['one call a prompt']:.3f} "
          f"({frames} frame(s) compiled), torch.compile(model) "
          f"{1 - med['torch.compile(model)'] / med['one call a prompt']:.3f} ({wrapper_frames} compiled), one call for all "
          f"{1 - med['one call'] / med['one call a prompt']:.3f}")


def _maml(tasks: int, how: str = "loop"):
    """One MAML step over ``tasks`` sine tasks: ``how`` is "loop" (a Python loop over the tasks,
    an inner autograd.grad with create_graph=True each), "vmap" (torch.func over the tasks) or
    "compiled" (the loop on the model compiled). Returns (step, gradients after one step)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 40), torch.nn.ReLU(), torch.nn.Linear(40, 40), torch.nn.ReLU(),
                                torch.nn.Linear(40, 1))
    net = torch.compile(model) if how == "compiled" else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    amp, phase = torch.rand(tasks, 1, 1) * 4.9 + 0.1, torch.rand(tasks, 1, 1) * 3.1
    support_x, query_x = torch.rand(tasks, 10, 1) * 10 - 5, torch.rand(tasks, 10, 1) * 10 - 5
    support_y, query_y = amp * torch.sin(support_x + phase), amp * torch.sin(query_x + phase)

    def adapted_loss(params, sx, sy, qx, qy, inner_lr=0.01):
        g = grad(lambda p: loss_fn(functional_call(model, p, (sx,)), sy))(params)
        fast = {k: params[k] - inner_lr * g[k] for k in params}
        return loss_fn(functional_call(model, fast, (qx,)), qy)

    def step():
        optimizer.zero_grad()
        params = dict(model.named_parameters())
        if how == "vmap":
            vmap(adapted_loss, in_dims=(None, 0, 0, 0, 0))(params, support_x, support_y, query_x, query_y).sum().backward()
        else:
            meta = 0
            for t in range(tasks):
                inner = torch.autograd.grad(loss_fn(functional_call(net, params, (support_x[t],)), support_y[t]),
                                            list(params.values()), create_graph=True)
                fast = {k: v - 0.01 * g for (k, v), g in zip(params.items(), inner, strict=True)}
                meta = meta + loss_fn(functional_call(net, fast, (query_x[t],)), query_y[t])
            meta.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        return grads
    return step


def _lbfgs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1))
    x = torch.randn(512, 8)
    y = torch.sin(x.sum(1, keepdim=True))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=20, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return lambda: optimizer.step(closure)


def _pipelines():
    """(label, once per text, the whole list with batch_size=16) for two BERTs, or None without
    transformers."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast, pipeline
    except ImportError:
        return None
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(200)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    texts = [" ".join(f"w{(i * 7 + j) % 200}" for j in range(10 + i % 20)) for i in range(64)]
    out = []
    for hidden, layers in ((64, 2), (256, 4)):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                            intermediate_size=4 * hidden)
        pipe = pipeline("text-classification", model=BertForSequenceClassification(config).eval(), tokenizer=tokenizer,
                        device=-1)

        def each(pipe=pipe):
            return [pipe(t)[0]["label"] for t in texts]

        def batched(pipe=pipe):
            return [p["label"] for p in pipe(texts, batch_size=16)]
        out.append((f"{layers} layers of {hidden}", each, batched))
    return out


def profiled(path: str | None = None, steps: int = 5, time_steps: int = T):
    torch.manual_seed(0)
    return profile_steps(_step(LoopCell(), time_steps=time_steps), steps, path, warm=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--record", metavar="DIR", help="record the bundle tests/data keeps into DIR instead")
    parser.add_argument("--generation", action="store_true", help="time the generation cases only")
    args = parser.parse_args()
    if args.generation:
        print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
        generation = _generation()
        if generation is None:
            raise SystemExit("the generation cases need transformers")
        _time_generation(generation, args.rounds)
        piped = _generation_pipeline()
        if piped is not None:
            each, batched = piped
            assert each() == batched()  # the same texts (greedy, left-padded)
            med, line = medians(alternated({"pipeline, a prompt a call": each, "the fix: the list": batched},
                                           args.rounds, 1))
            print(line)
            print(f"pipeline saved: {1 - med['the fix: the list'] / med['pipeline, a prompt a call']:.3f}")
        return
    if args.record:
        profiled(os.path.join(args.record, "cpu_rnn_loop.json.gz"), steps=3, time_steps=32)  # a smaller file
        profile_steps(_per_sample_step("per sample"), 3, os.path.join(args.record, "cpu_per_sample.json.gz"), warm=2)
        profile_steps(_gru_step(8), 3, os.path.join(args.record, "cpu_gru.json.gz"), warm=2)
        _profile_inference(os.path.join(args.record, "cpu_infer_per_sample.json.gz"), 100)
        generation = _generation(prompts=1, new_tokens=24)
        if generation is not None:
            import gpumagic

            generation[0]()
            with gpumagic.profile(save=os.path.join(args.record, "cpu_generate.json.gz"), display=False):
                generation[0]()
        profile_steps(_maml(4), 3, os.path.join(args.record, "cpu_maml.json.gz"), warm=2)
        profile_steps(_per_sample_step("summed"), 3, os.path.join(args.record, "cpu_summed_losses.json.gz"), warm=2)
        profile_steps(_lbfgs(), 1, os.path.join(args.record, "cpu_lbfgs.json.gz"), warm=1)  # a smaller file
        print("recorded cpu_rnn_loop.json.gz, cpu_per_sample.json.gz, cpu_gru.json.gz, cpu_infer_per_sample.json.gz"
              + (", cpu_generate.json.gz" if generation is not None else "")
              + ", cpu_maml.json.gz, cpu_summed_losses.json.gz, cpu_lbfgs.json.gz")
        return
    print(f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    f = profiled().finding("cpu-op-overhead")
    torch.manual_seed(0)
    compiled_model = LoopCell()
    loops = {"eager": _step(LoopCell()), "compiled": _step(compiled_model, torch.compile(compiled_model)),
             "nn.RNN": _step(FusedCell())}
    loops["compiled"]()  # compiles
    med, line = medians(alternated(loops, args.rounds, args.steps))
    said = f"upper bound {f.est_gain:.3f}" if f else "the rule is silent"
    print(line)
    print(f"saved: compiled {1 - med['compiled'] / med['eager']:.3f}, nn.RNN {1 - med['nn.RNN'] / med['eager']:.3f}; "
          f"{said}")
    f = profile_steps(_per_sample_step("per sample"), 5, None, warm=2).finding("cpu-op-overhead")
    said = (f"upper bound {f.est_gain:.3f}, {f.evidence.numbers['passes_per_step']:.0f} passes a step"
            if f else "the rule is silent")
    med, line = medians(alternated({"per sample": _per_sample_step("per sample"), "batched": _per_sample_step("batched")},
                                   args.rounds, args.steps))
    print(line)
    print(f"saved by one pass on the batch: {1 - med['batched'] / med['per sample']:.3f}; {said}")
    f = profile_steps(_per_sample_step("summed"), 5, None, warm=2).finding("cpu-op-overhead")
    said = (f"upper bound {f.est_gain:.3f}, {f.evidence.numbers['loss_calls_per_step']:.0f} losses a step, first fix "
            f"{f.fixes[0].description[:40]!r}…" if f else "the rule is silent")
    med, line = medians(alternated({"summed": _per_sample_step("summed"), "batched": _per_sample_step("batched")},
                                   args.rounds, args.steps))
    print(line)
    print(f"saved by one call on the batch instead of per-sample losses summed: "
          f"{1 - med['batched'] / med['summed']:.3f}; {said}")
    f = profile_steps(_gru_step(8), 5, None, warm=2).finding("cpu-op-overhead")
    said = f"the finding: {f.title!r}, gain {f.est_gain}" if f else "the rule is silent"
    gru = {"GRU 8": _gru_step(8), "GRU 8 compiled": _gru_step(8, compiled=True), "GRU 64": _gru_step(64)}
    gru["GRU 8 compiled"]()  # compiles
    med, line = medians(alternated(gru, args.rounds, args.steps))
    print(line)
    print(f"per sequence: GRU 8 {med['GRU 8'] / 8:.3f} ms, compiled {med['GRU 8 compiled'] / 8:.3f} ms, "
          f"GRU 64 {med['GRU 64'] / 64:.3f} ms; {said}")
    f = _profile_inference(None, 300).finding("cpu-op-overhead")
    said = f"upper bound {f.est_gain:.3f}" if f else "the rule is silent"
    one_by_one, stacked = _inference(300)
    assert one_by_one() == stacked()
    med, line = medians(alternated({"one by one": one_by_one, "stacked": stacked}, args.rounds, 5))
    print(line)
    print(f"saved by one call on the stack: {1 - med['stacked'] / med['one by one']:.3f}; {said}")
    generation = _generation()
    if generation is not None:
        _time_generation(generation, args.rounds)
    f = profile_steps(_maml(4), 5, None, warm=2).finding("cpu-op-overhead")
    said = (f"upper bound {f.est_gain:.3f}, first fix {f.fixes[0].description[:40]!r}…" if f else "the rule is silent")
    for tasks in (4, 16):
        loop, vmapped = _maml(tasks), _maml(tasks, "vmap")
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(loop(), vmapped(), strict=True))
        med, line = medians(alternated({"loop over tasks": _maml(tasks), "vmap": _maml(tasks, "vmap")},
                                       args.rounds, args.steps))
        print(f"MAML, {tasks} tasks: {line}")
        print(f"  saved by vmap: {1 - med['vmap'] / med['loop over tasks']:.3f}" + (f"; {said}" if tasks == 4 else ""))
    for label, each, batched in _pipelines() or ():
        assert each() == batched()
        med, line = medians(alternated({"one text a call": each, "batch_size=16": batched}, args.rounds, 1))
        print(f"pipeline, BERT {label}, 64 texts: {line}")
        print(f"  saved by the whole list: {1 - med['batch_size=16'] / med['one text a call']:.3f}")
    try:
        _maml(4, "compiled")()
        print("MAML with the model compiled: ran")
    except RuntimeError as exc:
        print(f"MAML with the model compiled: RuntimeError: {str(exc).splitlines()[0][:100]}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
