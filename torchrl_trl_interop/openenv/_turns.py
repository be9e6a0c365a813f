"""The steps of a serving process's sessions, one at a time, in the order they asked.

OpenEnv's server runs each session's calls in a thread of its own, so that a step that waits (a
tool in a subprocess, a network call) holds up no other session. Steps that compute gain
nothing from the threads (Python code holds the GIL) and lose twice: every session's thread
contends for the GIL at once (the served toy task took up to 2x the CPU time a step with 8
sessions and more on one worker), and which one runs next is left to the scheduler, so some
sessions wait several turns while others step (p99 2.3-2.9x the mean step latency at 32
sessions on 2 workers; 1.5-1.9x in turns).

:class:`StepTurns` gives the sessions' ``reset`` and ``step`` turns, first come first served:
the threads waiting for their turn sleep, off the GIL. A step that has run for ``stall_s``
(it waits on something, or computes for long) no longer holds the next one up, which starts
beside it, as each session's thread would have. Handing a turn over wakes the next thread
(measured: 7-33% of the steps/s at 32 sessions on 2 workers, on a busy machine); OpenEnv's
single executor thread (``REQUIRES_SINGLE_THREAD_EXECUTOR``) hands over nothing, but holds every
session up behind a step that waits.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from typing import Any

__all__ = ["StepTurns", "taking_turns"]

#: how long a step runs before the next may start beside it (the toy task steps in 1.5 ms)
STALL_S = 0.05


class StepTurns:
    """Turns for the steps of one process's sessions: one at a time, first come first served;
    a step running for ``stall_s`` lets the next start.

    Args:
        stall_s (float, optional): seconds a step runs before the next may start beside it.
            Defaults to ``0.05``.

    Examples:
        >>> turns = StepTurns(stall_s=0.05)
        >>> with turns:
        ...     turns.running()
        1
        >>> turns.running()
        0
    """

    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()  # first come first
        self._started: dict[threading.Event, float] = {}  # running step -> when it started
        self._local = threading.local()

    def running(self) -> int:
        """How many steps run now."""
        return len(self._started)

    def waiting(self) -> int:
        """How many steps wait for their turn."""
        return len(self._waiting)

    def __enter__(self) -> StepTurns:
        me = threading.Event()
        with self._lock:
            self._waiting.append(me)
            try:
                while (wait := self._wait_s(me)) != 0:
                    me.clear()
                    self._lock.release()
                    try:
                        me.wait(wait)
                    finally:
                        self._lock.acquire()
            except BaseException:  # interrupted while waiting: out of the line
                self._waiting.remove(me)
                self._wake_next()
                raise
            self._waiting.popleft()
            self._started[me] = time.monotonic()  # the key holds ``me``: unique while it runs
            self._wake_next()  # it waits for this step now
        self._local.__dict__.setdefault("mine", []).append(me)  # this thread's, innermost last
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            del self._started[self._local.mine.pop()]
            self._wake_next()

    def _wait_s(self, me: threading.Event) -> float | None:
        """``0``: ``me`` starts now; ``None``: until woken; else the seconds until the steps
        running now have all run for ``stall_s`` (or until woken)."""
        if self._waiting[0] is not me:
            return None
        if not self._started:
            return 0
        latest = max(self._started.values()) + self.stall_s - time.monotonic()
        return max(latest, 0)

    def _wake_next(self) -> None:
        if self._waiting:
            self._waiting[0].set()


def taking_turns(cls: type, turns: StepTurns | None = None) -> type:
    """A subclass of the OpenEnv ``Environment`` class ``cls`` whose ``reset`` and ``step``
    take turns (``turns``, a new :class:`StepTurns` by default) with those of every other
    instance: one server process's sessions."""
    turns = StepTurns() if turns is None else turns

    def in_turn(method: Any) -> Any:
        @functools.wraps(method)  # OpenEnv reads its signature to pick the keyword arguments
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            with turns:
                return method(self, *args, **kwargs)

        return call

    attrs = {"reset": in_turn(cls.reset), "step": in_turn(cls.step), "__doc__": cls.__doc__}
    return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})
