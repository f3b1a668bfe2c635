"""Splitting a line magic's text into its leading options and the statement after them
(``%gpuprofile``, ``%gputimeit``)."""

from __future__ import annotations

_QUOTES = "'\""


def split_options(line: str, valued: set[str]) -> tuple[str, str]:
    """Split ``%gpuprofile`` line text into its leading options and the statement after them.

    The statement is returned exactly as typed (quotes and spacing kept). ``valued`` names the
    options that take a value; ``--`` ends the options explicitly.
    """
    i, n = 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i >= n or line[i] != "-" or i + 1 >= n or not (line[i + 1].isalpha() or line[i + 1] == "-"):
            return line[:i].strip(), line[i:]
        end = _token_end(line, i)
        token = line[i:end]
        if token == "--":
            return line[:i].strip(), line[end:].lstrip()
        i = end
        if token in valued:  # the value is the next token
            while i < n and line[i].isspace():
                i += 1
            i = _token_end(line, i)


def _token_end(line: str, i: int) -> int:
    """Index just past the token starting at ``i`` (a quoted string counts as one token)."""
    n = len(line)
    while i < n and not line[i].isspace():
        if line[i] in _QUOTES:
            close = line.find(line[i], i + 1)
            i = n if close < 0 else close + 1
        else:
            i += 1
    return i


def _valued_options(parser) -> set[str]:
    return {s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
