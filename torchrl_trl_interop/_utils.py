"""Private helpers shared by every module: optional dependencies, keys, argument checks.

Every other module of the package imports from here; this module imports nothing of the package.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
from collections.abc import Iterable
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from tensordict.utils import NestedKey, unravel_key

_EXTRA_OF = {"transformers": "hf", "trl": "hf", "datasets": "hf", "accelerate": "hf", "ray": "ray"}

#: The keys TorchRL's LLM wrappers write (``TransformersWrapper``, ``vLLMWrapper``).
TOKEN_KEY: tuple[str, ...] = ("tokens", "full")
ATTENTION_MASK_KEY: tuple[str, ...] = ("masks", "all_attention_mask")
HISTORY_KEY: tuple[str, ...] = ("history", "full")

Key = tuple[str, ...]


def require(package: str, feature: str) -> None:
    """Raises an :class:`ImportError` naming the extra to install if ``package`` is missing."""
    if importlib.util.find_spec(package) is None:
        extra = _EXTRA_OF.get(package, "hf")
        raise ImportError(
            f"{feature} needs the optional package `{package}`, which is not installed. "
            f"Install it with `pip install torchrl-trl-interop[{extra}]` (or `pip install {package}`)."
        )


# -- keys ----------------------------------------------------------------------------------------


def _is_nested_key(key: Any) -> bool:
    if isinstance(key, str):
        return True
    return isinstance(key, tuple) and len(key) > 0 and all(_is_nested_key(k) for k in key)


def as_key(key: NestedKey, arg: str = "key") -> Key:
    """Returns ``key`` in the package's one internal form: a flat tuple of str.

    Any tensordict ``NestedKey`` is accepted (``"a"``, ``("a", "b")``, ``("a", ("b", "c"))``);
    it is flattened with :func:`tensordict.utils.unravel_key`.

    Raises:
        TypeError: if ``key`` is not a str or a non-empty (nested) tuple of str; the message
            names ``arg``.
    """
    if type(key) is tuple and key and all(type(k) is str for k in key):
        return key  # already in internal form (the hot path: keys resolved once, used per batch)
    if not _is_nested_key(key):
        raise TypeError(
            f"{arg}={key!r} is not a key. Expected a key: a str or a non-empty tuple of str (a "
            f"tensordict NestedKey), got {type(key).__name__}."
        )
    flat = unravel_key(key)
    return (flat,) if isinstance(flat, str) else flat


def as_optional_key(key: NestedKey | None, arg: str = "key") -> Key | None:
    """:func:`as_key`, passing ``None`` through (an optional input that is not used)."""
    return None if key is None else as_key(key, arg)


def as_keys(keys: NestedKey | Iterable[NestedKey], arg: str) -> list[Key]:
    """A list of keys in internal form; a single str or tuple key counts as one key."""
    if isinstance(keys, (str, tuple)):
        return [as_key(keys, arg)]
    if not isinstance(keys, Iterable) or isinstance(keys, (bytes, dict)):
        raise TypeError(
            f"{arg} should be a list of keys (str or tuple of str), got {type(keys).__name__}."
        )
    return [as_key(k, f"{arg}[{i}]") for i, k in enumerate(keys)]


def public_key(key: Key) -> NestedKey:
    """tensordict's canonical form of an internal key (``("a",)`` -> ``"a"``), for ``in_keys``."""
    return key[0] if len(key) == 1 else key


def key_to_str(key: Key, sep: str = ".") -> str:
    """Joins an internal key into one string: ``("tokens", "full")`` -> ``"tokens.full"``."""
    return sep.join(key)


def format_keys(keys: Iterable[Any]) -> str:
    """Formats a collection of keys for an error message, sorted for readability."""
    return (
        "["
        + ", ".join(sorted(repr(public_key(k) if isinstance(k, tuple) else k) for k in keys))
        + "]"
    )


def _is_leaf(cls: type) -> bool:
    # tensors, non-tensor data (text) and tensorclasses (History) are leaves; sub-tensordicts not
    return not issubclass(cls, TensorDictBase) or bool(getattr(cls, "_is_non_tensor", False))


def keys_present(td: TensorDictBase) -> str:
    """The leaf keys of ``td`` (a History counts as one), formatted for an error message."""
    return format_keys(td.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf))


def get_entry(
    td: TensorDictBase,
    key: Key,
    arg: str,
    owner: str,
    hint: str = "",
    where: str = "the input tensordict",
) -> Any:
    """``td.get(key)``, as a list of rows when the entry is a ragged lazy stack.

    Raises:
        KeyError: if ``key`` is absent; the message names ``arg``, ``where`` it was looked for,
            the keys present, and ``hint`` (what to do) or a default hint.
    """
    if key not in td.keys(include_nested=True):
        hint = hint or f"Pass {arg}=... naming the entry that holds it."
        raise KeyError(
            f"{owner}: {arg}={public_key(key)!r} not found in {where} (found {keys_present(td)}). "
            f"{hint}"
        )
    try:
        return td.get(key)
    except RuntimeError:
        # a ragged lazy stack cannot be stacked into one tensor: read it row by row
        return td.get(key, as_list=True)


