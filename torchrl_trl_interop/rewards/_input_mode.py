"""Which input a reward class reads: ``input_mode=`` and one key argument per mode.

TorchRL's LLM classes (``TransformersWrapper``, ``ChatEnv``) name the form of their input with
``input_mode="history" | "text" | "tokens"`` and read it at one key per mode. The reward classes
of this package do the same, and the key arguments they took before ``input_mode`` existed keep
working: a key argument set to something else than its default *implies* its mode. One rule for
every class, in :func:`resolve_input_mode`:

* ``input_mode`` given: a key argument of another mode is an error (it would be ignored);
* ``input_mode`` not given: the mode of the key arguments set, the class's default if none is;
  key arguments of two modes are an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._keys import as_nested_key

__all__ = ["INPUT_MODES", "resolve_input_mode"]

#: TorchRL's input forms, as ``TransformersWrapper(input_mode=...)`` names them.
INPUT_MODES = ("history", "text", "tokens")


def _is_set(value: Any, default: Any, arg: str) -> bool:
    """Whether a key argument was set: not ``None`` and not its default (compared as keys)."""
    if value is None:
        return False
    key = as_nested_key(value, arg)  # a TypeError naming the argument for a non-key
    return default is None or key != as_nested_key(default, arg)


def resolve_input_mode(
    owner: str,
    input_mode: str | None,
    key_args: Mapping[str, tuple[str, Any, Any]],
    *,
    modes: Sequence[str],
    default: str,
) -> str:
    """The input mode of a reward class, from ``input_mode`` and the key arguments set.

    Args:
        owner (str): the public call, named by the errors.
        input_mode (str or None): what the caller passed.
        key_args (dict): ``{argument name: (its mode, the value passed, its default)}``, in
            signature order; a value that is ``None`` or equal to its default is not set.

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
        >>> args = {"token_key": ("tokens", ("tokens", "full"), ("tokens", "full")),
        ...         "text_key": ("text", "text", None)}
        >>> resolve_input_mode("Scorer", None, args, modes=INPUT_MODES, default="tokens")
        'text'
        >>> resolve_input_mode("Scorer", "tokens", args, modes=INPUT_MODES, default="tokens")
        Traceback (most recent call last):
        ...
        ValueError: Scorer: text_key='text' is the key of input_mode='text', but input_mode='tokens': it would be ignored. Drop text_key=, or pass input_mode='text'.
    """
    if input_mode is not None and (not isinstance(input_mode, str) or input_mode not in modes):
        raise ValueError(
            f"{owner}: input_mode={input_mode!r}; expected one of {list(modes)} (TorchRL's "
            "input forms), or None to infer it from the key argument given."
        )
    given = [
        (arg, mode, value)
        for arg, (mode, value, default_value) in key_args.items()
        if _is_set(value, default_value, arg)
    ]
    if input_mode is not None:
        for arg, mode, value in given:
            if mode != input_mode:
                raise ValueError(
                    f"{owner}: {arg}={value!r} is the key of input_mode={mode!r}, but "
                    f"input_mode={input_mode!r}: it would be ignored. Drop {arg}=, or pass "
                    f"input_mode={mode!r}."
                )
        return input_mode
    first, *others = given or [(None, default, None)]
    for arg, mode, value in others:
        if mode != first[1]:
            raise ValueError(
                f"{owner}: got both {first[0]}={first[2]!r} and {arg}={value!r}, which select "
                f"two different inputs (input_mode={first[1]!r} and {mode!r}): one would be "
                "ignored. Pass only the key of the input to read, or input_mode=... with its "
                "key."
            )
    return first[1]
