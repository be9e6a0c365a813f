"""Rows of a plain tensor-storage buffer read from its storage directly: what ``rb.sample`` and
``rb[index]`` return, without tensordict's slow index of string columns.

A ``LazyTensorStorage`` keeps a string column as one ``NonTensorStack`` of ``NonTensorData``,
one per row, and indexing it (``storage[index]``) builds every selected row anew: most of what
``rb.sample`` takes on a buffer with a ``prompt`` column, which caps any reader that samples
through the buffer (figures: ``benchmarks/RESULTS.rst``). :func:`take` indexes tensors as torch does and stacks the selected rows' own
``NonTensorData`` (the same objects, read-only here); anything else is indexed as tensordict
does.

:func:`direct_sample` and :func:`direct_read` apply only where the buffer would return exactly
the storage's rows: a plain ``ReplayBuffer`` (not a subclass, which may add entries) over a
one-dimensional ``LazyTensorStorage``/``TensorStorage`` on the CPU, holding a TensorDict, with
no transform, the default collate function, no prefetch, no sample unit and no generation
tracking. They return ``None`` otherwise, and the caller goes through the buffer. The sampler
draws the indices as in ``rb.sample`` (its own state and generator, under the buffer's locks).

It reads torchrl's and tensordict's internals (the buffer's ``_storage``, ``_sampler``,
``_collate_fn``, locks and flags; the storage's ``_storage``; ``TensorDict._new_unsafe``): it runs
on the versions it was measured on (:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED` and
:data:`~torchrl_trl_interop._upstream.TENSORDICT_MEASURED`); on any other, :func:`direct_read` and
:func:`direct_sample` return ``None`` (the caller reads through the buffer) and :func:`take` is
``value[index]``.

A ``ListStorage`` buffer with torchrl's default collate function is read the same way, for
another reason: that collate stacks the rows densely where it can
(``LazyStackedTensorDict.maybe_dense_stack``), and a dense stack of rows whose History entries
are of different classes (a :class:`~torchrl_trl_interop.MessageHistory` row beside plain
ones: real conversations) keeps the first row's class and drops the fields another lacks,
silently. :func:`direct_read` and :func:`direct_sample` return such a buffer's rows as stored,
in a lazy stack, every row with its own entries.

The upstream fix that would retire it: index a ``NonTensorStack`` by its list of rows
(tensordict), ``index_select`` tensors in ``TensorStorage.get``, and a dense stack of
tensorclasses that refuses rows of different classes (tensordict).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import (
    LazyStackedTensorDict,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
)
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.storages.utils import _collate_id

from ._gate import TENSORDICT_MEASURED, TORCHRL_MEASURED, use_fast

__all__ = ["direct_read", "direct_sample", "take"]

#: the internals this module reads (test/test_layout.py checks the list against the code)
READS = (
    "torchrl.data.replay_buffers.storages.utils._collate_id",
    "torchrl.data.ReplayBuffer._storage",
    "torchrl.data.ReplayBuffer._transform",
    "torchrl.data.ReplayBuffer._collate_fn",
    "torchrl.data.ReplayBuffer._prefetch",
    "torchrl.data.ReplayBuffer._sample_unit",
    "torchrl.data.ReplayBuffer._writer",
    "torchrl.data.ReplayBuffer._delayed_init",
    "torchrl.data.ReplayBuffer._service_shutdown",
    "torchrl.data.ReplayBuffer._replay_lock",
    "torchrl.data.ReplayBuffer._write_lock",
    "torchrl.data.ReplayBuffer._sampler",
    "torchrl.data.TensorStorage._storage",
    "torchrl.data.ListStorage._storage",
    "tensordict.TensorDict._has_names",
    "tensordict.TensorDict._new_unsafe",
    "tensordict.NonTensorStack._new_lazy_unsafe",
)


def take(value: Any, index: torch.Tensor, rows: list[int] | None = None) -> Any:
    """``value[index]`` along its first dimension, for a 1-D ``index`` of rows (none negative).

    Tensors are read with ``index_select`` (faster than ``value[index]`` on rows of tokens);
    plain TensorDicts are indexed per entry; a
    ``NonTensorStack`` of single ``NonTensorData`` rows is restacked from the selected rows; any
    other value is ``value[index]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"x": torch.arange(4), "text": ["a", "b", "c", "d"]}, batch_size=[4])
        >>> out = take(td, torch.tensor([3, 1]))
        >>> out["x"].tolist(), out.get("text").tolist()
        ([3, 1], ['d', 'b'])
    """
    if not use_fast(TENSORDICT_MEASURED):
        return value[index]
    if isinstance(value, torch.Tensor):
        if index.dtype in (torch.int64, torch.int32) and index.device == value.device:
            return value.index_select(0, index)  # faster than value[index]
        return value[index]
    if type(value) is TensorDict and not value._has_names():
        rows = index.tolist() if rows is None else rows
        entries = {k: take(v, index, rows) for k, v in value.items()}
        batch_size = torch.Size([len(rows), *value.batch_size[1:]])
        return TensorDict._new_unsafe(entries, batch_size=batch_size, device=value.device)
    if type(value) is NonTensorStack and value.stack_dim == 0 and value.batch_dims == 1:
        stacked = value.tensordicts  # one 0-dim entry per row
        selected = [stacked[i] for i in (index.tolist() if rows is None else rows)]
        if selected and all(type(row) is NonTensorData for row in selected):
            return NonTensorStack._new_lazy_unsafe(*selected, stack_dim=0)
    return value[index]


def _plain_storage(replay_buffer: Any) -> Any:
    """The buffer's storage when its rows come back as stored (see the module doc), else ``None``."""
    if not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED) or not _plain_buffer(replay_buffer):
        return None
    storage = getattr(replay_buffer, "_storage", None)
    plain = (
        type(storage) in (LazyTensorStorage, TensorStorage)
        and storage.initialized
        and type(storage._storage) is TensorDict
        and storage._storage.batch_dims >= 1
        and getattr(storage, "ndim", 1) == 1
        and (storage.device in (None, "auto") or torch.device(storage.device).type == "cpu")
        and replay_buffer._collate_fn is _collate_id
    )
    return storage if plain else None


