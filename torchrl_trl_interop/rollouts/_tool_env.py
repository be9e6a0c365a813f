"""One TorchRL environment as one TRL environment instance: ``reset``, tool calls, the close.

:class:`TorchRLEnvironment` is the base of the classes
:func:`~torchrl_trl_interop.as_trl_environment_factory` builds. An instance owns one TorchRL
LLM environment (``batch_size=(1,)``) and steps it: ``reset(**row)`` with the row's prompt, each
tool method with the model's call written as the environment's tool transform reads it, and
:meth:`~TorchRLEnvironment._close` with the completion's final answer; :func:`get_reward`
hands TRL the rewards the tool steps wrote. Only ``reset``, ``get_reward`` (which the factory
adds when the environment writes a reward) and the tool methods are public functions: TRL turns
every other public function of the class into a tool. A step's reward reaches TRL once, through
``get_reward`` or the factory's ``reward_func``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensordict import set_list_to_stack

from .._checks import boundary
from .._conversation import is_message_list
from .._keys import PROMPT_HISTORY_KEY
from ._chat_episode import conversation, reset_episode, reset_input, step_episode
from ._tool_outcome import EpisodeOver, awaited, run_tool
from ._tools import tool_transforms
from ._trl_prompts import PLACEHOLDER_PROMPT, has_prompt_source, shown_prompt

if TYPE_CHECKING:  # pragma: no cover
    from ._tools import TorchRLTool

__all__ = ["PUBLIC_NAMES", "TorchRLEnvironment", "get_reward"]

#: the public names of an instance that are not tools
PUBLIC_NAMES = ("reset", "get_reward", "env", "messages", "reward")


def _turns(messages: Sequence[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(m.get("role"), m.get("content")) for m in messages]


def _observation(prompt: list[dict[str, Any]], after_reset: list[dict[str, Any]]) -> str | None:
    """What the environment added at reset, as the text TRL appends to the last prompt message.

    Raises:
        ValueError: if the environment changed the conversation in another way (e.g. a system
            prompt), which the model, prompted by TRL with the dataset's prompt, would not see.
    """
    if _turns(after_reset) == _turns(prompt):
        return None
    last, env_last = prompt[-1], after_reset[-1] if after_reset else {}
    same_start = _turns(after_reset[:-1]) == _turns(prompt[:-1])
    content, env_content = str(last.get("content")), str(env_last.get("content"))
    if same_start and env_last.get("role") == last.get("role") and env_content.startswith(content):
        return env_content[len(content) :]
    raise ValueError(
        f"after reset, the environment's conversation is {_turns(after_reset)!r:.400}, not the "
        f"row's prompt {_turns(prompt)!r:.400} (or the prompt with text appended to its last "
        "message, which reset() could return). TRL prompts the model with the dataset's "
        "prompt, so the model would not see the difference: put a system prompt in the "
        "dataset's prompt instead of the ChatEnv's system_prompt."
    )


def _completion_calls(completion: Any, names: set[str]) -> list[tuple[str, Any]]:
    """The calls to this environment's tools in a TRL completion, in order."""
    calls = []
    for message in completion if isinstance(completion, list) else []:
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            if function.get("name") in names:
                calls.append((function["name"], function.get("arguments")))
    return calls


def _last_turn_calls(completion: Any, names: set[str]) -> list[tuple[str, Any]]:
    """The calls of the completion's last turn, when it is an assistant turn (calls TRL's loop
    may have left unrun)."""
    if not isinstance(completion, list) or not completion:
        return []
    last = completion[-1]
    return _completion_calls([last], names) if last.get("role") == "assistant" else []


def _own_tools(tools: dict[str, TorchRLTool], transforms: list) -> dict[str, TorchRLTool]:
    """``tools`` (listed from the factory's first environment) run by ``transforms``, another
    environment's tool transforms: each tool's transform replaced by the one in its place.

    Raises:
        RuntimeError: if the environment has another number of tool transforms.
    """
    first = list(dict.fromkeys(tool.transform for tool in tools.values()))
    if not first or any(t in transforms for t in first):  # no tool, or the first environment
        return dict(tools)
    if len(transforms) != len(first):
        raise RuntimeError(
            f"this environment has {len(transforms)} tool transforms, the factory's first had "
            f"{len(first)}: make_env must build the same environment every time."
        )
    own = {id(t): mine for t, mine in zip(first, transforms)}
    return {
        name: dataclasses.replace(tool, transform=own[id(tool.transform)])
        for name, tool in tools.items()
    }


