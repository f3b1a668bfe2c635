"""The "preprocess once and cache the tensors" fix, shared by ``host-cpu-saturated``,
``dataloader-bound`` and the fixes for a slow data-pipeline stage (``rules.stagefixes``)."""

CACHE_FIX = "Preprocess once and cache the tensors (random augmentations then repeat per sample)"
CACHE_CODE = """
from pathlib import Path

cache_dir = Path.home() / ".cache" / "my_dataset"   # your cache folder: room for every sample's tensors
cache_dir.mkdir(parents=True, exist_ok=True)
cached = cache_dir / "preprocessed.pt"             # delete it when the data or the transforms change
if not cached.exists():
    samples = [dataset[i] for i in range(len(dataset))]   # decode and transform once
    paired = isinstance(samples[0], (tuple, list))        # (input, label, ...) or one tensor a sample
    fields = zip(*samples) if paired else [samples]
    torch.save((paired, [torch.stack([torch.as_tensor(v) for v in f]) for f in fields]), cached)
paired, fields = torch.load(cached)
# the same samples as before: (input, label, ...) tuples, or one tensor (a tensor indexes like a dataset)
dataset = torch.utils.data.TensorDataset(*fields) if paired else fields[0]"""
