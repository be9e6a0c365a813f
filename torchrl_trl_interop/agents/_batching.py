"""Concurrent requests batched into the policy's calls, on one thread, never dropped.

:class:`Batcher` runs one worker thread: it takes the oldest waiting request, adds every other
one already waiting (or arriving within ``wait_s``) up to ``max_rows`` rows, and hands them to
``run`` together: one policy call serves them all. A request sampled with a seed is served
alone (its seed drives that call). Requests wait in an unbounded queue, in order; each one's
future gets its result or its exception, a request whose client gave up (a cancelled future) is
skipped, and when the batcher stops, the requests still waiting get a 503. The worker is the
only thread that calls the policy and its tokenizer.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ._requests import ClientError

__all__ = ["Batcher", "Job"]

#: how often the idle worker checks that it should stop
_POLL_S = 0.05


@dataclass
class Job:
    """One request: its payload, its number of rows (choices), its seed, its future."""

    payload: Any
    rows: int = 1
    seed: int | None = None
    future: Future = field(default_factory=Future)


class Batcher:
    """A worker thread that serves queued jobs in batches (see the module's docstring).

    Args:
        run (Callable[[list[Job]], None]): serves a batch; it resolves each job's future (an
            exception it raises goes to every future it left unresolved).

    Keyword Args:
        max_rows (int): the most rows a batch gathers (a job larger than that goes alone).
        wait_s (float): how long a batch waits for more jobs once it has one.
        name (str): the thread's name.

    Examples:
        >>> served = []
        >>> batcher = Batcher(lambda jobs: [j.future.set_result(j.payload) for j in jobs],
        ...                   max_rows=8, wait_s=0.0)
        >>> batcher.start()
        >>> batcher.submit(Job("hello")).result(timeout=5)
        'hello'
        >>> batcher.stop(timeout=5)
    """

    def __init__(
        self,
        run: Callable[[list[Job]], None],
        *,
        max_rows: int,
        wait_s: float,
        name: str = "openai-server-batcher",
    ) -> None:
        self.run = run
        self.max_rows = max_rows
        self.wait_s = wait_s
        self.name = name
        self.batches = 0
        self._queue: queue.Queue[Job] = queue.Queue()
        self._held: collections.deque[Job] = collections.deque()  # the worker's own
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future:
        """Queues ``job``; its future resolves when a batch serves it."""
        if not self.alive or self._stopping.is_set():
            raise ClientError(
                "the server is not serving (closed, or its worker stopped).", status=503
            )
        self._queue.put(job)
        return job.future

    def stop(self, timeout: float) -> None:
        """Stops the worker after the batch it is serving (waiting at most ``timeout`` s); the
        jobs still waiting get a 503."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        refused = ClientError("the server closed before serving this request.", status=503)
        for job in [*self._held, *_drain(self._queue)]:
            if not job.future.done():
                job.future.set_exception(refused)
        self._held.clear()

    def _next(self, timeout: float) -> Job | None:
        if self._held:
            return self._held.popleft()
        try:
            return self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None

    def _gather(self, first: Job) -> list[Job]:
        """``first`` and the jobs that join it (none when ``first`` is seeded)."""
        batch, rows = [first], first.rows
        if first.seed is not None:
            return batch
        deadline = time.monotonic() + self.wait_s
        while rows < self.max_rows:
            job = self._next(deadline - time.monotonic())
            if job is None:
                break
            if job.seed is not None or rows + job.rows > self.max_rows:
                self._held.appendleft(job)  # served next, in order
                break
            batch.append(job)
            rows += job.rows
        return batch

    def _loop(self) -> None:
        while not self._stopping.is_set():
            first = self._next(_POLL_S)
            if first is None:
                continue
            batch = [j for j in self._gather(first) if j.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                self.run(batch)
            except BaseException as err:  # every request of the batch hears of it
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(err)
            self.batches += 1


def _drain(source: queue.Queue) -> list[Job]:
    out = []
    while True:
        try:
            out.append(source.get_nowait())
        except queue.Empty:
            return out
