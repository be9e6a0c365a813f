"""Reading a replay buffer into named rows: :class:`BufferReader`, one path for every view.

A reader reads batches (by storage index or by sampling) through the buffer's transforms, walks
each one once (``_columns.walk_columns``) under its ``_columns.Schema``, and hands the walked
columns to the form its :class:`View` asks for: per-row tensors (the torch view), Python values
(the streaming Hugging Face view) or an Arrow table (the map-style one). It does not decide who
reads what: :class:`~torchrl_trl_interop.TorchRLBufferDataset` does. Its errors are signed by the
public call being made; rows read later, by iterating a view, by the call that made the view
(:attr:`View.call`), once per batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.utils import NestedKey

from .._checks import speaking_for
from .._upstream._direct import direct_read
from ._arrow import arrow_table, declared_schema, python_columns
from ._columns import Column, Schema, Selection, walk_columns
from ._committed import committed_length, read_committed, read_committed_rows
from ._processes import (
    check_overwrites,
    check_storage_columns,
    picklable_remote,
    sample,
    spawn_safe_buffer,
    write_mark,
)

__all__ = ["TORCH_VIEW", "BufferReader", "View"]


@dataclass(frozen=True)
class View:
    """What a read is for: ``call``, the public call that made the view (it signs the errors
    raised while the view is iterated, after that call returned), and the rows' form.

    ``python=False``: per-row tensors, ``str`` and message lists (the torch view);
    ``python=True``: plain Python values (the Hugging Face views), of the types ``declared``
    (a ``pyarrow.Schema`` a streaming view fixed when it was built; ``None``: each batch's own).
    """

    call: str = "TorchRLBufferDataset"
    python: bool = False
    declared: Any = None


#: The torch view's reads, signed by the dataset itself.
TORCH_VIEW = View()


@functools.lru_cache(maxsize=64)
def row_builder(names: tuple[str, ...]) -> Callable[..., dict[str, Any]]:
    """A function of one value per name that returns the row ``{name: value}``.

    Its body is one dict display (``lambda v0, v1: {k0: v0, k1: v1}``, the names bound as
    globals of the function, never written into its source): cheaper per row than
    ``dict(zip(names, values))`` (figures: ``benchmarks/RESULTS.rst``).

    Examples:
        >>> row_builder(("input_ids", "score"))([1, 2], 0.5)
        {'input_ids': [1, 2], 'score': 0.5}
    """
    args = ", ".join(f"v{i}" for i in range(len(names)))
    display = ", ".join(f"k{i}: v{i}" for i in range(len(names)))
    return eval(f"lambda {args}: {{{display}}}", {f"k{i}": n for i, n in enumerate(names)})


class BufferReader:
    """Reads rows of ``replay_buffer``, ``batch_size`` at a time, as ``{output name: value}`` dicts.

    Args:
        replay_buffer (ReplayBuffer): any torchrl buffer, a ``RayReplayBuffer`` or its client.
        batch_size (int): rows per sampled batch and per storage read.

    Keyword Args:
        selection (Selection, optional): the columns to read and their names. Defaults to
            every leaf column, under its dotted name.
        device (torch.device, optional): tensors are moved there.

    Examples:
        >>> import torch
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> reader = BufferReader(toy_buffer(4), 2, selection=Selection(rename={"x": "id"}))
        >>> [row["id"].item() for row in reader.epoch_rows(torch.tensor([3, 1, 2]))]
        [3, 1, 2]
    """

    def __init__(
        self,
        replay_buffer: Any,
        batch_size: int,
        *,
        selection: Selection | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        self.selection = selection if selection is not None else Selection()
        self.device = device
        self._schema: Schema | None = None

    def __len__(self) -> int:
        return len(self.replay_buffer)

    @property
    def known_columns(self) -> list[NestedKey] | None:
        """The stored columns read, once a batch was seen (``None`` before)."""
        return None if self._schema is None else self._schema.columns

    def schema(self, batch: TensorDictBase | None = None) -> Schema:
        """The columns and output names, resolved from the first batch read (or row 0)."""
        if self._schema is None:
            if batch is None:
                self.check_not_empty()
                batch = self.read(torch.arange(1))
            schema = self.selection.resolve(batch)
            check_storage_columns(self.replay_buffer, batch, schema.columns, self.selection.sep)
            self._schema = schema
        return self._schema

    def check_not_empty(self) -> None:
        """Raises a :class:`RuntimeError` if the buffer holds no row."""
        if len(self.replay_buffer) == 0:
            raise RuntimeError(
                "the replay buffer is empty (len(replay_buffer) == 0), so there is nothing to "
                "read. Extend it (e.g. run the collector) first."
            )

    def read(self, index: torch.Tensor, *, committed: bool = False) -> TensorDictBase:
        """Rows by storage index (no sampling), through the buffer's transforms.

        ``committed=True`` (a worker reading a buffer with a :class:`CommittedWriter`) retries a
        read that overlapped a write, so no row comes back half written.
        """
        with set_list_to_stack(True):  # History needs it; scoped to the read
            if committed:
                return read_committed_rows(self.replay_buffer, index)
            batch = direct_read(self.replay_buffer, index)  # a plain storage: the same rows
            return batch if batch is not None else self.replay_buffer[index]

    def length(self, committed: bool = False) -> int:
        """Rows stored now (``committed``: rows a :class:`CommittedWriter` finished writing)."""
        return committed_length(self.replay_buffer) if committed else len(self.replay_buffer)

    def sample(self, generator: torch.Generator | None, committed: bool = False) -> TensorDictBase:
        """One sampled batch, drawn with ``generator`` (``None``: the buffer's own sampler)."""
        with set_list_to_stack(True):
            if committed:
                return read_committed(self.replay_buffer, self.batch_size, generator)
            return sample(self.replay_buffer, self.batch_size, generator)

    def walk(self, batch: TensorDictBase) -> tuple[list[str], list[Column]]:
        """The output names and the walked columns of a batch: the one walk of every view."""
        schema = self.schema(batch)
        mask_key = self.selection.attention_mask_key
        return schema.names, walk_columns(batch, schema.columns, mask_key)

    def rows(self, batch: TensorDictBase, view: View = TORCH_VIEW) -> Iterable[dict[str, Any]]:
        """The rows of a batch, one dict each, in the form ``view`` asks for (converted once
        per column, not once per row). Python rows are built as they are read (see
        ``_arrow.python_columns``), each by one call of :func:`row_builder`."""
        names, columns = self.walk(batch)
        if view.python:
            values = python_columns(columns, names, view.declared)
            return map(row_builder(tuple(names)), *values) if values else []
        values = [column.rows(self.device) for column in columns]
        return [dict(zip(names, row)) for row in zip(*values)]

    def arrow_table(self, batch: TensorDictBase) -> Any:
        """The rows of a batch as a ``pyarrow.Table``, each column typed from all its rows."""
        names, columns = self.walk(batch)
        return arrow_table(columns, names)

    def declared_schema(self) -> Any:
        """The ``pyarrow.Schema`` of the first ``batch_size`` stored rows (``None`` when a message
        column holds tool calls): the types a streaming view declares."""
        self.check_not_empty()
        n = min(self.batch_size, len(self.replay_buffer))
        names, columns = self.walk(self.read(torch.arange(n)))
        return declared_schema(columns, names)

    def epoch_rows(
        self,
        indices: torch.Tensor,
        committed: bool = False,
        since: tuple[int, int] | None = None,
        view: View = TORCH_VIEW,
    ) -> Iterator[dict[str, Any]]:
        """The rows at storage ``indices``, in that order, ``batch_size`` indices per read.

        ``since`` (a ``_processes.write_mark`` taken when the pass chose its rows): a row
        overwritten before it was read raises instead of being replaced.
        """
        if indices.numel() == 0:  # torch splits an empty tensor into one empty chunk
            return
        for chunk in indices.split(self.batch_size):
            with speaking_for(view.call):  # per batch: never across the yields
                batch = self.read(chunk, committed=committed)
                check_overwrites(self.replay_buffer, since, chunk)
                rows = self.rows(batch, view)
            yield from rows

    def sampled_rows(
        self,
        generator: torch.Generator | None,
        num_batches: int | None,
        committed: bool = False,
        view: View = TORCH_VIEW,
    ) -> Iterator[dict[str, Any]]:
        """The rows of ``num_batches`` sampled batches (``None``: forever)."""
        done = 0
        while num_batches is None or done < num_batches:
            with speaking_for(view.call):  # per batch: never across the yields
                rows = self.rows(self.sample(generator, committed), view)
            yield from rows
            done += 1

    def storage_batches(self, chunk_size: int) -> Iterator[TensorDictBase]:
        """Every stored row once, in storage order, ``chunk_size`` rows per read (errors are
        signed by the consumer's public call: it reads each batch)."""
        self.check_not_empty()
        since = write_mark(self.replay_buffer)
        n = len(self.replay_buffer)
        for start in range(0, n, chunk_size):
            index = torch.arange(start, min(start + chunk_size, n))
            batch = self.read(index)
            check_overwrites(self.replay_buffer, since, index)
            yield batch

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing.context import get_spawning_popen

        state = self.__dict__.copy()
        if get_spawning_popen() is None:
            # A plain pickle (e.g. a Ray task receiving the dataset).
            state["replay_buffer"] = picklable_remote(self.replay_buffer)
        else:
            # Sent to a spawned process: a DataLoader worker (the dataset checked it can be).
            state["replay_buffer"] = spawn_safe_buffer(self.replay_buffer)
        return state
