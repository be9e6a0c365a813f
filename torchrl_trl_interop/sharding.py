"""Who reads which rows: DataLoader workers, distributed ranks, epochs and seeds.

Plain functions over integers and index tensors; :class:`~torchrl_trl_interop.TorchRLBufferDataset`
calls them in ``__iter__``, in whichever process (main, worker, rank) iterates it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ShardInfo", "derive_seed", "epoch_indices", "shard_info"]

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


def shard_info(*, split_by_rank: bool | None = None) -> ShardInfo:
    """Reads the DataLoader worker (``get_worker_info``) and distributed rank of this process.

    Keyword Args:
        split_by_rank (bool, optional): ``None`` (default) uses the rank when ``torch.distributed``
            is initialized; ``False`` ignores ranks (the trainer shards, e.g. accelerate).

    Examples:
        >>> shard_info()
        ShardInfo(rank=0, world_size=1, worker_id=0, num_workers=1, in_worker=False)
    """
    rank, world_size = 0, 1
    if split_by_rank is not False and torch.distributed.is_available():
        if torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        elif split_by_rank:
            raise RuntimeError(
                "split_by_rank=True but torch.distributed is not initialized; call "
                "torch.distributed.init_process_group(...) first, or leave split_by_rank=None."
            )
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
    x = _splitmix(base)
    for part in parts:
        x = _splitmix(x ^ _splitmix(part))
    return x & _MASK63


def epoch_indices(
    n: int,
    info: ShardInfo,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> torch.Tensor:
    """The storage indices one reader visits in one epoch over ``n`` stored rows.

    Every index in ``range(n)`` goes to exactly one reader: the (optionally shuffled) order is the
    same on every rank and worker (it depends only on ``seed`` and ``epoch``), and reader ``k`` of
    ``K`` takes positions ``k, k + K, k + 2K, ...``.

    Examples:
        >>> both = [epoch_indices(5, ShardInfo(rank=r, world_size=2)).tolist() for r in (0, 1)]
        >>> both
        [[0, 2, 4], [1, 3]]
        >>> a = epoch_indices(10, ShardInfo(), shuffle=True, seed=1, epoch=0)
        >>> sorted(a.tolist()) == list(range(10))
        True
    """
    if shuffle:
        g = torch.Generator().manual_seed(derive_seed(seed, epoch))
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    return order[info.shard_id :: info.num_shards]
