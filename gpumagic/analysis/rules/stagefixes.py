"""What ``dataloader-bound`` says about the dominant stage of the data pipeline
(``metrics.host.loader_stages``, timed at capture) and the fix that fits that stage, each fix
with its public source:

- reading/decoding files: decode on the GPU (torchvision ``decode_jpeg(..., device="cuda")``), or
  decode once and cache (the tf.data performance guide's "Caching");
- a transform: augment on the GPU, or a cheaper transform (torchvision's "Performance
  considerations": v2 transforms on uint8 tensors, not PIL images);
- the dataset's own ``__getitem__``: a batched ``__getitems__`` (torch.utils.data.Dataset); for a
  ``TensorDataset``, whose ``__getitem__`` indexes every tensor with whatever index it is given,
  automatic batching off (a ``BatchSampler`` hands it the batch's indices in one call); an
  iterable dataset's ``__iter__``: yield whole batches, automatic batching off; a
  ``__getitems__`` already makes the batch in one call: preprocess once and cache;
- ``collate_fn``: the dataset makes the whole batch, automatic batching off (torch.utils.data,
  "Disabling automatic batching"); a collate function of the user's own (padding, tokenizing):
  the same result every epoch, so pad once before the loop and index (``pad_sequence``), each
  batch trimmed to its longest sequence as padding per batch does;
- ``pin_memory``: fewer bytes to pin (CUDA semantics, "Use pinned memory buffers": pinning is
  often an expensive operation).
"""

from __future__ import annotations

from gpumagic.analysis.loaderstages import custom_collate, kind
from gpumagic.analysis.rules.base import pct, pytorch
from gpumagic.analysis.rules.cachefix import CACHE_CODE, CACHE_FIX
from gpumagic.report.metrics import LoaderStage
from gpumagic.report.model import Fix

DECODE_GPU_SOURCE = "https://pytorch.org/vision/stable/generated/torchvision.io.decode_jpeg.html"
CACHE_SOURCE = "https://www.tensorflow.org/guide/data_performance#caching"
TRANSFORMS_SOURCE = "https://pytorch.org/vision/stable/transforms.html#performance-considerations"
GETITEMS_SOURCE = "https://pytorch.org/docs/stable/data.html#torch.utils.data.Dataset"
BATCHING_SOURCE = "https://pytorch.org/docs/stable/data.html#disable-automatic-batching"
PAD_SOURCE = "https://pytorch.org/docs/stable/generated/torch.nn.utils.rnn.pad_sequence.html"
PIN_SOURCE = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"

DECODE_GPU_CODE = """
import torchvision
# the dataset returns each file's bytes, torchvision.io.read_file(path), instead of a decoded image
images = torchvision.io.decode_jpeg(encoded_batch, device="cuda")   # a list of uint8 CHW tensors, decoded on the GPU"""

GPU_AUGMENT_CODE = """
from torchvision.transforms import v2

# the dataset returns uint8 image tensors, not augmented; the augmentations run on the GPU
augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                      v2.ToDtype(torch.float32, scale=True)])
for images, labels in loader:
    images = images.to("cuda", non_blocking=True)
    images = torch.stack([augment(img) for img in images])   # per image: each draws its own random crop"""

CHEAPER_TRANSFORM_CODE = """
from torchvision.transforms import v2

transform = v2.Compose([
    v2.ToImage(),                                  # PIL image -> uint8 tensor, before anything else
    v2.RandomResizedCrop(224, antialias=True),     # resize while the pixels are still uint8
    v2.RandomHorizontalFlip(),
    v2.ToDtype(torch.float32, scale=True),         # to float last
])"""

GETITEMS_CODE = """
inputs, targets = all_inputs, all_targets          # every sample's tensors, stacked once (your names)


class BatchedDataset(torch.utils.data.Dataset):
    \"\"\"One call per batch: the per-sample Python of __getitem__ becomes tensor operations.\"\"\"

    def __len__(self):
        return len(inputs)

    def __getitems__(self, indices):               # DataLoader passes the batch's indices at once
        idx = torch.as_tensor(indices)
        return inputs[idx], targets[idx]           # dtypes kept: token ids stay integers
        # no labels (inference): return inputs[idx] alone; per-sample work: the same on the batch


def keep_batch(batch):                             # the batch is already made: nothing to collate
    return batch


loader = DataLoader(BatchedDataset(), batch_size=batch_size, shuffle=True, collate_fn=keep_batch)"""


