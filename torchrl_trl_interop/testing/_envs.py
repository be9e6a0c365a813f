"""Chat environments that take TRL's prompts at reset, or serve their own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._data import toy_prompts
from ._tokenizer import toy_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast


def toy_tool_reply(template: str = "{n} characters", *, role: str = "tool"):
    """A torchrl tool transform that answers every assistant turn with a ``tool`` message.

    It is a real :class:`~torchrl.envs.llm.transforms.ToolTransformBase` (the base of torchrl's
    ``PythonInterpreter``, ``SimpleToolTransform``, ``MCPToolTransform``): after each step it
    appends ``template.format(n=len(answer))`` as a ``tool`` turn to the next prompt, so the
    environment adds tokens between two assistant turns whatever a random toy model says.

    Keyword Args:
        role (str, optional): the role of the reply, torchrl's ``tool_role`` (``"user"``: an
            environment that answers as the user). Defaults to ``"tool"``.

    Examples:
        >>> t = toy_tool_reply()
        >>> t.tool_role, t._process_batch_item("Hello", 0)
        ('tool', ['5 characters'])
        >>> toy_tool_reply(role="user").tool_role
        'user'
    """
    from torchrl.envs.llm.transforms.tools import ToolTransformBase

    reply_role = role

    class ToyToolReply(ToolTransformBase):
        tool_role = reply_role

        def _process_batch_item(self, content: str, index: int) -> list[str]:
            return [template.format(n=len(content))]

    return ToyToolReply()


def toy_chat_env(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    batch_size: int = 2,
    reply: bool = False,
    max_steps: int | None = None,
    transforms: list | None = None,
):
    """A ``ChatEnv`` in history mode that takes its prompts at reset (no ``DataLoadingPrimer``).

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.
        batch_size (int): rollouts per reset.
        reply (bool): append :func:`toy_tool_reply` (an environment turn after every answer).
        max_steps (int, optional): a ``StepCounter`` ends the episode after that many turns.
        transforms (list, optional): more transforms, appended last (e.g. a reward transform).

    Examples:
        >>> from tensordict import TensorDict
        >>> env = toy_chat_env(batch_size=2, reply=True, max_steps=2)
        >>> td = env.reset(TensorDict({"query": ["Hi", "Hello"]}, batch_size=[2]))
        >>> from torchrl_trl_interop import history_to_messages
        >>> history_to_messages(td["history", "prompt"])
        [[{'role': 'user', 'content': 'Hi'}], [{'role': 'user', 'content': 'Hello'}]]
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    env = ChatEnv(batch_size=(batch_size,), tokenizer=tokenizer, input_mode="history")
    if reply:
        env = env.append_transform(toy_tool_reply())
    if max_steps is not None:
        env = env.append_transform(StepCounter(max_steps=max_steps))
    for transform in transforms or []:
        env = env.append_transform(transform)
    return env


def _query_rows(rows: list[dict]) -> dict[str, list[str]]:
    return {"query": [r["query"] for r in rows]}


