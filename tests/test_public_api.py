"""The public surface is deliberate: lock ``__all__`` and lazy imports."""

import subprocess
import sys

import pytest

import gpumagic

PUBLIC = {
    "Evidence", "Finding", "Fix", "GpumagicError", "Profiler", "Report", "TimeitResult", "Trace", "TraceError",
    "Window", "__version__", "analyze", "analyze_job", "compare", "history", "load_ipython_extension", "load_trace", "monitor",
    "profile",
    "tune_dataloader", "unload_ipython_extension",
}


def test_all_is_locked():
    assert set(gpumagic.__all__) == PUBLIC


def test_import_registers_nothing_and_loads_no_heavy_package():
    code = ("import sys, gpumagic; "
            "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_attribute():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpumagic.nope  # noqa: B018


def test_gpumagic_compare_stays_the_function():
    """Importing the submodule must not shadow the package attribute ``compare``."""
    import importlib

    importlib.import_module("gpumagic.tuning.comparison")
    assert callable(gpumagic.compare)


def test_timeit_result_is_the_class_gputimeit_stores():
    """``gpumagic.TimeitResult`` resolves lazily to the class ``%gputimeit -o`` stores, and naming it
    loads neither torch nor IPython."""
    code = ("import sys, gpumagic; from gpumagic.capture.timeit import TimeitResult; "
            "assert gpumagic.TimeitResult is TimeitResult; "
            "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from gpumagic.capture.timeit import measure

    result = measure("sum(range(10))", lambda: sum(range(10)), max_seconds=0.2)
    assert isinstance(result, gpumagic.TimeitResult) and result.device == "cpu"


def test_version_is_the_installed_metadata_and_the_cli_prints_it():
    """One source of truth: pyproject.toml's version, as the installed distribution records it."""
    import re
    from importlib.metadata import version
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()  # tomllib: Python 3.11+
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)
    assert gpumagic.__version__ == version("gpumagic") == declared
    out = subprocess.run([sys.executable, "-m", "gpumagic", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"gpumagic {gpumagic.__version__}"


def test_example_names_the_bundled_trace_in_python_as_on_the_cli(tmp_path, monkeypatch):
    from gpumagic.examples import trace_path

    monkeypatch.chdir(tmp_path)  # no file called "example" here: the name alone must do
    trace = gpumagic.load_trace("example")
    assert trace.source == str(trace_path())
    report = gpumagic.analyze("example")
    assert report.findings[0].id == gpumagic.analyze(trace_path()).findings[0].id == "dataloader-bound"


def test_a_folder_named_gpumagic_in_the_working_folder_does_not_shadow_the_package(tmp_path):
    """Python run in the folder that holds a clone named ``gpumagic`` (a directory without
    ``__init__.py``, which Python would import as a namespace package) still gets the package, and
    ``%load_ext gpumagic`` works there."""
    import os
    from pathlib import Path

    (tmp_path / "gpumagic" / "tests").mkdir(parents=True)  # a stand-in for the clone's top folder
    if any(getattr(f, "__module__", "").startswith("__editable__") for f in sys.meta_path):
        pytest.skip("gpumagic is installed editable through a finder hook (an install from before the "
                    "package-dir setting): reinstall with pip install -e . to check this")
    code = ("import gpumagic, IPython; print(gpumagic.__file__); "
            "from IPython.core.interactiveshell import InteractiveShell; ip = InteractiveShell.instance(); "
            "print(ip.extension_manager.load_extension('gpumagic'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    file, loaded = out.stdout.split()[-2:]  # the installed package (a regular one), not the folder
    assert Path(file).name == "__init__.py" and tmp_path not in Path(file).resolve().parents and loaded == "None"


def test_a_copy_of_the_package_in_the_working_folder_is_named_with_the_fix(tmp_path):
    """A folder named ``gpumagic`` *with* ``__init__.py`` in the folder Python starts in (a copied
    or stale package) is imported instead of the installed one; ``%load_ext gpumagic`` says so,
    naming that folder, the installed one and what to do, and still loads."""
    import os
    import shutil
    import warnings
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path

    try:
        distribution("gpumagic")
    except PackageNotFoundError:
        pytest.skip("gpumagic is not installed here (run from a source tree): nothing to be shadowed")
    from gpumagic._origin import installed_folder, shadowing_note

    installed = installed_folder()
    assert installed is not None and shadowing_note() is None  # the installed package itself: quiet
    source = Path(gpumagic.__file__).resolve().parent
    shutil.copytree(source, tmp_path / "gpumagic", ignore=shutil.ignore_patterns("__pycache__", "*.json.gz"))
    code = ("import warnings, gpumagic; from IPython.core.interactiveshell import InteractiveShell; "
            "ip = InteractiveShell.instance(); warnings.simplefilter('always'); "
            "ws = []\nwith warnings.catch_warnings(record=True) as ws: "
            "ip.extension_manager.load_extension('gpumagic')\n"
            "print(gpumagic.__file__); print([str(w.message) for w in ws]); print('gpuprofile' in ip.magics_manager.magics['cell'])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    file, messages, registered = out.stdout.strip().splitlines()[-3:]
    copy = str((tmp_path / "gpumagic").resolve())
    assert Path(file).resolve().parent == Path(copy)  # the copy was imported, as Python's rules say
    assert copy in messages and installed in messages and "Rename or remove" in messages
    assert registered == "True"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shadowing_note() is None  # in this process gpumagic is the installed one


def test_the_installed_folder_is_read_from_a_regular_or_an_editable_install(tmp_path):
    """A regular install's package folder comes from its files; an editable one's from the source
    folder that ``direct_url.json`` names (PEP 610; a flat or a ``src`` layout); a URL that is not
    a local folder says nothing."""
    import json
    from importlib import metadata
    from pathlib import Path

    from gpumagic._origin import installed_folder

    class Dist(metadata.Distribution):
        def __init__(self, root: Path, direct_url: dict | None):
            self.root, self.direct_url = root, direct_url

        def read_text(self, filename):
            return json.dumps(self.direct_url) if filename == "direct_url.json" and self.direct_url else None

        def locate_file(self, path):
            return self.root / path

    site = tmp_path / "site-packages"
    (site / "gpumagic").mkdir(parents=True)
    (site / "gpumagic" / "__init__.py").write_text("")
    assert installed_folder(Dist(site, None)) == str(site.resolve() / "gpumagic")
    src = tmp_path / "clone with space"
    (src / "src" / "gpumagic").mkdir(parents=True)
    (src / "src" / "gpumagic" / "__init__.py").write_text("")
    editable = {"url": (src.resolve()).as_uri(), "dir_info": {"editable": True}}
    assert installed_folder(Dist(site, editable)) == str(src.resolve() / "src" / "gpumagic")
    remote = {"url": "https://example.org/gpumagic.tar.gz", "dir_info": {"editable": True}}
    assert installed_folder(Dist(tmp_path / "nowhere", remote)) is None
