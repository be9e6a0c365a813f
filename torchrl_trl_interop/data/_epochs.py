"""One pass over a buffer: the rows of some slots in one epoch, resumable from a row count.

A pass is what one reader (the main process, a DataLoader worker, a rank, or a shard group of a
Hugging Face view) yields for one epoch. :func:`read_pass` is the one dispatcher of every
iterating view of :class:`~torchrl_trl_interop.TorchRLBufferDataset`:

* epoch mode: slot ``s`` of ``num_slots`` owns the storage indices equal to ``s`` modulo
  ``num_slots`` (``_sharding.shard_indices``); the length is taken when
  the pass starts, so rows written during it wait for the next one, and a pass whose rows are
  overwritten before it read them raises (``_processes.check_overwrites``);
* sampling: each slot draws ``num_batches`` batches from its own stream, seeded from
  ``(base, rank, slot, epoch)`` when there is a base seed, else by the buffer's own sampler.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .._checks import is_int, signed, speaking_for
from ._processes import (
    check_reader,
    check_sample_size,
    check_sampler_copies,
    is_remote,
    write_mark,
)
from ._reader import TORCH_VIEW, BufferReader, View
from ._sharding import ReadMode, ShardInfo, derive_seed, shard_indices

__all__ = ["PassCounter", "read_pass", "slot_pass", "stream_base"]


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
            raise ValueError(signed(f"expected an int >= 0, got {epoch!r}."))
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        if self._current is not None:
            return dict(self._current)
        return {"epoch": self.epoch, "rows": 0, "base": None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or not {"epoch", "rows", "base"} <= set(state_dict):
            raise ValueError(
                signed(
                    "expected the dict returned by TorchRLBufferDataset.state_dict() (keys "
                    f"'epoch', 'rows', 'base'), got {state_dict!r:.200}."
                )
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
