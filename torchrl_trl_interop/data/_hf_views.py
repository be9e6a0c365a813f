"""Hugging Face ``datasets`` views of a buffer: features, a streaming view and a map-style view.

The streaming view is a :class:`datasets.IterableDataset` over :class:`BufferExamplesIterable`,
an examples iterable of our own. ``datasets`` itself then decides who reads what and when:

* its **shards** are *slots* of the buffer (slot ``s`` of ``S`` owns the storage indices equal to
  ``s`` modulo ``S``); DataLoader workers, ``accelerate``'s ``.shard()`` and
  ``split_dataset_by_node`` each take some slots, so every row is read once;
* its **epoch** (``IterableDataset.set_epoch``, called by every HF ``Trainer``, and restored by
  ``load_state_dict``) reaches the iterable through ``shuffle_data_sources``, and orders the pass;
* its **state dict** records how many rows the iterable yielded, so a resumed view skips them.

Every reach into ``datasets``' private classes lives in this module, which imports ``datasets``:
the dataset imports it only when a view is asked for.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features, IterableDataset
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import generate_random_fingerprint
from datasets.iterable_dataset import _BaseExamplesIterable
from datasets.table import InMemoryTable

from ._arrow import unify_schemas
from ._sharding import interleaved_shard_order

__all__ = [
    "BufferExamplesIterable",
    "features_of",
    "iterable_view",
    "table_view",
]

#: ``read(slots, num_slots, epoch, skip)`` yields the rows of those slots in that epoch, as dicts
#: of plain Python values (each batch's columns gathered once, each row's lists made when read).
SlotReader = Callable[[list[int], int, int, int], Iterator[dict[str, Any]]]


def features_of(schema: pa.Schema | None) -> Features | None:
    """The ``datasets.Features`` of an Arrow schema (``None`` passes: types left to ``datasets``).

    Examples:
        >>> features_of(pa.schema([("ids", pa.list_(pa.int32())), ("text", pa.string())]))
        {'ids': List(Value('int32')), 'text': Value('string')}
    """
    return None if schema is None else Features.from_arrow_schema(schema)


def _epoch_of(generator: np.random.Generator) -> int:
    """The epoch ``datasets`` seeded ``generator`` with (``np.random.default_rng(epoch)``)."""
    entropy = getattr(getattr(generator.bit_generator, "seed_seq", None), "entropy", None)
    if isinstance(entropy, int):
        return entropy
    return int(copy.deepcopy(generator).integers(2**31))  # a generator of the user's own


class BufferExamplesIterable(_BaseExamplesIterable):
    """The ``datasets`` examples iterable behind :func:`iterable_view` (see the module docstring).

    Args:
        read (callable): ``read(slots, num_slots, epoch, skip)``, yielding rows as dicts of
            Python values.
        slots (list of int): the slots this iterable reads, in the order ``datasets`` splits.
        num_slots (int): slots of the whole view.
        epoch (int, optional): the pass's epoch, set by ``shuffle_data_sources``. Defaults to 0.
        features (Features, optional): the rows' features. Rows are built with these types
            already, so ``datasets`` does not encode and decode every row again (unless the view
            is cast to other features). Defaults to ``None`` (``datasets`` infers them).
    """

    def __init__(
        self,
        read: SlotReader,
        slots: list[int],
        num_slots: int,
        epoch: int = 0,
        features: Features | None = None,
    ):
        super().__init__()
        self.read = read
        self.slots = list(slots)
        self.num_slots = num_slots
        self.epoch = epoch
        self._features = features

    @property
    def features(self) -> Features | None:
        # equal to the view's features: ``datasets`` then yields the rows as they are, without
        # encoding and decoding each one; a view cast to other features still casts them
        return self._features

    def _copy(self, **changes: Any) -> BufferExamplesIterable:
        fields = {
            "slots": self.slots,
            "num_slots": self.num_slots,
            "epoch": self.epoch,
            "features": self._features,
        }
        fields.update(changes)
        return type(self)(self.read, **fields)

    def _init_state_dict(self) -> dict:
        self._state_dict = {"rows": 0, "type": type(self).__name__}
        return self._state_dict

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        state = self._state_dict
        skip = state["rows"] if state else 0
        for i, row in enumerate(self.read(self.slots, self.num_slots, self.epoch, skip), skip):
            if state:
                state["rows"] = i + 1
            yield i, row

    def shuffle_data_sources(self, generator: np.random.Generator) -> BufferExamplesIterable:
        # datasets calls this at the start of every pass with epoch > 0: the pass's epoch.
        return self._copy(epoch=_epoch_of(generator))

    def shard_data_sources(
        self, num_shards: int, index: int, contiguous: bool = True
    ) -> BufferExamplesIterable:
        positions = self.split_shard_indices_by_worker(num_shards, index, contiguous=contiguous)
        return self._copy(slots=[self.slots[i] for i in positions])

    def reshard_data_sources(self) -> BufferExamplesIterable:
        return self._copy()  # slots are already the finest split

    @property
    def num_shards(self) -> int:
        return len(self.slots)

    @property
    def sleep_on_threads_shutdown(self) -> bool:
        # datasets' multi-source iterables (interleave_datasets) read it of each source when they
        # close; its base class asks the source's own ``ex_iterable(s)``, which a source has not
        # (an AttributeError, lost as an unraisable exception). Rows are read in the caller's
        # thread: no thread to wait for, as datasets' own ExamplesIterable says by default.
        return False


def iterable_view(read: SlotReader, num_slots: int, features: Features | None) -> IterableDataset:
    """A streaming :class:`datasets.IterableDataset` whose ``num_slots`` shards ``read`` serves.

    Slots are listed in bit-reversed order (``_sharding.interleaved_shard_order``)
    so that any contiguous block of them (what ``accelerate`` gives a rank) is spread over the
    buffer. Built in microseconds: nothing is hashed or pickled.
    """
    ex_iterable = BufferExamplesIterable(
        read, interleaved_shard_order(num_slots), num_slots, features=features
    )
    return IterableDataset(ex_iterable, info=DatasetInfo(features=features))


def table_view(tables: Iterator[pa.Table], cache_file: str | os.PathLike | None = None) -> Dataset:
    """A map-style :class:`datasets.Dataset` from ``pyarrow`` tables, one per read of the buffer.

    Each table is typed from its own rows; the dataset's features hold every table (types
    promoted as ``_arrow.unify_schemas`` does), so a column whose later rows need a wider type
    (ints, then floats; tool calls first seen in a later read) is read right, not cast to the
    first read's type. ``cache_file=None`` keeps the table in memory (``Dataset(InMemoryTable)``,
    with a random fingerprint, as :func:`iterable_view`'s, instead of a hash of the whole table);
    a path streams each table to an Arrow file there (``datasets``' own writer) and memory-maps
    it, as ``datasets`` does with hub data: only one table is in memory at a time (a read that
    widens a type rewrites what was written before it, once).

    Raises:
        TypeError: if a column's types in different reads have no common type.
    """
    if cache_file is None:
        parts = list(tables)
        features = features_of(unify_schemas([t.schema for t in parts]))
        schema = features.arrow_schema
        table = pa.concat_tables([t.cast(schema) for t in parts])
        # no content hash: an in-memory dataset gets no cache files, so its fingerprint only
        # names later transforms, and hashing the table would cost as much as building it
        info = DatasetInfo(features=features)
        return Dataset(InMemoryTable(table), info=info, fingerprint=generate_random_fingerprint())
    path = os.fspath(cache_file)
    schema, writer = None, None
    try:
        for table in tables:
            if schema is None:
                schema = table.schema
                writer = ArrowWriter(path=path, features=features_of(schema))
            elif table.schema != schema:
                wider = unify_schemas([schema, table.schema])
                if wider != schema:
                    writer, schema = _rewrite(path, writer, wider), wider
            writer.write_table(table.cast(writer.schema))
        writer.finalize()
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    return Dataset.from_file(path, info=DatasetInfo(features=features_of(schema)))


def _rewrite(path: str, writer: ArrowWriter, schema: pa.Schema) -> ArrowWriter:
    """A writer of ``schema`` at ``path`` that already holds what ``writer`` wrote, cast to it."""
    writer.finalize()
    narrow = path + ".narrow"
    os.replace(path, narrow)
    wider = ArrowWriter(path=path, features=features_of(schema))
    with pa.memory_map(narrow) as source:
        for batch in pa.ipc.open_stream(source):
            wider.write_table(pa.Table.from_batches([batch]).cast(wider.schema))
    os.remove(narrow)
    return wider
