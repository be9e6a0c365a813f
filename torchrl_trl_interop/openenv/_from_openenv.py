"""OpenEnv environments as a TorchRL ``EnvBase`` in history mode, one OpenEnv session per row.

:class:`OpenEnvChatEnv` reads and writes what a torchrl ``ChatEnv(input_mode="history")`` does:
a reset takes the prompt at ``data_key`` (``"query"``) and returns the conversation at
``("history", "prompt")``; a step takes the policy's ``("history", "full")``, sends its last
(assistant) turn to the OpenEnv environment as the action, and returns the conversation extended
with the environment's reply as the next ``("history", "prompt")``, with the reward and done flag
the environment returned. So torchrl's ``LLMCollector``, this package's
:func:`~torchrl_trl_interop.as_trl_rollout_func` and reward transforms drive any OpenEnv
environment, served (a WebSocket session per row) or in this process.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack, set_list_to_stack
from tensordict.utils import NestedKey
from torchrl.envs import EnvBase

from .._checks import as_mapping, boundary, check_positive_int, check_real, require
from .._conversation import is_message_list, messages_to_history, row_values
from .._keys import (
    DONE_KEY,
    HISTORY_KEY,
    REWARD_KEY,
    as_nested_key,
    key_parts,
    placeholder_turn,
    to_python,
)
from ..rollouts._episodes import REWARDED_KEY, _same_length, _to_messages
from ._sessions import ClientSession, Reply, call_each, close_quietly, open_sessions

__all__ = ["OpenEnvChatEnv"]

_RESET_KEY = "_reset"


def _content_action(content: str) -> dict[str, Any]:
    """The default action: ``{"content": ...}``, what :func:`as_openenv_environment` takes."""
    return {"content": content}


def _observed_messages(observation: dict[str, Any]) -> list[dict[str, Any]]:
    """The default reading of an observation: its ``messages`` (as
    :func:`as_openenv_environment` writes them)."""
    if "messages" not in observation:
        raise KeyError(
            f"the observation has no 'messages' (it holds {sorted(observation)}). Pass "
            "observation_fn=... turning this environment's observations into the messages "
            "they add to the conversation."
        )
    return observation["messages"]


def _filled(rows: list[Any]) -> Any:
    """``[T_i]`` Histories stacked as one ``[B, T]`` History, the shorter ones filled at the end
    with torchrl's placeholder turn (``"<none>"``), as ``ChatEnv`` batches keep one length:
    torchrl's policies (``TransformersWrapper``) cannot read a ragged batch of conversations."""
    width = max(row.shape[-1] for row in rows)
    rows = [
        row.extend(
            messages_to_history([placeholder_turn() for _ in range(width - row.shape[-1])]),
            dim=-1,
            inplace=False,
        )
        if row.shape[-1] < width
        else row
        for row in rows
    ]
    return lazy_stack(rows)


