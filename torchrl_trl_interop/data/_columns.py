"""TensorDicts into per-row columns: one sampled batch -> ``{key: [row 0, row 1, ...]}``.

:func:`split_columns` splits a batch once per column (never once per row): tensors become
per-row tensors (cut to the attended span of a mask), strings become ``str``, History becomes
TRL message lists (through ``_conversation``). :class:`Selection`
decides which columns a dataset yields and under which names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import (
    NonTensorStack,
    TensorDictBase,
    is_non_tensor,
    is_tensorclass,
    set_list_to_stack,
)
from tensordict.utils import NestedKey

from .._checks import as_device, check_tensordict
from .._conversation import history_column, history_to_messages, messages_of
from .._keys import (
    Key,
    as_key,
    as_keys,
    as_optional_key,
    flatten_nested,
    get_entry,
    key_to_str,
    public_key,
    row_entries,
)
from .._padding import split_rows, trim_bounds, trim_row

__all__ = [
    "Schema",
    "column_keys",
    "non_tensor_columns",
    "Selection",
    "row_values",
    "split_columns",
]


def _is_history(value: Any) -> bool:
    from torchrl.data.llm import History

    return isinstance(value, History)


def _is_lazy(td: Any) -> bool:
    return hasattr(td, "tensordicts") and hasattr(td, "stack_dim")


def _probe(td: TensorDictBase, key: Key) -> tuple[Any, bool]:
    """The entry at ``key`` of the first row, and whether any node on the path is a lazy stack."""
    node: Any = td
    lazy = False
    for part in key:
        while _is_lazy(node):
            lazy = True
            node = node.tensordicts[0]
        node = node.get(part)
    return node, lazy


def _is_container(value: Any) -> bool:
    if is_non_tensor(value) or _is_history(value):
        return False
    return isinstance(value, TensorDictBase) or is_tensorclass(value)


def column_keys(td: Any, prefix: Key = ()) -> list[Key]:
    """Leaf columns of ``td``: tensors, strings and History objects (History is one column).

    Sub-tensordicts and tensorclasses (``Tokens``, ``Masks``, ``ChatHistory``...) are walked;
    ``None`` fields (e.g. ``("log_probs", "full")`` when only the response was scored) are skipped.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> column_keys(TensorDict({"a": {"b": torch.zeros(2)}, "c": torch.zeros(2)}, [2]))
        [('a', 'b'), ('c',)]
    """
    out = []
    for key in td.keys():
        full = prefix + (key,)
        probe = _probe(td, (key,))[0]
        if probe is None:
            continue
        if _is_container(probe):
            out.extend(column_keys(td.get(key), full))
        else:
            out.append(full)
    return out


def non_tensor_columns(td: Any, columns: Sequence[Key]) -> list[Key]:
    """The columns holding strings or History (anything not a tensor) in ``td``."""
    return [k for k in columns if not isinstance(_probe(td, k)[0], torch.Tensor)]


def _unwrap(value: Any) -> Any:
    """Turns tensordict's list-likes (``LinkedList``) into plain lists, recursively."""
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _ragged_rows(batch: TensorDictBase, key: Key) -> list[torch.Tensor]:
    """Per-row tensors of a ragged column of a lazy stack, without building nested lazy stacks."""
    rows = row_entries(batch, key)
    if rows is not None and all(isinstance(r, torch.Tensor) for r in rows):
        return rows
    return list(batch.get(key, as_list=True))


def _mask_rows(batch: TensorDictBase, mask_key: Key | None) -> tuple[Any, list | None]:
    """What the mask at ``mask_key`` trims with: ``(bounds, None)`` for a dense mask (see
    :func:`trim_bounds`), ``(None, per-row masks)`` for a ragged one, ``(None, None)`` without."""
    if mask_key is None:
        return None, None
    if _probe(batch, mask_key)[1]:
        return None, _ragged_rows(batch, mask_key)
    mask = batch.get(mask_key)
    return (*trim_bounds(mask), mask.shape), None


def _non_tensor_rows(key: Key, value: Any, batch: int) -> list:
    rows = value.tolist() if is_non_tensor(value) else value
    if not isinstance(rows, list) or len(rows) != batch:
        raise TypeError(
            f"TorchRLBufferDataset: key {public_key(key)!r} holds a {type(value).__name__} that "
            f"cannot be split into {batch} rows. Store tensors, strings (NonTensorData/"
            "NonTensorStack) or History, or leave the key out with keys=[...]."
        )
    return _unwrap(rows)


