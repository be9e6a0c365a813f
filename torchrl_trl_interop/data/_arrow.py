"""A batch's columns packed for the Hugging Face views: flat values and row lengths, one per column.

:func:`~torchrl_trl_interop.split_columns` cuts a batch into per-row tensors, which is
what a torch dataset yields. The Hugging Face views need Python values or Arrow arrays instead,
and converting row by row costs a Python call (or several) per row and column. Here each column of
a batch is packed once: a tensor column becomes ``values`` (every row's values, concatenated)
and ``lengths`` (each row's leading length, or ``None`` when every row is ``values[i]``), a
History column becomes its ``role`` and ``content`` strings per row, anything else a list of
Python values. :func:`python_columns` turns that into per-row Python values with one ``tolist``
per column, :func:`arrow_table` into a ``pyarrow`` table of ``datasets``' types (values plus
offsets). Rows are cut to the attention mask exactly as :func:`split_columns` cuts them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from tensordict import NonTensorData, TensorDictBase, set_list_to_stack

from .._conversation import history_column, history_fields, history_to_messages
from .._keys import Key, row_entries, to_python
from .._padding import trim_row
from .._tool_calls import has_turn_fields
from ._columns import _is_history, _mask_rows, _non_tensor_rows, _probe, _ragged_rows

__all__ = ["PackedColumn", "arrow_table", "pack_columns", "python_columns"]


@dataclass
class PackedColumn:
    """One column of a batch: ``kind`` is ``"tensor"``, ``"history"`` or ``"python"``.

    ``"tensor"``: ``values`` holds the rows' values end to end and ``lengths`` (a list of int)
    each row's leading length; ``lengths is None`` means row ``i`` is ``values[i]``.
    ``"history"``: ``values`` is ``(roles, contents)``, one list of str per row.
    ``"python"``: ``values`` is the list of per-row Python values.
    """

    kind: str
    values: Any
    lengths: list[int] | None = None


def _tensor_column(rows: Sequence[torch.Tensor]) -> PackedColumn | None:
    """Packs per-row tensors (a ragged column); ``None`` if they do not share dtype and inner shape."""
    if not rows:
        return None
    first = rows[0]
    inner, dtype, ndim = first.shape[1:], first.dtype, first.ndim
    if any(r.dtype != dtype or r.ndim != ndim or r.shape[1:] != inner for r in rows):
        return None
    if ndim == 0:
        return PackedColumn("tensor", torch.stack(rows).detach().cpu())
    return PackedColumn("tensor", torch.cat(rows).detach().cpu(), [len(r) for r in rows])


def _history_column(batch: TensorDictBase, key: Key) -> PackedColumn:
    """A ``[B, T]`` History column's roles and contents per row (message lists otherwise)."""
    fields = history_column(batch, key)
    if fields is not None:
        return PackedColumn("history", fields)
    history = batch.get(key)
    if history.ndim != 2 or has_turn_fields(history):  # not plain turns: message lists
        return PackedColumn("python", history_to_messages(history))
    return PackedColumn("history", history_fields(history))


def _string_column(batch: TensorDictBase, key: Key) -> list | None:
    """The rows' values of a lazy stack of single ``NonTensorData`` entries (text), or ``None``."""
    rows = row_entries(batch, key)
    if rows is None or not all(type(v) is NonTensorData and not v.batch_size for v in rows):
        return None
    return [v._non_tensordict["data"] for v in rows]


def _dense_column(value: torch.Tensor, bounds: Any) -> PackedColumn:
    """Packs a ``[B, ...]`` tensor, cut to ``bounds`` as ``_padding.split_rows`` cuts."""
    value = value.detach().cpu()
    if bounds is not None:
        first, last, mask_shape = bounds
        if len(mask_shape) == 2 and value.shape[:2] == mask_shape and mask_shape[0] > 0:
            first, last = first.cpu(), last.cpu()
            positions = torch.arange(mask_shape[1])
            keep = (positions >= first[:, None]) & (positions < last[:, None])
            return PackedColumn("tensor", value[keep], (last - first).tolist())
    return PackedColumn("tensor", value)