def _primer(prompts: list[str], repeats: int, batch_size: int):
    """A ``DataLoadingPrimer`` serving ``prompts`` (each ``repeats`` times in a row), endlessly."""
    import torch
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    dataloader = torch.utils.data.DataLoader(
        [{"query": p} for p in prompts],
        batch_size=max(batch_size // repeats, 1),
        shuffle=False,
        collate_fn=_query_rows,
    )
    return DataLoadingPrimer(dataloader=dataloader, repeats=repeats, batch_size=(batch_size,))


def toy_primed_chat_env(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    prompts: list[str] | None = None,
    repeats: int = 2,
    batch_size: int = 2,
    transforms: list | None = None,
):
    """A single-turn ``ChatEnv`` that serves its own prompts (a ``DataLoadingPrimer``), endlessly.

    Each reset takes the next prompt batch (every prompt ``repeats`` times in a row, cycling over
    ``prompts``); a ``StepCounter(max_steps=1)`` ends each episode after one answer. What a
    collector needs to run on its own, apart from a trainer.

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.
        prompts (list of str): defaults to :func:`toy_prompts`.
        repeats (int): rows per prompt (GRPO's group size).
        batch_size (int): the env's batch size.
        transforms (list, optional): appended last (e.g. a reward transform).

    Examples:
        >>> env = toy_primed_chat_env(prompts=["Hi"], repeats=2)
        >>> from torchrl_trl_interop import history_to_messages
        >>> history_to_messages(env.reset()["history", "prompt"])[1]
        [{'role': 'user', 'content': 'Hi'}]
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    prompts = prompts if prompts is not None else toy_prompts()
    env = ChatEnv(batch_size=(batch_size,), tokenizer=tokenizer, input_mode="history")
    env = env.append_transform(_primer(prompts, repeats, batch_size))
    env = env.append_transform(StepCounter(max_steps=1))
    for transform in transforms or []:
        env = env.append_transform(transform)
    return env


def toy_add(a: int, b: int) -> int:
    """Adds two whole numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


def toy_tool_call(a: int, b: int) -> str:
    """An assistant turn calling :func:`toy_add` in torchrl's tool format
    (``SimpleToolTransform``: ``<tool>name\\n{json arguments}</tool>``).

    Examples:
        >>> print(toy_tool_call(2, 3))
        <tool>add
        {"a": 2, "b": 3}</tool>
    """
    import json

    return f"<tool>add\n{json.dumps({'a': a, 'b': b})}</tool>"


def toy_tool_env(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    batch_size: int = 1,
    max_steps: int = 2,
    prompts: list[str] | None = None,
):
    """The toy task as a tool-using ``ChatEnv``: ask, call ``add``, answer, get rewarded.

    A ``ChatEnv`` in history mode with torchrl's ``SimpleToolTransform`` running
    :func:`toy_add` (called as :func:`toy_tool_call` writes it; the tool's reply is a ``tool``
    turn), a ``StepCounter(max_steps)`` ending the episode, and
    :func:`~torchrl_trl_interop.testing.correct_answer` as the reward of the episode's last
    turn (``RewardTransform(..., only_done=True)``). It takes its prompts at reset, or, with
    ``prompts``, serves them itself (a ``DataLoadingPrimer``, one prompt per batch, as a
    collector needs). Module-level, so ``python -m torchrl_trl_interop.openenv serve
    torchrl_trl_interop.testing:toy_tool_env`` serves it.

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.
        batch_size (int): episodes per reset. Defaults to ``1`` (one OpenEnv session).
        max_steps (int): assistant turns per episode. Defaults to ``2``.
        prompts (list of str, optional): served by the environment itself, in order, endlessly.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop.testing import ScriptedChatPolicy
        >>> env = toy_tool_env()
        >>> td = env.reset(TensorDict({"query": ["What is 2 plus 3?"]}, batch_size=[1]))
        >>> policy = ScriptedChatPolicy([toy_tool_call(2, 3), "2 plus 3 is 5."])
        >>> rollout = env.rollout(2, policy, auto_reset=False, tensordict=td)
        >>> rollout["next", "reward"].flatten().tolist(), rollout["next", "done"].flatten().tolist()
        ([0.0, 1.0], [False, True])
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms import SimpleToolTransform

    from ..rewards._env_transform import RewardTransform
    from ._toy_task import correct_answer

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    env = ChatEnv(batch_size=(batch_size,), tokenizer=tokenizer, input_mode="history")
    if prompts is not None:
        env = env.append_transform(_primer(prompts, batch_size, batch_size))
    env = env.append_transform(SimpleToolTransform(tools={"add": toy_add}))
    env = env.append_transform(StepCounter(max_steps=max_steps))
    return env.append_transform(RewardTransform(correct_answer, only_done=True))


class _Counter:
    """The state of one counter environment: a tool that adds to it, a reward that reads it."""

    def __init__(self) -> None:
        self.value = self.scored = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.value += step
        return self.value

    def reward(self, prompts: list, completions: list, **kwargs) -> list[float]:
        """The counter's growth since the last scored turn (a TRL reward function)."""
        grown, self.scored = self.value - self.scored, self.value
        return [float(grown)] * len(completions)


def _counter_reset(counter: _Counter):
    from torchrl.envs.transforms import Transform

    class CounterReset(Transform):
        """Sets the counter back to 0 at every reset of the environment."""

        def _reset(self, tensordict, tensordict_reset):
            counter.value = counter.scored = 0
            return tensordict_reset

    return CounterReset()


def toy_counter_env(*, prompt: str | None = None):
    """A TorchRL ``ChatEnv`` (one rollout) with an ``increment(step)`` tool on its own counter;
    its reward is what the counter grew by at each step (summed: the final counter).

    The TorchRL twin of the counter environment of TRL's own GRPOTrainer tests. With ``prompt``,
    a ``DataLoadingPrimer`` serves it at every reset (the environment owns its prompts).

    Examples:
        >>> from torchrl_trl_interop import as_trl_environment_factory
        >>> env = as_trl_environment_factory(toy_counter_env)()
        >>> env.reset(prompt=[{"role": "user", "content": "Count."}]) is None
        True
        >>> env.increment(step=2), env.get_reward()
        ('Tool increment executed successfully:\\n2', 2.0)
    """
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms import SimpleToolTransform

    from ..rewards._env_transform import RewardTransform

    counter = _Counter()
    env = ChatEnv(batch_size=(1,), input_mode="history")
    if prompt is not None:
        env = env.append_transform(_primer([prompt], 1, 1))
    env = env.append_transform(_counter_reset(counter))
    env = env.append_transform(SimpleToolTransform(tools={"increment": counter.increment}))
    return env.append_transform(RewardTransform(counter.reward))


def shout(text: str) -> str:
    """
    Shout the given text.

    Args:
        text: Text to shout.

    Returns:
        The text in upper case.
    """
    return text.upper()


def toy_prompting_env(prompt: str, *, tools: dict | None = None):
    """A TorchRL ``ChatEnv`` (one rollout) that serves ``prompt`` at every reset (a
    ``DataLoadingPrimer``: the environment owns its prompts), with optional tools
    (``SimpleToolTransform(tools=tools)``).

    Examples:
        >>> from torchrl_trl_interop import as_trl_environment_factory
        >>> from functools import partial
        >>> make = partial(toy_prompting_env, "Guess the word.")
        >>> env = as_trl_environment_factory(make, name="word")()
        >>> env.reset()  # no dataset prompt: TRL appends this to its empty user turn
        'Guess the word.'
    """
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms import SimpleToolTransform

    env = ChatEnv(batch_size=(1,), input_mode="history")
    env = env.append_transform(_primer([prompt], 1, 1))
    return env.append_transform(SimpleToolTransform(tools=tools)) if tools else env
