"""One address, N serving processes: each new connection handed to the least busy one.

The supervisor of ``serve --workers N`` (:mod:`._workers`) alone listens on the address. A
thread of its own (:class:`ConnectionDispatcher`) accepts each connection and passes its file
descriptor (``socket.send_fds``, over a Unix socket pair per worker) to the worker with the
fewest open connections (a WebSocket session is one), ties taken in turn; the worker
(:func:`receive_connections`) serves it on its uvicorn event loop
(``loop.connect_accepted_socket`` with uvicorn's protocol), and the connection, and so the
session, stays there. Sessions opened at once are spread evenly: 4 and 4 of 8 on 2 workers.

What the kernel does without this spreads them unevenly: with ``SO_REUSEPORT`` on every
worker, a hash of each connection's addresses picks the worker (18 and 14 of 32 sessions, 15
and 17, in readings of ``/health``), and the sessions on the fuller worker wait longer for each
step; with one listening socket shared (``uvicorn --workers N``), the worker that wakes first
accepts every connection waiting.

The open connections are counted with no lock: the supervisor alone counts those it handed to
each worker, and each worker alone counts those it closed (``closed``, one int per worker in
memory they share).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from typing import Any

__all__ = ["ConnectionDispatcher", "receive_connections"]

#: the longest a hand-off may block on a worker that does not read (then the next is tried)
_SEND_TIMEOUT_S = 5.0
_ACCEPT_POLL_S = 0.2


class ConnectionDispatcher:
    """Accepts the connections of ``sock`` in a thread and hands each to a worker.

    Args:
        sock (socket.socket): the bound socket of the address (it listens once started).
        closed (sequence of int): per worker, how many connections it closed, written by that
            worker alone (a ``multiprocessing`` ``Array``).

    Examples:
        >>> import socket
        >>> listening = socket.create_server(("127.0.0.1", 0))
        >>> dispatcher = ConnectionDispatcher(listening, closed=[0, 0])
        >>> ends = [dispatcher.attach(index) for index in range(2)]  # each worker's end
        >>> dispatcher.start()
        >>> clients = [socket.create_connection(listening.getsockname()) for _ in range(4)]
        >>> [len(socket.recv_fds(ends[i], 8, 8)[1]) for i in (0, 1, 0, 1)]  # in turn
        [1, 1, 1, 1]
        >>> dispatcher.open_connections()
        [2, 2]
        >>> dispatcher.stop()
        >>> for s in (*clients, *ends, listening):
        ...     s.close()
    """

    def __init__(self, sock: socket.socket, closed: Any) -> None:
        self.sock = sock
        self.closed = closed
        self.handed = [0] * len(closed)
        self.channels: list[socket.socket | None] = [None] * len(closed)
        self.next = 0  # where the next tie starts
        self.lock = threading.Lock()  # channels and counts: the watcher replaces workers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, index: int) -> socket.socket:
        """A new channel to worker ``index`` (a fresh start: nothing handed, nothing closed);
        returns the worker's end, for its process (:func:`receive_connections`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.settimeout(_SEND_TIMEOUT_S)
        with self.lock:
            old, self.channels[index] = self.channels[index], ours
            self.handed[index], self.closed[index] = 0, 0
        if old is not None:
            old.close()  # its connections not yet received die with it
        return theirs

    def detach(self, index: int) -> None:
        """Hands worker ``index`` nothing more (it died)."""
        with self.lock:
            old, self.channels[index] = self.channels[index], None
        if old is not None:
            old.close()

    def open_connections(self) -> list[int]:
        """Per worker, the connections handed to it and not closed yet."""
        return [h - c for h, c in zip(self.handed, self.closed)]

    def start(self) -> None:
        self.sock.listen(2048)  # uvicorn's backlog
        self.sock.settimeout(_ACCEPT_POLL_S)
        self._thread = threading.Thread(target=self._run, name="openenv-dispatcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_SEND_TIMEOUT_S + 2 * _ACCEPT_POLL_S)
        with self.lock:
            channels, self.channels = self.channels, [None] * len(self.channels)
        for channel in channels:
            if channel is not None:
                channel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # the socket closed under us: stopping
                return
            with conn:  # closed here once handed: the worker holds its own descriptor
                self._hand(conn)

    def _hand(self, conn: socket.socket) -> None:
        """To the worker with the fewest open connections, ties in turn; the next one if the
        hand-off fails (the worker died). No worker: the connection is closed."""
        tried: set[int] = set()
        while True:
            with self.lock:
                index = self._least_busy(tried)
                if index is None:
                    return
                channel = self.channels[index]
                self.handed[index] += 1
                self.next = (index + 1) % len(self.channels)
            try:
                socket.send_fds(channel, [b"c"], [conn.fileno()])
                return
            except OSError:
                with self.lock:
                    if self.channels[index] is channel:
                        self.handed[index] -= 1
                tried.add(index)

    def _least_busy(self, tried: set[int]) -> int | None:
        count = len(self.channels)
        order = [(self.next + k) % count for k in range(count)]
        ready = [i for i in order if self.channels[i] is not None and i not in tried]
        if not ready:
            return None
        busy = self.open_connections()
        return min(ready, key=lambda i: busy[i])  # the first of the least busy, in turn


class _CountedSocket(socket.socket):
    """An accepted connection that counts itself closed, once (asyncio's transport closes its
    socket when the connection is lost)."""

    def count_closes(self, closed: Any, index: int) -> None:
        """Counts this connection in ``closed[index]`` once it closes."""
        self.closed_counts = closed
        self.worker = index
        self.counted = False

    def close(self) -> None:
        if not getattr(self, "counted", True):
            self.counted = True
            self.closed_counts[self.worker] += 1
        super().close()


def receive_connections(
    channel: socket.socket,
    closed: Any,
    index: int,
    create_protocol: Any,
    loop: asyncio.AbstractEventLoop,
) -> None:  # pragma: no cover - runs in a worker process
    """Serves on ``loop`` every connection the supervisor hands over ``channel``, each with a
    protocol from ``create_protocol`` (uvicorn's), counting those closed in ``closed[index]``."""
    channel.setblocking(False)

    def readable() -> None:
        while True:
            try:
                _, fds, flags, _ = socket.recv_fds(channel, 64, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                loop.remove_reader(channel.fileno())
                return
            if not fds:  # the supervisor is gone: PR_SET_PDEATHSIG stops this process
                loop.remove_reader(channel.fileno())
                return
            if flags & getattr(socket, "MSG_CTRUNC", 0):
                print(f"worker {index}: connections lost in a hand-off", file=sys.stderr)
            for fd in fds:
                conn = _CountedSocket(fileno=fd)
                conn.count_closes(closed, index)
                conn.setblocking(False)
                loop.create_task(_serve(conn))

    async def _serve(conn: socket.socket) -> None:
        try:
            await loop.connect_accepted_socket(create_protocol, conn)
        except OSError:  # the client left while being handed over
            conn.close()

    loop.add_reader(channel.fileno(), readable)
