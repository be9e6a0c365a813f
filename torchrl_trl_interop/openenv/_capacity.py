"""The sessions a served environment admits: one count for every worker, idle ones closed.

OpenEnv's server (0.10) counts the WebSocket sessions of its own process
(``max_concurrent_envs``): served by ``N`` processes (``uvicorn --workers N``, as OpenEnv's
template suggests) it admits ``N`` times as many, and refuses a session that lands on a full
process while another has room. Its idle reaper (``session_timeout``) frees an idle WebSocket
session's slot without closing its socket: the session keeps being answered while a second
client takes the slot (two sessions on a one-session server), and it counts a session idle from
its last answered message, so a step longer than the timeout is reaped while it runs.

Here, in front of OpenEnv's app (:func:`admit_sessions`):

* :class:`SessionSlots` counts the open WebSocket sessions of all the workers serving one
  address against one limit: capacity is the total, whichever process a session lands on;
* a session waits at most ``idle_timeout_s`` for its client's next message (the time the
  server is not working for it); past that the server closes its socket, and OpenEnv's
  handler destroys the session as for a client that left;
* ``GET /health`` answers what OpenEnv's does (``{"status": "healthy"}``) and how many sessions
  are open and may be: ``{"sessions": {"open": 3, "max": 8, "per_worker": [1, 2]},
  "workers": 2, "session_timeout_s": null}``.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import contextmanager
from typing import Any

__all__ = ["IDLE_CLOSE_CODE", "SessionSlots", "admit_sessions", "capacity_reply"]

#: the WebSocket close code of a session closed for idling (4000-4999: the application's own)
IDLE_CLOSE_CODE = 4408


class SessionSlots:
    """The open WebSocket sessions of the workers serving one address, against one limit.

    One process: a plain count (the event loop takes and gives back slots one at a time).
    Several (:func:`~torchrl_trl_interop.openenv._workers.serve_workers`): ``counts`` holds one
    int per worker in memory the worker processes share, changed only under an exclusive
    ``flock`` of ``lock_path``: the kernel releases the lock of a process that dies holding
    it, and the supervisor zeroes the count of a worker that died (:meth:`clear`).

    Args:
        limit (int): the most sessions open at once over all the workers.

    Keyword Args:
        counts (sequence of int, optional): one count per worker, shared between processes (a
            ``multiprocessing`` ``Array``). Defaults to one count in this process.
        lock_path (str, optional): the file locked around a change of ``counts`` (needed with
            ``counts``).
        worker (int, optional): which count is this process's. Defaults to ``0``.

    Examples:
        >>> slots = SessionSlots(2)
        >>> [slots.take(), slots.take(), slots.take()], slots.open()
        ([True, True, False], 2)
        >>> slots.give_back(); slots.open()
        1
    """

    def __init__(
        self,
        limit: int,
        *,
        counts: Any = None,
        lock_path: str | None = None,
        worker: int = 0,
    ) -> None:
        if counts is not None and lock_path is None:
            raise ValueError("SessionSlots: shared counts need a lock_path.")
        self.limit = limit
        self.counts = [0] if counts is None else counts
        self.lock_path = lock_path
        self.worker = worker
        self._fd: int | None = None

    @property
    def workers(self) -> int:
        return len(self.counts)

    @contextmanager
    def _locked(self):
        if self.lock_path is None:
            yield
            return
        import fcntl  # POSIX: several workers serve one address only there (send_fds)

        if self._fd is None:
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def take(self) -> bool:
        """Takes a slot for a session of this worker; ``False`` if every slot is taken."""
        with self._locked():
            if sum(self.counts) >= self.limit:
                return False
            self.counts[self.worker] += 1
            return True

    def give_back(self) -> None:
        """Gives back a slot this worker took."""
        with self._locked():
            self.counts[self.worker] = max(0, self.counts[self.worker] - 1)

    def clear(self, worker: int) -> int:
        """Gives back every slot of ``worker`` (a process that died); returns how many."""
        with self._locked():
            lost, self.counts[worker] = self.counts[worker], 0
            return lost

    def open(self) -> int:
        """The sessions open over all the workers."""
        return sum(self.counts)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict[str, Any]:  # to a worker process: its own lock descriptor
        return {**self.__dict__, "_fd": None}


def capacity_reply(open_sessions: int, limit: int, workers: int) -> str:
    """OpenEnv's ``CAPACITY_REACHED`` error message (its clients read the code), with the
    count over all the workers."""
    across = f" over {workers} worker processes" if workers > 1 else ""
    return json.dumps(
        {
            "type": "error",
            "data": {
                "message": f"Server at capacity: {open_sessions}/{limit} sessions active{across}. "
                "Cannot accept new connections.",
                "code": "CAPACITY_REACHED",
                "active_sessions": open_sessions,
                "max_sessions": limit,
            },
        }
    )


class _SessionGate:
    """ASGI middleware of the ``/ws`` sessions: admitted by :class:`SessionSlots`, closed when
    idle (module docstring)."""

    def __init__(self, app: Any, slots: SessionSlots, idle_timeout_s: float | None) -> None:
        self.app = app
        self.slots = slots
        self.idle_timeout_s = idle_timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        opens_session = (
            scope["type"] == "websocket"
            and scope.get("path") == "/ws"
            and b"session_id=" not in scope.get("query_string", b"")  # attaches to one: no new
        )
        if not opens_session:
            return await self.app(scope, receive, send)
        if not self.slots.take():
            return await self._refuse(receive, send)
        try:
            await self.app(scope, *self._idle_closing(receive, send))
        finally:
            self.slots.give_back()

    async def _refuse(self, receive: Any, send: Any) -> None:
        """Refuses a session as OpenEnv does: accepted, an error message, closed."""
        await receive()  # websocket.connect
        text = capacity_reply(self.slots.open(), self.slots.limit, self.slots.workers)
        try:
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.send", "text": text})
            await send({"type": "websocket.close", "code": 1000})
        except OSError:  # the client already left
            pass

    def _idle_closing(self, receive: Any, send: Any) -> tuple[Any, Any]:
        """``receive`` that closes the session past ``idle_timeout_s`` without a message, and
        ``send`` that drops what the app sends after that close."""
        timeout = self.idle_timeout_s
        if timeout is None:
            return receive, send
        closed = False
        connected = False

        async def idle_receive() -> dict:
            nonlocal closed, connected
            if not connected:  # websocket.connect, before the app accepts
                connected = True
                return await receive()
            try:
                return await asyncio.wait_for(receive(), timeout)
            except asyncio.TimeoutError:
                closed = True
                reason = f"session idle for more than {timeout:g} s (the server's session timeout)"
                try:
                    await send(
                        {"type": "websocket.close", "code": IDLE_CLOSE_CODE, "reason": reason}
                    )
                except OSError:
                    pass
                return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}

        async def closing_send(message: dict) -> None:
            if not closed:
                await send(message)

        return idle_receive, closing_send


def admit_sessions(app: Any, slots: SessionSlots, idle_timeout_s: float | None = None) -> Any:
    """Puts OpenEnv's FastAPI ``app``'s WebSocket sessions behind ``slots`` and
    ``idle_timeout_s``, and answers ``GET /health`` with the sessions open and allowed (module
    docstring); returns ``app``."""
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]

    def health() -> dict[str, Any]:
        return {
            "status": "healthy",
            "sessions": {
                "open": slots.open(),
                "max": slots.limit,
                "per_worker": list(slots.counts),
            },
            "workers": slots.workers,
            "session_timeout_s": idle_timeout_s,
        }

    app.add_api_route("/health", health, methods=["GET"], tags=["Health"], summary="Health check")
    app.add_middleware(_SessionGate, slots=slots, idle_timeout_s=idle_timeout_s)
    return app
