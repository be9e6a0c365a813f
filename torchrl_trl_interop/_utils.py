"""Private helpers shared by every module: optional-dependency flags and key handling."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from tensordict.utils import NestedKey

_has_transformers = importlib.util.find_spec("transformers") is not None
_has_trl = importlib.util.find_spec("trl") is not None
_has_datasets = importlib.util.find_spec("datasets") is not None
_has_ray = importlib.util.find_spec("ray") is not None

_EXTRA_OF = {"transformers": "hf", "trl": "hf", "datasets": "hf", "accelerate": "hf", "ray": "ray"}


def require(package: str, feature: str) -> None:
    """Raises an :class:`ImportError` naming the extra to install if ``package`` is missing."""
    if importlib.util.find_spec(package) is None:
        extra = _EXTRA_OF.get(package, "hf")
        raise ImportError(
            f"{feature} needs the optional package `{package}`, which is not installed. "
            f"Install it with `pip install torchrl-trl-interop[{extra}]` (or `pip install {package}`)."
        )


def normalize_key(key: NestedKey) -> str | tuple[str, ...]:
    """Returns ``key`` as a plain string or a flat tuple of strings (``("a",)`` -> ``"a"``)."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        flat: list[str] = []
        for part in key:
            flat.append(part)
        return flat[0] if len(flat) == 1 else tuple(flat)
    raise TypeError(
        f"Expected a key as a str or a non-empty tuple of str (a tensordict NestedKey), "
        f"got {key!r} of type {type(key).__name__}."
    )


def key_to_str(key: NestedKey, sep: str = ".") -> str:
    """Flattens a nested key into one string: ``("tokens", "full")`` -> ``"tokens.full"``."""
    key = normalize_key(key)
    return key if isinstance(key, str) else sep.join(key)


def format_keys(keys: Iterable[Any]) -> str:
    """Formats a collection of keys for an error message, sorted for readability."""
    return "[" + ", ".join(sorted(repr(k) for k in keys)) + "]"
