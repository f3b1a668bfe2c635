"""Which variable names ``-o NAME`` (``%%gpuprofile``, ``%gputune``) may store a result under."""

from __future__ import annotations

import builtins
import keyword
import re

#: Names IPython keeps its output cache and input history under (``_``, ``__``, ``___``,
#: ``_i``/``_ii``/``_iii``, ``_<n>``, ``_i<n>``, ``_ih``, ``_oh``, ``_dh``): IPython writes them
#: itself (IPython.core.displayhook, IPython.core.history).
_IPYTHON_CACHE_NAMES = re.compile(r"_{1,3}|_i{1,3}|_i?[0-9]+|_ih|_oh|_dh", re.ASCII)


def output_name_problem(name: str, user_ns: dict, hidden: dict | None = None) -> str | None:
    """Why ``-o NAME`` may not store a result under ``name`` in ``user_ns`` (None when it may).

    Refused: what is not a plain identifier or is a keyword; dunder names (``__builtins__``,
    ``__name__``: the interpreter's, replacing one breaks every later cell); IPython's own
    variables (``In``, ``Out``, ``get_ipython``, ``exit``: ``hidden`` is the shell's
    ``user_ns_hidden``) and output-cache names; builtins the user did not bind themselves
    (``print``, ``list``)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        return f"-o needs a variable name, not {name!r}"
    if name.startswith("__") and name.endswith("__"):
        return f"-o {name}: names with double underscores on both sides belong to Python; choose another name"
    if _IPYTHON_CACHE_NAMES.fullmatch(name):
        return f"-o {name}: IPython keeps its output history under {name}; choose another name"
    hidden = hidden or {}
    if name in hidden and user_ns.get(name) is hidden[name]:
        return f"-o {name}: {name} is IPython's own; choose another name"
    if hasattr(builtins, name) and name not in user_ns:
        return f"-o {name}: {name} is a Python builtin; choose another name (or bind {name} yourself first)"
    return None
