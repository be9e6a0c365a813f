"""Walked columns for the Hugging Face views: their Arrow types, Python values and Arrow arrays.

The torch view yields a :class:`~torchrl_trl_interop.data._columns.Column`'s per-row tensors.
The Hugging Face views need Python values or Arrow arrays instead, and converting row by row
costs a Python call (or several) per row and column. Here each column of a batch is converted
once: tensors through their values end to end and each row's length (Arrow values plus
offsets, or, for Python rows, each row's ``tolist`` of its NumPy view, made when the row is
read), History turns through their ``role`` and ``content`` strings, other values through
``datasets``' own typed conversion.

**Types come from every row, never from the first one.** A column whose rows hold different
types (a ``score`` written as ``1`` in one row, ``0.5`` in the next: ``int64`` and ``float32``
tensors) gets the type pyarrow promotes them to (ints and floats: a float that holds the ints
exactly, ``float64`` for ``int64``), which is what ``datasets.Dataset.from_list`` gives for
the same Python values; a message column gets the fields of every message (tool calls included).
Types with no common type (a bool and a number, a str and a number, a list and a scalar) are
refused with an error naming the column: values are never cast silently. :func:`unify_schemas`
applies the same rule across batches; :func:`python_columns` checks a batch against types
declared earlier (the streaming view) and refuses what they cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain, repeat
from operator import mul
from typing import Any

import numpy as np
import torch

from .._keys import to_python
from ._columns import DENSE, MESSAGES, RAGGED, TURNS, Column

__all__ = [
    "arrow_table",
    "column_type",
    "declared_schema",
    "python_columns",
    "unify_schemas",
]

#: Arrow types of torch dtypes (bfloat16: ``float32``, as ``datasets`` stores it).
_ARROW_OF = {
    torch.bool: "bool_",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.bfloat16: "float32",
    torch.float32: "float32",
    torch.float64: "float64",
}


def _scalar_type(dtype: torch.dtype, name: str) -> Any:
    import pyarrow as pa

    arrow = _ARROW_OF.get(dtype)
    if arrow is None:
        raise TypeError(
            f"column {name!r} holds {dtype} values, which Arrow (and so datasets) cannot "
            "store. Store the real and imaginary parts as two float columns, or leave the "
            "column out with keys=[...]."
        )
    return getattr(pa, arrow)()


def _torch_dtype(arrow_type: Any) -> torch.dtype:
    """The torch dtype of an Arrow number type (the inverse of ``_ARROW_OF``)."""
    import pyarrow as pa

    return next(
        d for d, a in _ARROW_OF.items() if d != torch.bfloat16 and getattr(pa, a)() == arrow_type
    )


def _nest(arrow_type: Any, levels: int) -> Any:
    import pyarrow as pa

    for _ in range(levels):
        arrow_type = pa.list_(arrow_type)
    return arrow_type


def _leaf(arrow_type: Any) -> Any:
    while hasattr(arrow_type, "value_type"):
        arrow_type = arrow_type.value_type
    return arrow_type


def _turns_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _unify(types: Sequence[Any], name: str, where: str) -> Any:
    """The type pyarrow promotes ``types`` to (``"permissive"``); a :class:`TypeError` naming the
    column if they have none."""
    import pyarrow as pa

    distinct = list(dict.fromkeys(types))
    if len(distinct) == 1:
        return distinct[0]
    try:
        schemas = [pa.schema([pa.field(name, t)]) for t in distinct]
        return pa.unify_schemas(schemas, promote_options="permissive").field(name).type
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise TypeError(
            f"column {name!r} holds values of types {[str(t) for t in distinct]} {where}, and "
            "Arrow (so datasets) has no type that holds them all without changing values (a "
            "bool and a number, a str and a number, a list and a scalar). Store one type in "
            "every row (e.g. every score as a float), or leave the column out with keys=[...]."
        ) from err


def _row_dtype(rows: Sequence[torch.Tensor], name: str) -> tuple[torch.dtype, Any]:
    """The dtype that holds every row of a ragged column, and its Arrow type."""
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    ndims = {r.ndim for r in rows}
    types = [_nest(_scalar_type(d, name), n) for d in dtypes for n in ndims]
    arrow_type = _unify(types, name, "in different rows")
    return (dtypes[0] if len(dtypes) == 1 else _torch_dtype(_leaf(arrow_type))), arrow_type


def _values_array(column: Column, name: str) -> Any:
    """A column of Python values through ``datasets``' typed conversion (what ``from_list`` does)."""
    import pyarrow as pa
    from datasets.arrow_writer import OptimizedTypedSequence

    values = [to_python(v) for v in column.data]
    try:
        return pa.array(OptimizedTypedSequence(values, col=name))
    except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
        raise TypeError(
            f"column {name!r} holds values that Arrow (so datasets) cannot give one type "
            f"({err}). Store one type in every row, or leave the column out with keys=[...]."
        ) from err


