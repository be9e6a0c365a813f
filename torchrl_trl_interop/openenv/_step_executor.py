"""The calls of a serving process's sessions, on one thread in the order they came; a call that
stalls lets the next start on another thread.

OpenEnv's server (0.10) runs each WebSocket session's calls (``reset``, ``step``, the
environment's construction and ``close``) in a thread of the session's own, so that a step that
waits (a tool in a subprocess, a network call) holds up no other session. Steps that compute
gain nothing from those threads (Python code holds the GIL) and lose twice: the threads of every
session contend for the GIL at once, and each step wakes its session's thread. With 32 sessions
on two workers that made a served step cost 2.9-3.5 ms of server CPU against 2.6 ms in process,
and left some sessions waiting several turns while others stepped (p99 2.3-2.9x the mean step
latency). OpenEnv's other choice, one thread for all the sessions
(``REQUIRES_SINGLE_THREAD_EXECUTOR``), costs neither, but holds every session up behind a step
that waits.

:class:`StepExecutor` is that one thread, with a way out: a call that has run for ``stall_s``
(it waits on something, or computes for long) no longer holds the next one up, which starts on
another thread beside it, as each session's thread would have. While calls come, the thread that
ran one takes the next (no thread is woken); one idle thread watches the running call for a
stall, waking at most once per ``stall_s``.

:func:`run_sessions_in` gives OpenEnv's server this executor; it reads the server's shared
executor, an internal, on the OpenEnv versions it was measured on (:data:`OPENENV_MEASURED`); on
any other (and under :func:`~torchrl_trl_interop._upstream.plain_upstream`) the server keeps its
own thread per session. What would retire it: an ``executor=`` argument to OpenEnv's
``HTTPEnvServer``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from .._upstream import use_fast

__all__ = ["OPENENV_MEASURED", "STALL_S", "StepExecutor", "run_sessions_in"]

#: how long a call runs before the next may start beside it (the toy task steps in 1.5 ms)
STALL_S = 0.05
#: the OpenEnv versions whose server's shared session executor :func:`run_sessions_in` replaces
OPENENV_MEASURED: tuple[str, str, str] = ("openenv", "0.10.0", "0.11")
#: idle threads kept: one watches the running call for a stall, one takes the next call
_IDLE_KEPT = 2
_JOIN_TIMEOUT_S = 10.0


class StepExecutor(Executor):
    """Runs calls one at a time, first come first served, on one thread; a call running for
    ``stall_s`` lets the next start on another thread beside it.

    A ``concurrent.futures`` executor: ``submit`` returns a ``Future``, as asyncio's
    ``run_in_executor`` expects.

    Args:
        stall_s (float, optional): seconds a call runs before the next may start beside it.
            Defaults to ``0.05``.

    Examples:
        >>> executor = StepExecutor()
        >>> [executor.submit(pow, 2, n).result(timeout=10) for n in range(4)]
        [1, 2, 4, 8]
        >>> executor.shutdown()
    """

    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self._cond = threading.Condition()
        self._queue: deque[tuple[Future, Callable[..., Any], tuple, dict]] = deque()
        self._started: dict[int, float] = {}  # running thread's ident -> when its call started
        self._idle = 0
        self._watching = 0  # idle threads waiting for the running calls to stall
        self._threads: list[threading.Thread] = []
        self._names = itertools.count()
        self._shut = False

    def running(self) -> int:
        """How many calls run now."""
        return len(self._started)

    def waiting(self) -> int:
        """How many calls wait for their turn."""
        return len(self._queue)

    def threads(self) -> int:
        """How many threads the executor holds (running a call or idle)."""
        with self._cond:
            return sum(thread.is_alive() for thread in self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Queues ``fn(*args, **kwargs)``; returns its future."""
        future: Future = Future()
        with self._cond:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.append((future, fn, args, kwargs))
            if self._idle == 0:
                self._start_thread()  # to run it now, or to watch the running call
            elif not self._started or not self._watching:
                self._cond.notify()  # an idle thread runs it now, or watches the running call
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Runs the queued calls (cancels them with ``cancel_futures``), then stops the threads;
        ``wait`` waits for them (at most 10 s each)."""
        with self._cond:
            self._shut = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._cond.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(_JOIN_TIMEOUT_S)

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"openenv-step-{next(self._names)}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _wait_s(self) -> float | None:
        """``0``: the next call may start now; ``None``: none may until one comes or ends; else
        the seconds until the calls running now have all run for ``stall_s``."""
        if not self._queue:
            return None
        if not self._started:
            return 0
        return max(max(self._started.values()) + self.stall_s - time.monotonic(), 0)

    def _work(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while True:
                wait = self._wait_s()
                if wait == 0:
                    future, fn, args, kwargs = self._queue.popleft()
                    self._started[me] = time.monotonic()
                    self._cond.release()
                    try:
                        _run(future, fn, args, kwargs)
                    finally:
                        self._cond.acquire()
                        del self._started[me]
                        if self._shut:
                            self._cond.notify_all()  # the idle threads may end
                    continue
                if self._shut and not self._queue:
                    return
                if wait is None and not self._started and self._idle >= _IDLE_KEPT:
                    return  # enough threads wait for the next call
                if wait is None and self._started:
                    wait = self.stall_s  # watch the running call: the queue may fill
                watching = wait is not None
                self._idle += 1
                self._watching += watching
                try:
                    self._cond.wait(wait)
                finally:
                    self._idle -= 1
                    self._watching -= watching


def _run(future: Future, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as err:  # the caller's to see, as ThreadPoolExecutor does
        future.set_exception(err)
    else:
        future.set_result(result)


def run_sessions_in(server: Any, executor: Executor) -> bool:
    """Has OpenEnv's ``HTTPEnvServer`` ``server`` run every session's calls in ``executor``
    (on :data:`OPENENV_MEASURED`, outside :func:`~torchrl_trl_interop._upstream.plain_upstream`);
    returns whether it does. Otherwise ``server`` keeps OpenEnv's own thread per session.

    Call it before the server serves (its sessions take their executor when they open).
    """
    if not use_fast(OPENENV_MEASURED):
        return False
    previous, server._shared_session_executor = server._shared_session_executor, executor
    if previous is not None:
        previous.shutdown(wait=False)
    return True
