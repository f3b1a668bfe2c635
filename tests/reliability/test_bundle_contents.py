"""A saved bundle holds nothing from the environment: with ``--stack``, frames under the working
folder are relative and frames under the home folder start with ``~``; no user or host name, no
environment variable, no temporary path."""

from __future__ import annotations

import gzip
import importlib.util
import json
import socket

import pytest

torch = pytest.importorskip("torch")

from capture_state import clean_state_fixture  # noqa: E402,F401

from gpumagic.capture import CaptureOptions, CaptureSession  # noqa: E402
from gpumagic.capture.bundle import shorten_paths  # noqa: E402

WORK = "import torch\n\ndef work():\n    torch.ones(3).add_(1)\n"


def _module_at(path, name: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(WORK)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frames_are_relative_to_the_working_folder_and_home(tmp_path, monkeypatch, clean_state):
    home, project = tmp_path / "home" / "ana", tmp_path / "home" / "ana" / "proj"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPUMAGIC_TEST_SECRET", "s3cr3t-value")
    in_project = _module_at(project / "models" / "net.py", "gm_net")
    in_home = _module_at(home / "lib" / "helpers.py", "gm_helpers")
    monkeypatch.chdir(project)
    target = project / "run.json.gz"
    session = CaptureSession(CaptureOptions(stack=True, nvml=False, save=str(target)))
    session.start()
    in_project.work()
    in_home.work()
    session.finish()
    saved = gzip.decompress(target.read_bytes())
    frames = {e["name"] for e in json.loads(saved)["traceEvents"] if e.get("cat") == "python_function"}
    assert "models/net.py(3): work" in frames, sorted(f for f in frames if "work" in f)
    assert "~/lib/helpers.py(3): work" in frames
    secrets = [str(home), str(tmp_path), "s3cr3t-value"]
    if len(socket.gethostname()) >= 6:  # a short host name ("vm") also occurs by chance
        secrets.append(socket.gethostname())
    for secret in secrets:
        assert secret.encode() not in saved, secret


@pytest.mark.parametrize("raw, expected", [
    (b'"name": "/home/ana/proj/a.py(1): f"', b'"name": "a.py(1): f"'),
    (b'"name": "/home/ana/lib/b.py(2): g"', b'"name": "~/lib/b.py(2): g"'),
    (b'"name": "/home/ana/projX/c.py(3): h"', b'"name": "~/projX/c.py(3): h"'),  # not under proj/
    (b'"name": "/opt/x/home/ana/d.py(4): i"', b'"name": "/opt/x/home/ana/d.py(4): i"'),  # not at the start
    (b'"Call stack": "/home/ana/proj/a.py(1): f;/home/ana/e.py(5): j"', b'"Call stack": "a.py(1): f;~/e.py(5): j"'),
])
def test_shorten_paths(raw, expected):
    assert shorten_paths(raw, cwd="/home/ana/proj", home="/home/ana") == expected


def test_a_root_working_folder_or_home_shortens_nothing():
    raw = b'"name": "/srv/a.py(1): f"'
    assert shorten_paths(raw, cwd="/", home="/") == raw


def test_shorten_paths_rewrites_what_the_look_behind_regex_rewrote():
    """The find-based rewrite matches ``re.sub`` with a look-behind on every arrangement of
    folders, separators and near-misses (overlaps, a folder at the very start, a prefix of it)."""
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    folder = b"/h/a/"
    pieces = st.sampled_from([folder, b"/h/a", b"/h/", b'"', b";", b" ", b"x", b"/", b"a/", b"/h/a/h/a/"])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(pieces, max_size=12))
    def check(parts):
        raw = b"".join(parts)
        regex = re.sub(rb'(?<=["; ])' + re.escape(folder), lambda _m: b"~/", raw)
        assert shorten_paths(raw, cwd="/nowhere/else", home="/h/a") == regex

    check()
