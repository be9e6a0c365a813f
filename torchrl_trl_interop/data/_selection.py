"""Which columns a batch holds, which ones a call selects, and under which names.

:func:`column_keys` lists a batch's leaf columns (a History is one column), :func:`select_columns`
turns keys into them and :func:`check_mask_column` checks a mask, each error signed by the
public call being made (``_checks.signed``). A :class:`Selection` holds a dataset's ``keys``,
``rename``, ``attention_mask_key`` and ``sep``, checked once; :meth:`Selection.resolve` matches them against
the first batch read and gives the :class:`Schema` (stored columns and output names) that every
later batch is walked with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase, is_non_tensor, is_tensorclass
from tensordict.utils import NestedKey

from .._checks import as_mapping, signed, type_error
from .._keys import as_nested_key, key_parts, key_to_str

__all__ = [
    "Schema",
    "Selection",
    "as_column_key",
    "as_column_keys",
    "check_mask_column",
    "column_keys",
    "is_history",
    "non_tensor_columns",
    "probe",
    "select_columns",
]

# -- a batch's columns --------------------------------------------------------------------------


def as_column_key(key: Any, arg: str) -> NestedKey:
    """``key`` in canonical form (:func:`~torchrl_trl_interop._keys.as_nested_key`); a
    :class:`TypeError` signed by the public call being made and naming ``arg`` otherwise."""
    try:
        return as_nested_key(key, arg)
    except TypeError as err:
        raise TypeError(signed(err.args[0])) from None


def as_column_keys(keys: Any, arg: str) -> list[NestedKey]:
    """A non-empty list of canonical keys; a single str or tuple key counts as one key.

    Raises:
        TypeError: if ``keys`` is not a key or a list of keys.
        ValueError: if ``keys`` is empty (it would select no column).
    """
    if isinstance(keys, (str, tuple)):
        return [as_column_key(keys, arg)]
    if not isinstance(keys, Iterable) or isinstance(keys, (bytes, dict)):
        raise type_error(arg, "a list of keys (str or tuple of str)", keys)
    out = [as_column_key(k, f"{arg}[{i}]") for i, k in enumerate(keys)]
    if not out:
        raise ValueError(
            signed(
                f"{arg}=[] selects no column, so there would be nothing to read. Pass {arg}=None "
                "for every column, or name at least one key."
            )
        )
    return out


def is_history(value: Any) -> bool:
    """Whether ``value`` is a :class:`~torchrl.data.llm.History` (one column, not walked into)."""
    from torchrl.data.llm import History

    return isinstance(value, History)


def _is_lazy(td: Any) -> bool:
    return hasattr(td, "tensordicts") and hasattr(td, "stack_dim")


def probe(td: TensorDictBase, key: NestedKey) -> tuple[Any, bool]:
    """The entry at ``key`` of the first row, and whether any node on the path is a lazy stack."""
    node: Any = td
    lazy = False
    for part in key_parts(key):
        while _is_lazy(node):
            lazy = True
            node = node.tensordicts[0]
        node = node.get(part)
    return node, lazy


def _is_container(value: Any) -> bool:
    if is_non_tensor(value) or is_history(value):
        return False
    return isinstance(value, TensorDictBase) or is_tensorclass(value)


def column_keys(td: Any, prefix: tuple[str, ...] = ()) -> list[NestedKey]:
    """Leaf columns of ``td``: tensors, strings and History objects (History is one column).

    Sub-tensordicts and tensorclasses (``Tokens``, ``Masks``, ``ChatHistory``...) are walked;
    ``None`` fields (e.g. ``("log_probs", "full")`` when only the response was scored) are skipped.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> column_keys(TensorDict({"a": {"b": torch.zeros(2)}, "c": torch.zeros(2)}, [2]))
        [('a', 'b'), 'c']
    """
    out = []
    for key in td.keys():
        parts = (*prefix, key)
        first = probe(td, key)[0]
        if first is None:
            continue
        if _is_container(first):
            out.extend(column_keys(td.get(key), parts))
        else:
            out.append(as_nested_key(parts))
    return out


def select_columns(
    batch: TensorDictBase,
    keys: Sequence[NestedKey] | None,
    *,
    sep: str = ".",
    where: str = "the batch",
) -> list[NestedKey]:
    """The leaf columns ``keys`` name, in order, once each (``None``: every leaf column; a key
    naming a sub-tensordict names its leaves).

    Raises:
        KeyError: if a key is not in ``batch``; the message lists the stored keys.
    """
    available = column_keys(batch)
    if keys is None:
        return available
    columns: list[NestedKey] = []
    for key in keys:
        parts = key_parts(key)
        matched = [k for k in available if key_parts(k)[: len(parts)] == parts]
        if not matched:
            stored = sorted(key_to_str(k, sep) for k in available)
            raise KeyError(
                signed(
                    f"key {key!r} from keys= is not in {where}; stored keys are {stored}. Fix "
                    "keys=[...] or write the key into the buffer."
                )
            )
        columns.extend(k for k in matched if k not in columns)
    return columns


def non_tensor_columns(td: Any, columns: Sequence[NestedKey]) -> list[NestedKey]:
    """The columns holding strings or History (anything not a tensor) in ``td``."""
    return [k for k in columns if not isinstance(probe(td, k)[0], torch.Tensor)]


def check_mask_column(
    batch: TensorDictBase, key: NestedKey, *, where: str = "the batch", sep: str = "."
) -> None:
    """Refuses a mask that is absent or is not a per-token bool or int mask (it would trim nothing).

    Raises:
        KeyError: if ``key`` is not a column of ``batch``.
        TypeError: if the column is not an int or bool tensor with a token dimension.
    """
    available = column_keys(batch)
    if key not in available:
        stored = sorted(key_to_str(k, sep) for k in available)
        raise KeyError(
            signed(f"attention_mask_key {key!r} is not in {where}; stored keys are {stored}.")
        )
    value, lazy = probe(batch, key)
    token_dims = value.ndim - (0 if lazy else batch.ndim) if isinstance(value, torch.Tensor) else 0
    if (
        not isinstance(value, torch.Tensor)
        or value.is_floating_point()
        or value.is_complex()
        or token_dims < 1
    ):
        what = (
            f"a {value.dtype} tensor with {token_dims} dim(s) per row"
            if isinstance(value, torch.Tensor)
            else f"a {type(value).__name__}"
        )
        raise TypeError(
            signed(
                f"attention_mask_key {key!r} holds {what}; expected a bool or int mask with one "
                "entry per token (e.g. ('masks', 'all_attention_mask')). Pass the mask's key, or "
                "attention_mask_key=None."
            )
        )


_WHERE = "the replay buffer's data"


@dataclass(frozen=True)
class Schema:
    """What a dataset yields: the stored ``columns`` (canonical keys) and their output ``names``."""

    columns: list[NestedKey]
    names: list[str]


@dataclass(frozen=True)
class Selection:
    """Which columns to read and how to name them: ``keys`` (``None``: every leaf, a key naming a
    sub-tensordict selects its leaves), ``rename``, the mask that cuts tensors, ``sep``.

    Keys are kept in tensordict's canonical form (``("r",)`` -> ``"r"``).
    """

    keys: list[NestedKey] | None = None
    rename: Mapping[NestedKey, str] = field(default_factory=dict)
    attention_mask_key: NestedKey | None = None
    sep: str = "."

    def __post_init__(self) -> None:
        keys = None if self.keys is None else [as_nested_key(k) for k in self.keys]
        rename = {as_nested_key(k): name for k, name in self.rename.items()}
        mask = self.attention_mask_key
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "rename", rename)
        object.__setattr__(
            self, "attention_mask_key", None if mask is None else as_nested_key(mask)
        )

    @classmethod
    def from_args(
        cls,
        keys: NestedKey | Sequence[NestedKey] | None,
        rename: Mapping[NestedKey, str] | None,
        attention_mask_key: NestedKey | None,
        sep: str,
    ) -> Selection:
        """A selection from a dataset's arguments, checked; errors are signed by the public call.

        Raises:
            TypeError: if a key is not a key, or ``rename`` is not a dict.
            ValueError: if ``keys`` is empty, or an output name or ``sep`` is not a non-empty str.
        """
        if not isinstance(sep, str) or not sep:
            raise ValueError(signed(f"sep must be a non-empty str, got {sep!r}."))
        names: dict[NestedKey, str] = {}
        for key, name in as_mapping(rename, "rename", "{stored key: output name}").items():
            if not isinstance(name, str) or not name:
                raise ValueError(
                    signed(f"rename maps {key!r} to {name!r}; output names must be non-empty str.")
                )
            names[as_column_key(key, "rename")] = name
        keys = None if keys is None else as_column_keys(keys, "keys")
        mask = attention_mask_key
        mask = None if mask is None else as_column_key(mask, "attention_mask_key")
        return cls(keys, names, mask, sep)

    def resolve(self, batch: Any) -> Schema:
        """Checks the selection against a sampled batch; output names are ``rename[key]`` or the
        key joined with ``sep``. Errors are signed by the public call that read.

        Raises:
            TypeError: if ``batch`` is not a TensorDict, or the mask is not a token mask.
            KeyError: if a key is not stored, or ``rename`` names a key that ``keys`` leaves out.
            ValueError: if two columns get the same output name.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> td = TensorDict({"tokens": {"full": torch.zeros(2, 3)}, "r": torch.zeros(2)}, [2])
            >>> Selection(rename={"r": "reward"}).resolve(td)
            Schema(columns=[('tokens', 'full'), 'r'], names=['tokens.full', 'reward'])
        """
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                signed(
                    f"the replay buffer returned a {type(batch).__name__}, not a TensorDict. Store "
                    "TensorDicts (e.g. rb.extend(TensorDict({...}, batch_size=[n]))) so columns "
                    "have names."
                )
            )
        sep = self.sep
        columns = select_columns(batch, self.keys, sep=sep, where=_WHERE)
        available = columns if self.keys is None else select_columns(batch, None)
        for key in self.rename:
            if key not in available:
                stored = sorted(key_to_str(k, sep) for k in available)
                raise KeyError(
                    signed(f"rename= key {key!r} is not in {_WHERE}; stored keys are {stored}.")
                )
            if key not in columns:
                raise KeyError(
                    signed(
                        f"rename= key {key!r} is not among the selected keys "
                        f"{[key_to_str(k, sep) for k in columns]}; add it to keys=[...]."
                    )
                )
        if self.attention_mask_key is not None:
            check_mask_column(batch, self.attention_mask_key, where=_WHERE, sep=sep)
        names = [self.rename.get(k, key_to_str(k, sep)) for k in columns]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(
                signed(
                    f"several keys map to the output name(s) {dupes}; give them distinct names "
                    "with rename={...}."
                )
            )
        return Schema(columns, names)
