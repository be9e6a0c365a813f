"""Who reads which rows of a buffer, and one pass over them: DataLoader workers, ranks, epochs,
seeds.

An epoch is split by *storage index*: reader ``k`` of ``K`` owns the rows whose index is ``k``
modulo ``K`` (:func:`shard_indices`). Readers that look at the buffer at different moments (a
collector may be writing) therefore never overlap, whatever length each of them saw. Who the
readers are is read in the process that iterates (main, worker, rank: :func:`shard_info`); how
they read is a :class:`ReadMode`. These are plain functions over integers and index tensors.

A *pass* is what one reader (the main process, a DataLoader worker, a rank, or a shard group of
a Hugging Face view) yields for one epoch. :func:`read_pass` is the one dispatcher of every
iterating view of :class:`~torchrl_trl_interop.TorchRLBufferDataset`:

* epoch mode: slot ``s`` of ``num_slots`` owns the storage indices equal to ``s`` modulo
  ``num_slots``; the length is taken when the pass starts, so rows written during it wait for
  the next one, and a pass whose rows are overwritten before it read them raises
  (``_processes.check_overwrites``);
* sampling: each slot draws ``num_batches`` batches from its own stream, seeded from
  ``(base, rank, slot, epoch)`` when there is a base seed (:func:`derive_seed`), else by the
  buffer's own sampler.

:class:`PassCounter` counts a reader's epochs and the rows of the pass in progress: what a
dataset's ``state_dict`` holds, so that a pass resumes where it stopped.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_bool, check_positive_int, is_int, speaking_for
from ._processes import (
    check_reader,
    check_sample_size,
    check_sampler_copies,
    is_remote,
    write_mark,
)
from ._reader import TORCH_VIEW, BufferReader, View

__all__ = [
    "PassCounter",
    "ReadMode",
    "ShardInfo",
    "accelerate_shards_data",
    "derive_seed",
    "distributed_rank",
    "interleaved_shard_order",
    "read_pass",
    "shard_indices",
    "shard_info",
    "slot_pass",
    "stream_base",
]

# -- who reads which rows -------------------------------------------------------------------------

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class ShardInfo:
    """Where the current iteration runs: rank and DataLoader worker, and the resulting shard."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    in_worker: bool = False

    @property
    def shard_id(self) -> int:
        """Index of this (rank, worker) among all readers, rank-major."""
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_shards(self) -> int:
        """Number of readers sharing the data."""
        return self.world_size * self.num_workers


@dataclass(frozen=True)
class ReadMode:
    """How a pass reads: ``num_batches`` sampled batches, or every stored row once (``epoch``).

    ``seed`` orders epochs (``0`` when ``None``, so that every rank agrees) or seeds per-reader
    sampling streams; ``split_by_rank`` is explained by :func:`distributed_rank`.

    Raises:
        ValueError: on a bad value or a combination that would do nothing (the message says
            which option to change).

    Examples:
        >>> ReadMode(epoch=True, shuffle=True).seed_or_default
        0
    """

    num_batches: int | None = 1
    epoch: bool = False
    shuffle: bool = False
    seed: int | None = None
    split_by_rank: bool | None = None

    def __post_init__(self) -> None:
        check_bool(self.epoch, "epoch")
        check_bool(self.shuffle, "shuffle")
        check_positive_int(self.num_batches, "num_batches", allow_none=True)
        if self.shuffle and not self.epoch:
            raise ValueError(
                "shuffle=True only applies to epoch=True (sampling is already random); drop "
                "shuffle=True or pass epoch=True."
            )
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}.")
        if self.epoch and self.num_batches != 1:
            raise ValueError(
                "num_batches has no effect with epoch=True (one pass yields every stored row "
                f"once); got num_batches={self.num_batches!r}. Leave it at its default."
            )
        if self.split_by_rank not in (None, True, False):
            raise ValueError(
                f"split_by_rank must be None, True or False, got {self.split_by_rank!r}."
            )

    @property
    def streaming(self) -> bool:
        """An unbounded sampled stream (``num_batches=None``)."""
        return self.num_batches is None and not self.epoch

    @property
    def seed_or_default(self) -> int:
        """The seed that orders epochs."""
        return self.seed if self.seed is not None else 0


