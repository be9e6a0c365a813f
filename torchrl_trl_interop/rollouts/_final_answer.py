"""The policy's final answer of a multi-turn rollout, for TRL reward functions.

With ``max_turns > 1``, ``GRPOTrainer`` decodes a rollout's whole completion (the policy's turns
*and* the environment's tokens between them: tool results, replies, chat markup) into one
assistant message and hands it to every reward function as ``completions``. A stock TRL reward
(``accuracy_reward``, ``think_format_reward``, length rewards) would then score the tool's output
as if the policy wrote it. :func:`~torchrl_trl_interop.as_trl_rollout_func` therefore returns,
per rollout, ``final_answer`` (the text of the policy's last turn) and ``final_answer_ids`` (its
tokens); :func:`score_final_answer` makes a stock reward function read those instead of
``completions`` and ``completion_ids``; :func:`completions_only_rewards` names the reward
functions that read neither (the rollout function warns about them once).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._checks import boundary, signed

__all__ = [
    "FINAL_ANSWER",
    "FINAL_ANSWER_IDS",
    "completions_only_rewards",
    "final_answer_ids",
    "score_final_answer",
    "warn_completions_only",
]

FINAL_ANSWER = "final_answer"
FINAL_ANSWER_IDS = "final_answer_ids"
#: Keywords of the rollout function that tell a reward function what the policy itself did.
ROLLOUT_KEYWORDS = frozenset({"history", "env_reward", FINAL_ANSWER, FINAL_ANSWER_IDS})
_MARK = "_torchrl_trl_reads_final_answer"


def final_answer_ids(completion_ids: Sequence[int], env_mask: Sequence[int]) -> list[int]:
    """The tokens of the policy's last turn: the last run of policy tokens (``env_mask`` 1).

    Examples:
        >>> final_answer_ids([5, 6, 7, 8, 9], [1, 1, 0, 1, 1])
        [8, 9]
        >>> final_answer_ids([5, 6], [1, 1])  # a single turn: the whole completion
        [5, 6]
    """
    end = len(env_mask)
    while end and not env_mask[end - 1]:
        end -= 1
    start = end
    while start and env_mask[start - 1]:
        start -= 1
    return list(completion_ids[start:end])


def _final_answer_kwargs(completions: list, kwargs: dict) -> dict:
    answers, ids = kwargs.get(FINAL_ANSWER), kwargs.get(FINAL_ANSWER_IDS)
    if answers is None or ids is None:
        raise KeyError(
            f"the reward function got no {FINAL_ANSWER!r} and {FINAL_ANSWER_IDS!r} keywords "
            f"(got {sorted(kwargs)}). They come from "
            "GRPOTrainer(rollout_func=as_trl_rollout_func(env)); with TRL's own generation "
            "the completion is the policy's answer: use the reward function unwrapped."
        )
    completions = [
        [{"role": "assistant", "content": answer}] if isinstance(c, list) else answer
        for c, answer in zip(completions, answers)
    ]
    return {**kwargs, "completions": completions, "completion_ids": list(ids)}


@boundary("score_final_answer")
def score_final_answer(reward_func: Callable) -> Callable:
    """A TRL reward function that scores the policy's final answer instead of ``completions``.

    The returned function has ``reward_func``'s name (which names its logged metric) and calls
    it with ``completions`` replaced by the policy's last turn (``final_answer``, in the form
    TRL gives: a ``[{"role": "assistant", "content": ...}]`` list for conversational prompts, a
    string otherwise) and ``completion_ids`` by that turn's tokens (``final_answer_ids``). Every
    other keyword passes through. For a single-turn rollout both are the whole completion, so
    wrapping changes nothing there. Async functions stay async.

    Args:
        reward_func (Callable): a TRL reward function
            (``f(prompts, completions, completion_ids, **kwargs) -> list[float | None]``), e.g.
            ``trl.rewards.accuracy_reward``.

    Returns:
        the wrapped reward function. It raises ``KeyError`` when called without the
        ``final_answer`` and ``final_answer_ids`` keywords that
        :func:`~torchrl_trl_interop.as_trl_rollout_func` returns.

    Raises:
        TypeError: if ``reward_func`` is not callable.

    Examples:
        >>> def answer_length(completions, **kwargs):
        ...     return [float(len(c[0]["content"])) for c in completions]
        >>> scored = score_final_answer(answer_length)
        >>> scored.__name__
        'answer_length'
        >>> whole = [[{"role": "assistant", "content": "call<tool>5 characters</tool>Done"}]]
        >>> scored(prompts=[[]], completions=whole, completion_ids=[[1, 2, 3]],
        ...        final_answer=["Done"], final_answer_ids=[[3]])
        [4.0]
    """
    if not callable(reward_func):
        raise TypeError(
            "reward_func must be a TRL reward function (a callable), got "
            f"{type(reward_func).__name__}."
        )
    # the function TRL calls: its errors name the wrapped function
    sign = boundary(f"score_final_answer({_name(reward_func)})")
    if inspect.iscoroutinefunction(reward_func):

        @sign
        @functools.wraps(reward_func)
        async def scored_async(
            prompts: list, completions: list, completion_ids: Any = None, **kwargs: Any
        ) -> list:
            return await reward_func(prompts=prompts, **_final_answer_kwargs(completions, kwargs))

        setattr(scored_async, _MARK, True)
        return scored_async

    @sign
    @functools.wraps(reward_func)
    def scored(prompts: list, completions: list, completion_ids: Any = None, **kwargs: Any) -> list:
        # the whole completion's ids are replaced by the last turn's (final_answer_ids)
        return reward_func(prompts=prompts, **_final_answer_kwargs(completions, kwargs))

    setattr(scored, _MARK, True)
    return scored


def _name(reward_func: Any) -> str:
    return getattr(reward_func, "__name__", None) or type(reward_func).__name__


def completions_only_rewards(reward_funcs: Sequence[Any]) -> list[str]:
    """The names of the reward functions that read only ``completions`` of a rollout.

    A reward model reads the decoded completion; a function reads only ``completions`` unless it
    is wrapped by :func:`score_final_answer` or names one of the rollout function's keywords
    (``history``, ``env_reward``, ``final_answer``, ``final_answer_ids``) as a parameter.

    Examples:
        >>> def by_history(completions, history, **kwargs): ...
        >>> def stock(completions, **kwargs): ...
        >>> completions_only_rewards([by_history, stock, score_final_answer(stock)])
        ['stock']
    """
    import torch

    names = []
    for func in reward_funcs:
        if getattr(func, _MARK, False):
            continue
        if isinstance(func, torch.nn.Module):  # a reward model: TRL scores the decoded completion
            names.append(type(func).__name__)
            continue
        try:
            parameters = inspect.signature(func).parameters
        except (TypeError, ValueError):  # a builtin or an object without a signature
            continue
        if not ROLLOUT_KEYWORDS & set(parameters):
            names.append(_name(func))
    return names


def warn_completions_only(reward_funcs: Sequence[Any], max_turns: int) -> None:
    """Warns when multi-turn rollouts meet reward functions that read only ``completions``."""
    names = completions_only_rewards(reward_funcs)
    if names:
        warnings.warn(
            signed(
                f"with max_turns={max_turns}, GRPOTrainer decodes each rollout's whole "
                "completion (the policy's turns and the environment's tokens between them: tool "
                "results, replies, chat markup) into one message, `completions`, and the reward "
                f"functions {names} read only that: they score the environment's text as the "
                "policy's. Wrap a stock TRL reward function with score_final_answer(f) to score "
                f"the policy's last turn, or read the {FINAL_ANSWER!r}, 'history' or "
                "'env_reward' keyword."
            ),
            UserWarning,
            stacklevel=3,
        )
