"""Online streaming into DataLoader worker processes: a writer that publishes only whole rows.

torchrl's tensor storages publish a new length *before* the new rows are written, so a worker
process sampling while a collector extends the buffer can read rows that are not written yet
(see the project BRIEF). :class:`CommittedWriter` brackets every write with a sequence counter in
shared memory (a seqlock); :class:`~torchrl_trl_interop.TorchRLBufferDataset` reads in workers
only rows that were committed, and retries a read that overlapped a write.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torchrl.data.replay_buffers.writers import RoundRobinWriter

__all__ = ["CommittedWriter", "read_committed"]


class CommittedWriter(RoundRobinWriter):
    """A :class:`~torchrl.data.RoundRobinWriter` that tells readers in other processes which rows are whole.

    Use it for a buffer that a collector keeps extending while DataLoader workers read it through
    :class:`~torchrl_trl_interop.TorchRLBufferDataset` (``num_batches=None``): workers then never
    yield a row the writer has not finished writing. In-process readers do not need it.

    Every ``add``/``extend`` makes a shared counter odd while it writes and even once done, and
    records the committed length. Readers copy rows between two reads of the counter and retry if
    it moved (a seqlock), so rows being overwritten in a full circular buffer are safe too.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        >>> rb.writer.committed
        (2, 3)
    """

    def __init__(self, compilable: bool = False) -> None:
        super().__init__(compilable=compilable)
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


def read_committed(
    replay_buffer: Any,
    batch_size: int,
    generator: torch.Generator,
    *,
    timeout: float = 60.0,
) -> Any:
    """Samples ``batch_size`` committed rows uniformly, retrying reads that overlapped a write.

    Args:
        replay_buffer (ReplayBuffer): a buffer whose writer is a :class:`CommittedWriter`.
        batch_size (int): rows to draw.
        generator (torch.Generator): draws the indices.

    Keyword Args:
        timeout (float): seconds to keep retrying before raising ``TimeoutError``.
    """
    log = replay_buffer.writer._commit_log
    deadline = time.monotonic() + timeout
    while True:
        before = int(log[0])
        length = int(log[1])
        if before % 2 == 0 and length > 0:
            index = torch.randint(length, (batch_size,), generator=generator)
            batch = replay_buffer.storage.get(index)  # a gathered copy
            if int(log[0]) == before:
                return batch
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"read_committed: no consistent read within {timeout} s (sequence {int(log[0])}, "
                f"committed length {int(log[1])}). Is the writer stuck, or the buffer empty?"
            )
        time.sleep(0.0005)
