"""A torchrl round-robin writer that publishes which rows are whole, for readers in other processes.

:class:`CommittedWriter` brackets every write with a sequence counter in shared memory (a
seqlock; :mod:`~torchrl_trl_interop.data._committed` reads it). It overrides torchrl's private
``Writer._empty`` (what ``ReplayBuffer.empty`` calls: there is no public hook for an emptied
buffer) and reads the writer's ``_storage`` for the committed length. On the torchrl versions it
was written for (:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`) both are known to hold;
on any other (and under :func:`~torchrl_trl_interop._upstream.plain_upstream`), building one
checks that ``_empty`` is still there and raises a :class:`RuntimeError` naming it if not.

The upstream fix that would retire it: a public ``Writer.empty`` (or an emptied-buffer hook) and
a writer's ``storage`` accessor (torchrl).
"""

from __future__ import annotations

from typing import Any

import torch
from torchrl.data.replay_buffers.writers import RoundRobinWriter

from .._checks import boundary, check_bool
from ._gate import TORCHRL_MEASURED, use_fast

__all__ = ["CommittedWriter"]

#: the internals this module reads or overrides (test/test_layout.py checks the list)
READS = (
    "torchrl.data.RoundRobinWriter._empty",
    "torchrl.data.RoundRobinWriter._storage",
)


class CommittedWriter(RoundRobinWriter):
    """A :class:`~torchrl.data.RoundRobinWriter` that tells readers in other processes which rows are whole.

    Use it for a buffer that a collector keeps extending while DataLoader workers read it through
    :class:`~torchrl_trl_interop.TorchRLBufferDataset`: workers then never yield a row the writer
    has not finished writing (an online stream, ``num_batches=None``, in workers requires it).
    In-process readers (``num_workers=0``) do not need it.

    Every ``add``/``extend``/``write_at``/``empty`` makes a shared counter odd while it writes and
    even once done, and records the committed length. Readers copy rows between two reads of the
    counter and retry if it moved (a seqlock), so rows being overwritten in a full circular buffer
    are safe too. Writes that bypass the writer (``replay_buffer[index] = value``) are not tracked.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        >>> rb.writer.committed
        (2, 3)
    """

    @boundary("CommittedWriter")
    def __init__(self, compilable: bool = False) -> None:
        if not use_fast(TORCHRL_MEASURED) and not callable(
            getattr(RoundRobinWriter, "_empty", None)
        ):
            from importlib.metadata import version

            raise RuntimeError(
                f"torchrl {version('torchrl')}'s writers have no '_empty', which "
                "ReplayBuffer.empty() calls on torchrl 0.14 and CommittedWriter overrides to "
                "tell readers the buffer emptied (torchrl has no public hook for it). Install "
                f"torchrl {TORCHRL_MEASURED[1]} to {TORCHRL_MEASURED[2]} (exclusive), or "
                "report it."
            )
        super().__init__(compilable=check_bool(compilable, "compilable"))
        # [sequence, committed length]; shared memory so spawned workers see the writer's updates.
        self._commit_log = torch.zeros(2, dtype=torch.int64).share_memory_()

    @property
    def committed(self) -> tuple[int, int]:
        """``(sequence, committed length)``: the sequence is odd while a write is in progress."""
        seq, length = self._commit_log.tolist()
        return int(seq), int(length)

    def _write(self, method: Any, data: Any) -> Any:
        self._commit_log[0] += 1  # odd: writing
        try:
            return method(data)
        finally:
            self._commit_log[1] = len(self._storage)
            self._commit_log[0] += 1  # even: committed

    def add(self, data: Any) -> int | torch.Tensor:
        return self._write(super().add, data)

    def extend(self, data: Any) -> torch.Tensor:
        return self._write(super().extend, data)

    def write_at(self, index: int | torch.Tensor, data: Any) -> int | torch.Tensor:
        return self._write(lambda d: super(CommittedWriter, self).write_at(index, d), data)

    def _empty(self, empty_write_count: bool = True) -> None:
        self._commit_log[0] += 1
        try:
            super()._empty(empty_write_count=empty_write_count)
        finally:
            self._commit_log[1] = 0
            self._commit_log[0] += 1