def pack_columns(
    batch: TensorDictBase, keys: Sequence[Key], attention_mask_key: Key | None
) -> list[PackedColumn]:
    """Packs the columns ``keys`` of a ``[B]`` batch (keys as resolved by a
    ``_columns.Selection``), cut to ``attention_mask_key``'s span.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> column = pack_columns(td, [("ids",)], ("mask",))[0]
        >>> column.values, column.lengths
        (tensor([5, 6, 7, 8, 9]), [2, 3])
        >>> python_columns([column])
        [[[5, 6], [7, 8, 9]]]
    """
    n = batch.batch_size[0]
    with set_list_to_stack(True):  # reading History needs it; scoped to the call
        bounds, row_masks = _mask_rows(batch, attention_mask_key)
        out = []
        for key in keys:
            probe, lazy = _probe(batch, key)
            if lazy and isinstance(probe, torch.Tensor):
                rows = _ragged_rows(batch, key)
                if bounds is not None and rows:
                    out.append(_dense_column(torch.stack(rows), bounds))
                    continue
                if row_masks is not None:
                    rows = [trim_row(v, m) for v, m in zip(rows, row_masks)]
                packed = _tensor_column(rows)
                out.append(packed if packed is not None else PackedColumn("python", list(rows)))
                continue
            if _is_history(probe):
                out.append(_history_column(batch, key))
                continue
            if not isinstance(probe, torch.Tensor) and lazy:
                strings = _string_column(batch, key)
                if strings is not None:
                    out.append(PackedColumn("python", strings))
                    continue
            value = batch.get(key)
            if isinstance(value, torch.Tensor):
                out.append(_dense_column(value, bounds))
            else:
                out.append(PackedColumn("python", _non_tensor_rows(key, value, n)))
    return out


def _split(flat: list, lengths: list[int]) -> list[list]:
    out, start = [], 0
    for length in lengths:
        out.append(flat[start : start + length])
        start += length
    return out


def _python_values(column: PackedColumn) -> list:
    if column.kind == "tensor":
        values = column.values
        if values.dtype == torch.bfloat16:
            values = values.float()  # what a bfloat16 row's tolist() gives
        flat = values.numpy().tolist()  # numpy builds Python lists faster than torch
        return flat if column.lengths is None else _split(flat, column.lengths)
    if column.kind == "history":
        roles, contents = column.values
        return [
            [{"role": r, "content": c} for r, c in zip(row_roles, row_contents)]
            for row_roles, row_contents in zip(roles, contents)
        ]
    return [to_python(v) for v in column.values]


def python_columns(columns: Sequence[PackedColumn]) -> list[list]:
    """Per-row Python values of each packed column, as ``to_python`` gives them row by row."""
    return [_python_values(column) for column in columns]


def _offsets(lengths: Any) -> Any:
    import numpy as np

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _tensor_array(column: PackedColumn, arrow_type: Any) -> Any:
    """Values plus offsets: one Arrow list level per dimension of a row."""
    import numpy as np
    import pyarrow as pa

    values = column.values
    if values.dtype == torch.bfloat16:
        values = values.float()  # datasets stores bfloat16 as float32
    inner = list(values.shape[1:])
    array = pa.array(values.reshape(-1).numpy())
    for level in reversed(range(len(inner))):  # fixed inner dims, innermost first
        count = values.shape[0] * math.prod(inner[:level])
        array = pa.ListArray.from_arrays(np.arange(count + 1, dtype=np.int32) * inner[level], array)
    if column.lengths is not None:
        array = pa.ListArray.from_arrays(_offsets(column.lengths), array)
    return array if array.type == arrow_type else array.cast(arrow_type)


def _history_array(column: PackedColumn, arrow_type: Any) -> Any:
    import pyarrow as pa

    roles, contents = column.values
    turns = pa.StructArray.from_arrays(
        [
            pa.array(list(chain.from_iterable(roles)), pa.string()),
            pa.array(list(chain.from_iterable(contents)), pa.string()),
        ],
        names=["role", "content"],
    )
    array = pa.ListArray.from_arrays(_offsets([len(r) for r in roles]), turns)
    return array if array.type == arrow_type else array.cast(arrow_type)


def arrow_table(columns: Sequence[PackedColumn], names: Sequence[str], features: Any) -> Any:
    """A ``pyarrow.Table`` of the packed columns, with ``features``' Arrow schema.

    Tensor columns are built from their values and offsets, History from its strings; other
    columns go through ``datasets``' own typed conversion (what ``Dataset.from_dict`` does).
    """
    import pyarrow as pa
    from datasets.arrow_writer import OptimizedTypedSequence

    schema = features.arrow_schema
    arrays = []
    for column, name in zip(columns, names):
        field = schema.field(name)
        if column.kind == "tensor":
            arrays.append(_tensor_array(column, field.type))
            continue
        if column.kind == "history" and field.type == _history_type():
            arrays.append(_history_array(column, field.type))
            continue
        values = features.encode_column(_python_values(column), name)
        arrays.append(pa.array(OptimizedTypedSequence(values, type=features[name], col=name)))
    return pa.Table.from_arrays(arrays, schema=schema)


def _history_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
