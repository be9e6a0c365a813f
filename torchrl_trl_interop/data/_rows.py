"""TRL rows into TensorDicts: one dict of columns per example -> a ``[N]`` lazy-stacked TensorDict.

The inverse direction of ``_columns``. Conversational columns become
:class:`~torchrl.data.llm.History` (through ``_conversation``), one class per column (a
:class:`~torchrl_trl_interop.MessageHistory` when some row's messages hold fields History has
no slot for); this module owns the tensordict list-to-stack scope that History needs, so
callers never set it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict, lazy_stack, set_list_to_stack
from tensordict.utils import NestedKey

from .._checks import as_mapping, boundary, check_among, check_dicts
from .._conversation import conversations_to_histories, is_message_list
from ._columns import as_column_key

__all__ = ["extend_with_rows", "rows_to_tensordict"]

#: The kinds of a conversational column: plain History, or MessageHistory (extra fields).
_HISTORY, _MESSAGE_HISTORY = "history", "MessageHistory"
_HISTORIES = {_HISTORY, _MESSAGE_HISTORY}


def _numeric_dtype(value: Any) -> Any:
    """The torch dtype a row value is stored with, ``None`` if it is not a (nested) number list."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, float):
        return torch.float64  # float64: Python floats come back exactly
    return None


def _list_dtype(value: Any) -> tuple[Any, tuple[int, ...]] | None:
    """``(dtype, shape)`` of a rectangular list of numbers, ``None`` for anything else."""
    if not isinstance(value, (list, tuple)):
        dtype = _numeric_dtype(value)
        return None if dtype is None else (dtype, ())
    if len(value) == 0:
        return (None, (0,))
    inner = [_list_dtype(v) for v in value]
    if any(i is None for i in inner) or len({i[1] for i in inner}) != 1:
        return None
    dtypes = {i[0] for i in inner if i[0] is not None}
    if dtypes == {torch.int64, torch.float64}:
        return None  # mixed ints and floats: keep them as Python objects, loss-free
    if len(dtypes) > 1:
        return None
    return (dtypes.pop() if dtypes else None, (len(value),) + inner[0][1])


def _column_kind(name: str, values: Sequence[Any]) -> Any:
    """``"history"``, ``"object"`` or a ``(dtype, ndim)`` tensor kind for one column."""
    conversations = [is_message_list(v) for v in values]
    if all(conversations):
        return _HISTORY
    if any(conversations):
        row = conversations.index(False)
        raise ValueError(
            f"column {name!r} holds conversations (message lists) in some rows but "
            f"{values[row]!r:.100} in row {row}. A column is stored either as History or as "
            "plain values; make it uniform first (e.g. with dataset.map or dataset.filter)."
        )
    kinds = [_list_dtype(v) for v in values]
    if any(k is None for k in kinds):
        return "object"
    ndims = {len(k[1]) for k in kinds}
    dtypes = {k[0] for k in kinds if k[0] is not None}
    if len(ndims) != 1 or len(dtypes) > 1:
        return "object"
    dtype = dtypes.pop() if dtypes else torch.int64
    return (dtype, ndims.pop())


def _history_column(name: str, values: Sequence[Any], previous: Any) -> tuple[list, str]:
    """The rows' conversations as Histories of one class, and the column's kind."""
    histories, fields = conversations_to_histories(
        values, message_history=previous == _MESSAGE_HISTORY
    )
    if fields and previous == _HISTORY:
        row = next(i for i, v in enumerate(values) if conversations_to_histories([v])[1])
        extra = sorted({k for m in values[row] for k in m} - {"role", "content", "tool_calls"})
        what = f"message fields {extra}" if extra else "a tool turn without its call's name"
        raise ValueError(
            f"column {name!r} was stored as plain History so far, but row {row} of these rows "
            f"holds {what}, which a plain History cannot give back: they need a "
            "MessageHistory, and one column holds one class. Write every row in one chunk "
            "(replay_buffer_from_hf(..., chunk_size=number of rows)), or make every message "
            "hold those fields first (datasets.Dataset.from_list(rows) does)."
        )
    return histories, _MESSAGE_HISTORY if fields else _HISTORY


def _entry(kind: Any, value: Any) -> Any:
    if kind == "object":
        return NonTensorData(value)
    return torch.tensor(value, dtype=kind[0])


