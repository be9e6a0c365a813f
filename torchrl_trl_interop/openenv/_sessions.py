"""One OpenEnv session: an ``Environment`` in this process, or a client of a served one.

Both answer ``reset(**kwargs)`` and ``step(action)`` with a :class:`Reply` in OpenEnv's wire
format (``serialize_observation``: the observation's fields as a dict, its reward and done), so
the TorchRL side reads one format whichever way the environment runs. A client's failures come
back as errors that name the server and what to do: the server's refusals as ``RuntimeError``,
a lost or silent server (connection closed, no reply within ``message_timeout_s``, a session
the server closed) as ``ConnectionError``.

:func:`open_sessions` opens a batch's sessions, spread over several servers when given their
URLs (as many on each as its ``/health`` says it admits); :func:`call_each` runs one call per
session at once, the served ones each in a thread of their own (a batch's steps overlap on
the servers instead of waiting for each other).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from .._checks import type_error

__all__ = [
    "ClientSession",
    "LocalSession",
    "Reply",
    "call_each",
    "close_quietly",
    "open_sessions",
    "plan_rows",
]

#: the WebSocket sessions this process holds open, per server URL
_HELD: Counter = Counter()
#: how long a reset refused for capacity is tried again: a slot another client just gave back
#: is freed by the server a moment after that client's close returns
_CAPACITY_GRACE_S = 2.0


class Reply(NamedTuple):
    """What a reset or a step returned: OpenEnv's wire format."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


class LocalSession:
    """An OpenEnv ``Environment`` instance in this process."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.where = f"the in-process {type(environment).__name__}"

    def _reply(self, observation: Any) -> Reply:
        from openenv.core.env_server.serialization import serialize_observation

        out = serialize_observation(observation)
        return Reply(out["observation"], out["reward"], bool(out["done"]))

    def reset(self, **kwargs: Any) -> Reply:
        return self._reply(self.environment.reset(**kwargs))

    def step(self, action: Any) -> Reply:
        from openenv.core.env_server.types import Action

        if not isinstance(action, Action):
            action_type = getattr(type(self.environment), "action_type", None)
            if action_type is None:
                raise TypeError(
                    f"action_fn returned a {type(action).__name__}, and {self.where} declares "
                    "no action_type to validate it with; make action_fn return an instance "
                    "of the environment's Action class."
                )
            action = action_type.model_validate(action)
        return self._reply(self.environment.step(action))

    def close(self) -> None:
        self.environment.close()


class ClientSession:
    """A WebSocket session of a served environment, through OpenEnv's synchronous client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.url = client.base_url
        self.where = f"the OpenEnv server at {self.url}"
        self.held = False  # counted in _HELD
        self.playing = False  # a reset answered: the server holds an episode of this session
        self.group: list = [self]  # the sessions of its environment, for the capacity hint

    def _capacity_hint(self) -> str:
        mine = [s for s in self.group if getattr(s, "url", None) == self.url]
        others = _HELD[self.url] - sum(s.held for s in mine)
        if others > 0:
            return (
                f" This process still holds {others} other session(s) of this server: "
                "environments not closed (an OpenEnvChatEnv of an earlier run, a re-run "
                "notebook cell). Call close() on them, or drop them (they are released when "
                "collected); then build this one again."
            )
        return (
            f" No other session of this process holds a slot: the server runs fewer concurrent "
            f"sessions than this environment's {len(mine)} session(s) on it plus other "
            "clients' sessions; serve it with more max_concurrent_envs, "
            "or pass more servers' URLs."
        )

    def _lost_session(self, err: BaseException) -> ConnectionError:
        """The server no longer holds this session's episode: OpenEnv's client reconnected
        to a new session (the server closed the old one), which refused the step."""
        return ConnectionError(
            f"{self.where} no longer holds this session: the session was closed (idle past "
            "the server's session timeout, or its server process died or restarted) and "
            f"the step reached a new session, which answered: {err}. The episode is lost: "
            "reset to start another."
        )

    def _call(self, what: str, call: Callable[[], Any]) -> Reply:
        from websockets.exceptions import ConnectionClosed

        deadline = time.monotonic() + _CAPACITY_GRACE_S
        while True:
            try:
                result = call()
                break
            except RuntimeError as err:
                if not str(err).startswith("Server error"):
                    raise
                full = "CAPACITY_REACHED" in str(err)
                if what == "step" and self.playing and (full or "before reset" in str(err)):
                    self.playing = False
                    raise self._lost_session(err) from err
                if full and what == "reset" and time.monotonic() < deadline:
                    time.sleep(0.05)  # a slot given back a moment ago: the server frees it soon
                    continue
                hint = self._capacity_hint() if full else ""
                raise RuntimeError(f"{self.where} refused the {what}: {err}.{hint}") from err
            except ConnectionClosed as err:
                # a refused session's error frame may be lost when its close beats our send
                # (the retry reconnects); past the grace, the server went away
                if what == "reset" and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise self._lost(what, err) from err
            except OSError as err:  # refused, reset, TimeoutError
                raise self._lost(what, err) from err
        self.playing = True
        return Reply(result.observation, result.reward, bool(result.done))

    def _lost(self, what: str, err: BaseException) -> ConnectionError:
        limit = getattr(self.client, "_message_timeout", "its limit")
        cause = (
            f"gave no reply within message_timeout_s={limit}"
            if isinstance(err, TimeoutError)
            else f"went away ({type(err).__name__}: {err})"
        )
        return ConnectionError(
            f"{self.where} {cause} during the {what}. The session and its episode are lost: "
            "check the server (its log, whether it still runs), then reset."
        )

    def connect(self) -> None:
        try:
            self.client.connect()
            self.held = True
            _HELD[self.url] += 1
        except (ConnectionError, OSError) as err:
            raise ConnectionError(
                f"could not connect to {self.where} ({err}). Is it running? Serve a TorchRL "
                "environment with `python -m torchrl_trl_interop.openenv serve "
                "MODULE:make_env --port N`."
            ) from err

    def reset(self, **kwargs: Any) -> Reply:
        return self._call("reset", lambda: self.client.reset(**kwargs))

    def step(self, action: Any) -> Reply:
        payload = action.model_dump() if hasattr(action, "model_dump") else action
        return self._call("step", lambda: self.client.step(payload))

    def close(self) -> None:
        self.playing = False
        if self.held:
            self.held = False
            _HELD[self.url] -= 1
        self.client.close()