def accelerate_shards_data() -> bool:
    """Whether an initialized ``accelerate`` state with several processes runs in this process.

    A Hugging Face ``Trainer`` (or an ``Accelerator``) then splits the data of every DataLoader it
    prepares across ranks itself: ``dispatch_batches=True`` (its default for iterable datasets)
    iterates on rank 0 only and sends each rank its slice; ``dispatch_batches=False`` wraps the
    dataset in ``IterableDatasetShard``, which iterates everything on every rank and keeps one
    slice. A dataset that also split by rank would lose rows in both cases.

    Never imports ``accelerate``: it only looks at it if something else already did.

    Examples:
        >>> accelerate_shards_data()
        False
    """
    state = sys.modules.get("accelerate.state")
    if state is None:
        return False
    shared = state.PartialState._shared_state
    return bool(shared) and int(shared.get("num_processes", 1) or 1) > 1


def distributed_rank(split_by_rank: bool | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` to split data by, as decided by ``split_by_rank``.

    Keyword Args:
        split_by_rank (bool, optional): ``True`` uses the ``torch.distributed`` rank (and raises
            if it is not initialized); ``False`` ignores ranks; ``None`` (default) uses the rank
            when ``torch.distributed`` is initialized and no ``accelerate`` state splits the data
            already (see :func:`accelerate_shards_data`).

    Raises:
        RuntimeError: ``split_by_rank=True`` without an initialized process group.

    Examples:
        >>> distributed_rank()
        (0, 1)
        >>> distributed_rank(split_by_rank=False)
        (0, 1)
    """
    if split_by_rank is False or not torch.distributed.is_available():
        if split_by_rank:
            raise RuntimeError(
                "split_by_rank=True but torch.distributed is not available in this build of torch."
            )
        return 0, 1
    if not torch.distributed.is_initialized():
        if split_by_rank:
            raise RuntimeError(
                "split_by_rank=True but torch.distributed is not initialized; call "
                "torch.distributed.init_process_group(...) first, or leave split_by_rank=None."
            )
        return 0, 1
    if split_by_rank is None and accelerate_shards_data():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def shard_info(
    *, split_by_rank: bool | None = None, rank_world: tuple[int, int] | None = None
) -> ShardInfo:
    """Reads the DataLoader worker (``get_worker_info``) and distributed rank of this process.

    Keyword Args:
        split_by_rank (bool, optional): see :func:`distributed_rank`.
        rank_world (tuple of int, optional): ``(rank, world_size)`` decided by the parent process
            of a DataLoader worker. A worker started with ``spawn`` has no process group of its
            own, so the dataset records its parent's rank when it is pickled and passes it here.

    Examples:
        >>> shard_info()
        ShardInfo(rank=0, world_size=1, worker_id=0, num_workers=1, in_worker=False)
        >>> shard_info(rank_world=(1, 2))
        ShardInfo(rank=1, world_size=2, worker_id=0, num_workers=1, in_worker=False)
    """
    rank, world_size = rank_world if rank_world is not None else distributed_rank(split_by_rank)
    worker = torch.utils.data.get_worker_info()
    if worker is None:
        return ShardInfo(rank, world_size)
    return ShardInfo(rank, world_size, worker.id, worker.num_workers, in_worker=True)


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(base: int, *parts: int) -> int:
    """Mixes a base seed with integers (rank, worker id, epoch) into a new 63-bit seed.

    Distinct ``parts`` give distinct, reproducible seeds (SplitMix64 finalizer).

    Examples:
        >>> derive_seed(0, 1) != derive_seed(0, 2) != derive_seed(1, 1)
        True
        >>> derive_seed(7, 3) == derive_seed(7, 3)
        True
    """
    x = _splitmix(base & _MASK64)
    for part in parts:
        x = _splitmix(x ^ _splitmix(part & _MASK64))
    return x & _MASK63


def _priorities(indices: torch.Tensor, seed: int) -> np.ndarray:
    """A pseudo-random 64-bit priority per storage index, a function of ``(seed, index)`` only."""
    with np.errstate(over="ignore"):
        x = indices.numpy().astype(np.uint64) ^ np.uint64(_splitmix(seed & _MASK64))
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def shard_indices(
    n: int,
    shard_id: int | Sequence[int],
    num_shards: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> torch.Tensor:
    """The storage indices below ``n`` that shard(s) ``shard_id`` of ``num_shards`` read in one epoch.

    Shard ``k`` owns the indices ``k, k + K, k + 2K, ...``: the shards partition ``range(n)``,
    and two shards never overlap even if they were given different ``n`` (rows written between
    their reads). Several shards may be read by one reader (``shard_id`` a list): their indices
    are merged. Without ``shuffle`` they come in storage order; with ``shuffle=True`` in an order
    drawn from ``(seed, epoch)`` that does not depend on ``n`` or on the shards: every index has
    one random priority per epoch, so a reader of all shards visits a uniform permutation of
    the whole buffer, and readers of a few shards visit their rows spread over all of it.

    Examples:
        >>> shard_indices(7, 1, 3).tolist()
        [1, 4]
        >>> shard_indices(8, [0, 3], 4).tolist()
        [0, 3, 4, 7]
        >>> sorted(shard_indices(100, 2, 4, shuffle=True, seed=3).tolist()) == list(range(2, 100, 4))
        True
        >>> every = shard_indices(20, list(range(4)), 4, shuffle=True, seed=3, epoch=1)
        >>> [i for i in every.tolist() if i % 4 == 2] == shard_indices(20, 2, 4, shuffle=True, seed=3, epoch=1).tolist()
        True
    """
    ids = [shard_id] if isinstance(shard_id, int) else list(shard_id)
    if num_shards <= 0 or not all(0 <= k < num_shards for k in ids):
        raise ValueError(f"shard ids must be in [0, {num_shards}), got {shard_id}.")
    if len(ids) == 1:
        owned = torch.arange(ids[0], max(n, ids[0]), num_shards)  # empty when n <= shard_id
    else:
        owned = torch.arange(n)
        owned = owned[torch.isin(owned % num_shards, torch.tensor(ids, dtype=torch.long))]
    if shuffle and owned.numel() > 1:
        order = np.argsort(_priorities(owned, derive_seed(seed, epoch)), kind="stable")
        owned = owned[torch.from_numpy(order)]
    return owned


def interleaved_shard_order(num_shards: int) -> list[int]:
    """Shard ids ordered so that any contiguous block of the list holds spread-out shard ids.

    ``accelerate`` gives each rank a contiguous block of a ``datasets.IterableDataset``'s shards
    (``dataset.shard(num_processes, rank)``). Listing shards in bit-reversed order makes the
    block of each rank hold shard ids that are spread over the whole range, so that the rows of
    a small buffer (fewer rows than shards) still go to every rank.

    Examples:
        >>> interleaved_shard_order(8)
        [0, 4, 2, 6, 1, 5, 3, 7]
        >>> interleaved_shard_order(8)[:4]  # rank 0 of 2 gets the even shards
        [0, 4, 2, 6]
        >>> sorted(interleaved_shard_order(6))
        [0, 1, 2, 3, 4, 5]
    """
    bits = max(num_shards - 1, 0).bit_length()

    def reverse(x: int) -> int:
        return int(f"{x:0{bits}b}"[::-1], 2) if bits else 0

    return sorted(range(num_shards), key=reverse)


# -- one pass over a buffer ----------------------------------------------------------------------


def stream_base(mode: ReadMode, num_slots: int, info: ShardInfo) -> int | None:
    """The base seed of a sampling pass's streams: ``seed``, else one drawn from torch's RNG when
    several readers need distinct streams, else ``None`` (the buffer's own sampler draws)."""
    if mode.epoch or mode.seed is not None:
        return mode.seed
    if num_slots > 1 or info.in_worker:
        return int(torch.randint(2**62, (1,)))  # new for every pass, reproducible under a seed
    return None


def read_pass(
    reader: BufferReader,
    mode: ReadMode,
    slots: list[int],
    num_slots: int,
    epoch: int,
    *,
    info: ShardInfo,
    copies: int,
    base: int | None,
    skip: int = 0,
    view: View = TORCH_VIEW,
) -> Iterator[dict[str, Any]]:
    """The rows of ``slots`` (of ``num_slots``) in ``epoch``, the first ``skip`` left out.

    Args:
        reader (BufferReader): reads the buffer.
        mode (ReadMode): sampling or epoch, shuffle, seed.
        slots (list of int): the slots this reader owns.
        num_slots (int): slots in all.
        epoch (int): the pass's epoch.

    Keyword Args:
        info (ShardInfo): where the pass runs (worker, rank).
        copies (int): readers holding their own copy of the buffer's sampler.
        base (int or None): base seed of sampled streams (see :func:`stream_base`).
        skip (int): rows already yielded by an earlier, interrupted run of this pass.
        view (View): the public call that made the view (it signs errors) and the rows' form.

    Examples:
        >>> from torchrl_trl_interop.data._reader import BufferReader
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> reader, mode = BufferReader(toy_buffer(6), 4), ReadMode(epoch=True)
        >>> rows = read_pass(reader, mode, [1], 2, 0, info=ShardInfo(), copies=1, base=0, skip=1)
        >>> [int(r["x"]) for r in rows]
        [3, 5]
    """
    rb = reader.replay_buffer
    remote = is_remote(rb)
    with speaking_for(view.call):  # the checks, before the first read (never across a yield)
        reader.check_not_empty()
        committed = check_reader(
            rb,
            in_worker=info.in_worker,
            streaming=mode.streaming,
            sampling=not mode.epoch,
            columns=reader.known_columns,
            sep=reader.selection.sep,
        )
        if mode.epoch:
            since = write_mark(rb)  # before the length: a write in between is seen
            n = reader.length(committed)
            indices = shard_indices(
                n, slots, num_slots, shuffle=mode.shuffle, seed=mode.seed_or_default, epoch=epoch
            )
        else:
            check_sample_size(rb, reader.batch_size)
            if not remote:
                check_sampler_copies(rb, copies)
    if mode.epoch:
        yield from reader.epoch_rows(indices[skip:], committed, since=since, view=view)
        return

    def generator(slot: int) -> torch.Generator | None:
        if base is None or remote:
            return None
        return torch.Generator().manual_seed(derive_seed(base, info.rank, slot, epoch))

    rows = (
        row
        for slot in slots
        for row in reader.sampled_rows(generator(slot), mode.num_batches, committed, view)
    )
    yield from itertools.islice(rows, skip, None)


def slot_pass(
    reader: BufferReader,
    mode: ReadMode,
    info: ShardInfo,
    slots: list[int],
    num_slots: int,
    epoch: int,
    skip: int,
    view: View,
) -> Iterator[dict[str, Any]]:
    """The pass a streaming Hugging Face view reads: ``datasets`` gives the slots, the epoch and
    the rows already yielded; each DataLoader worker holds its own sampler copy."""
    copies = info.num_workers if num_slots > 1 else 1
    base = stream_base(mode, num_slots, info)
    return read_pass(
        reader,
        mode,
        slots,
        num_slots,
        epoch,
        info=info,
        copies=copies,
        base=base,
        skip=skip,
        view=view,
    )


class PassCounter:
    """A reader's epoch counter and the pass in progress: what a dataset's ``state_dict`` holds.

    A pass state is ``{"epoch": e, "rows": rows yielded, "base": stream seed}``. Between passes
    the state names the next epoch and ``0`` rows; a loaded state is resumed by the next pass of
    the same epoch.

    Examples:
        >>> counter = PassCounter()
        >>> state = counter.start(ReadMode(epoch=True), 1, ShardInfo())
        >>> list(counter.track(state, "ab")), counter.state_dict()
        (['a', 'b'], {'epoch': 1, 'rows': 0, 'base': None})
    """

    def __init__(self) -> None:
        self.epoch = 0
        self._current: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"expected an int >= 0, got {epoch!r}.")
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        if self._current is not None:
            return dict(self._current)
        return {"epoch": self.epoch, "rows": 0, "base": None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or not {"epoch", "rows", "base"} <= set(state_dict):
            raise ValueError(
                "expected the dict returned by TorchRLBufferDataset.state_dict() (keys "
                f"'epoch', 'rows', 'base'), got {state_dict!r:.200}."
            )
        self.set_epoch(int(state_dict["epoch"]))
        self._resume = dict(state_dict)

    def start(self, mode: ReadMode, num_slots: int, info: ShardInfo) -> dict[str, Any]:
        """Begins a pass of the current epoch (resuming a loaded state of that epoch)."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] == epoch:
            state = {"epoch": epoch, "rows": int(resume["rows"]), "base": resume["base"]}
        else:
            state = {"epoch": epoch, "rows": 0, "base": stream_base(mode, num_slots, info)}
        self._current = state
        return state

    def run(self, reader: BufferReader, mode: ReadMode, info: ShardInfo) -> Iterator[dict]:
        """The next pass of a torch view: this reader's shard of the current epoch."""
        state = self.start(mode, info.num_shards, info)
        rows = read_pass(
            reader,
            mode,
            [info.shard_id],
            info.num_shards,
            state["epoch"],
            info=info,
            copies=info.num_shards,
            base=state["base"],
            skip=state["rows"],
        )
        return self.track(state, rows)

    def track(self, state: dict[str, Any], rows: Iterable[Any]) -> Iterator[Any]:
        """Yields ``rows``, counting them in ``state``; the pass ends with the last one."""
        for row in rows:
            state["rows"] += 1
            yield row
        if self._current is state:
            self._current = None