def getitems_code(shuffle: bool = True) -> str:
    """:data:`GETITEMS_CODE`; without ``shuffle`` (inference, evaluation) the batches keep the
    dataset's order, as the loader's did."""
    return GETITEMS_CODE if shuffle else GETITEMS_CODE.replace(", shuffle=True", "")


def batch_sampler_code(shuffle: bool = True) -> str:
    """Automatic batching off, the batch's indices handed to the dataset at once: drawn at random
    when training (``RandomSampler``, as ``shuffle=True``), in order otherwise (``SequentialSampler``:
    predictions stay aligned with the dataset's order)."""
    sampler = "RandomSampler" if shuffle else "SequentialSampler"
    return f"""
from torch.utils.data import BatchSampler, {sampler}

# automatic batching off: dataset[indices] gets the batch's indices and returns the whole batch
# (a TensorDataset does; your __getitem__ must accept a list of indices)
sampler = BatchSampler({sampler}(dataset), batch_size=batch_size, drop_last=False)
loader = DataLoader(dataset, sampler=sampler, batch_size=None)"""

ITERABLE_BATCHES_CODE = """
# dataset.__iter__ yields whole batches (the batch dimension first), made with tensor operations,
# instead of one sample at a time; automatic batching off: DataLoader passes them through as they are
loader = DataLoader(dataset, batch_size=None)"""

PAD_ONCE_CODE = """
from torch.nn.utils.rnn import pad_sequence

# sequences: each sample's token ids as a tensor; a collate that tokenizes: tokenize once instead,
#   sequences = [torch.tensor(ids) for ids in tokenizer(texts)["input_ids"]]
# once, before the loop: every sequence padded into one tensor (pad_id after each one's end), with
# its length; the same tensors every epoch instead of padding each batch again. The tensor holds
# samples x longest: with a few very long sequences, pad per length bucket instead
pad_id = 0                                                 # a tokenizer's: tokenizer.pad_token_id
lengths = torch.tensor([len(s) for s in sequences])
padded = pad_sequence(sequences, batch_first=True, padding_value=pad_id)
all_labels = torch.tensor(labels)
for epoch in range(epochs):
    order = torch.randperm(len(padded))
    for start in range(0, len(padded), batch_size):
        idx = order[start:start + batch_size]
        width = int(lengths[idx].max())                    # the batch's longest, as padding per batch gives
        x, y = padded[idx, :width], all_labels[idx]
        attention_mask = torch.arange(width) < lengths[idx, None]   # a transformer's: True on the tokens"""

PIN_CODE = """
# the dataset returns uint8 images, not float32: a quarter of the bytes to pin and copy
loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True)
for images, labels in loader:
    images = images.to("cuda", non_blocking=True).float().div_(255)   # convert on the GPU"""


def stage_sentence(stages: list[LoaderStage]) -> str:
    """The summary's sentence about the dominant stage."""
    top = stages[0]
    where = "in the DataLoader workers" if top.where == "worker" else "in the main process"
    if top.name == "other":
        return (f"Timed stages: {pct(top.share)} of each batch's fetch is outside every timed stage ({where}: the "
                "fetcher's own loop, or work the timers do not see).")
    return (f"Timed stages: {top.name} takes the largest share of each batch, {pct(top.share)} "
            f"({top.ms_per_batch:.2f} ms per batch {where}).")


