"""OpenEnv's server around a TorchRL environment: the app, and a server in a background thread.

:func:`openenv_app` is OpenEnv's own FastAPI app (``create_app``: HTTP ``/reset``, ``/step``,
``/state``, ``/schema``, ``/health`` and the WebSocket ``/ws`` of stateful sessions) serving
:func:`~torchrl_trl_interop.as_openenv_environment`'s class, its sessions admitted and closed
when idle by :mod:`._capacity`. :func:`openenv_server` runs it with uvicorn in a background
thread for the length of a ``with`` block; the command line serves it in the foreground, in one
process or several (:mod:`._workers`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._checks import boundary, check_positive_int, check_real, require
from .._sockets import bound_socket
from ._capacity import SessionSlots, admit_sessions
from ._step_executor import StepExecutor, run_sessions_in

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI
    from torchrl.envs import EnvBase

__all__ = [
    "environment_class",
    "openenv_app",
    "openenv_server",
    "served_app",
    "uvicorn_protocol",
    "uvicorn_server",
]

_STOP_TIMEOUT_S = 10.0


@boundary("openenv_app")
def openenv_app(
    make_env: Callable[[], EnvBase] | EnvBase | type,
    *,
    max_concurrent_envs: int = 1,
    session_timeout_s: float | None = None,
) -> FastAPI:
    """OpenEnv's server app (``create_app``) serving a TorchRL LLM environment.

    Args:
        make_env (callable, EnvBase or Environment subclass): what
            :func:`~torchrl_trl_interop.as_openenv_environment` takes (a function building a
            ``ChatEnv``-based environment of batch size ``(1,)``, or one environment), or the
            class it returned.

    Keyword Args:
        max_concurrent_envs (int, optional): the most WebSocket sessions at once, each with its
            own environment (more than one needs a function building one per session). Defaults
            to ``1``, as OpenEnv's ``create_app``.
        session_timeout_s (float, optional): a session whose client sends nothing for this long
            (the server idle, waiting for its next message) is closed by the server: its socket
            closed with code 4408, its slot given back. Defaults to ``None`` (never).

    Returns:
        a FastAPI app, to run with uvicorn (``uvicorn.run(app, host=..., port=...)``). Its
        ``GET /health`` answers ``{"status": "healthy", "sessions": {"open": ..., "max": ...},
        "workers": 1, "session_timeout_s": ...}``.

    Raises:
        ValueError: if ``max_concurrent_envs`` is not a positive int, or above 1 for one shared
            environment (OpenEnv's ``ConcurrencyConfigurationError``).

    Examples:
        >>> from fastapi.testclient import TestClient
        >>> from torchrl_trl_interop.testing import toy_tool_env
        >>> with TestClient(openenv_app(toy_tool_env)) as client:
        ...     with client.websocket_connect("/ws") as ws:
        ...         ws.send_json({"type": "reset", "data": {"prompt": "What is 2 plus 3?"}})
        ...         ws.receive_json()["data"]["observation"]["messages"]
        [{'role': 'user', 'content': 'What is 2 plus 3?'}]
    """
    cls = environment_class(make_env, max_concurrent_envs, session_timeout_s)
    return served_app(cls, SessionSlots(max_concurrent_envs), session_timeout_s)


def environment_class(make_env: Any, max_concurrent_envs: int, session_timeout_s: Any) -> type:
    """The ``Environment`` class :func:`openenv_app` serves; checks the arguments."""
    require("openenv", "openenv_app")
    from openenv.core.env_server.interfaces import Environment

    from ._to_openenv import as_openenv_environment

    check_positive_int(max_concurrent_envs, "max_concurrent_envs")
    if session_timeout_s is not None and check_real(session_timeout_s, "session_timeout_s") <= 0:
        raise ValueError(f"session_timeout_s must be > 0, got {session_timeout_s!r}.")
    is_class = isinstance(make_env, type) and issubclass(make_env, Environment)
    cls = make_env if is_class else as_openenv_environment(make_env)
    if max_concurrent_envs > 1 and not cls.SUPPORTS_CONCURRENT_SESSIONS:
        raise ValueError(
            f"max_concurrent_envs={max_concurrent_envs}, but every session would share one "
            "environment. Pass a function building a new environment per session."
        )
    return cls


def served_app(cls: type, slots: SessionSlots, session_timeout_s: float | None) -> FastAPI:
    """OpenEnv's app serving ``cls`` (its ``HTTPEnvServer``'s routes, as ``create_app`` registers
    them, in ``OPENENV_MODE``), its WebSocket sessions admitted by ``slots`` and closed after
    ``session_timeout_s`` idle (:func:`._capacity.admit_sessions`).

    OpenEnv's own limit is the total (``slots`` is the binding one: it counts every worker's
    sessions), and OpenEnv's reaper gets no timeout (module docstring of :mod:`._capacity`).
    The sessions' calls run one at a time, a stalled one letting the next start beside it
    (:mod:`._step_executor`).
    """
    import os

    from fastapi import FastAPI
    from openenv.core.env_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig

    from ._errors import answer_mistakes_clearly

    config = ConcurrencyConfig(max_concurrent_envs=slots.limit, session_timeout=None)
    server = HTTPEnvServer(
        cls, cls.action_type, cls.observation_type, concurrency_config=config, env_name=cls.__name__
    )
    run_sessions_in(server, StepExecutor())
    app = FastAPI(title=f"{cls.__name__}: a TorchRL environment served with OpenEnv")
    server.register_routes(app, mode=os.environ.get("OPENENV_MODE", "simulation"))
    answer_mistakes_clearly(app, factory_failures=getattr(cls, "factory_failures", None))
    return admit_sessions(app, slots, session_timeout_s)


def uvicorn_server(
    app: Any, log_level: str, on_listening: Callable[[Any], None] | None = None
) -> Any:
    """uvicorn's server, which calls ``on_listening(server)`` once it listens, and stops on
    SIGINT and SIGTERM with exit status 0 (uvicorn's own re-raises the signal once stopped: a
    ``KeyboardInterrupt`` traceback and status 1 for Ctrl-C)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and on_listening is not None:
                on_listening(self)

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield  # a background server: the main thread owns the signals
                return
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=_STOP_TIMEOUT_S, ws_ping_timeout=20.0
    )
    return Server(config)


