"""The command line's server: one environment served in the foreground by one process or N.

One process runs every session's step on one core (the environment's transforms, tools and
tokenizer hold the GIL). ``serve(..., workers=N)`` serves one address from ``N`` processes,
each OpenEnv's app under uvicorn (:func:`~._serve.served_app`):

* **The address.** This process alone listens on it, and hands each new connection to the
  worker with the fewest open connections, ties in turn (:mod:`._handoff`: the connection's
  file descriptor passed over a Unix socket); a connection, and so a WebSocket session, stays
  with that worker. Sessions opened at once are spread evenly (4 and 4 of 8). The kernel's
  ``SO_REUSEPORT`` spread them by a hash of their addresses (18 and 14 of 32), and ``uvicorn
  --workers N`` shares one listening socket, where asyncio accepts every connection waiting at
  a wake-up, so sessions opened together pile onto one worker.
* **Capacity is the total.** The workers count their sessions in shared memory against one
  limit (:class:`~._capacity.SessionSlots`): a session is refused only when ``max_concurrent_envs``
  are open over all the workers, and ``GET /health`` (any worker) says how many are, per worker.
* **Steps in order.** A process's sessions' calls run on one thread, first come first served
  (:mod:`._step_executor`); one that runs for 50 ms lets the next start on another thread.
* **Supervision.** This process starts the workers (``spawn``), announces the URL once all
  listen, and stops them on SIGINT or SIGTERM (exit status 0). A worker that dies while
  serving loses its sessions (their clients get a ``ConnectionError``); it is handed no more
  connections, its slots are given back and a new worker takes its place. A worker that dies
  while starting stops the server. Workers die with this process (``PR_SET_PDEATHSIG`` on
  Linux).
* **Pauses.** Each serving process freezes what it holds once started (``gc.freeze``: torch,
  transformers and OpenEnv's imports, the first environment): Python's full collections then
  walk only what the sessions made. Measured: 300-370 ms pauses under 32 sessions, every few
  seconds, each one stalling every session of the process; 20-50 ms frozen.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

from .._checks import boundary
from .._processes import end_with_parent
from .._sockets import bound_socket
from ._capacity import SessionSlots
from ._handoff import ConnectionDispatcher, receive_connections
from ._serve import environment_class, served_app, uvicorn_protocol, uvicorn_server

__all__ = ["load_env_factory", "serve"]

#: the longest wait for the workers to listen (each imports torch, torchrl and OpenEnv)
_STARTUP_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 15.0


def load_env_factory(spec: str) -> Any:
    """``"package.module:name"`` -> that object (a function building an environment, an
    environment, or an ``Environment`` class).

    Raises:
        ValueError: if ``spec`` is not ``MODULE:NAME``.
        ImportError: if the module cannot be imported.
        AttributeError: if the module has no such name.
    """
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(
            f"expected MODULE:NAME (e.g. torchrl_trl_interop.testing:toy_tool_env), got {spec!r}."
        )
    module = importlib.import_module(module_name)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{module_name!r} has no {name!r} (looked for {part!r}).")
        obj = getattr(obj, part)
    return obj


@boundary("serve")  # the CLI's command
def serve(
    spec: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_concurrent_envs: int = 1,
    session_timeout_s: float | None = None,
    workers: int = 1,
    log_level: str = "info",
) -> None:
    """Serves ``MODULE:NAME`` in the foreground until interrupted (SIGINT/SIGTERM), from
    ``workers`` processes behind one address (module docstring).

    One environment is built first, so that a ``make_env`` that cannot serve (batch size, not
    a ChatEnv, an exception) fails here, with its reason, instead of in every client's session;
    the URL is printed once the server listens.

    Raises:
        ValueError, TypeError: if ``make_env`` builds what cannot be served (the reason named).
        RuntimeError: if building the environment raised another error, or a worker died while
            starting.
        OSError: if the address cannot be bound.
    """
    cls = environment_class(load_env_factory(spec), max_concurrent_envs, session_timeout_s)
    try:
        cls().close()
    except (ValueError, TypeError) as err:
        raise type(err)(f"{spec} cannot be served: {err}") from err
    except Exception as err:
        raise RuntimeError(
            f"{spec} failed to build an environment: {type(err).__name__}: {err}"
        ) from err
    if workers > 1 and not hasattr(socket, "send_fds"):
        raise OSError(f"--workers {workers} needs socket.send_fds (Unix: Linux, BSD, macOS).")
    sock = bound_socket(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}"
    where = f" from {workers} worker processes" if workers > 1 else ""
    announce = f"serving {spec} with OpenEnv at {url} (WebSocket {url}/ws){where}"
    try:
        if workers == 1:
            slots = SessionSlots(max_concurrent_envs)
            app = served_app(cls, slots, session_timeout_s)
            _freeze()
            server = uvicorn_server(app, log_level, lambda _: print(announce, flush=True))
            server.run(sockets=[sock])
        else:
            config = (session_timeout_s, log_level)
            _Supervisor(spec, sock, workers, max_concurrent_envs, config).run(announce)
    finally:
        sock.close()


class _Supervisor:
    """Starts, watches and stops the worker processes of :func:`serve` (module docstring)."""

    def __init__(
        self, spec: str, sock: socket.socket, workers: int, limit: int, config: tuple
    ) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="torchrl-openenv-")
        counts = self.ctx.Array("i", workers, lock=False)
        lock_path = os.path.join(self.folder, "slots.lock")
        self.slots = SessionSlots(limit, counts=counts, lock_path=lock_path)
        self.ready = self.ctx.Array("b", workers, lock=False)
        self.dispatcher = ConnectionDispatcher(sock, self.ctx.Array("q", workers, lock=False))
        self.config = (spec, *config)
        self.processes: list[Any] = [None] * workers
        self.stop = threading.Event()

    def _start(self, index: int) -> None:
        self.ready[index] = 0
        channel = self.dispatcher.attach(index)
        handed = (channel, self.dispatcher.closed)
        process = self.ctx.Process(
            target=_worker,
            args=(index, self.slots, self.ready, os.getpid(), *handed, *self.config),
            name=f"openenv-worker-{index}",
            daemon=False,  # an environment may start processes of its own; stopped by _stop_all
        )
        try:
            process.start()
        finally:
            channel.close()  # the worker's end: the worker holds its own
        self.processes[index] = process

    def run(self, announce: str) -> None:
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, lambda *_: self.stop.set()) for sig in stops}
        try:
            for index in range(len(self.processes)):
                self._start(index)
            if self._wait_listening():
                self.dispatcher.start()
                print(announce, flush=True)
                self._watch()
        finally:
            self.dispatcher.stop()
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.slots.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _wait_listening(self) -> bool:
        """``True`` once every worker listens; ``False`` if stopped first."""
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not all(self.ready):
            for index, process in enumerate(self.processes):
                if process.exitcode is not None:
                    raise RuntimeError(
                        f"worker {index} exited with status {process.exitcode} while starting "
                        "(its error is above)."
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the workers did not listen within {_STARTUP_TIMEOUT_S:g} s (ready: "
                    f"{list(self.ready)})."
                )
            if self.stop.wait(0.05):
                return False
        return True

    def _watch(self) -> None:
        """Until stopped: a worker that died is replaced, its slots given back."""
        while not self.stop.wait(0.2):
            for index, process in enumerate(self.processes):
                if process.exitcode is None:
                    continue
                if process.exitcode == 0:  # stopped by a signal of its own (Ctrl-C's group)
                    self.stop.set()
                    return
                self.dispatcher.detach(index)
                lost = self.slots.clear(index)
                print(
                    f"worker {index} (pid {process.pid}) died (status {process.exitcode}): its "
                    f"{lost} session(s) are lost; starting another.",
                    file=sys.stderr,
                    flush=True,
                )
                self._start(index)

    def _stop_all(self) -> None:
        alive = [p for p in self.processes if p is not None and p.exitcode is None]
        for process in alive:
            process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:  # connections that would not close
                process.kill()
                process.join(_STOP_TIMEOUT_S)


def _freeze() -> None:
    """Leaves what this process holds now out of Python's collections (module docstring)."""
    gc.collect()
    gc.freeze()


def _worker(  # pragma: no cover - runs in a worker process
    index: int,
    slots: SessionSlots,
    ready: Any,
    parent: int,
    channel: socket.socket,
    closed: Any,
    spec: str,
    session_timeout_s: float | None,
    log_level: str,
) -> None:
    """One worker: OpenEnv's app, serving the connections the supervisor hands over
    ``channel`` (:mod:`._handoff`).

    It builds one environment before it listens, as :func:`serve` does: the first sessions,
    built at once in threads of their own, would otherwise race on the environment's first
    imports (transformers' lazy modules raise ``ImportError`` there)."""
    end_with_parent(parent, sig=signal.SIGTERM)  # a worker stops as on the supervisor's SIGTERM
    slots.worker = index
    cls = environment_class(load_env_factory(spec), slots.limit, session_timeout_s)
    cls().close()
    app = served_app(cls, slots, session_timeout_s)
    _freeze()

    def listening(server: Any) -> None:
        loop = asyncio.get_running_loop()
        receive_connections(channel, closed, index, uvicorn_protocol(server), loop)
        ready[index] = 1

    try:
        uvicorn_server(app, log_level, listening).run(sockets=[])
    finally:
        channel.close()