def stage_fixes(stages: list[LoaderStage] | None, gpu: bool, training: bool = True, waits: bool = False) -> list[Fix]:
    """Fixes that fit the dominant stage (none when it is ``other``); ``training``: the loader's
    batches may be drawn at random (not when inference or evaluation relies on their order).
    ``waits``: the CPU samples say the loading mostly waits rather than computes (a read from disk
    or the network): the dataset's own stage then gets the cache fix, each sample read once,
    not a batched ``__getitems__``, which saves per-sample Python, not waiting."""
    if not stages:
        return []
    top = stages[0]
    what = kind(top.name)
    named = f"{top.name} is the slowest stage ({pct(top.share)} of each batch)"
    if what == "dataset" and waits and top.name != TENSOR_DATASET_ITEM and not top.name.endswith("." + TENSOR_DATASET_ITEM):
        return [pytorch(f"{named}, and it mostly waits rather than computes (a read from disk or the network): "
                        f"{CACHE_FIX[0].lower()}{CACHE_FIX[1:]}, so that each sample is read once (source: "
                        f"{CACHE_SOURCE})", CACHE_CODE)]
    if what == "decode":
        out = [pytorch(f"{named}: {CACHE_FIX[0].lower()}{CACHE_FIX[1:]}, so that files are read and decoded once "
                       f"(source: {CACHE_SOURCE})", CACHE_CODE)]
        if gpu:
            out.insert(0, pytorch(f"{named}: decode on the GPU (source: {DECODE_GPU_SOURCE})", DECODE_GPU_CODE))
        return out
    if what == "transform":
        out = [pytorch(f"{named}: a cheaper transform — v2 transforms on uint8 tensors rather than PIL images, "
                       f"resizing before converting to float (source: {TRANSFORMS_SOURCE})", CHEAPER_TRANSFORM_CODE)]
        if gpu:
            out.insert(0, pytorch(f"{named}: augment on the GPU, after the copy (source: {TRANSFORMS_SOURCE})",
                                  GPU_AUGMENT_CODE))
        return out
    if what == "dataset":
        return [_dataset_fix(top.name, named, training)]
    if what == "collate" and custom_collate(top.name):
        return [pytorch(f"{named}: your collate function runs for every batch; if it pads (or tokenizes), its result "
                        "is the same every epoch: pad the whole dataset once before the loop and index each batch, "
                        "trimmed to its longest sequence (source: "
                        f"{PAD_SOURCE})", PAD_ONCE_CODE)]
    iterable = next((st.name for st in stages if st.name.endswith(".__iter__")), None)
    if what == "collate" and iterable:  # no sampler for an IterableDataset: it yields whole batches itself
        return [_dataset_fix(iterable, f"{named}, after {iterable}", training)]
    if what == "collate":
        return [pytorch(f"{named}: collation stacks sample by sample; let the dataset make the whole batch "
                        f"(source: {BATCHING_SOURCE})", batch_sampler_code(training))]
    if what == "pin" and gpu:
        return [pytorch(f"{named}: pinning is often an expensive operation; pin fewer bytes "
                        f"(source: {PIN_SOURCE})", PIN_CODE)]
    return []


#: The dataset class whose ``__getitem__`` indexes each of its tensors with the index it is given
#: (``tuple(tensor[index] for tensor in self.tensors)``): a list of indices gives the whole batch.
TENSOR_DATASET_ITEM = "TensorDataset.__getitem__"


def makes_batch_at_once(stages: list[LoaderStage] | None) -> bool:
    """Whether the dominant stage's fix makes the batch in one call instead of sample by sample
    (a per-sample ``__getitem__`` or ``__iter__``, or the collation): what that fix can save is
    the per-sample work, not only the time a worker would move off the main thread."""
    if not stages:
        return False
    top = stages[0]
    what = kind(top.name)
    return what == "collate" or (what == "dataset" and not top.name.endswith(".__getitems__"))


def tensor_dataset_item(name: str) -> bool:
    """A stage's name is a ``TensorDataset``'s ``__getitem__`` (bare, or under its qualifier)."""
    return name == TENSOR_DATASET_ITEM or name.endswith("." + TENSOR_DATASET_ITEM)


def _dataset_fix(name: str, named: str, training: bool) -> Fix:
    """The fix for the dataset's own stage, by the method that takes the time."""
    if tensor_dataset_item(name):
        return pytorch(f"{named}: a TensorDataset indexes its tensors with a whole list of indices; automatic "
                       f"batching off hands it the batch's indices in one call (source: {BATCHING_SOURCE})",
                       batch_sampler_code(training))
    if name.endswith(".__getitems__"):
        return pytorch(f"{named}: it already makes the batch in one call, so its own work is the cost: "
                       f"{CACHE_FIX[0].lower()}{CACHE_FIX[1:]} (source: {CACHE_SOURCE})", CACHE_CODE)
    if name.endswith(".__iter__"):
        return pytorch(f"{named}: an iterable dataset yields one sample at a time; yield whole batches made with "
                       f"tensor operations, automatic batching off (source: {BATCHING_SOURCE})", ITERABLE_BATCHES_CODE)
    return pytorch(f"{named}: it is called once per sample, paying Python's and the loader's cost each time; a "
                   "batched __getitems__ makes the batch in one call — it saves that per-call cost, not the work "
                   f"each sample needs on its own, such as decoding a file (source: {GETITEMS_SOURCE})",
                   getitems_code(training))
