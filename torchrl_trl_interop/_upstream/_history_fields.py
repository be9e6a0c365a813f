"""Reading a TorchRL :class:`~torchrl.data.llm.History`'s roles and contents, whatever its layout.

A History's tensordict takes several layouts: lazy stacks of per-turn TensorDicts (what
``History.from_chats`` and TorchRL's LLM wrappers build), TensorDicts whose ``NonTensorStack``
fields stack every turn (what :func:`~torchrl_trl_interop.messages_to_history` builds, and what a
``LazyTensorStorage`` returns), and any nesting of the two. :func:`history_fields` reads
``(roles, contents)`` from the ``NonTensorData`` / ``NonTensorStack`` payloads in one walk, for
every layout, and falls back to tensordict's ``tolist`` for any other; :func:`history_column`
reads a column of ``[T]`` Histories without building the stacked History (the turns of every
row in one pass when each row is a lazy stack of turns, else row by row);
:func:`history_messages` reads every turn's dict (what ``tolist`` gives) the same way.

The walk reads tensordict's internals (a ``TensorDict``'s entry dict ``_tensordict``, its
``_batch_size``, a ``NonTensorData``'s payload ``_non_tensordict["data"]``, a tensorclass's
``_tensordict``): it runs on the tensordict versions it was measured on
(:data:`~torchrl_trl_interop._upstream.TENSORDICT_MEASURED`); on any other, every function here is
tensordict's ``tolist`` (``history.tolist(tolist_first=True)``, much slower: the figures are in
``benchmarks/RESULTS.rst``, "Why the speed paths").

The upstream fix that would retire it: a ``tolist`` of a History (or of one field of it) that
reads the payloads in one walk, without building a tensorclass per turn (tensordict/torchrl).
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict

from ._gate import TENSORDICT_MEASURED, use_fast

if TYPE_CHECKING:  # pragma: no cover
    from torchrl.data.llm import History

__all__ = [
    "history_column",
    "history_fields",
    "history_messages",
    "non_tensor_payloads",
    "row_entries",
]

#: the internals this module reads (test/test_layout.py checks the list against the code)
READS = (
    "tensordict.TensorDict._tensordict",
    "tensordict.TensorDict._batch_size",
    "tensordict.NonTensorData._tensordict",
    "tensordict.NonTensorData._non_tensordict",
    "tensordict.tensorclass._tensordict",
)


def history_fields(history: History) -> tuple[Any, Any]:
    """``(roles, contents)`` of a History as nested lists (one level per batch dimension), as
    ``history.role`` and ``history.content`` give them, read from the payloads in one walk
    (:func:`_layout_fields`); any layout it does not know goes through tensordict's ``tolist``.

    Examples:
        >>> from torchrl.data.llm import History
        >>> history_fields(History.from_chats([[{"role": "user", "content": "Hi"}]]))
        ([['user']], [['Hi']])
    """
    if not use_fast(TENSORDICT_MEASURED):
        return _plain_fields(history, "role"), _plain_fields(history, "content")
    td = history._tensordict
    fields = _layout_fields(td, history.ndim)
    if fields is not None:
        return fields
    return _field_lists(td, "role", history.ndim), _field_lists(td, "content", history.ndim)


def _payloads(value: Any, ndim: int) -> Any:
    """The values of a non-tensor entry with ``ndim`` batch dimensions as nested lists, what its
    ``tolist()`` gives, read from the payloads directly; ``None`` for any other entry.

    A ``NonTensorData`` holds one value for its whole batch (every element is that value); a
    ``NonTensorStack`` holds one entry per element along its stack dimension.
    """
    cls = type(value)
    if cls is NonTensorData:
        shape = value._tensordict._batch_size  # not .batch_size: a tensorclass call
        if len(shape) != ndim:
            return None
        return _repeat(value._non_tensordict["data"], tuple(shape))
    if cls is NonTensorStack and ndim == 1 and value.stack_dim == 0:  # one row: one loop
        values = []
        for sub in value.tensordicts:
            if type(sub) is not NonTensorData or sub._tensordict._batch_size:
                return None
            values.append(sub._non_tensordict["data"])
        return values
    if cls is NonTensorStack and 0 <= value.stack_dim < ndim and value.tensordicts:
        rows = [_payloads(sub, ndim - 1) for sub in value.tensordicts]
        return None if any(r is None for r in rows) else _stacked(rows, value.stack_dim)
    return None


def _stacked(parts: list, dim: int) -> list:
    """Nested lists of ``parts`` stacked along ``dim``: ``parts[i]`` is the slice at index
    ``i`` of that dimension (a ``NonTensorStack`` stacked along the turns, say)."""
    if dim == 0:
        return parts
    return [_stacked([p[i] for p in parts], dim - 1) for i in range(len(parts[0]))]


def _repeat(data: Any, shape: tuple[int, ...]) -> Any:
    """``data`` as nested lists of ``shape`` (a new list at every level)."""
    if not shape:
        return data
    if len(shape) == 1:
        return [data] * shape[0]
    return [_repeat(data, shape[1:]) for _ in range(shape[0])]


def _layout_fields(td: Any, ndim: int) -> tuple[Any, Any] | None:
    """``(roles, contents)`` of a History's tensordict with ``ndim`` batch dimensions, read from
    the ``NonTensorData`` / ``NonTensorStack`` payloads in one walk, whatever the layout: lazy
    stacks of per-turn TensorDicts (what ``History.from_chats`` and TorchRL's wrappers build),
    TensorDicts whose fields stack every turn (:func:`messages_to_history`, a
    ``LazyTensorStorage``), any nesting of the two, stacked along any dimension; ``None`` for
    any other layout or a turn with tool calls (read as message lists instead)."""
    return _layout_values(td, ndim, ("role", "content"), exact=False)


def _layout_values(td: Any, ndim: int, names: tuple[str, ...], exact: bool) -> tuple | None:
    """The fields ``names`` of a History's tensordict as nested lists, read as
    :func:`_layout_fields` reads the roles and contents; ``exact``: ``None`` unless every turn
    holds exactly these fields (else: ``None`` for a turn with tool calls)."""
    cls = type(td)
    if cls is LazyStackedTensorDict:
        dim = td.stack_dim
        if not 0 <= dim < ndim or not td.tensordicts:
            return None
        if ndim == 1:  # one conversation's turns: the common case, read in one loop
            return _turn_fields(td.tensordicts, names, exact)
        rows = [_layout_values(sub, ndim - 1, names, exact) for sub in td.tensordicts]
        if any(row is None for row in rows):
            return None
        return tuple(_stacked([row[i] for row in rows], dim) for i in range(len(names)))
    if cls is not TensorDict or len(td._batch_size) != ndim:
        return None
    fields = td._tensordict
    if not _holds(fields, names, exact):
        return None
    values = tuple(_payloads(fields.get(name), ndim) for name in names)
    return None if any(v is None for v in values) else values


def _holds(fields: dict, names: tuple[str, ...], exact: bool) -> bool:
    if exact:
        return len(fields) == len(names) and all(name in fields for name in names)
    return "tool_calls" not in fields


def history_column(batch: Any, key: tuple[str, ...]) -> tuple[list, list] | None:
    """``(roles, contents)`` per row of the ``[T]`` Histories at ``key`` of a lazy stack of
    rows (what TorchRL's LLM storages return), without building the stacked History; ``None``
    for any other layout (read ``batch.get(key)`` then).

    Every layout the package and TorchRL produce is read in one pass over the rows, and a column
    may mix them: rows that are lazy stacks of turns (``History.from_chats``, TorchRL's wrappers)
    have their turns gathered and read together in one pass over the turns
    (:func:`_turn_fields`); rows whose fields stack their turns
    (:func:`~torchrl_trl_interop.messages_to_history`, ``replay_buffer_from_hf``, a
    ``LazyTensorStorage``) are read from their two stacks' payloads (:func:`_payloads`).
    """
    from torchrl.data.llm import History

    if not use_fast(TENSORDICT_MEASURED):
        return None
    rows = row_entries(batch, key)
    if rows is None:
        return None
    # per row: the number of its turns read with the gathered ones, or its (roles, contents)
    parts: list[Any] = []
    gathered: list = []
    for history in rows:
        if type(history) is not History:
            return None
        td = history._tensordict
        if type(td) is LazyStackedTensorDict:
            turns = td.tensordicts
            # each row's turns: the stack's one dimension (``td.batch_size``, not ``h.ndim``)
            if td.stack_dim != 0 or not turns or len(td.batch_size) != 1:
                return None
            gathered += turns
            parts.append(len(turns))
            continue
        if type(td) is not TensorDict or len(td._batch_size) != 1:
            return None
        fields = td._tensordict
        if "tool_calls" in fields:
            return None
        roles, contents = _payloads(fields.get("role"), 1), _payloads(fields.get("content"), 1)
        if roles is None or contents is None:
            return None
        parts.append((roles, contents))
    turn_fields = ([], [])
    if gathered:
        turn_fields = _turn_fields(gathered, ("role", "content"), False)
        if turn_fields is None:
            return None
    roles_out, contents_out, start = [], [], 0
    all_roles, all_contents = turn_fields
    for part in parts:
        if type(part) is int:
            roles_out.append(all_roles[start : start + part])
            contents_out.append(all_contents[start : start + part])
            start += part
        else:
            roles_out.append(part[0])
            contents_out.append(part[1])
    return roles_out, contents_out


def _turn_fields(turns: list, names: tuple[str, ...], exact: bool) -> tuple | None:
    """The fields ``names`` (two or more) of per-turn TensorDicts (no batch dimension), what
    :func:`_layout_values` reads for them; ``None`` for any other.

    One pass, each turn's entries read once: the turns of a column lie apart in memory, and a
    pass a field would read them twice."""
    get, n, payloads = itemgetter(*names), len(names), []
    for turn in turns:
        if type(turn) is not TensorDict or turn._batch_size:
            return None
        fields = turn._tensordict
        if not _holds(fields, names, exact):
            return None
        try:
            values = get(fields)
        except KeyError:
            return None
        for value in values:
            if type(value) is not NonTensorData:
                return None
            payloads.append(value._non_tensordict["data"])
    return tuple(payloads[i::n] for i in range(n))


def history_messages(history: History) -> list:
    """``history.tolist(tolist_first=True)`` of a ``[B, T]`` History: per conversation, one dict
    per turn (``role``, ``content`` and ``is_complete`` where the History holds it).

    Read from the payloads in one walk (much faster than tensordict's ``tolist``) when every turn
    holds just these fields; any other History (tool calls, other fields, other layouts) goes
    through ``tolist``.

    Examples:
        >>> from torchrl.data.llm import History
        >>> history = History.from_chats([[{"role": "user", "content": "Hi"}]])
        >>> history_messages(history) == history.tolist(tolist_first=True)
        True
    """
    if history.ndim == 2 and use_fast(TENSORDICT_MEASURED):
        for names in (("role", "content", "is_complete"), ("role", "content")):
            values = _layout_values(history._tensordict, 2, names, exact=True)
            if values is not None:
                return [[dict(zip(names, turn)) for turn in zip(*row)] for row in zip(*values)]
    return history.tolist(tolist_first=True)


def _field_lists(td: Any, field: str, ndim: int) -> Any:
    """The values of a History's ``field`` as nested lists (``ndim`` levels), through
    tensordict's ``tolist`` below the lazy stacks along their first dim (the layouts
    :func:`_layout_fields` does not know)."""
    if type(td) is LazyStackedTensorDict and td.stack_dim == 0 and ndim:
        return [_field_lists(sub, field, ndim - 1) for sub in td.tensordicts]
    return td.get(field).tolist()


def _plain_fields(history: History, field: str) -> Any:
    """``field`` of every turn as nested lists, read through tensordict's ``tolist`` (the plain
    branch of :func:`history_fields`)."""

    def pick(tree: Any, depth: int) -> Any:
        return tree[field] if depth == 0 else [pick(sub, depth - 1) for sub in tree]

    return pick(history.tolist(tolist_first=True), history.ndim)


def row_entries(batch: Any, key: tuple[str, ...]) -> list | None:
    """The entry at ``key`` of every row of a lazy stack (stacked along dim 0), read from the
    rows' own dicts, so no stacked value is built; ``None`` if ``batch`` is not such a stack.

    On tensordict versions other than those measured, each row's entry is read with ``get``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict, lazy_stack
        >>> rows = [TensorDict({"a": {"b": torch.tensor(i)}}) for i in range(2)]
        >>> row_entries(lazy_stack(rows), ("a", "b"))
        [tensor(0), tensor(1)]
    """
    if not (hasattr(batch, "tensordicts") and getattr(batch, "stack_dim", None) == 0):
        return None
    fast = use_fast(TENSORDICT_MEASURED)
    out = []
    try:
        for td in batch.tensordicts:
            node = td
            for part in key:
                if fast and type(node) is TensorDict:
                    node = node._tensordict[part]
                else:
                    node = node.get(part)
            out.append(node)
    except (KeyError, RuntimeError):  # e.g. a nested ragged stack that cannot be read whole
        return None
    return out


def non_tensor_payloads(values: list) -> list:
    """The payloads of ``NonTensorData`` values (``value.data``), read without the
    tensorclass's attribute lookup on the tensordict versions measured.

    Examples:
        >>> from tensordict import NonTensorData
        >>> non_tensor_payloads([NonTensorData("a"), NonTensorData("b")])
        ['a', 'b']
    """
    if use_fast(TENSORDICT_MEASURED):
        return [v._non_tensordict["data"] for v in values]
    return [v.data for v in values]