def _plain_buffer(replay_buffer: Any) -> bool:
    """Whether the buffer returns its storage's rows as its collate function makes them: a
    plain ``ReplayBuffer`` without transform, prefetch, sample unit or generation tracking."""
    transform = getattr(replay_buffer, "_transform", None)
    return (
        type(replay_buffer) is ReplayBuffer
        and (transform is None or len(transform) == 0)
        and not getattr(replay_buffer, "_prefetch", False)
        and getattr(replay_buffer, "_sample_unit", None) is None
        and not getattr(replay_buffer._writer, "tracks_generations", False)
        and not getattr(replay_buffer, "_delayed_init", False)
        and not getattr(replay_buffer, "_service_shutdown", False)
    )


def _list_storage(replay_buffer: Any) -> Any:
    """The buffer's ``ListStorage`` when torchrl's default collate would stack its rows (see
    the module doc), else ``None``."""
    if not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED) or not _plain_buffer(replay_buffer):
        return None
    storage = getattr(replay_buffer, "_storage", None)
    if type(storage) is ListStorage and _is_default_list_collate(replay_buffer._collate_fn):
        return storage
    return None


def _is_default_list_collate(fn: Any) -> bool:
    """Whether ``fn`` is torchrl's ``_stack_anything``: compared by name, as torchrl's
    ``implement_for`` builds the function anew (a buffer may hold another object than the
    module's, which is a registry wrapper)."""
    return getattr(fn, "__name__", None) == "_stack_anything" and str(
        getattr(fn, "__module__", "")
    ).startswith("torchrl.data.replay_buffers")


def _rows(storage: Any, index: torch.Tensor) -> TensorDictBase | None:
    """``storage.get(index)`` for a 1-D integer index (a ``ListStorage``'s rows as stored, in a
    lazy stack), or ``None`` (an empty index, or one out of the stored rows or negative: the
    storage's own ``get`` says what it makes of it; rows that are not tensordicts)."""
    rows = index.tolist()
    if not rows or not 0 <= min(rows) <= max(rows) < len(storage):
        return None
    if type(storage) is ListStorage:
        items = [storage._storage[i] for i in rows]
        if not all(isinstance(item, TensorDictBase) for item in items):
            return None
        return LazyStackedTensorDict(*items, stack_dim=0)
    return take(storage._storage, index, rows)


def direct_read(replay_buffer: Any, index: torch.Tensor) -> TensorDictBase | None:
    """``replay_buffer[index]`` (a 1-D integer tensor of storage indices), or ``None`` where the
    buffer is not plain (then read ``replay_buffer[index]``).

    Examples:
        >>> import torch
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> direct_read(toy_buffer(4), torch.tensor([2, 0]))["x"].tolist()
        [2, 0]
    """
    storage = _plain_storage(replay_buffer) or _list_storage(replay_buffer)
    if storage is None or index.dtype not in (torch.int64, torch.int32) or index.ndim != 1:
        return None
    with replay_buffer._replay_lock:
        return _rows(storage, index)  # None: out of range, the buffer's read raises


def direct_sample(replay_buffer: Any, batch_size: int) -> TensorDictBase | None:
    """``replay_buffer.sample(batch_size)``, its sampler drawing, or ``None`` where the buffer
    is not plain (then call ``replay_buffer.sample``).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> direct_sample(toy_buffer(4), 3).batch_size
        torch.Size([3])
    """
    storage = _plain_storage(replay_buffer) or _list_storage(replay_buffer)
    if storage is None:
        return None
    with replay_buffer._replay_lock, replay_buffer._write_lock:
        index, _ = replay_buffer._sampler.sample(storage, batch_size)
        rows = None
        if isinstance(index, torch.Tensor) and index.ndim == 1 and not index.is_floating_point():
            rows = _rows(storage, index)
        return rows if rows is not None else replay_buffer._collate_fn(storage.get(index))
