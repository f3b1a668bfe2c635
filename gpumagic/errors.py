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
