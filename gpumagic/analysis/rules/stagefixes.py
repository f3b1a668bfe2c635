"""What ``dataloader-bound`` says about the dominant stage of the data pipeline
(``metrics.host.loader_stages``, timed at capture) and the fix that fits that stage, each fix
with its public source:

- reading/decoding files: decode on the GPU (torchvision ``decode_jpeg(..., device="cuda")``), or
  decode once and cache (the tf.data performance guide's "Caching");
- a transform: augment on the GPU, or a cheaper transform (torchvision's "Performance
  considerations": v2 transforms on uint8 tensors, not PIL images);
- the dataset's own ``__getitem__``: a batched ``__getitems__`` (torch.utils.data.Dataset);
- ``collate_fn``: the dataset makes the whole batch, automatic batching off (torch.utils.data,
  "Disabling automatic batching");
- ``pin_memory``: fewer bytes to pin (CUDA semantics, "Use pinned memory buffers": pinning is
  often an expensive operation).
"""

from __future__ import annotations

from gpumagic.analysis.loaderstages import kind
from gpumagic.analysis.rules.base import pct, pytorch
from gpumagic.analysis.rules.cachefix import CACHE_CODE, CACHE_FIX
from gpumagic.report.metrics import LoaderStage
from gpumagic.report.model import Fix

DECODE_GPU_SOURCE = "https://pytorch.org/vision/stable/generated/torchvision.io.decode_jpeg.html"
CACHE_SOURCE = "https://www.tensorflow.org/guide/data_performance#caching"
TRANSFORMS_SOURCE = "https://pytorch.org/vision/stable/transforms.html#performance-considerations"
GETITEMS_SOURCE = "https://pytorch.org/docs/stable/data.html#torch.utils.data.Dataset"
BATCHING_SOURCE = "https://pytorch.org/docs/stable/data.html#disable-automatic-batching"
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
inputs, targets = x, y                             # every sample's tensors, prepared once


class BatchedDataset(torch.utils.data.Dataset):
    \"\"\"One call per batch: the per-sample Python of __getitem__ becomes tensor operations.\"\"\"

    def __len__(self):
        return len(inputs)

    def __getitems__(self, indices):               # DataLoader passes the batch's indices at once
        idx = torch.as_tensor(indices)
        return inputs[idx].float(), targets[idx]


def keep_batch(batch):                             # the batch is already made: nothing to collate
    return batch


loader = DataLoader(BatchedDataset(), batch_size=batch_size, shuffle=True, collate_fn=keep_batch)"""

BATCH_SAMPLER_CODE = """
from torch.utils.data import BatchSampler, RandomSampler

# automatic batching off: dataset[indices] gets the batch's indices and returns the whole batch
# (a TensorDataset does; your __getitem__ must accept a list of indices)
sampler = BatchSampler(RandomSampler(dataset), batch_size=batch_size, drop_last=False)
loader = DataLoader(dataset, sampler=sampler, batch_size=None)"""

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


def stage_fixes(stages: list[LoaderStage] | None, gpu: bool) -> list[Fix]:
    """Fixes that fit the dominant stage (none when it is ``other``)."""
    if not stages:
        return []
    top = stages[0]
    what = kind(top.name)
    named = f"{top.name} is the slowest stage ({pct(top.share)} of each batch)"
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
        return [pytorch(f"{named}: its per-sample Python runs once per sample; a batched __getitems__ makes the "
                        f"batch in one call (source: {GETITEMS_SOURCE})", GETITEMS_CODE)]
    if what == "collate":
        return [pytorch(f"{named}: collation stacks sample by sample; let the dataset make the whole batch "
                        f"(source: {BATCHING_SOURCE})", BATCH_SAMPLER_CODE)]
    if what == "pin" and gpu:
        return [pytorch(f"{named}: pinning is often an expensive operation; pin fewer bytes "
                        f"(source: {PIN_SOURCE})", PIN_CODE)]
    return []
