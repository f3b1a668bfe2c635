"""Reading gpumagic's environment variables: one strict parser, one warning, then the default.

Every ``GPUMAGIC_*`` value goes through these helpers, so that a value that cannot be used
(``GPUMAGIC_KEEP_RUNS=²``, ``GPUMAGIC_MAX_INFLATE=nan``, a number out of range) never switches a
limit off or raises deep inside a run: it gives one :class:`EnvWarning` (once per variable and
value in a process) and the documented default is used instead.

- :func:`env_int`: a plain ASCII whole number (``[0-9]+``, so no ``²``, no ``1e3``, no ``0x10``)
  within ``minimum..maximum``;
- :func:`env_float`: a finite decimal number within ``minimum..maximum`` (no ``nan``, no ``inf``);
- :func:`env_flag`: ``1/true/yes/on`` or ``0/false/no/off`` (any case).

An unset or blank variable is the default without a warning.
"""

from __future__ import annotations

import math
import os
import re
import threading
import warnings

_ASCII_INT = re.compile(r"[0-9]{1,30}")
_ASCII_FLOAT = re.compile(r"[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,4})?")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


class EnvWarning(RuntimeWarning):
    """An environment variable gpumagic reads held a value it cannot use; the default was used."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or not value.strip() else value.strip()


def _refuse(name: str, value: str, wanted: str, default: object) -> None:
    with _lock:
        if (name, value) in _warned:
            return
        _warned.add((name, value))
    shown = value if len(value) <= 40 else value[:39] + "…"
    warnings.warn(f"gpumagic: {name}={shown!r} is not {wanted}; using the default {default}", EnvWarning, stacklevel=3)


def env_int(name: str, default: int, *, minimum: int, maximum: int, what: str = "") -> int:
    """``name`` as a whole number in ``minimum..maximum``, or ``default`` (one warning) when it is not."""
    value = _raw(name)
    if value is None:
        return default
    if _ASCII_INT.fullmatch(value) and minimum <= int(value) <= maximum:
        return int(value)
    _refuse(name, value, f"a whole number{' of ' + what if what else ''} from {minimum} to {maximum}", default)
    return default


def env_float(name: str, default: float, *, minimum: float, maximum: float, what: str = "") -> float:
    """``name`` as a finite decimal number in ``minimum..maximum``, or ``default`` (one warning)."""
    value = _raw(name)
    if value is None:
        return default
    if _ASCII_FLOAT.fullmatch(value) and any(c.isdigit() for c in value.split("e")[0].split("E")[0]):
        number = float(value)
        if math.isfinite(number) and minimum <= number <= maximum:
            return number
    _refuse(name, value, f"a number{' (' + what + ')' if what else ''} from {minimum:g} to {maximum:g}", default)
    return default


def env_flag(name: str, default: bool) -> bool:
    """``name`` as on (``1/true/yes/on``) or off (``0/false/no/off``), or ``default`` (one warning)."""
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    _refuse(name, value, "one of 1, true, yes, on, 0, false, no, off", "on" if default else "off")
    return default


__all__ = ["EnvWarning", "env_flag", "env_float", "env_int"]