def _rows_to_tensordict(
    rows: Sequence[dict[str, Any]],
    rename: dict[str, Any] | None,
    kinds: dict[str, Any] | None,
) -> tuple[Any, dict[str, Any]]:
    """:func:`rows_to_tensordict`, checking columns against ``kinds`` (from earlier chunks)."""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)) or not rows:
        raise ValueError(
            "rows_to_tensordict expects a non-empty list of TRL rows (dicts of columns), got "
            f"{type(rows).__name__}{' (empty)' if isinstance(rows, Sequence) else ''}."
        )
    check_dicts(rows, "rows", "mapping column names to values")
    names = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(names):
            raise KeyError(
                f"row {i} has columns {sorted(row)} but row 0 has {sorted(names)}; every row "
                "needs the same columns."
            )
    rename = as_mapping(rename, "rename", "{column: key}")
    rename = {name: as_column_key(key, f"rename[{name!r}]") for name, key in rename.items()}
    check_among(rename, names, "rename=", "the rows' columns")
    new_kinds = dict(kinds or {})
    columns: dict[str, list] = {}
    for name in names:
        values = [row[name] for row in rows]
        kind = _column_kind(name, values)
        previous = new_kinds.get(name)
        if previous is not None and (previous != kind and {previous, kind} != _HISTORIES):
            raise ValueError(
                f"column {name!r} was stored as {previous} so far but these rows need {kind}. "
                "Rows of one buffer must agree per column; cast or fill the column first "
                "(e.g. dataset.cast_column or dataset.map)."
            )
        if kind == _HISTORY:
            columns[name], kind = _history_column(name, values, previous)
        else:
            columns[name] = [_entry(kind, v) for v in values]
        new_kinds[name] = kind
    keys = [rename.get(name, name) for name in names]
    tds = []
    for i in range(len(rows)):
        td = TensorDict(batch_size=[])
        for key, name in zip(keys, names):
            td.set(key, columns[name][i])
        tds.append(td)
    return lazy_stack(tds), new_kinds


@boundary("rows_to_tensordict")
def rows_to_tensordict(
    rows: Sequence[dict[str, Any]], *, rename: dict[str, Any] | None = None
) -> Any:
    """Converts TRL rows (one dict of columns per example) into a ``[N]`` lazy-stacked TensorDict.

    Conversational columns (message lists) become :class:`~torchrl.data.llm.History` (one
    ``[T_i]`` History per row, ragged across rows; a
    :class:`~torchrl_trl_interop.MessageHistory` for every row of a column where some message
    holds fields History has no slot for, such as ``reasoning_content``); numbers and
    rectangular number lists become
    tensors (``bool``, ``int64``, or ``float64`` so Python floats come back exactly); everything
    else (strings, ``None``, mixed lists, dicts) is kept as-is in ``NonTensorData``.

    Args:
        rows (list of dict): the examples, all with the same columns.

    Keyword Args:
        rename (dict, optional): maps a column name to the (nested) key it is stored under, e.g.
            ``{"prompt": ("history", "prompt")}``. Other columns keep their name.

    Returns:
        a :class:`~tensordict.LazyStackedTensorDict` with batch size ``[len(rows)]``.

    Raises:
        ValueError: if ``rows`` is empty, or a column mixes conversations with other values.
        TypeError: if a row is not a dict.
        KeyError: if rows have different columns, or ``rename`` names an absent column.

    Examples:
        >>> rows = [{"prompt": [{"role": "user", "content": "Hi"}], "score": 1.5},
        ...         {"prompt": [{"role": "user", "content": "Yo"}, {"role": "user", "content": "?"}],
        ...          "score": -2.0}]
        >>> from torchrl_trl_interop import history_to_messages
        >>> td = rows_to_tensordict(rows, rename={"prompt": ("history", "prompt")})
        >>> td.batch_size, td.get("score").tolist()
        (torch.Size([2]), [1.5, -2.0])
        >>> history_to_messages(td.get(("history", "prompt"))) == [r["prompt"] for r in rows]
        True
    """
    with set_list_to_stack(True):
        return _rows_to_tensordict(rows, rename, None)[0]


def extend_with_rows(
    replay_buffer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    rename: dict[str, NestedKey] | None = None,
    kinds: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Converts ``rows`` as :func:`rows_to_tensordict` does and writes them to ``replay_buffer``.

    Keyword Args:
        rename (dict, optional): as in :func:`rows_to_tensordict`.
        kinds (dict, optional): the column kinds returned by an earlier call on the same buffer;
            a column whose kind changes raises a :class:`ValueError`.

    Returns:
        the column kinds, to pass to the next call.

    Examples:
        >>> from torchrl.data import LazyStackStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyStackStorage(4))
        >>> kinds = extend_with_rows(rb, [{"text": "a", "score": 1.0}])
        >>> _ = extend_with_rows(rb, [{"text": "b", "score": 2.0}], kinds=kinds)
        >>> len(rb), rb[1]["text"]
        (2, 'b')
    """
    with set_list_to_stack(True):
        td, kinds = _rows_to_tensordict(rows, rename, kinds)
        replay_buffer.extend(td)
    return kinds