def _raise_first(replies: list[Any]) -> None:
    """Raises the first row's failure of a batch of calls (every call has ended)."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


class OpenEnvChatEnv(EnvBase):
    """An OpenEnv environment as a TorchRL LLM environment in history mode.

    Each row of the batch is one OpenEnv session: a WebSocket session of a served environment
    (OpenEnv's ``GenericEnvClient``), or an ``Environment`` in this process. The environment
    reads and writes what a torchrl ``ChatEnv(input_mode="history")`` does, so torchrl's
    ``LLMCollector``, :func:`~torchrl_trl_interop.as_trl_rollout_func` and reward transforms drive
    it as they drive a ``ChatEnv``:

    * **reset**: each row's prompt at ``data_key`` (``"query"``: a str or a History, as a
      ``ChatEnv`` takes it) is sent as ``reset(prompt=...)`` (``prompt_kwarg``), with the
      columns named by ``reset_kwargs_keys``; the observation's messages (``observation_fn``)
      become the conversation, ``("history", "prompt")``. If the observation has none, the
      prompt is the conversation, as a ``ChatEnv`` makes it. Without a prompt in the input, the
      OpenEnv environment's reset serves its own.
    * **step**: the last turn of the policy's ``("history", "full")``, an assistant turn, is sent
      as ``action_fn(content)``; the next ``("history", "prompt")`` is ``("history", "full")`` and
      the messages the observation adds; the reward goes to ``("next", "reward")`` (shape
      ``[*batch, 1, 1]``, as torchrl's LLM reward transforms write it) and the done flag to
      ``("next", "done")`` and ``("next", "terminated")``. OpenEnv environments often reward
      only the last step (``reward=None`` before): a step without a reward writes ``0.0``,
      which adds nothing to a return (``MCAdvantage``'s sums stay finite), and
      ``("next", "rewarded")`` (bool, ``[*batch, 1]``) says which steps the environment
      rewarded, so an episode never rewarded is told from one rewarded ``0.0``:
      :func:`~torchrl_trl_interop.as_trl_rollout_func` sums the rewarded steps only and gives
      TRL ``env_reward=None`` for an episode without any. Rows already done are not sent again
      (nor rows torchrl's partial steps leave out, ``"_step"``): they keep their conversation,
      with reward 0.0. Conversations of one batch keep one length: the shorter ones (rows
      done, or given fewer messages) are filled with torchrl's placeholder turn
      (``"<none>"``), as a ``ChatEnv`` batch, so torchrl's ``TransformersWrapper`` and
      ``LLMCollector`` drive rows that end at different steps. Under ``LLMCollector``, the rows
      it resets while others play get conversations as long as the others' (torchrl keeps
      the others' as they are): a reset prompt of more turns than a conversation still playing
      is refused (``ValueError``).
    * **served**: the rows' calls go to their servers at once (a thread per session), so a
      batch's steps overlap on the servers; the sessions of a list of servers are spread over
      them, as many on each as its ``/health`` says it admits.

    The defaults speak the format of :func:`~torchrl_trl_interop.as_openenv_environment`
    (``{"content": ...}`` actions, ``messages`` in observations), so a TorchRL environment served
    through OpenEnv and wrapped back plays the same episodes as the environment itself. Other
    environments need ``action_fn`` and ``observation_fn``.

    Args:
        env (str, list of str, Environment, EnvClient or callable): the OpenEnv environment: a
            server's URL (``"http://127.0.0.1:8000"``; one WebSocket session per row), a list of
            servers' URLs (the rows spread over them: first as many on each as its ``/health``
            says it admits, which this package's servers say, then in turn), an ``Environment``
            instance or an OpenEnv client (one session: ``batch_size=1``), or a zero-argument
            callable returning either, called once per row (an ``Environment`` subclass is one).

    Keyword Args:
        batch_size (int, optional): the number of sessions, rows of the batch. Defaults to ``1``.
        action_fn (callable, optional): the assistant's message (a str) -> the action: a dict
            (sent as is to a server; validated with the environment's ``action_type`` in this
            process) or an OpenEnv ``Action``. Defaults to ``{"content": message}``.
        observation_fn (callable, optional): an observation (a dict of its fields) -> the
            messages it adds to the conversation, a list of ``{"role", "content"}`` dicts.
            Defaults to reading its ``messages`` field.
        prompt_kwarg (str or None, optional): the reset keyword the prompt is sent as. ``None``
            sends none (the environment serves its own prompts). Defaults to ``"prompt"``.
        reset_kwargs_keys (dict, optional): ``{reset keyword: key}``: more columns of the reset
            input sent at reset (e.g. ``{"answer": "answer"}``: a ``DataLoadingPrimer``'s column).
        connect_timeout_s (float, optional): a server's connection limit. Defaults to ``10.0``.
        message_timeout_s (float, optional): the longest wait for a server's reply; past it the
            call raises ``ConnectionError``. Defaults to ``60.0``.

    Raises:
        TypeError: if ``env`` is none of the above, or a function argument is not callable.
        ValueError: if ``batch_size`` is not a positive int, one instance or client is given for
            ``batch_size > 1``, or a timeout is not positive.
        ConnectionError: if a server cannot be reached.

    At reset and step: ``ConnectionError`` naming the server if it goes away, does not answer
    within ``message_timeout_s``, or closed the session (idle past its session timeout);
    ``RuntimeError`` if it refuses the call (an action of another schema, a step before reset,
    no free session: then every session of the environment is closed), or the environment is
    closed (``close()``, or that refusal: build a new one); ``ValueError`` if the policy's
    conversation does not extend the environment's by one assistant turn, or an observation
    adds no valid messages. A row's failure is raised once every row's call has ended.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop import as_openenv_environment, history_to_messages
        >>> from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_tool_call, toy_tool_env
        >>> env = OpenEnvChatEnv(as_openenv_environment(toy_tool_env))  # in this process
        >>> td = env.reset(TensorDict({"query": ["What is 2 plus 3?"]}, batch_size=[1]))
        >>> policy = ScriptedChatPolicy([toy_tool_call(2, 3), "2 plus 3 is 5."])
        >>> rollout = env.rollout(2, policy, tensordict=td, auto_reset=False)
        >>> rollout["next", "reward"].flatten().tolist()
        [0.0, 1.0]
        >>> history_to_messages(rollout[0, 0]["next", "history", "prompt"])[-1]
        {'role': 'tool', 'content': 'Tool add executed successfully:\\n5'}
        >>> env.close()
    """

    data_key: str = "query"
    input_mode: str = "history"
    policy_role: str = "assistant"

    @boundary("OpenEnvChatEnv")
    def __init__(
        self,
        env: Any,
        *,
        batch_size: int = 1,
        action_fn: Callable[[str], Any] | None = None,
        observation_fn: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
        prompt_kwarg: str | None = "prompt",
        reset_kwargs_keys: Mapping[str, NestedKey] | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        require("openenv", "OpenEnvChatEnv")
        check_positive_int(batch_size, "batch_size")
        for arg, fn in (("action_fn", action_fn), ("observation_fn", observation_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{arg} must be callable, got {fn!r:.100}.")
        if prompt_kwarg is not None and not isinstance(prompt_kwarg, str):
            raise TypeError(f"prompt_kwarg must be a str or None, got {prompt_kwarg!r}.")
        mapping = as_mapping(reset_kwargs_keys, "reset_kwargs_keys", "{reset keyword: key}")
        for arg, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("message_timeout_s", message_timeout_s),
        ):
            if check_real(value, arg) <= 0:
                raise ValueError(f"{arg} must be > 0, got {value!r}.")
        super().__init__(batch_size=torch.Size([batch_size]))
        self.action_fn = action_fn or _content_action
        self.observation_fn = observation_fn or _observed_messages
        self.prompt_kwarg = prompt_kwarg
        self.reset_kwargs_keys = {
            str(k): as_nested_key(v, f"reset_kwargs_keys[{k!r}]") for k, v in mapping.items()
        }
        self._sessions = open_sessions(
            env,
            batch_size,
            connect_timeout_s=float(connect_timeout_s),
            message_timeout_s=float(message_timeout_s),
        )
        for session in self._sessions:
            session.group = self._sessions
        served = sum(isinstance(s, ClientSession) for s in self._sessions)
        self._pool = (
            ThreadPoolExecutor(max_workers=served, thread_name_prefix="openenv-row")
            if served > 1
            else None
        )
        self._closed_by: str | None = None  # why the sessions were closed, once they are
        self._width = 0  # the conversations' length in the last output (partial resets match it)
        # an environment dropped without close() (a re-run notebook cell) gives its sessions
        # back when collected: a server's slots are not held by an object nobody can reach
        self._release = weakref.finalize(self, close_quietly, list(self._sessions))
        self._release.atexit = False  # at exit the process's sockets close anyway
        self._chats: list[list[dict[str, Any]] | None] = [None] * batch_size
        self._done = [False] * batch_size
        self._seed: int | None = None
        self._make_specs()

    def _make_specs(self) -> None:
        from torchrl.data import Binary, Composite, NonTensor, Unbounded
        from torchrl.modules.llm.policies import ChatHistory

        shape = self.batch_size
        history = HISTORY_KEY[0]
        self.full_observation_spec = Composite(
            {
                history: ChatHistory.default_spec(shape=shape, keys=["prompt"]),
                REWARDED_KEY: Binary(n=1, shape=(*shape, 1), dtype=torch.bool),
            },
            shape=shape,
        )
        self.full_action_spec = Composite(
            {history: ChatHistory.default_spec(shape=shape, keys=["full"])}, shape=shape
        )
        self.full_state_spec = Composite(
            {self.data_key: NonTensor(example_data="a string", shape=shape)}, shape=shape
        )
        self.full_reward_spec = Composite(
            {REWARD_KEY: Unbounded(shape=(*shape, 1, 1))}, shape=shape
        )

    def __repr__(self) -> str:
        places = list(dict.fromkeys(s.where for s in self._sessions)) or ["nothing (closed)"]
        where = places[0] if len(places) == 1 else f"{len(places)} servers {places}"
        return f"{type(self).__name__}(batch_size={tuple(self.batch_size)}, env={where})"

    def _check_open(self, what: str) -> None:
        if self._closed_by is not None:
            raise RuntimeError(
                f"{what} on an environment whose sessions were closed ({self._closed_by}). "
                "Build a new OpenEnvChatEnv(...) with the same arguments to open new "
                "sessions."
            )

    # -- reset -----------------------------------------------------------------------------------

    def _row_prompts(self, tensordict: TensorDictBase | None) -> list[Any]:
        """Each row's prompt at ``data_key`` (a str or TRL messages), or ``None``s."""
        from torchrl.data.llm import History

        n = self.batch_size[0]
        value = None if tensordict is None else tensordict.get(self.data_key, None)
        if value is None:
            return [None] * n
        if self.prompt_kwarg is None:
            raise ValueError(
                f"the reset input holds a prompt at {self.data_key!r}, but prompt_kwarg=None "
                "sends none. Pass prompt_kwarg='<reset keyword>', or reset without it."
            )
        prompts = _to_messages(value) if isinstance(value, History) else to_python(value)
        if isinstance(prompts, str):
            prompts = [prompts] * n
        if not isinstance(prompts, list) or len(prompts) != n:
            raise ValueError(
                f"expected {n} prompts at {self.data_key!r}, one per row, got {prompts!r:.200}."
            )
        for p in prompts:
            if not (isinstance(p, str) or is_message_list(p)):
                raise TypeError(
                    f"a prompt at {self.data_key!r} must be a str or a list of messages, got "
                    f"{p!r:.100} of type {type(p).__name__}."
                )
        return prompts

    @boundary("OpenEnvChatEnv")  # torchrl's reset calls it: its errors name this environment
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        self._check_open("reset")
        n = self.batch_size[0]
        rows = range(n)
        if tensordict is not None and _RESET_KEY in tensordict.keys():
            mask = tensordict.get(_RESET_KEY).reshape(n, -1).any(-1).tolist()
            rows = [i for i in rows if mask[i]]
        partial = len(rows) < n
        prompts = self._row_prompts(tensordict)
        columns = {
            name: [to_python(v) for v in row_values(tensordict, key_parts(key), name)]
            for name, key in self.reset_kwargs_keys.items()
        }
        seed, self._seed = self._seed, None
        calls = []
        for i in rows:
            kwargs = {name: values[i] for name, values in columns.items()}
            if seed is not None:
                kwargs["seed"] = seed + i
            if prompts[i] is not None:
                kwargs[self.prompt_kwarg] = prompts[i]
            calls.append((self._sessions[i], lambda s=self._sessions[i], k=kwargs: s.reset(**k)))
        replies = call_each(calls, self._pool)
        self._refused_for_capacity(replies)
        for i, reply in zip(rows, replies):
            if isinstance(reply, BaseException):
                continue  # raised below, once the rows that were reset are recorded
            chat = self._messages(reply, i, "reset")
            if not chat and prompts[i] is not None:  # the prompt is the conversation, as ChatEnv's
                p = prompts[i]
                chat = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
            if not chat:
                raise ValueError(
                    f"{self._sessions[i].where} returned no messages at reset and no prompt "
                    f"was sent; pass a prompt at {self.data_key!r} or an observation_fn "
                    "reading the reset observation's prompt."
                )
            self._chats[i], self._done[i] = chat, False
        _raise_first(replies)
        # torchrl keeps the rows still playing as the last output left them (self._width long)
        width = self._width if partial else 0
        if width and any(len(self._chats[i]) > width for i in rows):
            longest = max(len(self._chats[i]) for i in rows)
            raise ValueError(
                f"the rows reset while others play got conversations of {longest} turns, "
                f"longer than those still playing ({width}): torchrl keeps the playing "
                "rows' conversations as they are, and a batch of conversations of different "
                "lengths cannot be read by torchrl's policies. Give prompts of fewer turns, "
                "or drive the environment with env.rollout(...) or as_trl_rollout_func, "
                "which reset the whole batch."
            )
        with set_list_to_stack(True):
            chats = [c or [placeholder_turn()] for c in self._chats]  # a row never reset
            chats = [c + [placeholder_turn()] * (width - len(c)) for c in chats]
            out = self._history_td(messages_to_history(_same_length(chats)))
            out.set(REWARDED_KEY, torch.zeros(n, 1, dtype=torch.bool))
        self._width = max(len(c) for c in chats)
        if tensordict is not None:  # keep the prompt and the row's columns, as ChatEnv does
            reserved = [HISTORY_KEY[0], _RESET_KEY, "next", *self.done_keys, *self.reward_keys]
            kept = tensordict.exclude(*reserved)
            out = kept.to_lazystack(0).update(out) if kept.keys() else out
        return out

    def _refused_for_capacity(self, replies: list[Any]) -> None:
        """A reset refused by a full server closes every session (the slots the other rows
        hold are given back now) and raises that refusal."""
        for err in replies:
            if isinstance(err, RuntimeError) and "CAPACITY_REACHED" in str(err):
                self.close(raise_if_closed=False)
                self._closed_by = "a full server refused a reset"
                raise RuntimeError(
                    f"{err} This environment's sessions were closed: build a new one."
                ) from err

    # -- step ------------------------------------------------------------------------------------

    @boundary("OpenEnvChatEnv")  # torchrl's step calls it
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._check_open("step")
        n = self.batch_size[0]
        rewards, rewarded = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        with set_list_to_stack(True):
            full = tensordict.get(HISTORY_KEY)
            chats = _to_messages(full)
            added: list[list[dict[str, Any]]] = [[] for _ in range(n)]
            stepped = tensordict.get("_step", None)  # torchrl's partial steps
            stepped = [True] * n if stepped is None else stepped.reshape(n, -1).any(-1).tolist()
            playing = [i for i in range(n) if stepped[i] and not self._done[i]]
            actions = {i: self.action_fn(self._assistant_turn(chats[i], i)) for i in playing}
            calls = [
                (self._sessions[i], lambda s=self._sessions[i], a=actions[i]: s.step(a))
                for i in playing
            ]
            replies = call_each(calls, self._pool)
            for i, reply in zip(playing, replies):
                if isinstance(reply, BaseException):
                    continue  # raised below, once the rows that stepped are recorded
                added[i] = self._messages(reply, i, "step")
                if reply.reward is not None:  # None: this step gives no reward, adds nothing
                    rewards[i], rewarded[i] = float(reply.reward), True
                self._chats[i], self._done[i] = chats[i] + added[i], reply.done
            _raise_first(replies)
            rows = [full[i] for i in range(n)]
            rows = [
                row.extend(messages_to_history(new), inplace=False, dim=-1) if new else row
                for row, new in zip(rows, added)
            ]
            out = self._history_td(_filled(rows))
            self._width = out.get(HISTORY_KEY[0]).prompt.shape[-1]
        done = torch.tensor(self._done).reshape(n, 1)
        out.set(REWARD_KEY, rewards.reshape(n, 1, 1))
        out.set(REWARDED_KEY, rewarded.reshape(n, 1))
        out.set(DONE_KEY, done)
        out.set("terminated", done.clone())
        return out

    def _assistant_turn(self, chat: list[dict[str, Any]], i: int) -> str:
        """The content of the policy's one new turn in row ``i``'s conversation."""
        known = self._chats[i]
        if known is None:
            raise RuntimeError(f"step before reset (row {i}); call env.reset() first.")
        new, extends = chat[len(known) :], chat[: len(known)] == known
        if not extends or len(new) != 1 or new[0]["role"] != self.policy_role:
            raise ValueError(
                f"row {i}'s ('history', 'full') should be the environment's conversation plus "
                f"one {self.policy_role!r} turn (an OpenEnv step takes one message), got "
                f"{len(new)} new turns {[m['role'] for m in new]} after {len(known)} known "
                f"ones{'' if extends else ' (which differ)'}."
            )
        return new[0]["content"]

    def _messages(self, reply: Reply, i: int, what: str) -> list[dict[str, Any]]:
        messages = self.observation_fn(reply.observation)
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError(
                f"observation_fn returned {messages!r:.200} for row {i}'s {what}; expected a "
                "list of {'role': ..., 'content': ...} messages."
            )
        if messages:
            messages_to_history(messages)  # raises naming the bad message
        return [dict(m) for m in messages]

    def _history_td(self, prompt: Any) -> TensorDictBase:
        from torchrl.modules.llm.policies import ChatHistory

        out = TensorDict(batch_size=self.batch_size).to_lazystack(0)
        out.set(HISTORY_KEY[0], ChatHistory(prompt=prompt, batch_size=self.batch_size))
        return out

    def _set_seed(self, seed: int | None) -> None:
        """OpenEnv seeds at reset: the next reset sends ``seed=seed + row`` to each session."""
        self._seed = seed

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Closes every session (a client's WebSocket, an in-process environment); a later
        reset or step raises, saying so."""
        sessions, self._sessions = getattr(self, "_sessions", []), []
        if getattr(self, "_closed_by", None) is None:
            self._closed_by = "close() was called"
        release = getattr(self, "_release", None)
        if release is not None:
            release.detach()
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=False)
        errors = []
        for session in sessions:
            try:
                session.close()
            except Exception as err:  # a server already gone: close the others anyway
                errors.append(err)
        super().close(raise_if_closed=raise_if_closed)
        if errors:
            raise errors[0]
