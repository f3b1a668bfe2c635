"""Text laid out for the reader's terminal: the width to use, and lines wrapped or shortened to it.

The width is ``COLUMNS`` when it is set, else the size of the terminal standard output is
attached to, else :data:`DEFAULT_WIDTH` (:func:`shutil.get_terminal_size` does exactly that
lookup). It is never less than :data:`MIN_WIDTH`: the tables need that much. Widths count
characters (code points); a name with double-width East Asian characters may look wider.
"""

from __future__ import annotations

import re
import shutil
import textwrap

#: The width when neither ``COLUMNS`` nor a terminal says otherwise (a log file, a notebook).
DEFAULT_WIDTH = 100
#: The narrowest layout: the kernel table's fixed columns and a short name need 60 characters.
MIN_WIDTH = 60
ELLIPSIS = "\u2026"
#: The space between a number and its unit ("414 ms", "37 %", "12.5 GB/s"): never a line break.
_NUMBER_UNIT = re.compile(r"(?<=\d) (?=(?:ms|\u00b5s|us|ns|s|%|[kKMGT]i?B(?:/s)?|B|[GT]FLOP/s|x|\u00d7)(?![\w/]))")
_KEEP = "\u00a0"  # a no-break space while wrapping (textwrap breaks at ASCII whitespace only)


def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """``COLUMNS``, else the terminal's width, else ``default``; at least :data:`MIN_WIDTH`."""
    columns = shutil.get_terminal_size((default, 24)).columns
    return max(MIN_WIDTH, columns if columns > 0 else default)


def resolve_width(width: int | None) -> int:
    """``width`` as asked (at least :data:`MIN_WIDTH`), or :func:`terminal_width` when None."""
    return terminal_width() if width is None else max(MIN_WIDTH, int(width))


def wrap(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    """``text`` as lines of at most ``width`` characters, breaking at spaces but never between a
    number and its unit (a word longer than a line, such as a URL or a kernel name, is broken
    where the line ends); at least one line. A no-break space in ``text`` becomes a space."""
    protected = _NUMBER_UNIT.sub(_KEEP, text.replace(_KEEP, " "))
    lines = textwrap.wrap(protected, width=width, initial_indent=indent,
                          subsequent_indent=indent if subsequent is None else subsequent, break_on_hyphens=False)
    return [line.replace(_KEEP, " ") for line in lines] or [indent.rstrip()]


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in an ellipsis when it was cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS
