"""TorchRL's LLM key layout and the package's one key form; reading entries by key.

The keys TorchRL's LLM wrappers write (``TransformersWrapper``, ``vLLMWrapper``, ``ChatEnv``) are
declared here once; every module takes them from here. This module imports only ``_checks`` (to
sign its errors with the public call being made).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase
from tensordict.utils import NestedKey, unravel_key

from ._checks import type_error

# -- TorchRL's LLM key layout -------------------------------------------------------------------
# What ``TransformersWrapper``/``vLLMWrapper`` (tokens, masks, text, history, log-probs), ``ChatEnv``
# (history, reward, done) and ``LLMCollector(track_policy_version=True)`` write; each in
# tensordict's canonical form (``unravel_key``: a str for one level, a tuple of str for more).

#: Each family's whole sequence, prompt and response: ``(family, "full" | "prompt" | "response")``.
_PARTS = ("full", "prompt", "response")
TOKEN_KEY, PROMPT_TOKEN_KEY, RESPONSE_TOKEN_KEY = (("tokens", part) for part in _PARTS)
TEXT_KEY, PROMPT_TEXT_KEY, RESPONSE_TEXT_KEY = (("text", part) for part in _PARTS)
HISTORY_KEY, PROMPT_HISTORY_KEY, RESPONSE_HISTORY_KEY = (("history", part) for part in _PARTS)
ATTENTION_MASK_KEY: tuple[str, str] = ("masks", "all_attention_mask")
ASSISTANT_MASK_KEY: tuple[str, str] = ("masks", "all_assistant_mask")
FULL_LOG_PROBS_KEY: tuple[str, str] = ("log_probs", "full")
RESPONSE_LOG_PROBS_KEY: tuple[str, str] = ("log_probs", "response")
REWARD_KEY: str = "reward"
NEXT_REWARD_KEY: tuple[str, str] = ("next", "reward")
DONE_KEY: str = "done"
NEXT_DONE_KEY: tuple[str, str] = ("next", "done")
POLICY_VERSION_KEY: str = "policy_version"
NEXT_POLICY_VERSION_KEY: tuple[str, str] = ("next", "policy_version")

# -- torchrl's placeholder turn ------------------------------------------------------------------
#: The role of the turn torchrl fills a ``ChatEnv`` batch's shorter conversations with, so that
#: a ``[B, T]`` History keeps one length; torchrl's renders skip it. Known here only.
PLACEHOLDER_ROLE: str = "<none>"


def placeholder_turn() -> dict[str, str]:
    """A new placeholder turn as a message dict (torchrl's padding of a shorter conversation).

    Examples:
        >>> placeholder_turn()
        {'role': '<none>', 'content': ''}
    """
    return {"role": PLACEHOLDER_ROLE, "content": ""}


def without_placeholders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without torchrl's placeholder turns (a new list; the dicts are not copied).

    Examples:
        >>> without_placeholders([{"role": "user", "content": "Hi"}, placeholder_turn()])
        [{'role': 'user', 'content': 'Hi'}]
    """
    return [m for m in messages if m["role"] != PLACEHOLDER_ROLE]


# -- keys ----------------------------------------------------------------------------------------


def _is_nested_key(key: Any) -> bool:
    if isinstance(key, str):
        return True
    return isinstance(key, tuple) and len(key) > 0 and all(_is_nested_key(k) for k in key)


def as_nested_key(key: NestedKey, arg: str = "key") -> NestedKey:
    """Returns ``key`` in the package's one key form: tensordict's canonical ``NestedKey``.

    That is what :func:`tensordict.utils.unravel_key` returns, and what ``td.keys(True)``,
    ``in_keys`` and ``out_keys`` hold: a str for a top-level key, a flat tuple of str for a nested
    one. Any ``NestedKey`` is accepted (``("a",)`` -> ``"a"``, ``("a", ("b", "c"))`` ->
    ``("a", "b", "c")``).

    Raises:
        TypeError: if ``key`` is not a str or a non-empty (nested) tuple of str; the message
            names ``arg``.

    Examples:
        >>> as_nested_key(("reward",)), as_nested_key(("tokens", ("full",)))
        ('reward', ('tokens', 'full'))
    """
    if type(key) is str:
        return key
    if not _is_nested_key(key):
        raise type_error(
            arg, "a key: a str or a non-empty tuple of str (a tensordict NestedKey)", key
        )
    return unravel_key(key)


def key_parts(key: NestedKey) -> tuple[str, ...]:
    """The levels of a canonical key as a tuple: ``"a"`` -> ``("a",)``; a tuple is returned as is.

    Examples:
        >>> key_parts("reward"), key_parts(("tokens", "full"))
        (('reward',), ('tokens', 'full'))
    """
    return (key,) if isinstance(key, str) else key


def key_to_str(key: NestedKey, sep: str = ".") -> str:
    """Joins a key into one string: ``("tokens", "full")`` -> ``"tokens.full"``, ``"a"`` -> ``"a"``."""
    return key if isinstance(key, str) else sep.join(key)


def format_keys(keys: Iterable[Any]) -> str:
    """Formats a collection of keys for an error message, sorted for readability."""
    return (
        "["
        + ", ".join(sorted(repr(unravel_key(k) if isinstance(k, tuple) else k) for k in keys))
        + "]"
    )


def _is_leaf(cls: type) -> bool:
    # tensors, non-tensor data (text) and tensorclasses (History) are leaves; sub-tensordicts not
    return not issubclass(cls, TensorDictBase) or issubclass(cls, NonTensorStack)


def keys_present(td: TensorDictBase) -> str:
    """The leaf keys of ``td`` (a History counts as one), formatted for an error message."""
    return format_keys(td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf))


def get_entry(
    td: TensorDictBase,
    key: NestedKey,
    arg: str,
    hint: str = "",
    where: str = "the input tensordict",
) -> Any:
    """``td.get(key)``, as a list of rows when the entry is a ragged lazy stack.

    Raises:
        KeyError: if ``key`` is absent; the message, signed by the public call being made
            (:func:`~torchrl_trl_interop._checks.boundary`), names ``arg``, ``where`` it was looked
            for, the keys present, and ``hint`` (what to do) or a default hint.
    """
    try:  # the common case in one lookup: a key that is absent reads None
        value = td.get(key)
    except RuntimeError:
        # a ragged lazy stack cannot be stacked into one tensor: read it row by row
        return td.get(key, as_list=True)
    except (KeyError, ValueError):  # absent, or a key below a leaf: reported below
        value = None
    if value is not None:
        return value
    if key not in td.keys(include_nested=True):
        hint = hint or f"Pass {arg}=... naming the entry that holds it."
        message = f"{arg}={unravel_key(key)!r} not found in {where} (found {keys_present(td)}). "
        raise KeyError(message + hint)
    try:
        return td.get(key)
    except RuntimeError:
        # a ragged lazy stack cannot be stacked into one tensor: read it row by row
        return td.get(key, as_list=True)


# -- values --------------------------------------------------------------------------------------


def flatten_nested(nested: Any, depth: int) -> list:
    """Flattens ``depth`` levels of list nesting: ``depth=0`` gives ``[nested]``."""
    if depth == 0:
        return [nested]
    if depth == 1:
        return list(nested)
    return [item for sub in nested for item in flatten_nested(sub, depth - 1)]


def to_python(value: Any) -> Any:
    """A tensor or a tensordict non-tensor entry as plain Python (``tolist``); anything else as is."""
    if isinstance(value, (torch.Tensor, NonTensorData, NonTensorStack)):
        return value.tolist()
    return value
