"""How the dataset reads a torchrl buffer from other processes: workers, spawn and Ray.

torchrl's private attributes it needs (a buffer's generator, a storage's tensordict, a writer's
counters) are read in ``_upstream/_buffers``, a plain storage's rows in ``_upstream/_direct``,
each behind its version gate; the Ray buffer client classes are known here. The checks
refuse reads that would silently yield wrong rows (see the project BRIEF): stale copies in
DataLoader workers, half-written rows, samplers copied into several readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import (
    LazyMemmapStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
)

from .._checks import type_error
from .._keys import key_to_str
from .._upstream._buffers import buffer_generator, generator_of, storage_data, write_counters
from .._upstream._direct import direct_sample
from ._columns import column_keys, non_tensor_columns
from ._committed import CommittedWriter

__all__ = [
    "check_buffer",
    "check_remote_seed",
    "check_replay_buffer",
    "check_sample_size",
    "check_overwrites",
    "check_picklable_for_workers",
    "check_reader",
    "check_sampler_copies",
    "check_storage_columns",
    "is_remote",
    "picklable_remote",
    "sample",
    "spawn_safe_buffer",
    "write_mark",
]


def _remote_buffer_types() -> tuple[type, ...]:
    """torchrl's Ray buffer and its picklable clients (reads are calls to the buffer's actor)."""
    from torchrl.data.replay_buffers import ray_buffer

    names = ("RayReplayBuffer", "_RayReplayBufferClient", "_LazyDistributedReplayClient")
    return tuple(getattr(ray_buffer, name) for name in names if hasattr(ray_buffer, name))


def is_remote(replay_buffer: Any) -> bool:
    """Whether ``replay_buffer`` is a :class:`~torchrl.data.RayReplayBuffer` or one of its clients."""
    return isinstance(replay_buffer, _remote_buffer_types())


def picklable_remote(replay_buffer: Any) -> Any:
    """A Ray buffer as something a plain pickle (e.g. a Ray task) can carry: its ``client()``.

    A ``RayReplayBuffer`` does not pickle in torchrl 0.14.1; its client does and reads the same
    actor. Any other buffer is returned as is.
    """
    from torchrl.data import RayReplayBuffer

    return replay_buffer.client() if isinstance(replay_buffer, RayReplayBuffer) else replay_buffer


def sample(
    replay_buffer: ReplayBuffer, batch_size: int, generator: torch.Generator | None
) -> TensorDictBase:
    """``replay_buffer.sample(batch_size)``, drawn with ``generator`` when one is given.

    The buffer keeps its own generator: it is swapped back after the call. A plain tensor-storage
    buffer is read from its storage directly (``_upstream._direct.direct_sample``): the same rows.
    """
    if generator is None:
        return _sample(replay_buffer, batch_size)
    previous = buffer_generator(replay_buffer)
    replay_buffer.set_rng(generator)
    try:
        return _sample(replay_buffer, batch_size)
    finally:
        replay_buffer.set_rng(previous)


def _sample(replay_buffer: ReplayBuffer, batch_size: int) -> TensorDictBase:
    """``replay_buffer.sample``, read from a plain tensor storage directly (``_upstream._direct``)."""
    batch = direct_sample(replay_buffer, batch_size)
    return batch if batch is not None else replay_buffer.sample(batch_size)


def _shallow_copy(obj: Any) -> Any:
    clone = object.__new__(type(obj))
    clone.__dict__.update(obj.__dict__)
    return clone


def spawn_safe_buffer(replay_buffer: ReplayBuffer) -> ReplayBuffer:
    """``replay_buffer`` with its ``torch.Generator`` left out, for pickling into a spawned worker.

    A ``torch.Generator`` cannot be sent to a spawned process (measured: "unable to resize file"
    in every worker), and a buffer built with ``generator=`` holds one in its storage, sampler and
    writer. Workers draw with their own generator (``_sharding.derive_seed``),
    so the copy sent to them leaves it out; the user's buffer is not modified.
    """
    generator = generator_of(replay_buffer)
    if not isinstance(generator, torch.Generator):
        return replay_buffer
    originals = [replay_buffer] + [
        value for value in replay_buffer.__dict__.values() if generator_of(value) is generator
    ]
    copies = {id(obj): _shallow_copy(obj) for obj in originals}

    def swap(value: Any) -> Any:
        if value is generator:
            return None
        if id(value) in copies:
            return copies[id(value)]
        if isinstance(value, (list, tuple)) and any(id(v) in copies for v in value):
            return type(value)(swap(v) for v in value)  # e.g. a storage's attached entities
        return value

    for clone in copies.values():
        for name, value in list(clone.__dict__.items()):
            clone.__dict__[name] = swap(value)
    return copies[id(replay_buffer)]


def check_local(replay_buffer: Any, error: type[Exception], why: str) -> None:
    """Raises ``error`` ("a RayReplayBuffer ``why``") when ``replay_buffer``
    lives in a Ray actor, which a job needing the buffer in this process cannot use."""
    if is_remote(replay_buffer):
        raise error(f"a {type(replay_buffer).__name__} {why}")


def check_picklable_for_workers(replay_buffer: Any) -> None:
    """Raises if ``replay_buffer`` cannot be read from spawned DataLoader worker processes."""
    check_local(
        replay_buffer,
        RuntimeError,
        "cannot be read from DataLoader worker processes (they are not Ray workers; every read is "
        "a call to the buffer's actor anyway, so workers would add nothing). Use num_workers=0 "
        "(dataloader_num_workers=0 in a Trainer).",
    )
    storage = replay_buffer.storage
    if isinstance(storage, ListStorage):
        raise RuntimeError(
            f"a {type(storage).__name__} cannot be sent to DataLoader worker processes "
            "(torchrl sets the 'spawn' start method, and list storages cannot be shared). Use "
            "num_workers=0, or store the rows in a LazyTensorStorage (shared memory; add "
            "writer=torchrl_trl_interop.CommittedWriter() if it is extended while workers "
            "read; strings and History need num_workers=0)."
        )


def check_storage_columns(
    replay_buffer: Any, batch: TensorDictBase, columns: Sequence[NestedKey], sep: str
) -> None:
    """Refuses per-row strings/History from a ``LazyMemmapStorage`` (it keeps one per key)."""
    if is_remote(replay_buffer) or not isinstance(replay_buffer.storage, LazyMemmapStorage):
        return
    strings = non_tensor_columns(batch, columns)
    if strings:
        raise ValueError(
            "the buffer uses LazyMemmapStorage, which keeps a single value per non-tensor key "
            "instead of one per row, so the strings/History under "
            f"{[key_to_str(k, sep) for k in strings]} would come back wrong. Store them in "
            "LazyTensorStorage, LazyStackStorage or ListStorage, or leave them out with "
            "keys=[...]."
        )


def check_sampler_copies(replay_buffer: Any, copies: int) -> None:
    """Refuses a ``SamplerWithoutReplacement`` copied into several readers."""
    if copies > 1 and isinstance(replay_buffer.sampler, SamplerWithoutReplacement):
        raise RuntimeError(
            f"the buffer samples without replacement, but {copies} readers (DataLoader workers "
            "x ranks) each hold their own sampler copy, so every reader would yield the whole "
            "epoch. Pass epoch=True (every stored row exactly once, split across readers) or "
            "use num_workers=0."
        )


def check_reader(
    replay_buffer: Any,
    *,
    in_worker: bool,
    streaming: bool,
    sampling: bool,
    columns: Sequence[NestedKey] | None,
    sep: str,
) -> bool:
    """Refuses reads that would yield stale or half-written rows; ``True``: use the seqlock.

    Only DataLoader worker processes are at risk: they hold a copy of the buffer, whose
    tensors are shared with the writer (spawn moves them to shared memory) but whose list
    storages and strings are not.
    """
    if not in_worker or is_remote(replay_buffer):
        return False
    storage = replay_buffer.storage
    if isinstance(storage, ListStorage):
        if streaming:
            raise RuntimeError(
                f"an online stream (num_batches=None) from a {type(storage).__name__} in a "
                "DataLoader worker reads a private copy of the buffer taken when the worker "
                "started: rows written later are never seen. Use num_workers=0, or a "
                "LazyTensorStorage with writer=torchrl_trl_interop.CommittedWriter()."
            )
        return False
    committed = isinstance(replay_buffer.writer, CommittedWriter)
    if streaming and not committed:
        raise RuntimeError(
            "streaming (num_batches=None) into DataLoader workers while the buffer is being "
            "extended needs to know which rows are fully written: torchrl's storages publish "
            "the new length before writing the rows, so workers would read unwritten rows. "
            "Build the buffer with writer=torchrl_trl_interop.CommittedWriter(), or use "
            "num_workers=0."
        )
    if not committed:
        return False  # a finite read of a buffer nobody writes to: the copy is exact
    if sampling and type(replay_buffer.sampler) is not RandomSampler:
        raise RuntimeError(
            "DataLoader workers read a CommittedWriter buffer by sampling committed rows "
            f"uniformly, but the buffer uses {type(replay_buffer.sampler).__name__}, whose "
            "state lives in the main process. Use RandomSampler (the default), epoch=True, or "
            "num_workers=0."
        )
    stored = storage_data(storage)
    if isinstance(stored, TensorDictBase):
        shared = stored.is_memmap() or all(
            t.is_shared() for t in stored.values(True, True) if isinstance(t, torch.Tensor)
        )
        if not shared:
            raise RuntimeError(
                "the storage is not in shared memory in this worker (a 'fork' DataLoader gets "
                "a private copy), so new rows would never arrive. Use the 'spawn' start "
                "method (torchrl's default) or call "
                "replay_buffer.storage._storage.share_memory_() before starting the workers."
            )
        columns = columns if columns is not None else column_keys(stored)
        strings = [key_to_str(k, sep) for k in non_tensor_columns(stored, columns)]
        if strings:
            raise RuntimeError(
                f"the columns {strings} hold strings/History, which live in the writer's "
                "process and reach DataLoader workers only as a copy taken when they started: "
                "rows written later would come with stale strings. Read them with "
                "num_workers=0, or leave them out with keys=[...]."
            )
    return True


def check_buffer(replay_buffer: Any) -> None:
    """Refuses anything but a torchrl buffer (or a Ray buffer's client) with one batch dimension.

    Storages with more than one (``LazyTensorStorage(n, ndim=2)``) are refused:
    torchrl indexes them along their first dimension, not by stored element, so "every stored
    row once" has no meaning the dataset could keep (sampling draws elements, a storage read
    gives a ``[k, ...]`` block of them).
    """
    remote = is_remote(replay_buffer)
    if not isinstance(replay_buffer, ReplayBuffer) and not remote:
        raise TypeError(
            "replay_buffer must be a torchrl ReplayBuffer (ReplayBuffer, "
            "TensorDictReplayBuffer, RayReplayBuffer, ...), got "
            f"{type(replay_buffer).__name__}."
        )
    ndim = 1 if remote else getattr(replay_buffer.storage, "ndim", 1)
    if ndim != 1:
        raise ValueError(
            f"the buffer's {type(replay_buffer.storage).__name__} has ndim={ndim}; the dataset "
            "reads storages with one batch dimension (ndim=1), one row per stored element. "
            "Store the rows flat: extend a storage built with ndim=1 with data.reshape(-1) "
            "(e.g. [time, envs] -> [time * envs])."
        )


def check_replay_buffer(replay_buffer: Any) -> None:
    """Raises a :class:`TypeError` unless ``replay_buffer`` is a torchrl ``ReplayBuffer`` (one to
    write rows into or to save).

    Examples:
        >>> check_replay_buffer([1, 2])
        Traceback (most recent call last):
        ...
        TypeError: replay_buffer must be a torchrl ReplayBuffer, got [1, 2] of type list.
    """
    if not isinstance(replay_buffer, ReplayBuffer):
        raise type_error("replay_buffer", "a torchrl ReplayBuffer", replay_buffer)


def check_remote_seed(replay_buffer: Any, mode: Any) -> None:
    """Refuses ``seed=`` when sampling a Ray buffer: its actor samples for every reader."""
    if is_remote(replay_buffer) and mode.seed is not None and not mode.epoch:
        raise ValueError(
            f"seed={mode.seed!r} cannot seed a {type(replay_buffer).__name__}: its actor "
            "samples for every reader (readers get distinct rows without seeds). Drop seed=, "
            "or pass epoch=True (the seed then orders each epoch)."
        )


def check_sample_size(replay_buffer: Any, batch_size: int) -> None:
    """Refuses sampling batches larger than the storage can hold, before anything is allocated.

    A sampled batch of more rows than the storage's capacity (``max_size``) could only repeat
    rows, and asks torch's allocator for ``batch_size`` indices at once (``10**12``: 8 TB).
    Storage reads (epoch mode, :meth:`~torchrl_trl_interop.TorchRLBufferDataset.iter_storage`,
    the Hugging Face map view) read at most the stored rows whatever ``batch_size`` is.
    """
    if is_remote(replay_buffer):
        return
    capacity = getattr(replay_buffer.storage, "max_size", None)
    if isinstance(capacity, int) and batch_size > capacity:
        raise ValueError(
            f"batch_size={batch_size} rows per sampled batch is more than the buffer's "
            f"{type(replay_buffer.storage).__name__} can ever hold (max_size={capacity}): the "
            f"batch could only repeat rows, and drawing it would allocate {batch_size} indices "
            f"at once. Pass batch_size <= {capacity}, or epoch=True (each read then takes at "
            "most the stored rows)."
        )


def write_mark(replay_buffer: Any) -> tuple[int, int] | None:
    """``(writes so far, cursor)`` of a round-robin writer; ``None`` where writes can't be located.

    Both live in shared memory (``multiprocessing.Value``), so a DataLoader worker reads the
    writer's current values.
    """
    writer = None if is_remote(replay_buffer) else replay_buffer.writer
    if not isinstance(writer, RoundRobinWriter):
        return None
    count, cursor = write_counters(writer)
    return None if count is None or cursor is None else (count, cursor)


def check_overwrites(replay_buffer: Any, since: tuple[int, int] | None, read: torch.Tensor) -> None:
    """Raises if writes since ``since`` (a :func:`write_mark`) replaced any row in ``read``.

    Round-robin writes go to consecutive slots from the cursor, so the replaced slots are known;
    writes that cannot be located (``write_at``, ``empty``, more than a full wrap) count as
    replacing every slot.
    """
    if since is None or read.numel() == 0:
        return
    now = write_mark(replay_buffer)
    written = now[0] - since[0]
    if written == 0:
        return
    capacity = replay_buffer.storage.max_size
    if 0 < written < capacity and (since[1] + written) % capacity == now[1]:
        slots = (since[1] + torch.arange(written)) % capacity
        replaced = read[torch.isin(read, slots)]
    else:
        replaced = read
    if replaced.numel():
        raise RuntimeError(
            f"{replaced.numel()} row(s) of this pass (storage indices {replaced[:8].tolist()}) "
            "were overwritten by the buffer's writer before the pass read them, so the pass "
            "cannot yield the rows stored when it began (epoch mode reads each of those "
            "exactly once). Pause writing during an epoch pass, give the buffer room for what "
            "is written meanwhile (a larger max_size), or read with sampling (epoch=False)."
        )