def uvicorn_protocol(server: Any) -> Callable[[], Any]:
    """A started uvicorn ``server``'s protocol factory, as its ``startup`` builds it for its
    listening sockets: for connections accepted elsewhere (``loop.connect_accepted_socket``),
    served and shut down as its own."""
    config = server.config

    def create_protocol() -> Any:
        return config.http_protocol_class(
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )

    return create_protocol


@contextmanager
@boundary("openenv_server")  # signed per step: never across the with block
def openenv_server(
    make_env: Callable[[], EnvBase] | EnvBase | type,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_concurrent_envs: int = 1,
    session_timeout_s: float | None = None,
    startup_timeout_s: float = 30.0,
    log_level: str = "warning",
) -> Iterator[str]:
    """Serves a TorchRL LLM environment with OpenEnv's server in a background thread.

    The server (uvicorn, :func:`openenv_app`) listens while the ``with`` block runs and is
    stopped when it ends, whatever happens in it; the block gets the server's base URL, for
    OpenEnv's clients or :class:`~torchrl_trl_interop.OpenEnvChatEnv`.

    Args:
        make_env (callable, EnvBase or Environment subclass): as in :func:`openenv_app`.

    Keyword Args:
        host (str, optional): the address to listen on. Defaults to ``"127.0.0.1"`` (loopback).
        port (int, optional): the port; ``0`` takes a free one. Defaults to ``0``.
        max_concurrent_envs (int, optional): as in :func:`openenv_app`. Defaults to ``1``.
        session_timeout_s (float, optional): as in :func:`openenv_app`. Defaults to ``None``.
        startup_timeout_s (float, optional): the longest wait for the server to listen.
            Defaults to ``30.0``.
        log_level (str, optional): uvicorn's log level. Defaults to ``"warning"``.

    Yields:
        the base URL, ``"http://HOST:PORT"``.

    Raises:
        OSError: if the port cannot be bound.
        TimeoutError: if the server does not start within ``startup_timeout_s``.
        RuntimeError: if the server thread dies while starting.

    Examples:
        >>> from openenv.core import GenericEnvClient
        >>> from torchrl_trl_interop.testing import toy_tool_env
        >>> with openenv_server(toy_tool_env) as url:
        ...     with GenericEnvClient(base_url=url).sync() as client:
        ...         client.reset(prompt="What is 2 plus 3?").observation["messages"]
        [{'role': 'user', 'content': 'What is 2 plus 3?'}]
    """
    if check_real(startup_timeout_s, "startup_timeout_s") <= 0:
        raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}.")
    app = openenv_app(
        make_env,
        max_concurrent_envs=max_concurrent_envs,
        session_timeout_s=session_timeout_s,
    )
    sock = bound_socket(host, port)
    server = uvicorn_server(app, log_level)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="openenv-server", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the server on {host}:{port} failed to start.")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {startup_timeout_s} s.")
            time.sleep(0.01)
        bound = sock.getsockname()[1]
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(_STOP_TIMEOUT_S)
        if thread.is_alive():  # connections that would not close: stop without waiting
            server.force_exit = True
            thread.join(_STOP_TIMEOUT_S)
        sock.close()