def _final_answer(completion: Any) -> str | None:
    """The completion's final answer: its last turn, when it is an assistant turn without calls."""
    if isinstance(completion, str):
        return completion
    last = completion[-1] if completion else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content") or ""
    if isinstance(content, list):  # content blocks
        content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content


class TorchRLEnvironment:
    """Base of the classes :func:`as_trl_environment_factory` builds: one TorchRL env per instance.

    Only ``reset``, ``get_reward`` and the tool methods added by the factory are public
    functions: TRL turns every other public function of the class into a tool.
    """

    _tools: dict[str, TorchRLTool] = {}
    _factory: Any  # the factory that built the class: reward and done keys, row columns
    _token: str = ""

    def __init__(self, env: Any) -> None:
        self._env = env
        #: the class's tools run by this instance's own transforms (the class lists them from
        #: the first environment built; every instance steps, watches and awaits its own)
        self._own_tools = _own_tools(type(self)._tools, tool_transforms(env))
        #: whether the reward was read through ``reward`` (TRL's own examples read
        #: ``env.reward`` in a reward function): ``get_reward`` then counts nothing more
        self._reward_read = False
        self._td: Any = None
        self._rewards: list[float | None] = []
        self._calls: list[tuple[str, dict[str, Any]]] = []
        self._done = False
        self._counted = 0  # rewards already handed to TRL (by get_reward or the reward function)
        self._reward_closed: tuple[bool, float | None] = (False, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tools={list(self._tools)}, steps={len(self._rewards)})"

    @property
    def env(self) -> Any:
        """The TorchRL environment this instance steps."""
        return self._env

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The environment's conversation as TRL messages (its ``("history", "prompt")``)."""
        with set_list_to_stack(True):
            return conversation(self._td.get(PROMPT_HISTORY_KEY)) if self._td is not None else []

    @property
    def reward(self) -> float | None:
        """The sum of the rewards the environment wrote over the episode's steps, ``None`` if none.

        A reward function that reads it (as TRL's own OpenEnv examples do) scores the episode:
        ``get_reward`` then hands TRL nothing more for it, so no reward is counted twice."""
        self._reward_read = True
        written = [r for r in self._rewards if r is not None]
        return sum(written) if written else None

    @boundary("as_trl_environment_factory")
    def reset(self, **row: Any) -> str | None:
        """Resets the TorchRL environment with the row's ``prompt`` (text or messages), or, for
        an environment with its own prompt source (a ``DataLoadingPrimer``), with the prompt it
        serves; the row's other columns (or ``row_keys``) go into the reset tensordict, where
        reward parsers read them (e.g. ``"answer"``). Returns what the environment appended to
        the last message of the prompt TRL shows the model (the row's prompt, or TRL's empty
        user turn when the row has none), or ``None``."""
        prompt = row.get("prompt", PLACEHOLDER_PROMPT)  # TRL's prompt for a row without one
        if not isinstance(prompt, str) and not is_message_list(prompt):
            raise TypeError(
                "the row's prompt should be a str or a list of messages, got "
                f"{type(prompt).__name__}: {prompt!r:.200}."
            )
        messages = shown_prompt(prompt)
        columns = {key: row[key] for key in self._factory._columns(row)}
        own_prompts = has_prompt_source(self._env)
        if own_prompts and messages != PLACEHOLDER_PROMPT:  # a dataset's prompt, not TRL's own
            raise ValueError(
                "the environment serves its own prompts (it holds a DataLoadingPrimer), and "
                f"the dataset row has one too ({row['prompt']!r:.200}): TRL would show the "
                "model the row's prompt with the environment's appended to its last message. "
                "Leave the prompt column out of the dataset (TRL then shows the environment's "
                "prompt alone), or drop the DataLoadingPrimer to prompt from the dataset."
            )
        shown = None if own_prompts else messages
        fix = "pass row_keys=[...] without them"
        td = reset_input(self._env, shown, columns, fix=fix)
        self._td, after_reset = reset_episode(self._env, td)
        self._rewards, self._calls, self._done, self._counted = [], [], False, 0
        self._reward_closed = (False, None)
        return _observation(messages, after_reset)

    def _uncounted_reward(self) -> float | None:
        """The summed reward of the steps not yet handed to TRL, ``None`` if they wrote none."""
        written = [r for r in self._rewards[self._counted :] if r is not None]
        self._counted = len(self._rewards)
        return sum(written) if written else None

    def _step(self, content: str) -> list[dict[str, Any]]:
        """Steps the environment with an assistant turn; the turns it added after it."""
        factory = self._factory
        out = step_episode(
            self._env, self._td, content, reward_key=factory.reward_key, done_key=factory.done_key
        )
        self._td, self._done = out.td, out.done
        self._rewards.append(out.reward)
        return out.added

    def _call_tool(self, name: str, **arguments: Any) -> str:
        """A tool method's body: the call written as the env reads it, one step, the reply.

        Raises:
            ToolFailed: if the tool raised (the environment holds the turn TorchRL wrote).
        """
        tool = self._check_call(name, arguments)
        return run_tool(tool.transform, tool.env_name, lambda: self._reply(tool, arguments))

    async def _acall_tool(self, name: str, **arguments: Any) -> str:
        """An async tool method's body: the tool awaited once, then :meth:`_call_tool`'s step."""
        tool = self._check_call(name, arguments)
        outcome = await awaited(tool.transform, tool.env_name, arguments)
        run = lambda: self._reply(tool, arguments)  # noqa: E731
        return run_tool(tool.transform, tool.env_name, run, outcome)

    def _check_call(self, name: str, arguments: dict[str, Any]) -> TorchRLTool:
        tool = self._own_tools[name]
        self._calls.append((name, dict(arguments)))
        if self._td is None:
            raise RuntimeError(f"tool {name!r} called before reset().")
        if self._done:
            raise EpisodeOver(
                f"The episode is over: the environment ended it after {len(self._rewards)} "
                "steps. Answer without calling a tool."
            )
        tool.signature.signature.bind(**arguments)  # a missing or unknown argument: TypeError
        return tool

    def _reply(self, tool: TorchRLTool, arguments: dict[str, Any]) -> str:
        name = tool.name
        added = self._step(tool.render(arguments))
        if len(added) != 1:
            raise RuntimeError(
                f"after the call to {name!r}, the environment added {len(added)} turns "
                f"({_turns(added)!r:.300}); a tool call expects exactly one reply."
            )
        return added[0]["content"]

    def _close(self, completion: Any) -> float | None:
        """Closes the episode with the completion's final answer (one step); the summed reward
        of the steps not already handed to TRL by ``get_reward``."""
        if self._reward_closed[0]:
            return self._reward_closed[1]
        calls = _completion_calls(completion, set(self._tools))
        # the environment ran every call of the completion, but those of its last turn when
        # TRL's loop stopped there (max_tool_calling_iterations): they are never run
        last_turn = _last_turn_calls(completion, set(self._tools))
        ran = self._calls
        if calls[: len(ran)] != ran or len(ran) < len(calls) - len(last_turn):
            raise ValueError(
                f"this environment ran the calls {self._calls!r:.300}, but the completion it "
                f"is scored with holds {calls!r:.300}: environments= and completions= do not "
                "match one to one."
            )
        final = _final_answer(completion)
        if final is not None and self._td is not None and not self._done:
            self._step(final)
        self._reward_closed = (True, self._uncounted_reward())
        return self._reward_closed[1]


@boundary("as_trl_environment_factory")
def get_reward(self: TorchRLEnvironment) -> float | None:
    """The environment's reward, summed over the steps its tools ran (TRL's env-owned reward):
    ``0.0`` when no step wrote one.

    ``GRPOTrainer`` calls it once per rollout, after the reward functions, and never with the
    final answer. Steps already scored by the factory's ``reward_func`` (which closes the
    episode with the final answer) are not counted again; once it closed the episode, ``None``
    (this rollout is scored there).
    """
    if self._reward_read:  # a reward function read env.reward: it scored the episode
        self._uncounted_reward()
        return None
    closed = self._reward_closed[0]
    reward = self._uncounted_reward()
    return reward if reward is not None or closed else 0.0
