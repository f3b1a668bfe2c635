"""The repository holds code, docs and small test data in their folders: nothing a run writes."""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: What a run writes (tensors, traces, reports, databases, images, tables), never tracked at the top level.
OUTPUT_SUFFIXES = (".pt", ".pth", ".safetensors", ".npy", ".npz", ".pkl", ".json", ".gz", ".html", ".png", ".svg",
                   ".sqlite", ".sqlite3", ".db", ".csv", ".log")


def test_no_data_or_output_file_is_tracked_at_the_top_level():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git is not available")
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    top = [path for path in out.stdout.splitlines() if "/" not in path]
    assert "pyproject.toml" in top  # the listing is the repository's
    assert [path for path in top if path.lower().endswith(OUTPUT_SUFFIXES)] == []
