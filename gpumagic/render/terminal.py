"""Text that is safe to print on a terminal.

Names in a trace (kernels, operators, devices, labels, thread names) are whatever the program
that wrote it put there, and a terminal obeys control characters: ``ESC ] 0 ; … BEL`` sets the
window title, ``ESC [ 2 J`` clears the screen, ``\\r`` overwrites the line. Every text view puts
names through :func:`printable`, and passes its finished layout through :func:`printable_lines`.
JSON escapes control characters by itself and HTML escapes markup, so only text needs this.

What is removed: escape sequences as a whole (CSI ``ESC [ … final``, OSC/DCS/APC/PM/SOS strings up
to ``BEL`` or ``ESC \\``, and two-character ``ESC x``; ECMA-48 sections 5.3-5.6), and every other
C0 control (U+0000-U+001F), DEL (U+007F) and C1 control (U+0080-U+009F, which includes the
8-bit CSI U+009B). In a name, a line break or tab becomes a space, so that it stays on its line.
"""

from __future__ import annotations

import re

_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"                                 # CSI: ESC [ params intermediates final
    r"|\x9b[0-?]*[ -/]*[@-~]"                                  # 8-bit CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"                                       # other escapes (ESC c, ESC ( B, a lone ESC)
)
_SPACE_LIKE = re.compile(r"[\t\n\r\x0b\x0c]")
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_CONTROLS_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(name: object) -> str:
    """``name`` as one line of text without escape sequences or control characters."""
    text = _SEQUENCES.sub("", str(name))
    return _CONTROLS.sub("", _SPACE_LIKE.sub(" ", text))


def printable_lines(text: str) -> str:
    """A finished text layout with every escape sequence and control character removed, line
    breaks kept (tabs become spaces)."""
    text = _SEQUENCES.sub("", text).replace("\t", " ").replace("\r", "")
    return _CONTROLS_BUT_NEWLINE.sub("", text)
