"""The "preprocess once and cache the tensors" fix, shared by ``host-cpu-saturated``,
``dataloader-bound`` and the fixes for a slow data-pipeline stage (``rules.stagefixes``)."""

CACHE_FIX = "Preprocess once and cache the tensors (random augmentations then repeat per sample)"
CACHE_CODE = """
from pathlib import Path

cache_dir = Path.home() / ".cache" / "my_dataset"   # your cache folder: room for every sample's tensors
cache_dir.mkdir(parents=True, exist_ok=True)
cached = cache_dir / "preprocessed.pt"             # delete it when the data or the transforms change
if not cached.exists():
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))   # decode and transform once
    torch.save((torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])), cached)
x, y = torch.load(cached)
dataset = torch.utils.data.TensorDataset(x, y)"""