def column_type(column: Column, name: str) -> Any:
    """The Arrow type that holds every row of a walked column (see the module docstring).

    Raises:
        TypeError: if the rows have no common type, or a dtype Arrow cannot store.
    """
    import pyarrow as pa

    if column.kind == DENSE:
        return _nest(_scalar_type(column.data.dtype, name), column.data.ndim - 1)
    if column.kind == RAGGED:
        return _row_dtype(column.data, name)[1]
    if column.kind == TURNS:
        return _turns_type()
    if all(type(v) is str for v in column.data):
        return pa.string()
    return _values_array(column, name).type


def declared_schema(columns: Sequence[Column], names: Sequence[str]) -> Any:
    """The ``pyarrow.Schema`` a streaming view declares from a batch, or ``None`` when a message
    column holds tool calls (their arguments have no fixed type: ``datasets`` takes each row as
    it comes)."""
    import pyarrow as pa

    if any(c.kind == MESSAGES for c in columns):
        return None
    return pa.schema([(n, column_type(c, n)) for c, n in zip(columns, names)])


def unify_schemas(schemas: Sequence[Any]) -> Any:
    """One schema for batches read with :func:`arrow_table`: each column's types promoted (see
    the module docstring).

    Raises:
        TypeError: if a column's types have no common type.
    """
    import pyarrow as pa

    first = schemas[0]
    if all(s == first for s in schemas):
        return first
    return pa.schema(
        [
            (n, _unify([s.field(n).type for s in schemas], n, "in different reads"))
            for n in first.names
        ]
    )


# -- tensors: values end to end and row lengths --------------------------------------------------


def _packed(column: Column, dtype: torch.dtype) -> tuple[torch.Tensor, list[int] | None] | None:
    """A tensor column's values end to end, as ``dtype``, and each row's leading length (``None``:
    row ``i`` is ``values[i]``); ``None`` if its rows do not share their inner shape."""
    if column.kind == DENSE:
        value = column.data.detach().cpu()
        if column.bounds is not None:
            first, last, mask_shape = column.bounds.first, column.bounds.last, column.bounds.shape
            if len(mask_shape) == 2 and value.shape[:2] == mask_shape and mask_shape[0] > 0:
                first, last = first.cpu(), last.cpu()
                positions = torch.arange(mask_shape[1])
                keep = (positions >= first[:, None]) & (positions < last[:, None])
                return value[keep].to(dtype), (last - first).tolist()
        return value.to(dtype), None
    rows = column.data
    inner = rows[0].shape[1:]
    if any(r.ndim != rows[0].ndim or r.shape[1:] != inner for r in rows):
        return None
    if any(r.dtype != dtype for r in rows):
        rows = [r.to(dtype) for r in rows]
    if rows[0].ndim == 0:
        return torch.stack(rows).detach().cpu(), None
    return torch.cat(rows).detach().cpu(), [len(r) for r in rows]


def _tensor_dtype(column: Column, name: str) -> torch.dtype:
    if column.kind == DENSE:
        _scalar_type(column.data.dtype, name)  # refuses what Arrow cannot store
        return column.data.dtype
    return _row_dtype(column.data, name)[0]


