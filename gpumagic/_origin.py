"""Where ``gpumagic`` was imported from, and whether that is the installed distribution.

A folder named ``gpumagic`` with an ``__init__.py`` in the folder a notebook runs in (a copied or
stale package, or a source checkout's package folder when an older version is installed) comes
first on ``sys.path`` and is imported instead of the installed package. Its code then runs with
the installed metadata's version, and what the user sees matches neither. :func:`shadowing_note`
compares the imported package's folder with the one the installed distribution records: its
files (a regular install) or, for an editable install, the source folder that ``direct_url.json``
names (PEP 610). ``%load_ext gpumagic`` warns with the folder and the fix when they differ.

A folder *without* ``__init__.py`` cannot get here: Python imports it as a namespace package only
when no regular ``gpumagic`` is found anywhere on ``sys.path``, and then none of this code runs
(IPython's "not an IPython extension" is the message; README's Troubleshooting explains it).
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from urllib.parse import unquote, urlparse

_PACKAGE = "gpumagic"


def imported_folder() -> str:
    """The real path of the folder this package was imported from."""
    return os.path.realpath(os.path.dirname(os.path.abspath(__file__)))


def installed_folder(dist: metadata.Distribution | None = None) -> str | None:
    """The real path of the installed distribution's package folder; ``None`` when gpumagic is not
    installed (run from a source tree on ``PYTHONPATH``) or the install does not say where."""
    dist = dist or _installed_distribution()
    if dist is None:
        return None
    editable_root = _editable_root(dist)
    if editable_root is not None:
        candidates = [os.path.join(editable_root, _PACKAGE), os.path.join(editable_root, "src", _PACKAGE)]
    else:
        candidates = [os.path.dirname(str(dist.locate_file(f"{_PACKAGE}/__init__.py")))]
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "__init__.py")):
            return os.path.realpath(folder)
    return None


def _installed_distribution() -> metadata.Distribution | None:
    """The distribution an installer put in this environment: the first ``gpumagic`` metadata on
    ``sys.path`` that has an ``INSTALLER`` file (PEP 376; pip writes one, also for editable installs).
    A source tree's ``gpumagic.egg-info`` (setuptools leaves one there) has none, and is taken only
    when nothing installed is found."""
    found = list(metadata.distributions(name=_PACKAGE))
    for dist in found:
        if dist.read_text("INSTALLER") is not None:
            return dist
    return found[0] if found else None


def _editable_root(dist: metadata.Distribution) -> str | None:
    """The source folder of an editable install (``direct_url.json``, PEP 610), else ``None``."""
    try:
        text = dist.read_text("direct_url.json")
        info = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not (info.get("dir_info") or {}).get("editable"):
        return None
    url = urlparse(str(info.get("url", "")))
    return unquote(url.path) if url.scheme == "file" else None


def shadowing_note() -> str | None:
    """A one-paragraph warning when the imported package is not the installed one, else ``None``."""
    dist = _installed_distribution()
    installed = installed_folder(dist)
    here = imported_folder()
    if dist is None or installed is None or installed == here:
        return None
    return (f"gpumagic was imported from {here}, not from the installed gpumagic "
            f"{dist.version} at {installed}: {os.path.dirname(here)} comes earlier on "
            f"sys.path (the folder the kernel started in, or PYTHONPATH), so its gpumagic folder shadows "
            f"the package. Rename or remove {here}, or start the notebook from another folder, then "
            f"restart the kernel.")