def close_quietly(sessions: list) -> None:
    """Closes every session, ignoring errors (a finalizer's job: the environment was dropped,
    or refused by a full server, and nobody is there to hear a failure)."""
    for session in sessions:
        try:
            session.close()
        except Exception:  # noqa: S110 - a server already gone: nothing to release
            pass
    sessions.clear()


def _session_of(value: Any, **client_kwargs: Any) -> LocalSession | ClientSession:
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.sync_client import SyncEnvClient

    if isinstance(value, Environment):
        return LocalSession(value)
    if isinstance(value, str):
        value = GenericEnvClient(base_url=value, **client_kwargs)
    if isinstance(value, EnvClient):
        value = value.sync()
    if isinstance(value, SyncEnvClient):
        session = ClientSession(value)
        session.connect()
        return session
    raise TypeError(
        "expected an OpenEnv Environment, an OpenEnv client (EnvClient, GenericEnvClient) or "
        f"a server URL, got {value!r:.100} of type {type(value).__name__}."
    )


def _free_slots(url: str, timeout_s: float) -> int | None:
    """How many more sessions the server at ``url`` admits, from its ``/health`` (this
    package's servers say; OpenEnv's own do not: ``None``, as for a server not answering)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as reply:
            sessions = json.loads(reply.read())["sessions"]
        return max(0, int(sessions["max"]) - int(sessions["open"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan_rows(urls: Sequence[str], n: int, free: Sequence[int | None]) -> list[str]:
    """The server of each of ``n`` rows: in turn over the servers with ``free`` slots while
    they have some, then in turn over those that do not say how many (else over all: their
    refusal at reset says which is full).

    Examples:
        >>> plan_rows(["a", "b"], 5, [1, 4])
        ['a', 'b', 'b', 'b', 'b']
        >>> plan_rows(["a", "b", "c"], 4, [0, None, 1])
        ['c', 'b', 'b', 'b']
    """
    room = [f or 0 for f in free]
    rows: list[str] = []
    while len(rows) < n and any(room):
        for i, url in enumerate(urls):
            if room[i] > 0 and len(rows) < n:
                rows.append(url)
                room[i] -= 1
    rest = [url for url, f in zip(urls, free) if f is None] or list(urls)
    rows += [rest[i % len(rest)] for i in range(n - len(rows))]
    return rows


def _urls(env: Any) -> list[str] | None:
    """``env`` as a list of server URLs, if it is one (``None`` otherwise)."""
    if not isinstance(env, (list, tuple)):
        return None
    if not env or not all(isinstance(u, str) for u in env):
        raise type_error("env", "a non-empty list of OpenEnv server URLs (str)", env)
    if len(set(env)) != len(env):
        raise ValueError(f"env lists a server twice: {list(env)}.")
    return list(env)


def open_sessions(
    env: Any,
    n: int,
    *,
    connect_timeout_s: float,
    message_timeout_s: float,
) -> list[LocalSession | ClientSession]:
    """``n`` sessions of ``env``: a server URL (``n`` WebSocket sessions), a list of them (the
    rows spread over the servers, :func:`plan_rows` by what each one's ``/health`` admits), an
    ``Environment`` instance or a client (one session: ``n`` must be 1), or a zero-argument
    callable returning either (called ``n`` times; an ``Environment`` subclass is one). Errors,
    here and in the sessions' calls, open with the public call being made
    (:func:`~torchrl_trl_interop._checks.boundary`).

    Raises:
        TypeError: if ``env`` (or what the callable returns) is none of these.
        ValueError: if a single instance or client is given for ``n > 1`` sessions, or a list
            names a server twice.
        ConnectionError: if a server cannot be reached (named).
    """
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.sync_client import SyncEnvClient

    client_kwargs = {"connect_timeout_s": connect_timeout_s, "message_timeout_s": message_timeout_s}
    if isinstance(env, (Environment, EnvClient, SyncEnvClient)):
        if n != 1:
            raise ValueError(
                f"one {type(env).__name__} is one OpenEnv session, but batch_size={n}. Pass a "
                "function (or class) building one per row, or the server's URL."
            )
        return [_session_of(env, **client_kwargs)]
    urls = _urls(env)
    if urls is None and not isinstance(env, str) and not callable(env):
        expected = (
            "an OpenEnv server URL (or a list of them), Environment or client, or a function "
            "building one"
        )
        raise type_error("env", expected, env)
    if urls is not None:
        free = [_free_slots(url, connect_timeout_s) for url in urls] if len(urls) > 1 else [None]
        rows: list[Any] = plan_rows(urls, n, free)
    else:
        rows = [env] * n
    sessions: list[LocalSession | ClientSession] = []
    try:
        for made in rows:
            made = made if isinstance(made, str) else made()
            sessions.append(_session_of(made, **client_kwargs))
    except BaseException:
        for session in sessions:
            session.close()
        raise
    return sessions


def call_each(
    calls: Sequence[tuple[LocalSession | ClientSession, Callable[[], Reply]]],
    pool: ThreadPoolExecutor | None,
) -> list[Reply | BaseException]:
    """Runs every ``(session, call)``: those of served sessions at once in ``pool`` (a batch's
    steps overlap on the servers), those of in-process ones here, in order. Returns each call's
    reply or the exception it raised, in order, once every call has ended (each bounded by its
    client's ``message_timeout_s``)."""
    futures = {}
    if pool is not None and len(calls) > 1:
        futures = {
            i: pool.submit(call)
            for i, (session, call) in enumerate(calls)
            if isinstance(session, ClientSession)
        }
    out: list[Reply | BaseException] = []
    for i, (_, call) in enumerate(calls):
        try:
            out.append(futures[i].result() if i in futures else call())
        except Exception as err:  # the caller raises the first, after every call ended
            out.append(err)
    return out
