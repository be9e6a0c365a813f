"""TorchRL LLM environments as OpenEnv environments: one episode per OpenEnv session.

:func:`as_openenv_environment` returns an ``openenv.core.env_server.interfaces.Environment``
subclass, built with no argument, so OpenEnv's own server serves it
(``create_app(cls, cls.action_type, cls.observation_type)``). Each instance plays one episode
at a time of a TorchRL ``ChatEnv`` in history mode (``batch_size=(1,)``): ``reset`` gives the
prompt to the ChatEnv, ``step`` appends the assistant's message to the conversation exactly as a
TorchRL policy writes it (``("history", "full")``) and steps the environment, so its transforms
(tools, reward parsers, replies, step counters) run as they do under a TorchRL collector.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .._checks import (
    boundary,
    check_real,
    is_int,
    require,
    speaking_for,
    type_error,
)

require("openenv", "as_openenv_environment")

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import EnvironmentMetadata, State  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from tensordict import TensorDict, TensorDictBase  # noqa: E402
from tensordict.utils import NestedKey  # noqa: E402
from torchrl.envs import EnvBase  # noqa: E402

from .._keys import (  # noqa: E402
    DONE_KEY,
    NEXT_DONE_KEY,
    NEXT_REWARD_KEY,
    REWARD_KEY,
    as_nested_key,
    key_parts,
)
from ..rollouts._chat_episode import (  # noqa: E402
    check_chat_env,
    reset_episode,
    reset_input,
    step_episode,
)
from ..rollouts._trl_prompts import has_prompt_source  # noqa: E402
from ._wire import (  # noqa: E402
    RequestStateError,
    RequestTypeError,
    RequestValueError,
    TorchRLChatAction,
    TorchRLChatObservation,
    tool_schemas,
)

__all__ = ["as_openenv_environment"]

_END_KEYS = ("terminated", "truncated")
_ONE_EPISODE = (
    "an OpenEnv session plays one episode (the server runs one environment per session: "
    "max_concurrent_envs)"
)
#: envs owned by a live instance: a factory returning one twice would share an episode
_OWNED: weakref.WeakSet = weakref.WeakSet()


def _under_next(key: NestedKey) -> tuple[str, ...]:
    """A key of the step's ``"next"`` entry as a key of the step's output."""
    return ("next", *key_parts(key))


class _TorchRLEnvironment(Environment[TorchRLChatAction, TorchRLChatObservation, State]):
    """The class :func:`as_openenv_environment` subclasses (see there)."""

    action_type = TorchRLChatAction
    observation_type = TorchRLChatObservation
    SUPPORTS_CONCURRENT_SESSIONS = True
    _make_env: Callable[[], EnvBase] | None = None
    _shared_env: EnvBase | None = None
    _reward_key: NestedKey = NEXT_REWARD_KEY  # in the step's output, under "next"
    _done_key: NestedKey = NEXT_DONE_KEY
    #: why building an instance failed, oldest first: the served app's FACTORY_ERROR replies
    #: give the reason, which OpenEnv's server leaves out (``_errors``)
    factory_failures: deque | None = None

    def __init__(self) -> None:  # OpenEnv's server builds one per session
        try:
            self._build()
        except Exception as err:
            if self.factory_failures is not None:
                self.factory_failures.append(f"{type(err).__name__}: {err}")
            raise

    @boundary("as_openenv_environment")  # signs the error before __init__ records it
    def _build(self) -> None:
        super().__init__()
        owns = self._shared_env is None
        env = self._make_env() if owns else self._shared_env
        self._base = check_chat_env(env, _ONE_EPISODE)
        if owns:
            if env in _OWNED:
                raise ValueError(
                    "make_env returned an environment another live instance already plays, "
                    "so two sessions would share one episode. Build a new environment in "
                    "each call, or pass the environment itself (one session at a time)."
                )
            _OWNED.add(env)
        self.env, self._owns = env, owns
        self._primed = has_prompt_source(env)
        self._tools = tool_schemas(env)
        self._td: TensorDictBase | None = None
        self._episode_id: str | None = None
        self._steps, self._done = 0, False
        self._running: threading.Thread | None = None  # a step that outlived its timeout

    # -- OpenEnv's interface ---------------------------------------------------------------------

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        prompt: str | list[dict[str, Any]] | None = None,
        **row: Any,
    ) -> TorchRLChatObservation:
        """Starts an episode with ``prompt`` (the ChatEnv's ``data_key``); ``row``'s other
        columns go into the reset tensordict, where the environment's transforms read them."""
        self._check_idle()
        if seed is not None and not is_int(seed):
            raise RequestTypeError(
                f"{type(self).__name__}.reset: seed must be an int, got {seed!r}."
            )
        if episode_id is not None and not isinstance(episode_id, str):
            raise RequestTypeError(
                f"{type(self).__name__}.reset: episode_id must be a str, got {episode_id!r:.100}."
            )
        td = self._reset_input(prompt, row)
        if seed is not None:
            self.env.set_seed(seed)
        self._td, conversation = reset_episode(self.env, td)
        self._episode_id = episode_id if episode_id is not None else str(uuid.uuid4())
        self._steps, self._done = 0, False
        return TorchRLChatObservation(
            messages=conversation,
            conversation=conversation,
            tools=[dict(t) for t in self._tools],
            done=False,
            reward=None,
        )

    def step(
        self, action: TorchRLChatAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TorchRLChatObservation:
        """Appends the assistant's message and steps the environment (within ``timeout_s``)."""
        name = type(self).__name__
        if kwargs:
            raise RequestTypeError(
                f"{name}.step got unexpected keyword arguments {sorted(kwargs)}."
            )
        action = self._as_action(action)
        if timeout_s is not None:
            with speaking_for(f"{name}.step"):  # the class: named by the user
                timeout_s = check_real(timeout_s, "timeout_s")
            if timeout_s <= 0:
                raise RequestValueError(f"{name}.step: timeout_s must be > 0, got {timeout_s}.")
        self._check_idle()
        if self._td is None:
            raise RequestStateError(
                f"{name}.step was called before reset(), or after a step that timed out: call "
                "reset(prompt=...) to start an episode first."
            )
        if self._done:
            raise RequestStateError(
                f"{name}.step: the episode {self._episode_id} is done (after {self._steps} "
                "steps); call reset() to start another."
            )
        keys = {"reward_key": self._reward_key, "done_key": self._done_key}
        run = lambda call: self._run(call, timeout_s)  # noqa: E731
        out = step_episode(self.env, self._td, action.content, run=run, **keys)
        self._td, self._done = out.td, out.done
        self._steps += 1
        return TorchRLChatObservation(
            messages=out.added,
            conversation=out.conversation,
            reward=out.reward,
            done=self._done,
            metadata={k: bool(out.out.get(k).any()) for k in _END_KEYS if k in out.out.keys()},
        )

    @property
    def state(self) -> State:
        """The episode's id and the number of steps taken in it."""
        return State(episode_id=self._episode_id, step_count=self._steps)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=type(self).__name__,
            description=f"A TorchRL {type(self.env).__name__} served with OpenEnv "
            "(torchrl_trl_interop.as_openenv_environment): send the assistant's message as "
            "{'content': ...}.",
        )

    def close(self) -> None:
        """Closes the environment if this instance built it (a shared one stays open)."""
        if self._owns:
            _OWNED.discard(self.env)
            self.env.close(raise_if_closed=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env={type(self.env).__name__}, steps={self._steps})"

    # -- helpers ---------------------------------------------------------------------------------

    def _reset_input(self, prompt: Any, row: dict[str, Any]) -> TensorDict:
        name = f"{type(self).__name__}.reset"
        if prompt is None and not self._primed:
            raise RequestValueError(
                f"{name} needs prompt=... (a str or a list of messages): the ChatEnv reads "
                f"{self._base.data_key!r} at reset and the environment holds no "
                "DataLoadingPrimer to serve one."
            )
        if prompt is not None and self._primed:
            raise RequestValueError(
                f"{name} got prompt=..., but the environment serves its own prompts (a "
                "DataLoadingPrimer), which would replace it. Reset without prompt=, or drop the "
                "DataLoadingPrimer."
            )
        try:
            with speaking_for(name):
                return reset_input(self.env, prompt, row, error=RequestValueError)
        except TypeError as err:
            raise RequestTypeError(str(err)) from err

    def _as_action(self, action: Any) -> TorchRLChatAction:
        name = f"{type(self).__name__}.step"
        if isinstance(action, TorchRLChatAction):
            return action
        if isinstance(action, Mapping):
            try:
                return TorchRLChatAction.model_validate(dict(action))
            except ValidationError as err:
                raise RequestValueError(
                    f"{name}: the action {dict(action)!r:.200} does not match the action schema "
                    f"{{'content': str}} (the assistant's message): {err}"
                ) from err
        raise RequestTypeError(
            f"{name}: action must be a {TorchRLChatAction.__name__} (or a dict "
            f"{{'content': str}}), got {action!r:.100} of type {type(action).__name__}."
        )

    def _check_idle(self) -> None:
        if self._running is not None and self._running.is_alive():
            raise RequestStateError(
                f"{type(self).__name__}: a step that timed out is still running in the "
                "environment; this instance cannot start another until it ends. Open a new "
                "session (a new instance) instead."
            )
        self._running = None

    def _run(self, call: Callable[[], Any], timeout_s: float | None) -> Any:
        """``call()``; with ``timeout_s``, in a thread: the episode is abandoned past it."""
        if timeout_s is None:
            return call()
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = call()
            except BaseException as err:  # re-raised in the caller's thread
                box["err"] = err

        thread = threading.Thread(target=target, name="torchrl-openenv-step", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            self._running, self._td = thread, None
            raise TimeoutError(
                f"{type(self).__name__}.step: the environment did not finish the step within "
                f"timeout_s={timeout_s}; the episode {self._episode_id} is abandoned. Reset once "
                "the step ends, or open a new session."
            )
        if "err" in box:
            raise box["err"]
        return box["out"]


@boundary("as_openenv_environment")
def as_openenv_environment(
    make_env: Callable[[], EnvBase] | EnvBase,
    *,
    name: str = "TorchRLEnvironment",
    reward_key: NestedKey = REWARD_KEY,
    done_key: NestedKey = DONE_KEY,
) -> type[Environment]:
    """Turns a TorchRL LLM environment into an OpenEnv ``Environment`` class.

    The class is built with no argument, so OpenEnv's server serves it as it serves any
    environment: ``create_app(cls, cls.action_type, cls.observation_type)`` (or
    :func:`~torchrl_trl_interop.openenv_app`, or ``python -m torchrl_trl_interop.openenv serve
    MODULE:make_env``). Each instance plays one episode at a time of the environment
    ``make_env()`` returns: a torchrl ``ChatEnv`` in ``input_mode="history"`` with
    ``batch_size=(1,)``, or a ``TransformedEnv`` around one (tools, reward transforms, replies,
    a ``StepCounter``...).

    ======================== ===================================================================
    OpenEnv                  TorchRL
    ======================== ===================================================================
    ``reset``                ``reset(seed=None, episode_id=None, prompt=..., **row)``:
                             ``env.reset`` with ``prompt`` (a str or TRL messages) at the
                             ChatEnv's ``data_key``; every other keyword (a dataset row's
                             columns) set in the reset tensordict, where transforms read it
                             (numbers as tensors, anything else as non-tensor data). Without ``prompt``, an environment with a ``DataLoadingPrimer``
                             serves its own.
    ``step(action)``         ``action.content`` appended as the assistant's turn to
                             ``("history", "prompt")``, written as ``("history", "full")`` the
                             way a TorchRL policy writes it (role: the ChatEnv's
                             ``policy_role``), then one step (``env.step``'s result): the
                             environment's transforms parse it and run its tools.
    observation              ``messages``: the new turns (the prompt at reset, the environment's
                             turns after a step); ``conversation``: all of it; ``tools``: the
                             tools' JSON schemas, at reset (the tools TRL's
                             ``environment_factory`` gets); ``reward``: the sum of
                             ``("next", reward_key)``, ``None`` if the step wrote none;
                             ``done``: ``("next", done_key)``; ``metadata``: ``terminated`` and
                             ``truncated`` when the environment writes them.
    ``state``                the episode id and the number of steps taken.
    ======================== ===================================================================

    ``step(action, timeout_s=...)`` runs the environment's step in a thread and raises
    ``TimeoutError`` if it takes longer: the episode is then abandoned (OpenEnv's WebSocket
    protocol passes no timeout; OpenEnv's client has its own).

    A transform that rewrites earlier turns shows in ``conversation`` only: ``messages`` holds
    the turns after the assistant's message.

    Args:
        make_env (callable or EnvBase): a function building a new environment at each call: each
            instance (each OpenEnv session) then owns its own, and the class allows concurrent
            sessions (``SUPPORTS_CONCURRENT_SESSIONS = True``). Or an environment itself: every
            instance shares it, so the class allows one session at a time.

    Keyword Args:
        name (str, optional): the class name, which OpenEnv's server uses as the environment's
            name. Defaults to ``"TorchRLEnvironment"``.
        reward_key (NestedKey, optional): the step's reward, under ``"next"``. Defaults to
            ``"reward"``.
        done_key (NestedKey, optional): the step's done flag, under ``"next"``. Defaults to
            ``"done"``.

    Returns:
        an ``openenv.core.env_server.interfaces.Environment`` subclass whose ``action_type``
        (``{"content": str}``) and ``observation_type`` are the pydantic models above.

    Raises:
        TypeError: if ``make_env`` is neither callable nor an environment, or (at construction
            of an instance) builds something that is not a ChatEnv-based torchrl environment.
        ValueError: if (at construction of an instance) the environment is not in history mode
            or its batch size is not ``(1,)``, or a factory returns an environment another live
            instance plays.

    An instance's ``reset`` raises ``ValueError`` for a missing prompt (or one a
    ``DataLoadingPrimer`` would replace) and a row column named like an entry of the
    environment, ``TypeError`` for a prompt of another type; ``step`` raises ``ValueError`` or
    ``TypeError`` for an action of another schema, ``RuntimeError`` before ``reset`` and after
    the episode is done.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tool_call, toy_tool_env
        >>> TorchRLEnvironment = as_openenv_environment(toy_tool_env)
        >>> env = TorchRLEnvironment()
        >>> obs = env.reset(prompt="What is 2 plus 3?")
        >>> obs.messages, obs.tools[0]["function"]["name"]
        ([{'role': 'user', 'content': 'What is 2 plus 3?'}], 'add')
        >>> obs = env.step(TorchRLEnvironment.action_type(content=toy_tool_call(2, 3)))
        >>> obs.messages, obs.reward, obs.done
        ([{'role': 'tool', 'content': 'Tool add executed successfully:\\n5'}], 0.0, False)
        >>> obs = env.step({"content": "2 plus 3 is 5."})
        >>> obs.reward, obs.done, env.state.step_count
        (1.0, True, 2)
        >>> env.close()
    """
    shared = make_env if isinstance(make_env, EnvBase) else None
    if shared is None and not callable(make_env):
        expected = "a function building a torchrl environment (or the environment itself)"
        raise type_error("make_env", expected, make_env)
    if shared is not None:
        check_chat_env(shared, _ONE_EPISODE)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier, got {name!r}.")
    attrs = {
        "__module__": __name__,
        "__doc__": f"{make_env!r:.200} as an OpenEnv environment (as_openenv_environment).",
        "_make_env": None if shared is not None else staticmethod(make_env),
        "_shared_env": shared,
        "_reward_key": _under_next(as_nested_key(reward_key, "reward_key")),
        "_done_key": _under_next(as_nested_key(done_key, "done_key")),
        "SUPPORTS_CONCURRENT_SESSIONS": shared is None,
        "factory_failures": deque(maxlen=64),
    }
    return type(name, (_TorchRLEnvironment,), attrs)
