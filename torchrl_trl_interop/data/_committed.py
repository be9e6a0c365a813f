"""Online streaming into DataLoader worker processes: a writer that publishes only whole rows.

torchrl's tensor storages publish a new length *before* the new rows are written, so a worker
process sampling while a collector extends the buffer can read rows that are not written yet
(see the project BRIEF). :class:`CommittedWriter` brackets every write with a sequence counter in
shared memory (a seqlock); :class:`~torchrl_trl_interop.TorchRLBufferDataset` reads in workers
only rows that were committed, and retries a read that overlapped a write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .._upstream._committed_writer import CommittedWriter

__all__ = ["CommittedWriter", "committed_length", "read_committed", "read_committed_rows"]


def committed_length(replay_buffer: Any) -> int:
    """The number of rows the :class:`CommittedWriter` of ``replay_buffer`` has finished writing.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> writer = CommittedWriter()
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=writer, batch_size=2)
        >>> for n in (3, 2):
        ...     _ = rb.extend(TensorDict({"x": torch.arange(n)}, batch_size=[n]))
        >>> committed_length(rb), writer.committed
        (5, (4, 5))
    """
    return int(replay_buffer.writer._commit_log[1])


def read_committed_rows(
    replay_buffer: Any,
    index: torch.Tensor | Callable[[int], torch.Tensor],
    *,
    timeout: float = 60.0,
) -> Any:
    """Reads rows by storage index, retrying a read that overlapped a write (seqlock).

    Args:
        replay_buffer (ReplayBuffer): a buffer whose writer is a :class:`CommittedWriter`.
        index (Tensor or callable): the storage indices to read, or a function mapping the
            committed length to them (called again on every retry, with that retry's length).

    Keyword Args:
        timeout (float): seconds to keep retrying before raising ``TimeoutError``.

    Returns:
        ``replay_buffer[index]``: a gathered copy, through the buffer's transforms.

    Raises:
        TimeoutError: no read fit between two writes within ``timeout`` seconds.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        >>> _ = rb.extend(TensorDict({"x": torch.arange(5) * 10}, batch_size=[5]))
        >>> read_committed_rows(rb, torch.tensor([4, 0]))["x"]
        tensor([40,  0])
        >>> read_committed_rows(rb, lambda n: torch.arange(n - 2, n))["x"]
        tensor([30, 40])
    """
    log = replay_buffer.writer._commit_log
    deadline = time.monotonic() + timeout
    while True:
        before = int(log[0])
        if before % 2 == 0:
            length = int(log[1])
            rows = index(length) if callable(index) else index
            if rows.numel() == 0 or length > 0:
                batch = replay_buffer[rows]  # a gathered copy
                if int(log[0]) == before:
                    return batch
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no consistent read within {timeout} s (sequence {int(log[0])}, committed "
                f"length {int(log[1])}). Is the writer stuck, or the buffer empty?"
            )
        time.sleep(0.0005)


def read_committed(
    replay_buffer: Any,
    batch_size: int,
    generator: torch.Generator | None,
    *,
    timeout: float = 60.0,
) -> Any:
    """Samples ``batch_size`` committed rows uniformly, retrying reads that overlapped a write.

    Args:
        replay_buffer (ReplayBuffer): a buffer whose writer is a :class:`CommittedWriter`.
        batch_size (int): rows to draw.
        generator (torch.Generator or None): draws the indices.

    Keyword Args:
        timeout (float): seconds to keep retrying before raising ``TimeoutError``.

    Raises:
        TimeoutError: nothing committed, or no read fit between two writes, within ``timeout``.

    Examples:
        >>> import torch
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> rb = toy_buffer(3, writer=CommittedWriter())
        >>> read_committed(rb, 4, torch.Generator().manual_seed(0))["x"].shape
        torch.Size([4])
    """

    def draw(length: int) -> torch.Tensor:
        if length == 0:  # nothing committed yet: wait (an empty index would return at once)
            return torch.zeros(batch_size, dtype=torch.long)
        return torch.randint(length, (batch_size,), generator=generator)

    log = replay_buffer.writer._commit_log
    deadline = time.monotonic() + timeout
    while int(log[1]) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the buffer stayed empty for {timeout} s; is the writer running?")
        time.sleep(0.001)
    return read_committed_rows(replay_buffer, draw, timeout=max(deadline - time.monotonic(), 0.0))
