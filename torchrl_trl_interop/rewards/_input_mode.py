"""Which input a reward class reads: ``input_mode=`` and one key argument per mode.

TorchRL's LLM classes (``TransformersWrapper``, ``ChatEnv``) name the form of their input with
``input_mode="history" | "text" | "tokens"`` and read it at one key per mode. The reward classes
of this package do the same, and the key arguments they took before ``input_mode`` existed keep
working: a key argument set to something else than its default *implies* its mode. One rule for
every class, in :func:`resolve_input_mode`:

* ``input_mode`` given: a key argument of another mode is an error (it would be ignored);
* ``input_mode`` not given: the mode of the key arguments set, the class's default if none is;
  key arguments of two modes are an error.

Which mode a key argument belongs to is said once, by its name (:data:`KEY_ARG_MODES`), and its
default is read from the public call's signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict.utils import NestedKey

from .._keys import HISTORY_KEY, TEXT_KEY, TOKEN_KEY, as_nested_key

__all__ = [
    "CHAT_MODES",
    "INPUT_MODES",
    "KEY_ARG_MODES",
    "MODE_KEYS",
    "MODE_KEY_ARGS",
    "check_distinct_keys",
    "mode_key",
    "resolve_input_mode",
]

#: TorchRL's input forms, as ``TransformersWrapper(input_mode=...)`` names them.
INPUT_MODES = ("history", "text", "tokens")

#: The forms of a chat (``ChatEnv(input_mode=...)``): what TRL reward functions read, prompts and
#: completions as messages or as text.
CHAT_MODES = ("history", "text")

#: The key argument of each mode, and TorchRL's key for it (what its LLM wrappers write): where a
#: mode reads when its key argument is not given.
MODE_KEY_ARGS = {"tokens": "token_key", "text": "text_key", "history": "history_key"}
MODE_KEYS = {"tokens": TOKEN_KEY, "text": TEXT_KEY, "history": HISTORY_KEY}

#: The mode each key argument belongs to, by its name: every reward class names them alike.
KEY_ARG_MODES = {
    "token_key": "tokens",
    "attention_mask_key": "tokens",
    "text_key": "text",
    "prompt_key": "text",
    "completion_key": "text",
    "history_key": "history",
}


def mode_key(mode: str, key: NestedKey | None) -> NestedKey:
    """The key ``mode`` reads: ``key`` (its key argument) if given, else TorchRL's
    (:data:`MODE_KEYS`), in canonical form.

    Examples:
        >>> mode_key("text", None), mode_key("history", ("chat",))
        (('text', 'full'), 'chat')
    """
    return as_nested_key(MODE_KEYS[mode] if key is None else key, MODE_KEY_ARGS[mode])


def check_distinct_keys(keys: Sequence[NestedKey]) -> None:
    """Raises a ``ValueError`` naming the keys of ``keys`` (those a reward call reads or writes,
    in canonical form) given for two inputs: each input needs its own key.

    Examples:
        >>> check_distinct_keys(["answer", ("history", "full")])
        >>> check_distinct_keys(["answer", "answer"])
        Traceback (most recent call last):
        ...
        ValueError: the key(s) ["'answer'"] are used for two inputs; give each input its own key.
    """
    keys = list(keys)
    duplicates = sorted({repr(k) for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(
            f"the key(s) {duplicates} are used for two inputs; give each input its own key."
        )


@functools.cache
def _key_arg_defaults(call: Callable) -> dict[str, Any]:
    """``{key argument: its default}`` of ``call``'s signature, in signature order."""
    parameters = inspect.signature(call).parameters
    return {name: p.default for name, p in parameters.items() if name in KEY_ARG_MODES}


def _is_set(value: Any, default: Any, arg: str) -> bool:
    """Whether a key argument was set: not ``None`` and not its default (compared as keys)."""
    if value is None:
        return False
    key = as_nested_key(value, arg)  # a TypeError naming the argument for a non-key
    return default is None or key != as_nested_key(default, arg)


def resolve_input_mode(
    call: Callable,
    arguments: Mapping[str, Any],
    *,
    modes: Sequence[str],
    default: str,
) -> str:
    """The input mode of a reward class, from ``input_mode`` and the key arguments set.

    Errors open with the public call being made (:func:`~torchrl_trl_interop._checks.boundary`).

    Args:
        call (callable): the public callable (a class's ``__init__``, a function): its signature
            says which key arguments it takes (those of :data:`KEY_ARG_MODES`) and their
            defaults; a key argument that is ``None`` or equal to its default is not set.
        arguments (mapping): what the caller passed: ``input_mode`` and the key arguments, by
            name (``locals()`` at the top of ``call``).

    Keyword Args:
        modes (sequence of str): the modes the class reads.
        default (str): the mode when neither ``input_mode`` nor a key argument says.

    Returns:
        the mode, one of ``modes``.

    Raises:
        TypeError: if a key argument is not a key.
        ValueError: if ``input_mode`` is not one of ``modes``, a key argument of another mode
            than ``input_mode`` is set, or (without ``input_mode``) key arguments of two modes are.

    Examples:
        >>> from torchrl_trl_interop._checks import boundary
        >>> @boundary("scorer")
        ... def scorer(*, input_mode=None, token_key=("tokens", "full"), text_key=None):
        ...     return resolve_input_mode(scorer, locals(), modes=INPUT_MODES, default="tokens")
        >>> scorer(), scorer(text_key="text"), scorer(input_mode="text")
        ('tokens', 'text', 'text')
        >>> scorer(input_mode="tokens", text_key="text")
        Traceback (most recent call last):
        ...
        ValueError: scorer: text_key='text' is the key of input_mode='text', but input_mode='tokens': it would be ignored. Drop text_key=, or pass input_mode='text'.
    """
    input_mode = arguments["input_mode"]
    if input_mode is not None and (not isinstance(input_mode, str) or input_mode not in modes):
        raise ValueError(
            f"input_mode={input_mode!r}; expected one of {list(modes)} (TorchRL's input "
            "forms), or None to infer it from the key argument given."
        )
    given = [
        (arg, KEY_ARG_MODES[arg], arguments[arg])
        for arg, arg_default in _key_arg_defaults(call).items()
        if _is_set(arguments[arg], arg_default, arg)
    ]
    if input_mode is not None:
        for arg, mode, value in given:
            if mode != input_mode:
                raise ValueError(
                    f"{arg}={value!r} is the key of input_mode={mode!r}, but "
                    f"input_mode={input_mode!r}: it would be ignored. Drop {arg}=, or pass "
                    f"input_mode={mode!r}."
                )
        return input_mode
    first, *others = given or [(None, default, None)]
    for arg, mode, value in others:
        if mode != first[1]:
            raise ValueError(
                f"got both {first[0]}={first[2]!r} and {arg}={value!r}, which select two "
                f"different inputs (input_mode={first[1]!r} and {mode!r}): one would be "
                "ignored. Pass only the key of the input to read, or input_mode=... with its "
                "key."
            )
    return first[1]