def row_entries(batch: Any, key: Key) -> list | None:
    """The entry at ``key`` of every row of a lazy stack (stacked along dim 0), read from the
    rows' own dicts, so no stacked value is built; ``None`` if ``batch`` is not such a stack."""
    if not (hasattr(batch, "tensordicts") and getattr(batch, "stack_dim", None) == 0):
        return None
    out = []
    try:
        for td in batch.tensordicts:
            node = td
            for part in key:
                node = node._tensordict[part] if type(node) is TensorDict else node.get(part)
            out.append(node)
    except (KeyError, RuntimeError):  # e.g. a nested ragged stack that cannot be read whole
        return None
    return out


def module_repr(module: Any, before: Iterable[str], after: Iterable[str] = ()) -> str:
    """A module's repr in tensordict's layout: one field per line, keys between ``before``/``after``."""
    fields = [*before, f"in_keys={module.in_keys}", f"out_keys={module.out_keys}", *after]
    body = ",\n    ".join(fields)
    return f"{type(module).__name__}(\n    {body})"


# -- argument checks -----------------------------------------------------------------------------


def check_positive_int(value: Any, arg: str, owner: str, *, allow_none: bool = False) -> None:
    """Raises a :class:`ValueError` unless ``value`` is a positive int (or ``None`` if allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        expected = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{owner}: {arg} must be {expected}, got {arg}={value!r}.")


def check_real(value: Any, arg: str, owner: str, *, finite: bool = True) -> float:
    """``value`` as a float; raises unless it is a real number (and finite, if asked).

    Raises:
        TypeError: if ``value`` is not a real number (a ``str``, a list, ``None``, a bool...).
        ValueError: if ``finite`` and ``value`` is NaN or infinite.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{owner}: {arg} must be a real number (int or float), got {value!r:.100} of type "
            f"{type(value).__name__}."
        )
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{owner}: {arg} must be a finite number, got {arg}={value!r}.")
    return value


def as_names(value: Any, arg: str, owner: str) -> tuple[str, ...]:
    """A non-empty tuple of str from a str (one name, never its characters) or an iterable of str.

    Raises:
        TypeError: if ``value`` is neither a str nor an iterable of str; the message names ``arg``.
        ValueError: if ``value`` is empty.
    """
    if type(value) is tuple and value and all(type(v) is str for v in value):
        return value  # already checked (the per-row path)
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable) or isinstance(value, (bytes, dict)):
        raise TypeError(
            f"{owner}: {arg} must be a str or a list of str, got {value!r:.100} of type "
            f"{type(value).__name__}."
        )
    names = tuple(value)
    bad = [v for v in names if not isinstance(v, str)]
    if bad:
        raise TypeError(
            f"{owner}: {arg} must be a str or a list of str, got {value!r:.100} (holding "
            f"{type(bad[0]).__name__})."
        )
    if not names:
        raise ValueError(f"{owner}: {arg} is empty; pass at least one name.")
    return names


def as_mapping(value: Any, arg: str, owner: str, what: str) -> dict:
    """``value`` as a dict (``None``: empty); raises a :class:`TypeError` naming ``arg`` and
    ``what`` it should map (e.g. ``"{column: key}"``) unless it is a mapping."""
    from collections.abc import Mapping

    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{owner}: {arg} must be a dict {what}, got {value!r:.100} of type "
            f"{type(value).__name__}."
        )
    return dict(value)


def check_tensordict(value: Any, arg: str, owner: str) -> None:
    """Raises a :class:`TypeError` naming ``arg`` unless ``value`` is a TensorDict."""
    if not isinstance(value, TensorDictBase):
        raise TypeError(
            f"{owner}: {arg} must be a TensorDict (e.g. TensorDict({{...}}, batch_size=[n])), got "
            f"{type(value).__name__}."
        )


def check_tokenizer(value: Any, arg: str, owner: str) -> None:
    """Raises a :class:`TypeError` naming ``arg`` unless ``value`` looks like an HF tokenizer."""
    looks_like = hasattr(value, "pad_token_id") or hasattr(value, "tokenizer")  # or a processor
    if value is not None and (not callable(value) or not looks_like):
        hint = (
            " Load it first: AutoTokenizer.from_pretrained(...)." if isinstance(value, str) else ""
        )
        raise TypeError(
            f"{owner}: {arg} must be a Hugging Face tokenizer (a PreTrainedTokenizerBase), got "
            f"{value!r:.100} of type {type(value).__name__}.{hint}"
        )


def as_device(value: Any, arg: str, owner: str) -> torch.device | None:
    """``value`` as a :class:`torch.device` (``None`` passes); a :class:`TypeError` naming ``arg``
    for anything that is not a device."""
    if value is None or isinstance(value, torch.device):
        return value
    try:
        return torch.device(value)
    except (TypeError, RuntimeError) as err:
        raise TypeError(
            f"{owner}: {arg} must be a torch.device or a device string such as 'cpu' or "
            f"'cuda:0', got {value!r:.100} of type {type(value).__name__}."
        ) from err


def check_bool(value: Any, arg: str, owner: str) -> bool:
    """``value`` if it is a bool (or a numpy bool); raises a :class:`TypeError` otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(
        f"{owner}: {arg} must be a bool (True or False), got {value!r:.100} of type "
        f"{type(value).__name__}."
    )


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
