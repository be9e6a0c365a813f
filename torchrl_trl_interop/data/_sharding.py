"""Who reads which rows: DataLoader workers, distributed ranks, epochs and seeds.

Plain functions over integers and index tensors; :class:`~torchrl_trl_interop.TorchRLBufferDataset`
calls them in ``__iter__``, in whichever process (main, worker, rank) iterates it.

An epoch is split by *storage index*: reader ``k`` of ``K`` owns the rows whose index is ``k``
modulo ``K``. Readers that look at the buffer at different moments (a collector may be writing)
therefore never overlap, whatever length each of them saw.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import check_bool, check_positive_int, is_int, signed

__all__ = [
    "ReadMode",
    "ShardInfo",
    "accelerate_shards_data",
    "derive_seed",
    "distributed_rank",
    "interleaved_shard_order",
    "shard_indices",
    "shard_info",
]

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
                signed(
                    "shuffle=True only applies to epoch=True (sampling is already random); drop "
                    "shuffle=True or pass epoch=True."
                )
            )
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(signed(f"seed must be an int or None, got {self.seed!r}."))
        if self.epoch and self.num_batches != 1:
            raise ValueError(
                signed(
                    "num_batches has no effect with epoch=True (one pass yields every stored row "
                    f"once); got num_batches={self.num_batches!r}. Leave it at its default."
                )
            )
        if self.split_by_rank not in (None, True, False):
            raise ValueError(
                signed(f"split_by_rank must be None, True or False, got {self.split_by_rank!r}.")
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
