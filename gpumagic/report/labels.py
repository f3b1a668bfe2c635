"""What a run label may be, checked in one place for everything that takes one (the magic's
``--label``, ``profile(label=...)``, ``GpuProfileCallback(label=...)``, ``runs.record``).

A label names runs in the history (``LABEL``, ``LABEL@N``) next to run ids (``r12``), and it is
written into the bundle, the history database (SQLite stores UTF-8) and the report's JSON. So a
label is refused when it looks like a run id (``r12`` would be ambiguous with run 12) or holds a
lone surrogate (``"\\ud800"``: not encodable in UTF-8, so it could be written nowhere). Empty is
fine: the run is unlabelled.
"""

from __future__ import annotations

import re

#: A run id as users type it: ``r`` and its number.
RUN_ID_RE = re.compile(r"r[0-9]+", re.ASCII)


def label_problem(label: object) -> str | None:
    """Why ``label`` cannot name a run (one phrase), or None when it can (``""`` is unlabelled)."""
    if not isinstance(label, str):
        return f"a run label must be a string, not {type(label).__name__}"
    if RUN_ID_RE.fullmatch(label.strip()):
        return f"the label {label.strip()!r} looks like a run id (r<number> names a run by its id); choose another"
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return f"the label {label.encode('utf-8', 'backslashreplace').decode()!r} holds a character that cannot be stored (a lone surrogate)"
    return None


__all__ = ["RUN_ID_RE", "label_problem"]
