"""One episode of a TorchRL ``ChatEnv`` played one turn at a time, for TRL and OpenEnv alike.

TRL's ``environment_factory`` (:mod:`._tool_env`) and the OpenEnv server
(:mod:`torchrl_trl_interop.openenv._to_openenv`) both play one conversation of a history-mode
``ChatEnv`` with ``batch_size=(1,)``: they reset it from a dataset row, step it with one turn of
the model, and read the reward, the done flag and the turns the environment added. The steps are
written here once:

* :func:`check_chat_env`: the environment is a history-mode ``ChatEnv`` (or a ``TransformedEnv``
  around one) playing one conversation;
* :func:`reset_input` and :func:`reset_episode`: the prompt at the ChatEnv's ``data_key`` (text as
  text, messages as a History) and the row's other columns in the reset tensordict, numbers as
  tensors and everything else as non-tensor data, as :func:`~torchrl_trl_interop.rows_to_tensordict`
  stores them;
* :func:`step_episode`: the turn appended to ``("history", "prompt")`` and written as
  ``("history", "full")`` the way a TorchRL policy writes it, then the package's step
  (:func:`._env_step.step`, :func:`._env_step.step_mdp`: torchrl's step without its defensive
  copies, the same result);
* :func:`conversation`: the conversation as TRL messages, torchrl's padding turns dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from tensordict import NonTensorStack, TensorDict, set_list_to_stack
from tensordict.utils import NestedKey

from .._conversation import history_to_messages, is_message_list, messages_to_history
from .._keys import HISTORY_KEY, PROMPT_HISTORY_KEY, key_parts, without_placeholders
from .._upstream._env_step import reset, step, step_mdp
from ._episodes import find_env_problem

__all__ = [
    "ChatStep",
    "check_chat_env",
    "conversation",
    "reset_episode",
    "reset_input",
    "step_episode",
]

_CHAT_HISTORY = key_parts(HISTORY_KEY)[0]  # "history": a ChatHistory (prompt, response, full)


def check_chat_env(env: Any, why: str) -> Any:
    """``env``'s base ``ChatEnv``; raises unless ``env`` plays one history-mode conversation.

    Args:
        env: what the user's ``make_env`` returned.
        why (str): why one conversation at a time, said in the batch-size error.

    Raises:
        TypeError: if ``env`` is not a torchrl environment, or its base reads no prompt.
        ValueError: if its ChatEnv is not in ``input_mode="history"`` or its batch size is not
            ``(1,)``.

    Examples:
        >>> from torchrl.envs.llm import ChatEnv
        >>> check_chat_env(ChatEnv(batch_size=(1,), input_mode="history"), "").input_mode
        'history'
        >>> check_chat_env(ChatEnv(batch_size=(2,), input_mode="history"), "one at a time")
        Traceback (most recent call last):
        ...
        ValueError: make_env returned an environment with batch_size=(2,); one at a time: build it with batch_size=(1,).
    """
    from torchrl.envs import EnvBase

    if not isinstance(env, EnvBase):
        raise TypeError(
            f"make_env returned {env!r:.100} of type {type(env).__name__}; expected a "
            "torchrl environment: a ChatEnv (input_mode='history') or a TransformedEnv "
            "around one."
        )
    problem = find_env_problem(env, own_prompts=True)
    if problem is not None:
        error, reason = problem
        raise error(f"make_env returned an environment that cannot be used: {reason}.")
    if tuple(env.batch_size) != (1,):
        raise ValueError(
            f"make_env returned an environment with batch_size={tuple(env.batch_size)}; {why}: "
            "build it with batch_size=(1,)."
        )
    return getattr(env, "base_env", env)


def conversation(history: Any) -> list[dict[str, Any]]:
    """A ``[1, T]`` History as TRL messages, torchrl's ``<none>`` padding turns dropped.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> conversation(messages_to_history([[{"role": "user", "content": "Hi"}]]))
        [{'role': 'user', 'content': 'Hi'}]
    """
    return without_placeholders(history_to_messages(history)[0])  # not history[0]: 6x slower


def _column(value: Any) -> Any:
    """One row's column as one entry of a ``[1]`` tensordict."""
    if isinstance(value, (bool, int, float)):
        return torch.tensor([value])
    return NonTensorStack(value)


