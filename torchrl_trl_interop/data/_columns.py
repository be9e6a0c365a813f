"""The one column walker: a sampled ``[B]`` batch -> one classified :class:`Column` per key.

Every view of a buffer reads a batch through :func:`walk_columns`: each column is probed once
(a dense tensor, ragged per-row tensors, History turns, or other values) and cut to the
attention mask once. What a view makes of a column is its own: :meth:`Column.rows` gives the
per-row tensors and values that the torch view and :func:`split_columns` yield; ``_arrow``
gives the Python values and Arrow arrays of the Hugging Face views. Which columns are walked is
``_selection``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDictBase,
    is_non_tensor,
    set_list_to_stack,
)
from tensordict.utils import NestedKey

from .._checks import as_device, boundary, check_tensordict, signed
from .._conversation import history_to_messages, messages_of, real_turns
from .._keys import key_parts, keys_present
from .._padding import Spans, mask_spans, trim_row
from .._tool_calls import has_turn_fields
from .._upstream._history_fields import (
    history_column,
    history_fields,
    non_tensor_payloads,
    row_entries,
)
from ._selection import (
    as_column_key,
    as_column_keys,
    check_mask_column,
    is_history,
    probe,
    select_columns,
)

__all__ = ["Column", "split_columns", "walk_columns"]

#: :attr:`Column.kind`: a ``[B, ...]`` tensor, a list of per-row tensors, History turns without
#: tool calls (``(roles, contents)``, one list of str per row), History with tool calls (TRL
#: message lists), or other per-row Python values.
DENSE, RAGGED, TURNS, MESSAGES, VALUES = "dense", "ragged", "turns", "messages", "values"


@dataclass
class Column:
    """One column of a ``[B]`` batch, as :func:`walk_columns` found it.

    ``kind`` is ``"dense"`` (``data``: a ``[B, ...]`` tensor, cut to ``bounds``, the
    :class:`~torchrl_trl_interop._padding.Spans` of a dense mask, when its leading shape is the
    mask's),
    ``"ragged"`` (``data``: ``B`` per-row tensors, already cut to their masks), ``"turns"``
    (``data``: ``(roles, contents)`` of History turns without tool calls), ``"messages"``
    (``data``: ``B`` TRL message lists of History with tool calls) or ``"values"`` (``data``:
    ``B`` Python values: strings, other objects).
    """

    key: NestedKey
    kind: str
    data: Any
    bounds: Spans | None = None

    def rows(self, device: torch.device | None = None) -> list:
        """The column's ``B`` per-row values: tensors (on ``device``), ``str``, message lists."""
        if self.kind == DENSE:
            value = self.data if device is None else self.data.to(device)
            return list(value.unbind(0)) if self.bounds is None else self.bounds.split(value)
        if self.kind == RAGGED:
            return list(self.data) if device is None else [v.to(device) for v in self.data]
        if self.kind == TURNS:
            return messages_of(*self.data)
        return self.data


# -- the walk ------------------------------------------------------------------------------------


def _ragged_rows(batch: TensorDictBase, key: NestedKey) -> list:
    """Per-row entries of a column of a lazy stack, without building nested lazy stacks."""
    rows = row_entries(batch, key_parts(key))
    return rows if rows is not None else list(batch.get(key, as_list=True))


def _mask_rows(
    batch: TensorDictBase, mask_key: NestedKey | None
) -> tuple[Spans | None, list | None]:
    """What the mask at ``mask_key`` cuts with: ``(spans, None)`` for a dense mask (see
    :func:`mask_spans`), ``(None, per-row masks)`` for a ragged one, ``(None, None)`` without."""
    if mask_key is None:
        return None, None
    if probe(batch, mask_key)[1]:
        return None, _ragged_rows(batch, mask_key)
    mask = batch.get(mask_key)
    return mask_spans(mask), None


def _cut_rows(rows: list[torch.Tensor], bounds: Spans) -> list[torch.Tensor]:
    """Per-row tensors cut to a dense mask's spans, each whose length is the mask's width."""
    first, last, mask_shape = bounds.first, bounds.last, bounds.shape
    if len(mask_shape) != 2 or len(rows) != mask_shape[0]:
        return rows
    width = mask_shape[1]
    return [
        r[f:e] if r.ndim and r.shape[0] == width else r
        for r, f, e in zip(rows, first.tolist(), last.tolist())
    ]


def _tensor_column(key: NestedKey, rows: list[torch.Tensor], bounds: Any, masks: Any) -> Column:
    if masks is not None:
        return Column(key, RAGGED, [trim_row(v, m) for v, m in zip(rows, masks)])
    if bounds is not None and rows:
        first = rows[0]
        if all(r.shape == first.shape and r.dtype == first.dtype for r in rows):
            return Column(key, DENSE, torch.stack(rows), bounds)
        return Column(key, RAGGED, _cut_rows(rows, bounds))
    return Column(key, RAGGED, rows)


def _history_column(batch: TensorDictBase, key: NestedKey) -> Column:
    fields = history_column(batch, key_parts(key))  # ragged rows: read without stacking
    if fields is not None:
        return Column(key, TURNS, real_turns(*fields))
    history = batch.get(key)
    if not is_history(history):  # rows of different History classes: a stack of them
        return Column(key, MESSAGES, history_to_messages(history))
    if history.ndim == 2 and not has_turn_fields(history):
        return Column(key, TURNS, real_turns(*history_fields(history)))
    return Column(key, MESSAGES, history_to_messages(history))


def _strings(rows: list | None, scalar: bool = False) -> list | None:
    """The strings of per-row single ``NonTensorData`` strings (text), or ``None``
    (``scalar``: the rows are known to be 0-dim)."""
    if rows is None or not all(type(v) is NonTensorData for v in rows):
        return None
    if not scalar and any(v.batch_size for v in rows):
        return None
    values = non_tensor_payloads(rows)
    return values if all(type(v) is str for v in values) else None


def _string_rows(batch: TensorDictBase, key: NestedKey) -> list | None:
    """The strings of a lazy stack's rows of single ``NonTensorData`` strings, or ``None``."""
    return _strings(row_entries(batch, key_parts(key)))


def _stacked_strings(value: Any) -> list | None:
    """The strings of a ``NonTensorStack`` of single ``NonTensorData`` strings, or ``None``
    (``tolist`` reads each through tensordict's attribute access: ~25 µs a row)."""
    if type(value) is not NonTensorStack or value.batch_dims != 1:
        return None
    return _strings(value.tensordicts, scalar=True)  # the entries of a 1-dim stack are 0-dim


def _unwrap(value: Any) -> Any:
    """Turns tensordict's list-likes (``LinkedList``) into plain lists, recursively."""
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _value_rows(key: NestedKey, value: Any, batch: int) -> list:
    rows = value.tolist() if is_non_tensor(value) else value
    if not isinstance(rows, list) or len(rows) != batch:
        raise TypeError(
            signed(
                f"key {key!r} holds a {type(value).__name__} that cannot be split into {batch} "
                "rows. Store tensors, strings (NonTensorData/NonTensorStack) or History, or leave "
                "the key out with keys=[...]."
            )
        )
    return _unwrap(rows)


def _column(batch: TensorDictBase, key: NestedKey, bounds: Any, masks: list | None) -> Column:
    first, lazy = probe(batch, key)
    if first is None:
        raise KeyError(
            signed(
                f"key {key!r} is not in this batch of the replay buffer (found "
                f"{keys_present(batch)}); do all rows hold the same keys? Leave it out with "
                "keys=[...], or write it into every row."
            )
        )
    if lazy and isinstance(first, torch.Tensor):
        rows = _ragged_rows(batch, key)
        if all(isinstance(r, torch.Tensor) for r in rows):
            return _tensor_column(key, rows, bounds, masks)
        return Column(key, VALUES, [r.tolist() if is_non_tensor(r) else r for r in rows])
    if is_history(first):
        return _history_column(batch, key)
    strings = _string_rows(batch, key) if lazy else None
    if strings is not None:
        return Column(key, VALUES, strings)
    value = batch.get(key)
    if isinstance(value, torch.Tensor):
        return Column(key, DENSE, value, bounds)
    strings = _stacked_strings(value)
    if strings is not None:
        return Column(key, VALUES, strings)
    return Column(key, VALUES, _value_rows(key, value, batch.batch_size[0]))


def walk_columns(
    batch: TensorDictBase,
    columns: Sequence[NestedKey],
    attention_mask_key: NestedKey | None,
) -> list[Column]:
    """The columns ``columns`` of a ``[B]`` batch (as :func:`select_columns` gives them), each
    classified once and cut to ``attention_mask_key``'s attended span.

    Raises:
        KeyError: if a column is missing from this batch.
        TypeError: if a value cannot be split into rows.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> column = walk_columns(td, ["ids"], "mask")[0]
        >>> column.kind, column.rows()
        ('dense', [tensor([5, 6]), tensor([7, 8, 9])])
    """
    with set_list_to_stack(True):  # reading History needs it; scoped to the call
        bounds, masks = _mask_rows(batch, attention_mask_key)  # the mask first: it cuts the rest
        return [_column(batch, key, bounds, masks) for key in columns]


@boundary("split_columns")
def split_columns(
    batch: TensorDictBase,
    *,
    keys: Sequence[NestedKey] | None = None,
    attention_mask_key: NestedKey | None = None,
    device: torch.device | str | None = None,
) -> dict[tuple[str, ...], list]:
    """Splits a ``[B]`` batch into columns of per-row values, one vectorized split per column.

    Tensors become per-row tensors (cut to the attended span of ``attention_mask_key`` when
    their leading shape matches the mask's), strings become ``str``, History becomes TRL message
    lists. Ragged lazy stacks are read with ``as_list=True``, never stacked. This is the column
    walk behind every view of :class:`~torchrl_trl_interop.TorchRLBufferDataset`.

    Args:
        batch (TensorDictBase): a ``[B]`` batch, dense or a (ragged) lazy stack.

    Keyword Args:
        keys (list of NestedKey, optional): columns to return (a single key may be given as is;
            a key naming a sub-tensordict selects its leaves); defaults to every leaf column.
        attention_mask_key (NestedKey, optional): the mask that decides which tokens are real.
        device (torch.device or str, optional): tensors are moved there (once per column).

    Returns:
        ``{column key as a tuple of str: list of B values}`` (``"ids"`` -> ``("ids",)``).

    Raises:
        TypeError: if ``batch`` is not a TensorDict, a key is not a key, or a value cannot be
            split into rows.
        ValueError: if ``keys`` is empty.
        KeyError: if a key of ``keys`` or ``attention_mask_key`` is not in ``batch``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> split_columns(td, keys=["ids"], attention_mask_key="mask")
        {('ids',): [tensor([5, 6]), tensor([7, 8, 9])]}
    """
    check_tensordict(batch, "batch")
    device = as_device(device, "device")
    keys = None if keys is None else as_column_keys(keys, "keys")
    mask_key = None
    if attention_mask_key is not None:
        mask_key = as_column_key(attention_mask_key, "attention_mask_key")
        check_mask_column(batch, mask_key)
    columns = walk_columns(batch, select_columns(batch, keys), mask_key)
    return {key_parts(c.key): c.rows(device) for c in columns}


# -- one key of any batch shape ------------------------------------------------------------------