def _solid_lengths(column: Column, dtype: torch.dtype) -> list[int] | None:
    """The row lengths of a bool mask column cut to its own spans when every row is then all
    ``True`` (``Spans.solid``), else ``None``."""
    bounds = column.bounds
    if bounds is None or not bounds.solid or column.data is not bounds.mask:
        return None
    if dtype != torch.bool or len(bounds.shape) != 2 or bounds.shape[0] == 0:
        return None
    return bounds.sizes[1::2]


def _tensor_values(column: Column, dtype: torch.dtype) -> Iterable:
    """Each row of a tensor column as Python values (what the row's ``tolist()`` gives), in row
    order.

    The batch's values are gathered once (one tensor end to end); each row's list is made from
    its NumPy view only when the row is read. Made all at once, a batch's lists and numbers
    (``256 x 128`` tokens: ~1 MB of new ``int`` objects) leave the caches before they are read,
    and live through collections of the garbage collector's youngest generation; made row by
    row, one row's memory is reused for the next (the streaming view: ~30% less time).
    """
    if column.kind == DENSE:
        lengths = _solid_lengths(column, dtype)
        if lengths is not None:  # a solid mask's own rows: all True, nothing to convert
            return map(mul, repeat([True]), lengths)
    packed = _packed(column, dtype)
    if packed is None:  # rows of different inner shapes: one tolist per row
        return [r.to(dtype).tolist() for r in column.data]
    values, lengths = packed
    if values.dtype == torch.bfloat16:
        values = values.float()  # what a bfloat16 row's tolist() gives
    values = values.numpy()  # numpy builds Python lists faster than torch
    if lengths is not None:
        bounds = list(accumulate(lengths, initial=0))
        return map(np.ndarray.tolist, map(values.__getitem__, map(slice, bounds, bounds[1:])))
    if values.ndim == 1:  # one number per row: no list to make
        return values.tolist()
    return map(np.ndarray.tolist, values)  # row views


def _turn_values(column: Column) -> list:
    roles, contents = column.data
    return [
        [{"role": r, "content": c} for r, c in zip(row_roles, row_contents)]
        for row_roles, row_contents in zip(roles, contents)
    ]


def _only_adds_fields(declared: Any, wider: Any) -> bool:
    """Whether ``wider`` is ``declared`` with more struct fields (or a type where ``declared``
    knew none: ``null``), every value of ``declared`` kept as it is.

    Examples:
        >>> import pyarrow as pa
        >>> turn = pa.struct([("role", pa.string()), ("content", pa.string())])
        >>> call = pa.struct([*turn, ("tool_calls", pa.list_(pa.string()))])
        >>> _only_adds_fields(pa.list_(turn), pa.list_(call)), _only_adds_fields(pa.int64(), pa.float64())
        (True, False)
    """
    import pyarrow as pa

    if declared == wider or pa.types.is_null(declared):
        return True
    if pa.types.is_struct(declared) and pa.types.is_struct(wider):
        names = [f.name for f in wider]
        return all(
            f.name in names and _only_adds_fields(f.type, wider.field(f.name).type)
            for f in declared
        )
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(is_list(declared) and is_list(wider) for is_list in lists):
        return _only_adds_fields(declared.value_type, wider.value_type)
    return False


def _python_values(column: Column, name: str, declared: Any) -> Iterable:
    if declared is not None:
        found = column_type(column, name)
        if found != declared:
            try:
                target = _unify([declared, found], "", "")
            except TypeError:
                target = None
            if target is not None and target != declared and _only_adds_fields(declared, target):
                # fields first met in a later batch (tool calls): every row of the batch gets
                # them, None where absent, as to_hf_dataset() types the column from all rows
                return _values_array(column, name).cast(target).to_pylist()
            if target != declared:
                raise TypeError(
                    f"column {name!r} holds {found} values in this batch, but the view's "
                    f"features were fixed as {declared} from the first batch of the buffer, "
                    "and they cannot hold these values without changing them. Use "
                    "to_hf_dataset() (its types come from every stored row), store one type "
                    "in every row, or leave the column out with keys=[...]."
                )
            if column.kind in (DENSE, RAGGED):
                return _tensor_values(column, _torch_dtype(_leaf(declared)))
            return _values_array(column, name).cast(declared).to_pylist()
    if column.kind in (DENSE, RAGGED):
        return _tensor_values(column, _tensor_dtype(column, name))
    if column.kind == TURNS:
        return _turn_values(column)
    return [to_python(v) for v in column.data]


