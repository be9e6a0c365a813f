"""A batch's columns: which it holds, which a call selects and under which names, and the one
walk that reads them.

A buffer row reaches every view along one path, in this module. A :class:`Selection` holds a
dataset's ``keys``, ``rename``, ``attention_mask_key`` and ``sep``, checked once;
:meth:`Selection.resolve` matches them against the first batch read (:func:`column_keys` lists a
batch's leaf columns, a History being one; :func:`select_columns` turns keys into them;
:func:`check_mask_column` checks the mask) and gives the :class:`Schema`, the stored columns and
their output names, that every later batch is walked with. :func:`walk_columns` reads each
column of a batch once (a dense tensor, ragged per-row tensors, History turns, or other values)
and cuts it to the attention mask once. What a view makes of a :class:`Column` is its own:
:meth:`Column.rows` gives the per-row tensors and values that the torch view and
:func:`split_columns` yield; ``_arrow`` gives the Python values and Arrow arrays of the Hugging
Face views. Errors are signed by the public call being made (``_checks.boundary``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDictBase,
    is_non_tensor,
    is_tensorclass,
    set_list_to_stack,
)
from tensordict.utils import NestedKey

from .._checks import as_device, as_mapping, boundary, check_tensordict, type_error
from .._conversation import has_turn_fields, history_to_messages, messages_of, real_turns
from .._keys import as_nested_key, key_parts, key_to_str, keys_present
from .._padding import Spans, mask_spans, trim_row
from .._upstream._history_fields import (
    history_column,
    history_fields,
    non_tensor_payloads,
    row_entries,
)

__all__ = [
    "Column",
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
    "split_columns",
    "walk_columns",
]

# -- which columns a batch holds, and which ones a call selects --------------------------------


def as_column_key(key: Any, arg: str) -> NestedKey:
    """``key`` in canonical form (:func:`~torchrl_trl_interop._keys.as_nested_key`); a
    :class:`TypeError` naming ``arg`` otherwise."""
    return as_nested_key(key, arg)


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
            f"{arg}=[] selects no column, so there would be nothing to read. Pass {arg}=None "
            "for every column, or name at least one key."
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
    available: list[NestedKey] | None = None,
) -> list[NestedKey]:
    """The leaf columns ``keys`` name, in order, once each (``None``: every leaf column; a key
    naming a sub-tensordict names its leaves). ``available``: ``column_keys(batch)``, when the
    caller listed them already.

    Raises:
        KeyError: if a key is not in ``batch``; the message lists the stored keys.
    """
    available = column_keys(batch) if available is None else available
    if keys is None:
        return available
    columns: list[NestedKey] = []
    for key in keys:
        parts = key_parts(key)
        matched = [k for k in available if key_parts(k)[: len(parts)] == parts]
        if not matched:
            stored = sorted(key_to_str(k, sep) for k in available)
            raise KeyError(
                f"key {key!r} from keys= is not in {where}; stored keys are {stored}. Fix "
                "keys=[...] or write the key into the buffer."
            )
        columns.extend(k for k in matched if k not in columns)
    return columns


def non_tensor_columns(td: Any, columns: Sequence[NestedKey]) -> list[NestedKey]:
    """The columns holding strings or History (anything not a tensor) in ``td``."""
    return [k for k in columns if not isinstance(probe(td, k)[0], torch.Tensor)]


def check_mask_column(
    batch: TensorDictBase,
    key: NestedKey,
    *,
    where: str = "the batch",
    sep: str = ".",
    available: list[NestedKey] | None = None,
) -> None:
    """Refuses a mask that is absent or is not a per-token bool or int mask (it would trim nothing).
    ``available``: ``column_keys(batch)``, when the caller listed them already.

    Raises:
        KeyError: if ``key`` is not a column of ``batch``.
        TypeError: if the column is not an int or bool tensor with a token dimension.
    """
    available = column_keys(batch) if available is None else available
    if key not in available:
        stored = sorted(key_to_str(k, sep) for k in available)
        raise KeyError(f"attention_mask_key {key!r} is not in {where}; stored keys are {stored}.")
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
            f"attention_mask_key {key!r} holds {what}; expected a bool or int mask with one "
            "entry per token (e.g. ('masks', 'all_attention_mask')). Pass the mask's key, or "
            "attention_mask_key=None."
        )


# -- the selection a dataset reads with, and the schema it resolves to ----------------------------

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
            raise ValueError(f"sep must be a non-empty str, got {sep!r}.")
        names: dict[NestedKey, str] = {}
        for key, name in as_mapping(rename, "rename", "{stored key: output name}").items():
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"rename maps {key!r} to {name!r}; output names must be non-empty str."
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
                f"the replay buffer returned a {type(batch).__name__}, not a TensorDict. Store "
                "TensorDicts (e.g. rb.extend(TensorDict({...}, batch_size=[n]))) so columns "
                "have names."
            )
        sep = self.sep
        available = column_keys(batch)  # listed once: the keys, rename and mask are checked on it
        columns = select_columns(batch, self.keys, sep=sep, where=_WHERE, available=available)
        for key in self.rename:
            if key not in available:
                stored = sorted(key_to_str(k, sep) for k in available)
                raise KeyError(f"rename= key {key!r} is not in {_WHERE}; stored keys are {stored}.")
            if key not in columns:
                raise KeyError(
                    f"rename= key {key!r} is not among the selected keys "
                    f"{[key_to_str(k, sep) for k in columns]}; add it to keys=[...]."
                )
        if self.attention_mask_key is not None:
            mask = self.attention_mask_key
            check_mask_column(batch, mask, where=_WHERE, sep=sep, available=available)
        names = [self.rename.get(k, key_to_str(k, sep)) for k in columns]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(
                f"several keys map to the output name(s) {dupes}; give them distinct names "
                "with rename={...}."
            )
        return Schema(columns, names)


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
    (``tolist`` reads each through tensordict's attribute access)."""
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
            f"key {key!r} holds a {type(value).__name__} that cannot be split into {batch} "
            "rows. Store tensors, strings (NonTensorData/NonTensorStack) or History, or leave "
            "the key out with keys=[...]."
        )
    return _unwrap(rows)


def _column(batch: TensorDictBase, key: NestedKey, bounds: Any, masks: list | None) -> Column:
    first, lazy = probe(batch, key)
    if first is None:
        raise KeyError(
            f"key {key!r} is not in this batch of the replay buffer (found "
            f"{keys_present(batch)}); do all rows hold the same keys? Leave it out with "
            "keys=[...], or write it into every row."
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