def split_columns(
    batch: TensorDictBase,
    *,
    keys: Sequence[NestedKey] | None = None,
    attention_mask_key: NestedKey | None = None,
    device: torch.device | str | None = None,
) -> dict[Key, list]:
    """Splits a ``[B]`` batch into columns of per-row values, one vectorized split per column.

    Tensors become per-row tensors (cut to the attended span of ``attention_mask_key`` when
    their leading shape matches the mask's), strings become ``str``, History becomes TRL message
    lists. Ragged lazy stacks are read with ``as_list=True``, never stacked.

    Args:
        batch (TensorDictBase): a ``[B]`` batch, dense or a (ragged) lazy stack.

    Keyword Args:
        keys (list of NestedKey, optional): leaf columns to return (a single key may be given
            as is); defaults to every leaf column.
        attention_mask_key (NestedKey, optional): the mask that decides which tokens are real.
        device (torch.device or str, optional): tensors are moved there (once per column).

    Returns:
        ``{column key as a tuple of str: list of B values}``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> split_columns(td, keys=["ids"], attention_mask_key="mask")
        {('ids',): [tensor([5, 6]), tensor([7, 8, 9])]}
    """
    check_tensordict(batch, "batch", "split_columns")
    n = batch.batch_size[0]
    columns = as_keys(keys, "keys") if keys is not None else column_keys(batch)
    mask_key = as_optional_key(attention_mask_key, "attention_mask_key")
    device = as_device(device, "device", "split_columns")
    with set_list_to_stack(True):  # reading History needs it; scoped to the call
        # Mask first: it decides the trimming of every tensor of its shape.
        bounds, row_masks = _mask_rows(batch, mask_key)

        out: dict[Key, list] = {}
        for key in columns:
            probe, lazy = _probe(batch, key)
            if lazy and isinstance(probe, torch.Tensor):
                rows = _ragged_rows(batch, key)
                if row_masks is not None:
                    rows = [trim_row(v, m) for v, m in zip(rows, row_masks)]
                elif bounds is not None:
                    rows = split_rows(torch.stack(rows), bounds) if rows else rows
                if device is not None:
                    rows = [v.to(device) for v in rows]
                out[key] = list(rows)
                continue
            if _is_history(probe):
                fields = history_column(batch, key)  # ragged rows: read without stacking
                if fields is not None:
                    out[key] = messages_of(*fields)
                    continue
            value = batch.get(key)
            if isinstance(value, torch.Tensor):
                if device is not None:
                    value = value.to(device)
                out[key] = split_rows(value, bounds)
            elif _is_history(value):
                out[key] = history_to_messages(value)
            else:
                out[key] = _non_tensor_rows(key, value, n)
    return out


def _check_mask_column(batch: TensorDictBase, key: Key) -> None:
    """Refuses a mask column that is not a per-token bool or int mask (it would trim nothing)."""
    value, lazy = _probe(batch, key)
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
            f"TorchRLBufferDataset: attention_mask_key {public_key(key)!r} holds {what}; expected "
            "a bool or int mask with one entry per token (e.g. ('masks', 'all_attention_mask')). "
            "Pass the mask's key, or attention_mask_key=None."
        )


@dataclass(frozen=True)
class Schema:
    """What a dataset yields: the stored ``columns`` (internal keys) and their output ``names``."""

    columns: list[Key]
    names: list[str]


