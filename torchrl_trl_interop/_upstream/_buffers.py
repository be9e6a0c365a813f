"""torchrl replay-buffer state with no public accessor: the missing hooks the package reads.

A buffer's generator (``ReplayBuffer.set_rng`` sets it; nothing reads it back), a tensor
storage's tensordict (``TensorStorage._storage``: where its rows live, to check they are in shared
memory or hold text), a round-robin writer's counters (``_write_count``, ``_cursor``: how far the
writes got), the buffer's lock and a storage's ``_empty`` (what ``ReplayBuffer.empty`` calls). No
public call gives them, so these are not speed paths with a plain branch: on the torchrl versions
they were read on (:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`) they are read as
they are; on any other (and under :func:`~torchrl_trl_interop._upstream.plain_upstream`) each is
read only after checking it is still there, and its absence raises a :class:`RuntimeError` that
names the attribute, or takes the public fallback the function names.

The upstream fix that would retire them: public accessors in torchrl (``ReplayBuffer.rng``,
``TensorStorage.data``, ``RoundRobinWriter.write_count``/``cursor``, ``Storage.empty``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ._gate import TORCHRL_MEASURED, use_fast

__all__ = [
    "buffer_generator",
    "buffer_writer",
    "empty_storage",
    "generator_of",
    "replay_lock",
    "storage_data",
    "write_counters",
]

#: the internals this module reads (test/test_layout.py checks the list against the code)
READS = (
    "torchrl.data.ReplayBuffer._rng",
    "torchrl.data.ReplayBuffer._replay_lock",
    "torchrl.data.ReplayBuffer._writer",
    "torchrl.data.TensorStorage._storage",
    "torchrl.data.TensorStorage._empty",
    "torchrl.data.RoundRobinWriter._write_count",
    "torchrl.data.RoundRobinWriter._cursor",
)

_MISSING = object()


def _read(obj: Any, name: str, needs: str) -> Any:
    """``obj.<name>``; off the measured versions, a clear error where it is gone."""
    if use_fast(TORCHRL_MEASURED):
        return getattr(obj, name)
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        from importlib.metadata import version

        raise RuntimeError(
            f"torchrl {version('torchrl')}: {type(obj).__name__} has no {name!r}, which {needs} "
            f"reads (torchrl has no public accessor for it; read on torchrl "
            f"{TORCHRL_MEASURED[1]} to {TORCHRL_MEASURED[2]}, exclusive). Install a torchrl in "
            "that range, or report it to torchrl_trl_interop."
        )
    return value


def buffer_generator(replay_buffer: Any) -> Any:
    """The ``torch.Generator`` a buffer samples with (``None``: torch's default).

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> g = torch.Generator()
        >>> rb.set_rng(g)
        >>> buffer_generator(rb) is g
        True
    """
    return _read(replay_buffer, "_rng", "sampling with a seeded generator (to restore it)")


def generator_of(component: Any) -> Any:
    """The generator a buffer component (storage, sampler, writer) holds, or ``None`` (also where
    torchrl keeps none under that name: then nothing is held, the public fallback).

    Examples:
        >>> from torchrl.data import RandomSampler
        >>> generator_of(RandomSampler()) is None
        True
    """
    return getattr(component, "_rng", None)


def storage_data(storage: Any) -> Any:
    """The tensordict a tensor storage keeps its rows in (``None`` before its first write, or for
    a storage that keeps none).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> storage.set([0], TensorDict({"x": torch.zeros(1)}, batch_size=[1]))
        >>> storage_data(storage).batch_size
        torch.Size([4])
    """
    from torchrl.data.replay_buffers.storages import TensorStorage

    if not isinstance(storage, TensorStorage):
        return None
    return _read(storage, "_storage", "checking where a tensor storage's rows live")


def write_counters(writer: Any) -> tuple[int | None, int | None]:
    """``(writes so far, cursor)`` of a writer (shared memory for a round-robin writer, so a
    DataLoader worker reads the writer's current values); ``None`` for a counter it keeps not
    (also where torchrl renamed it: then the writes cannot be located, the public fallback).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        >>> write_counters(rb.writer)
        (3, 3)
    """
    counters = (getattr(writer, "_write_count", None), getattr(writer, "_cursor", None))
    return tuple(None if c is None else int(c) for c in counters)  # type: ignore[return-value]


def buffer_writer(replay_buffer: Any) -> Any:
    """A local buffer's writer, or ``None`` (a remote buffer's client holds none).

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> type(buffer_writer(ReplayBuffer(storage=LazyTensorStorage(4)))).__name__
        'RoundRobinWriter'
    """
    return getattr(replay_buffer, "_writer", None)


def replay_lock(replay_buffer: Any) -> AbstractContextManager:
    """The lock a buffer holds while it samples and writes (a no-op lock for a buffer without).

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> with replay_lock(ReplayBuffer(storage=LazyTensorStorage(4))):
        ...     pass
    """
    return getattr(replay_buffer, "_replay_lock", None) or nullcontext()


def empty_storage(storage: Any) -> None:
    """Empties a storage as ``ReplayBuffer.empty`` does (the storage's own reset).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> storage.set([0, 1], TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
        >>> empty_storage(storage)
        >>> len(storage)
        0
    """
    _read(storage, "_empty", "loading a saved buffer into a non-empty storage")()