def python_columns(
    columns: Sequence[Column], names: Sequence[str], declared: Any
) -> list[Iterable]:
    """Per-row Python values of each column, as ``to_python`` gives them row by row: one iterable
    per column, in row order (a tensor column's row lists are made as they are read, from the
    batch's values gathered by then: see ``_tensor_values``).

    ``declared`` (a ``pyarrow.Schema`` from :func:`declared_schema`, or ``None``): a column whose
    rows have another type is converted to the declared one if it holds them exactly (ints in a
    float column); to a wider one if the rows only add struct fields (tool calls first met in a
    later batch: every message of the batch gets the ``tool_calls`` and ``name`` fields, as
    ``to_hf_dataset()`` gives them); and refused otherwise (floats in an int column).

    Raises:
        TypeError: if a column does not fit its declared type, or its rows have no common type.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop.data._columns import walk_columns
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> columns = walk_columns(td, ["ids"], "mask")
        >>> [list(rows) for rows in python_columns(columns, ["ids"], None)]
        [[[5, 6], [7, 8, 9]]]
    """
    return [
        _python_values(c, n, None if declared is None else declared.field(n).type)
        for c, n in zip(columns, names)
    ]


# -- Arrow arrays --------------------------------------------------------------------------------


def _tensor_array(column: Column, name: str) -> Any:
    """Values plus offsets: one Arrow list level per dimension of a row."""
    import numpy as np
    import pyarrow as pa

    dtype = _tensor_dtype(column, name)
    packed = _packed(column, dtype)
    if packed is None:  # rows of different inner shapes: Arrow lists hold them row by row
        return pa.array(_tensor_values(column, dtype), type=column_type(column, name))
    values, lengths = packed
    if values.dtype == torch.bfloat16:
        values = values.float()  # datasets stores bfloat16 as float32
    inner = list(values.shape[1:])
    array = pa.array(values.reshape(-1).numpy())
    for level in reversed(range(len(inner))):  # fixed inner dims, innermost first
        count = values.shape[0] * math.prod(inner[:level])
        array = pa.ListArray.from_arrays(np.arange(count + 1, dtype=np.int32) * inner[level], array)
    if lengths is not None:
        array = pa.ListArray.from_arrays(_offsets(lengths), array)
    return array


def _offsets(lengths: Any) -> Any:
    import numpy as np

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _turns_array(column: Column) -> Any:
    import pyarrow as pa

    roles, contents = column.data
    turns = pa.StructArray.from_arrays(
        [
            pa.array(list(chain.from_iterable(roles)), pa.string()),
            pa.array(list(chain.from_iterable(contents)), pa.string()),
        ],
        names=["role", "content"],
    )
    return pa.ListArray.from_arrays(_offsets([len(r) for r in roles]), turns)


def arrow_table(columns: Sequence[Column], names: Sequence[str]) -> Any:
    """A ``pyarrow.Table`` of walked columns, each typed from all of its rows.

    Tensor columns are built from their values and offsets, History turns from their strings;
    other columns go through ``datasets``' own typed conversion (what ``Dataset.from_list``
    does). Batches may differ in type: :func:`unify_schemas` gives the schema that holds them all.

    Raises:
        TypeError: if a column's rows have no common type.
    """
    import pyarrow as pa

    arrays = []
    for column, name in zip(columns, names):
        if column.kind in (DENSE, RAGGED):
            arrays.append(_tensor_array(column, name))
        elif column.kind == TURNS:
            arrays.append(_turns_array(column))
        else:
            arrays.append(_values_array(column, name))
    return pa.Table.from_arrays(arrays, names=list(names))
