"""gpumagic's exceptions.

::

    GpumagicError            base of everything gpumagic raises on purpose
     └── TraceError          the input is not a readable profiler trace (missing, empty,
                             truncated, corrupt, or some other kind of file)

Each message is one sentence that names the file and what is wrong with it; the CLI prints it
as one line on stderr and exits with status 2.
"""


class GpumagicError(Exception):
    """Base class for errors gpumagic raises on purpose."""


class TraceError(GpumagicError):
    """The input cannot be read as a PyTorch profiler (Kineto / Chrome-trace) trace."""


def exception_text(exc: BaseException) -> str:
    """``str(exc)`` for a message of gpumagic's that quotes an exception it did not raise (the
    user's code, a dataset, a library): an exception whose ``__str__`` itself raises is named by its
    type instead, so that formatting it never replaces it (the caller re-raises the original)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: its message cannot be shown (its __str__ raised)>"
