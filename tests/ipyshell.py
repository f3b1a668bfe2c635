"""An IPython shell for tests that drive magics, with the process state it touches restored."""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ipython_shell(extension: str) -> Iterator:
    """An ``InteractiveShell`` with ``extension`` loaded and history in memory. On exit the
    extension is unloaded, the singleton cleared, and builtins, ``__main__`` and the display and
    exception hooks put back as they were."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    saved_builtins = dict(builtins.__dict__)
    saved_main = sys.modules.get("__main__")
    saved_hooks = (sys.displayhook, sys.excepthook)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", extension)
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", extension)
        ip.history_manager.end_session()
        InteractiveShell.clear_instance()
        for name in set(builtins.__dict__) - set(saved_builtins):
            del builtins.__dict__[name]
        builtins.__dict__.update(saved_builtins)
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        sys.displayhook, sys.excepthook = saved_hooks
