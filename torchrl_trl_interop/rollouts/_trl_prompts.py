"""The prompts TRL hands a TorchRL environment: their two kinds, and environments that own them.

``GRPOTrainer`` prompts come in two kinds: conversational (a list of ``{"role", "content"}``
messages, rendered with the chat template) and plain text (a string the model is prompted with
as it is, no template around it). A TorchRL ``ChatEnv`` holds a conversation, so a string
becomes a user turn there, and a policy reading the environment's History sees it through the
chat template: :func:`check_rollout_prompts` says so once (a warning) and refuses what is neither
kind (an empty message list, naming the row).

An environment may also own its prompts: TRL 1.16 lets ``reset(**row)`` return text appended to
the last message of the prompt it shows (TRL's own empty user turn, :data:`PLACEHOLDER_PROMPT`,
when the dataset has no ``prompt`` column or there is no dataset). A TorchRL environment owns
its prompts when it holds a prompt source, torchrl's ``DataLoadingPrimer``
(:func:`has_prompt_source`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from .._checks import signed
from .._conversation import is_message_list

__all__ = ["PLACEHOLDER_PROMPT", "check_rollout_prompts", "has_prompt_source", "shown_prompt"]

#: the prompt GRPOTrainer shows for a row without one (TRL 1.16, ``_generate_and_score_completions``)
PLACEHOLDER_PROMPT: list[dict[str, str]] = [{"role": "user", "content": ""}]

_PLAIN_TEXT = (
    "the prompts are plain text (strings). GRPOTrainer prompts a model with such a "
    "string as it is, with no chat template around it; the TorchRL ChatEnv turns it into a user "
    "turn, and its policy is prompted with the chat template's rendering of that turn "
    "('<|im_start|>user\\n...'), so a base model trained on raw text is prompted in another "
    "format here. Pass conversational prompts ([{'role': 'user', 'content': ...}]) to prompt "
    "the model as TRL would (docs/online.rst, 'Prompt kinds')."
)


class PlainTextPromptWarning(UserWarning):
    """Plain-text prompts reach the TorchRL policy through the chat template (see above)."""


def has_prompt_source(env: Any) -> bool:
    """Whether ``env`` serves its own prompts at reset (it holds a torchrl ``DataLoadingPrimer``).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_chat_env, toy_primed_chat_env
        >>> has_prompt_source(toy_primed_chat_env()), has_prompt_source(toy_chat_env())
        (True, False)
    """
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    from ._tools import env_transforms

    return any(isinstance(t, DataLoadingPrimer) for t in env_transforms(env))


def shown_prompt(prompt: Any) -> list[dict[str, Any]]:
    """The conversation a TorchRL environment starts from for a TRL prompt (a string becomes
    one user turn).

    Examples:
        >>> shown_prompt("Hi")
        [{'role': 'user', 'content': 'Hi'}]
    """
    return list(prompt) if is_message_list(prompt) else [{"role": "user", "content": prompt}]


def check_rollout_prompts(prompts: Sequence[Any], *, warn: bool = True) -> bool:
    """Raises on a prompt that is neither kind; warns about plain text if ``warn``.

    Returns:
        whether it warned (a caller warns once: ``warn=not warned_before``).

    Raises:
        ValueError: naming the row, if a prompt is an empty message list.
        TypeError: naming the row, if a prompt is neither a string nor a list of messages, or
            the prompts mix both kinds.

    Examples:
        >>> check_rollout_prompts([[{"role": "user", "content": "Hi"}]])
        False
        >>> check_rollout_prompts([[]])
        Traceback (most recent call last):
        ...
        ValueError: prompts[0] is an empty message list; expected a non-empty list of {'role', 'content'} messages (or a string) per row: the dataset's 'prompt' column holds an empty conversation there.
    """
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            continue
        if isinstance(prompt, (list, tuple)) and not prompt:
            raise ValueError(
                f"prompts[{i}] is an empty message list; expected a non-empty list of "
                "{'role', 'content'} messages (or a string) per row: the dataset's 'prompt' "
                "column holds an empty conversation there."
            )
        if not is_message_list(prompt):
            raise TypeError(
                f"prompts[{i}] is {type(prompt).__name__} {prompt!r:.200}; expected a string "
                "or a non-empty list of {'role', 'content'} messages."
            )
    kinds = {isinstance(p, str) for p in prompts}
    if len(kinds) > 1:
        text = next(i for i, p in enumerate(prompts) if isinstance(p, str))
        chat = next(i for i, p in enumerate(prompts) if not isinstance(p, str))
        raise TypeError(
            f"the prompts mix plain text (prompts[{text}]) and message lists "
            f"(prompts[{chat}]); expected one kind per call, as a TRL dataset's prompt "
            "column holds one: make every prompt a list of {'role', 'content'} messages."
        )
    if warn and any(isinstance(p, str) for p in prompts):
        warnings.warn(signed(_PLAIN_TEXT), PlainTextPromptWarning, stacklevel=3)
        return True
    return False