@dataclass(frozen=True)
class Selection:
    """Which columns to read and how to name them: ``keys`` (``None``: every leaf, a key naming a
    sub-tensordict selects its leaves), ``rename``, the mask that trims tensors, ``sep``."""

    keys: list[Key] | None = None
    rename: Mapping[Key, str] = field(default_factory=dict)
    attention_mask_key: Key | None = None
    sep: str = "."

    @classmethod
    def from_args(
        cls,
        keys: NestedKey | Sequence[NestedKey] | None,
        rename: Mapping[NestedKey, str] | None,
        attention_mask_key: NestedKey | None,
        sep: str,
    ) -> Selection:
        """A selection from a dataset's arguments, checked (any key form is accepted).

        Raises:
            TypeError: if a key is not a key.
            ValueError: if an output name or ``sep`` is not a non-empty str.
        """
        if not isinstance(sep, str) or not sep:
            raise ValueError(f"TorchRLBufferDataset: sep must be a non-empty str, got {sep!r}.")
        if rename is not None and not isinstance(rename, Mapping):
            raise TypeError(
                f"TorchRLBufferDataset: rename must be a dict {{stored key: output name}}, got a "
                f"{type(rename).__name__}: {rename!r:.100}."
            )
        names: dict[Key, str] = {}
        for key, name in (rename or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"TorchRLBufferDataset: rename maps {key!r} to {name!r}; output names must be "
                    "non-empty str."
                )
            names[as_key(key, "rename")] = name
        keys = None if keys is None else as_keys(keys, "keys")
        return cls(keys, names, as_optional_key(attention_mask_key, "attention_mask_key"), sep)

    def resolve(self, batch: Any) -> Schema:
        """Checks the selection against a sampled batch; output names are ``rename[key]`` or the
        key joined with ``sep``.

        Raises:
            TypeError: if ``batch`` is not a TensorDict.
            KeyError: if a key is not stored, or ``rename`` names a key that ``keys`` leaves out.
            ValueError: if two columns get the same output name.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> td = TensorDict({"tokens": {"full": torch.zeros(2, 3)}, "r": torch.zeros(2)}, [2])
            >>> Selection(rename={("r",): "reward"}).resolve(td)
            Schema(columns=[('tokens', 'full'), ('r',)], names=['tokens.full', 'reward'])
        """
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                "TorchRLBufferDataset: the replay buffer returned a "
                f"{type(batch).__name__}, not a TensorDict. Store TensorDicts (e.g. "
                "rb.extend(TensorDict({...}, batch_size=[n]))) so columns have names."
            )
        sep = self.sep
        available = column_keys(batch)
        available_set = set(available)
        stored = sorted(key_to_str(k, sep) for k in available)
        if self.keys is None:
            columns = available
        else:
            columns = []
            for key in self.keys:
                matched = [k for k in available if k[: len(key)] == key]
                if not matched:
                    raise KeyError(
                        f"TorchRLBufferDataset: key {public_key(key)!r} from keys= is not in the "
                        f"replay buffer's data; stored keys are {stored}. Fix keys=[...] or write "
                        "the key into the buffer."
                    )
                columns.extend(k for k in matched if k not in columns)
        for key in self.rename:
            if key not in available_set:
                raise KeyError(
                    f"TorchRLBufferDataset: rename= key {public_key(key)!r} is not in the replay "
                    f"buffer's data; stored keys are {stored}."
                )
            if key not in columns:
                raise KeyError(
                    f"TorchRLBufferDataset: rename= key {public_key(key)!r} is not among the "
                    f"selected keys {[key_to_str(k, sep) for k in columns]}; add it to keys=[...]."
                )
        mask_key = self.attention_mask_key
        if mask_key is not None:
            if mask_key not in available_set:
                raise KeyError(
                    f"TorchRLBufferDataset: attention_mask_key {public_key(mask_key)!r} is not in "
                    f"the replay buffer's data; stored keys are {stored}."
                )
            _check_mask_column(batch, mask_key)
        names = [self.rename.get(k, key_to_str(k, sep)) for k in columns]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(
                f"TorchRLBufferDataset: several keys map to the output name(s) {dupes}; "
                "give them distinct names with rename={...}."
            )
        return Schema(columns, names)


def row_values(td: TensorDictBase, key: Key, arg: str, owner: str) -> list:
    """One Python value per element of ``td``'s batch, row-major (History -> message lists).

    Works for any batch shape (``[]``, ``[B]``, ``[E, G]``) and ragged lazy stacks.

    Raises:
        KeyError: if ``key`` is absent (``arg`` and the keys present are named).
        ValueError: if the entry's leading shape is not the batch shape.
        TypeError: if the entry is not a History, strings or a tensor.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"x": torch.arange(4).reshape(2, 2)}, batch_size=[2, 2])
        >>> row_values(td, ("x",), "x_key", "example")
        [0, 1, 2, 3]
    """
    from torchrl.data.llm import History

    hint = f"Pass {arg}=... naming where the rollouts hold it."
    value = get_entry(td, key, arg, owner, hint)
    if isinstance(value, list):  # a ragged lazy stack of tensors: go row by row
        return [v for sub in td.unbind(0) for v in row_values(sub, key, arg, owner)]
    if isinstance(value, History):
        if value.ndim != td.ndim + 1:
            raise ValueError(
                f"{owner}: {arg}={public_key(key)!r} holds a History of batch size "
                f"{tuple(value.batch_size)}; expected the tensordict's {tuple(td.batch_size)} "
                "plus one turn dimension."
            )
        return flatten_nested(history_to_messages(value), td.ndim)
    if isinstance(value, torch.Tensor):
        if value.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                f"{owner}: {arg}={public_key(key)!r} has shape {tuple(value.shape)}; expected "
                f"leading dims {tuple(td.batch_size)}."
            )
        return list(value.reshape(td.batch_size.numel(), *value.shape[td.ndim :]).tolist())
    if is_non_tensor(value):
        if td.ndim == 0:
            return [value.tolist() if isinstance(value, NonTensorStack) else value.data]
        return flatten_nested(value.tolist(), td.ndim)
    raise TypeError(
        f"{owner}: {arg}={public_key(key)!r} holds a {type(value).__name__}; expected a History, "
        "strings or a tensor."
    )
