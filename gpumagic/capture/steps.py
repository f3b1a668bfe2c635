"""Step detection: where training steps begin and end, without changes to the user's loop.

A global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
fires at the end of every ``optimizer.step()``, in a plain loop, Hugging Face's Trainer or
Lightning alike. The end of one step is the start of the next, so a ``ProfilerStep#N`` marker
spans from the end of optimizer step N-1 to the end of optimizer step N (it closes inside
``Optimizer.step``'s own annotation, a few microseconds before that annotation ends).

Only the first optimizer that steps counts (a GAN's second optimizer, stepping in the same
iteration, would otherwise halve every step), and only on the thread that started the capture.
A loop that builds its optimizer anew every step (a mistake ``optimizer-state-reset`` reports)
hands the count on: to a new optimizer once the first one is gone, or once two new optimizers
over the first one's parameters have stepped in a row without it (the old one lives on until
the garbage collector breaks its reference cycle).
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable

#: Prefix of the step markers; the analysis finds step boundaries by it (torch's own name).
STEP_MARKER_PREFIX = "ProfilerStep#"


class StepAction(enum.Enum):
    """What the capture does after a given number of completed optimizer steps."""

    NOTHING = "nothing"  # still skipping warm-up steps, or already stopped
    BEGIN = "begin"  # open the first step marker
    ADVANCE = "advance"  # close the current marker and open the next
    STOP = "stop"  # close the current marker and stop recording


def step_action(completed: int, first: int, last: int | None) -> StepAction:
    """The action after ``completed`` optimizer steps, for a window of steps ``[first, last)``.

    ``first`` steps are skipped; recording stops once ``last`` steps have completed (never
    when ``last`` is None). ``completed == 0`` is the start of recording.
    """
    if last is not None and completed >= last:
        return StepAction.STOP if completed == last else StepAction.NOTHING
    if completed < first:
        return StepAction.NOTHING
    return StepAction.BEGIN if completed == first else StepAction.ADVANCE


def marker_name(step_index: int) -> str:
    return f"{STEP_MARKER_PREFIX}{step_index}"


class OptimizerStepHook:
    """Calls ``on_step(completed_steps)`` after each step of the primary optimizer.

    Installed with :meth:`install`, removed with :meth:`remove` (never from inside the hook:
    torch iterates the hook dict while calling it).
    """

    def __init__(self, on_step: Callable[[int], None]) -> None:
        self._on_step = on_step
        self._handle = None
        self._primary: weakref.ReferenceType | None = None
        self._first_param: weakref.ReferenceType | None = None
        self._seen: weakref.WeakSet = weakref.WeakSet()
        self._new_since_primary = False
        self._owner = threading.get_ident()
        self.completed = 0
        self.other_optimizers = 0
        #: True once the loop was seen building a new optimizer for every step
        self.rebuilt = False
        self._held: set[int] = set()
        #: elements of those parameters by dtype name (``"float32"``, ``"float64"``...)
        self._elements: dict[str, int] = {}

    @property
    def held_parameters(self) -> int:
        """How many distinct parameters the optimizers that stepped hold (read at each one's first
        step: one pass over its parameter groups per optimizer, none per step)."""
        return len(self._held)

    @property
    def held_elements(self) -> dict[str, int]:
        """The elements of those parameters by dtype (``str(dtype)`` without ``torch.``), read
        with them: what the model computes in, as far as its parameters say."""
        return dict(self._elements)

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._owner = threading.get_ident()
        self._handle = register_optimizer_step_post_hook(self._hook)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def installed(self) -> bool:
        return self._handle is not None

    def _hook(self, optimizer, args, kwargs) -> None:
        if threading.get_ident() != self._owner:
            return
        new = optimizer not in self._seen
        if new:
            self._seen.add(optimizer)
            self._hold(optimizer)
        primary = None if self._primary is None else self._primary()
        if optimizer is primary:
            self._new_since_primary = False
        elif primary is None or self._replaces(optimizer, new):
            self._adopt(optimizer)
        else:
            self.other_optimizers += 1
            return
        self.completed += 1
        self._on_step(self.completed)

    def _hold(self, optimizer) -> None:
        for p in _parameters(optimizer):
            if id(p) in self._held:
                continue
            self._held.add(id(p))
            try:
                kind, n = str(p.dtype).removeprefix("torch."), int(p.numel())
            except (AttributeError, TypeError, RuntimeError):  # not a tensor: nothing to count
                continue
            self._elements[kind] = self._elements.get(kind, 0) + n

    def _adopt(self, optimizer) -> None:
        self._primary = weakref.ref(optimizer)
        first = _first_parameter(optimizer)
        self._first_param = None if first is None else weakref.ref(first)
        self._new_since_primary = False

    def _replaces(self, optimizer, new: bool) -> bool:
        """Whether ``optimizer``, which is not the primary, takes its place: a new optimizer (one
        stepping for the first time) over the primary's parameters, once the loop is seen building
        one every step (a second such optimizer stepping before the primary steps again). A GAN's
        or a wrapper's second optimizer steps again and again: it is never new after its first step."""
        first = _first_parameter(optimizer)
        if not new or first is None or self._first_param is None or self._first_param() is not first:
            return False
        if self.rebuilt or self._new_since_primary:
            self.rebuilt = True
            return True
        self._new_since_primary = True
        return False


def _parameters(optimizer):
    """The optimizer's parameters, group by group."""
    for group in getattr(optimizer, "param_groups", ()):
        yield from group.get("params", ())


def _first_parameter(optimizer):
    """The optimizer's first parameter (None when it has none)."""
    return next(_parameters(optimizer), None)