def reset_input(
    env: Any,
    prompt: str | list[dict[str, Any]] | None,
    columns: Mapping[str, Any],
    *,
    fix: str = "rename them",
    error: type[Exception] = ValueError,
) -> TensorDict:
    """The reset tensordict of ``env``: ``prompt`` at its ``data_key``, the row's ``columns``.

    Args:
        env: a history-mode ChatEnv with ``batch_size=(1,)`` (or a ``TransformedEnv`` around one).
        prompt (str, list of messages or None): text (the ChatEnv makes it a user turn), a
            conversation (a History), or ``None`` for an environment serving its own prompts.
        columns (dict): the row's other columns, put into the tensordict where transforms read
            them: numbers as ``[1]`` tensors, anything else as non-tensor data.

    Keyword Args:
        fix (str, optional): what to do about a column named like an entry of the environment.
        error (type, optional): the exception raised for such a column. Defaults to
            ``ValueError``.

    Raises:
        TypeError: if ``prompt`` is neither a str nor a list of messages.
        ValueError: (or ``error``) if a column has the name of one of the environment's entries.

    Examples:
        >>> from torchrl.envs.llm import ChatEnv
        >>> env = ChatEnv(batch_size=(1,), input_mode="history")
        >>> td = reset_input(env, "Hi", {"answer": "5", "level": 3})
        >>> list(td["query"]), list(td["answer"]), td["level"]
        (['Hi'], ['5'], tensor([3]))
        >>> reset_input(env, "Hi", {"history": "x"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the row columns ['history'] have the names of ... (its entries: [...]).
    """
    base = getattr(env, "base_env", env)
    specs = (env.full_observation_spec, env.full_state_spec, env.full_action_spec)
    specs += (env.full_done_spec, env.full_reward_spec)
    taken = {k for spec in specs for k in spec.keys()} | {_CHAT_HISTORY, "next", base.data_key}
    clash = sorted(set(columns) & taken)
    if clash:
        hint = " (the prompt goes in prompt=...)" if base.data_key in clash else ""
        raise error(
            f"the row columns {clash} have the names of the environment's own entries; "
            f"{fix}{hint} (its entries: {sorted(map(str, taken))})."
        )
    td = TensorDict(batch_size=[1])
    with set_list_to_stack(True):
        if isinstance(prompt, str):
            td.set(base.data_key, NonTensorStack(prompt))
        elif is_message_list(prompt):
            td.set(base.data_key, messages_to_history([prompt]))
        elif prompt is not None:
            raise TypeError(
                "the prompt should be a str or a list of {'role', 'content'} messages, got "
                f"{prompt!r:.200} of type {type(prompt).__name__}."
            )
        for key, value in columns.items():
            td.set(key, _column(value))
    return td


def reset_episode(env: Any, td: TensorDict) -> tuple[Any, list[dict[str, Any]]]:
    """``env.reset(td)`` (:func:`._env_step.reset`: the same reset, its History laid out once)
    and the conversation it starts with, as TRL messages.

    Examples:
        >>> from torchrl.envs.llm import ChatEnv
        >>> env = ChatEnv(batch_size=(1,), input_mode="history")
        >>> td, messages = reset_episode(env, reset_input(env, "Hi", {}))
        >>> messages
        [{'role': 'user', 'content': 'Hi'}]
    """
    with set_list_to_stack(True), torch.no_grad():
        td = reset(env, td)
        return td, conversation(td.get(PROMPT_HISTORY_KEY))


class ChatStep(NamedTuple):
    """What one step of :func:`step_episode` gives."""

    td: Any  #: the next step's input (``step_mdp`` of the step)
    out: Any  #: the step's output, ``td["next"]``
    added: list[dict[str, Any]]  #: the turns the environment added after the model's turn
    conversation: list[dict[str, Any]]  #: the whole conversation after the step
    reward: float | None  #: the sum of the step's reward, ``None`` if it wrote none
    done: bool  #: whether the step's done flag is set


def step_episode(
    env: Any,
    td: Any,
    content: str,
    *,
    reward_key: NestedKey,
    done_key: NestedKey,
    run: Callable[[Callable[[], Any]], Any] | None = None,
) -> ChatStep:
    """Steps ``env`` with the model's turn ``content``, as a TorchRL policy's turn.

    The turn (role: the ChatEnv's ``policy_role``) extends ``("history", "prompt")`` into
    ``("history", "full")``; the environment then steps with the package's step (torchrl's
    result, without its defensive copies).

    Args:
        env: the environment :func:`reset_episode` reset.
        td: the step's input (what :func:`reset_episode` or the last step returned).
        content (str): the model's turn.

    Keyword Args:
        reward_key (NestedKey): the reward in the step's output (``("next", "reward")``).
        done_key (NestedKey): the done flag in the step's output (``("next", "done")``).
        run (callable, optional): runs the environment's step, given as a zero-argument
            callable (e.g. in a thread, with a timeout). Defaults to calling it.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tool_call, toy_tool_env
        >>> env = toy_tool_env()
        >>> td, _ = reset_episode(env, reset_input(env, "What is 2 plus 3?", {}))
        >>> keys = {"reward_key": ("next", "reward"), "done_key": ("next", "done")}
        >>> out = step_episode(env, td, toy_tool_call(2, 3), **keys)
        >>> out.added, out.reward, out.done
        ([{'role': 'tool', 'content': 'Tool add executed successfully:\\n5'}], 0.0, False)
    """
    from torchrl.data.llm import History
    from torchrl.modules.llm.policies import ChatHistory

    role = getattr(getattr(env, "base_env", env), "policy_role", None) or "assistant"
    with set_list_to_stack(True), torch.no_grad():
        prompt = td.get(PROMPT_HISTORY_KEY)
        turn = History(role=role, content=content, is_complete=True).view(1, 1)
        full = prompt.extend(turn, dim=-1, inplace=False)
        td.set(_CHAT_HISTORY, ChatHistory(prompt=prompt, response=turn, full=full, batch_size=[1]))
        td = step(env, td) if run is None else run(lambda: step(env, td))
        reward = td.get(reward_key, None)
        done = td.get(done_key, None)
        out = td.get("next")
        after = conversation(out.get(PROMPT_HISTORY_KEY))
        answered = len(conversation(full))
        return ChatStep(
            td=step_mdp(env, td),
            out=out,
            added=after[answered:],
            conversation=after,
            reward=None if reward is None else float(reward.sum()),
            done=bool(done is not None and done.any()),
        )
