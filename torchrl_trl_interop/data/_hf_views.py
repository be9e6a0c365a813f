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
import torch
from datasets import (
    Dataset,
    DatasetInfo,
    Features,
    IterableDataset,
    List,
    Value,
    concatenate_datasets,
)
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import generate_random_fingerprint
from datasets.iterable_dataset import _BaseExamplesIterable
from datasets.table import InMemoryTable

from .._keys import to_python
from ._sharding import interleaved_shard_order

__all__ = [
    "BufferExamplesIterable",
    "feature_of",
    "features_of",
    "iterable_view",
    "map_view",
    "table_view",
]

_DTYPE_TO_HF = {
    torch.bool: "bool",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.float16: "float16",
    torch.bfloat16: "float32",
    torch.float32: "float32",
    torch.float64: "float64",
}

#: ``read(slots, num_slots, epoch, skip)`` yields the rows of those slots in that epoch, as dicts
#: of plain Python values (converted once per batch and column, not per row).
SlotReader = Callable[[list[int], int, int, int], Iterator[dict[str, Any]]]


def feature_of(value: Any) -> Any:
    """The ``datasets`` feature of one row value, or ``None`` if it cannot be inferred.

    Examples:
        >>> import torch
        >>> feature_of(torch.zeros(2, 3, dtype=torch.int32))
        List(List(Value('int32')))
        >>> feature_of([{"role": "user", "content": "Hi"}])
        List({'role': Value('string'), 'content': Value('string')})
    """
    if isinstance(value, torch.Tensor):
        dtype = _DTYPE_TO_HF.get(value.dtype)
        if dtype is None:
            return None
        feature: Any = Value(dtype)
        for _ in range(value.ndim):
            feature = List(feature)
        return feature
    if isinstance(value, bool):
        return Value("bool")
    if isinstance(value, int):
        return Value("int64")
    if isinstance(value, float):
        return Value("float64")
    if isinstance(value, str):
        return Value("string")
    if isinstance(value, list) and value and isinstance(value[0], dict):
        if any(m.keys() - {"role", "content"} for m in value):
            return None  # tool calls: their arguments have no fixed type; datasets infers it
        return List({"role": Value("string"), "content": Value("string")})
    if isinstance(value, list) and value:
        inner = feature_of(value[0])
        return None if inner is None else List(inner)
    return None


def features_of(row: dict[str, Any]) -> Features | None:
    """The ``datasets.Features`` of a row, or ``None`` when some column's type cannot be inferred."""
    features = {name: feature_of(value) for name, value in row.items()}
    if any(f is None for f in features.values()):
        return None
    return Features(features)


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


def map_view(columns: Iterator[dict[str, list]], features: Features | None) -> Dataset:
    """A map-style :class:`datasets.Dataset` from chunks of columns (``{name: values}``)."""
    parts = [
        Dataset.from_dict(
            {name: [to_python(v) for v in values] for name, values in chunk.items()},
            features=features,
        )
        for chunk in columns
    ]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def table_view(
    tables: Iterator[Any], features: Features, cache_file: str | os.PathLike | None = None
) -> Dataset:
    """A map-style :class:`datasets.Dataset` from ``pyarrow`` tables with ``features``' schema.

    ``cache_file=None`` keeps the table in memory (``Dataset(InMemoryTable)``, with a random
    fingerprint, as :func:`iterable_view`'s, instead of a hash of the whole table); a path streams
    each table to an Arrow file there (``datasets``' own writer) and memory-maps it, as
    ``datasets`` does with hub data: only one table is in memory at a time.
    """
    info = DatasetInfo(features=features)
    if cache_file is None:
        parts = list(tables)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        # no content hash: an in-memory dataset gets no cache files, so its fingerprint only
        # names later transforms, and hashing the table would cost as much as building it
        return Dataset(InMemoryTable(table), info=info, fingerprint=generate_random_fingerprint())
    path = os.fspath(cache_file)
    with ArrowWriter(path=path, features=features) as writer:
        for table in tables:
            writer.write_table(table)
        writer.finalize()
    return Dataset.from_file(path, info=info)
