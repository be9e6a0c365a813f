"""A torchrl ``ReplayBuffer`` seen as a dataset: :class:`TorchRLBufferDataset`.

Configuration, then iteration: every view (the torch ``IterableDataset``, :meth:`iter_storage`, the
Hugging Face views) reads batches from the buffer and walks each one into columns once
(``_reader.BufferReader``); who reads which rows, and the pass each reader makes, is decided by
``_sharding``, and reads from other processes are checked by ``_processes``. Errors are signed by
the public call that was made (``TorchRLBufferDataset``, ``TorchRLBufferDataset.to_hf_dataset``,
...): each method is a ``_checks.boundary``, and the rows of a view are read under the name of the
call that made it (``_reader.View``), batch by batch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer

from .._checks import as_device, boundary, check_positive_int, require
from .._keys import key_to_str
from ._columns import Selection
from ._processes import check_buffer, check_picklable_for_workers, check_remote_seed, is_remote
from ._reader import BufferReader, View
from ._sharding import PassCounter, ReadMode, ShardInfo, distributed_rank, shard_info, slot_pass

if TYPE_CHECKING:  # pragma: no cover
    import datasets

__all__ = ["DEFAULT_HF_EPOCH_SHARDS", "TorchRLBufferDataset"]

#: Shards of the Hugging Face view of an epoch-mode dataset (a power of two: see
#: ``_sharding.interleaved_shard_order``).
DEFAULT_HF_EPOCH_SHARDS = 64


class TorchRLBufferDataset(torch.utils.data.IterableDataset):
    """A torch :class:`~torch.utils.data.IterableDataset` over a torchrl :class:`~torchrl.data.ReplayBuffer`.

    Each iteration samples ``num_batches`` batches of ``batch_size`` rows from the buffer and
    yields one flat ``dict[str, Any]`` per row; with ``epoch=True`` it yields instead every stored
    row exactly once. Works on every torchrl storage, on the ragged lazy stacks that TorchRL's LLM
    wrappers write by default (``pad_output=False``), and on a
    :class:`~torchrl.data.RayReplayBuffer` (or its ``client()``). What a row holds is described
    in ``docs/overview.rst``; :meth:`as_hf_dataset` and :meth:`to_hf_dataset` give the Hugging
    Face views that TRL trainers take; ``docs/scale.rst`` says how rows are split between
    DataLoader workers and ranks.

    Args:
        replay_buffer (ReplayBuffer): the buffer to read (any torchrl ``ReplayBuffer`` subclass,
            including ``RayReplayBuffer``, or a ``RayReplayBuffer.client()``).
        batch_size (int): rows drawn per ``replay_buffer.sample`` call (per storage read with
            ``epoch=True``). Sampling refuses a ``batch_size`` above the storage's capacity
            (``max_size``) before anything is drawn: such a batch could only repeat rows, and
            ``10**12`` would ask for terabytes. Storage reads take at most the stored rows.

    Keyword Args:
        keys (list of NestedKey, optional): only these keys are yielded; a key naming a sub-
            tensordict selects all its leaves. Defaults to ``None`` (every leaf); ``[]`` is
            refused (it would select nothing).
        rename (dict, optional): maps stored keys to output names, e.g.
            ``{("tokens", "full"): "input_ids", ("masks", "all_attention_mask"): "attention_mask"}``.
        attention_mask_key (NestedKey, optional): a mask (bool or int) deciding which tokens are
            real; every tensor whose leading shape is the mask's is cut to the attended span.
        device (torch.device or str, optional): tensors are moved there. Defaults to ``None``.
        num_batches (int or None, optional): batches per iteration; ``None`` streams forever
            (the consumer sets a step limit, e.g. ``max_steps``) and sees rows written while it
            runs. Defaults to ``1``. Leave it at ``1`` with ``epoch=True``.
        sep (str, optional): joins nested keys into output names. Defaults to ``"."``.
        epoch (bool, optional): if ``True``, one iteration yields every row stored when it
            starts, exactly once, split without overlap across DataLoader workers and ranks.
            Defaults to ``False`` (sampling).
        shuffle (bool, optional): with ``epoch=True``, visit the rows in an order drawn from
            ``(seed, epoch)``, new every epoch (see :meth:`set_epoch`). Defaults to ``False``.
        seed (int, optional): base seed of the shuffling (epoch mode; ``0`` when ``None``, so
            that every rank agrees) or of the per-reader sampling streams. Defaults to ``None``.
        split_by_rank (bool, optional): whether epochs are split across ``torch.distributed``
            ranks. ``None`` (default): split when a process group is initialized, unless an
            ``accelerate`` state with several processes exists (a HF ``Trainer`` shards its
            DataLoaders itself). ``True`` for a hand-written loop in a process that also runs
            ``accelerate``, ``False`` to never split by rank.

    Raises:
        TypeError: if ``replay_buffer`` is not a ReplayBuffer, ``rename`` is not a dict,
            ``epoch``/``shuffle`` are not bools, ``device`` is not a device, a key is not a key,
            or a stored value cannot be converted (the key and type are named).
        ValueError: on a bad option or combination of options (the message says which).
        KeyError: if a key in ``keys``, ``rename`` or ``attention_mask_key`` is not stored.
        RuntimeError: when iterating an empty buffer, or when a configuration would silently
            train on wrong rows (see ``docs/scale.rst``); each message says what to change.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict, lazy_stack
        >>> from torchrl.data import LazyStackStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyStackStorage(100))
        >>> rows = [TensorDict({"tokens": {"full": torch.arange(n)}, "prompt": f"p{n}"}) for n in (3, 5)]
        >>> _ = rb.extend(lazy_stack(rows))  # ragged, as TorchRL's LLM wrappers write it

        Ragged rows come out with their own lengths, nested keys as ``"a.b"``:

        >>> sorted(next(iter(TorchRLBufferDataset(rb, batch_size=4))))
        ['prompt', 'tokens.full']
        >>> {len(row["tokens.full"]) for row in TorchRLBufferDataset(rb, batch_size=64)}
        {3, 5}

        Every stored row once, as a Hugging Face dataset, with renamed columns:

        >>> hf = TorchRLBufferDataset(rb, 4, rename={("tokens", "full"): "input_ids"}).to_hf_dataset()
        >>> hf[0]
        {'prompt': 'p3', 'input_ids': [0, 1, 2]}

        Every stored row once per epoch, shuffled (DataLoader workers split it):

        >>> ds = TorchRLBufferDataset(rb, 1, epoch=True, shuffle=True, seed=0)
        >>> sorted(row["prompt"] for row in ds)
        ['p3', 'p5']
    """

    @boundary("TorchRLBufferDataset")
    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        keys: Sequence[NestedKey] | None = None,
        rename: Mapping[NestedKey, str] | None = None,
        attention_mask_key: NestedKey | None = None,
        device: torch.device | str | None = None,
        num_batches: int | None = 1,
        sep: str = ".",
        epoch: bool = False,
        shuffle: bool = False,
        seed: int | None = None,
        split_by_rank: bool | None = None,
    ) -> None:
        check_buffer(replay_buffer)
        check_positive_int(batch_size, "batch_size")
        # ``epoch`` is the flag; ``self._passes`` counts the epochs
        self._mode = ReadMode(num_batches, epoch, shuffle, seed, split_by_rank)
        check_remote_seed(replay_buffer, self._mode)
        self._passes = PassCounter()  # the epoch counter, the pass in progress
        # (rank, world size) decided by the process that started this DataLoader worker.
        self._parent_rank: tuple[int, int] | None = None
        selection = Selection.from_args(keys, rename, attention_mask_key, sep)
        device = as_device(device, "device")
        self._reader = BufferReader(replay_buffer, batch_size, selection=selection, device=device)
        if len(replay_buffer) > 0:
            self._reader.schema()

    # -- properties (upstream-compatible accessors) ---------------------------------------------

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """The wrapped replay buffer."""
        return self._reader.replay_buffer

    @property
    def batch_size(self) -> int:
        """Rows drawn per ``sample`` call."""
        return self._reader.batch_size

    @property
    def num_batches(self) -> int | None:
        """Batches per iteration (``None``: unbounded)."""
        return self._mode.num_batches

    @property
    @boundary("TorchRLBufferDataset")
    def column_names(self) -> list[str]:
        """Output names of the yielded columns (needs a non-empty buffer)."""
        return list(self._reader.schema().names)

    # -- who reads what ------------------------------------------------------------------------

    @boundary("TorchRLBufferDataset.set_epoch")
    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that orders the next pass (epoch mode) and seeds its streams (``seed=``).

        HF ``Trainer`` (through accelerate) calls it at the start of every epoch, on every rank,
        like ``DistributedSampler.set_epoch``; call it yourself in a hand-written loop with
        DataLoader workers (each epoch's workers get a copy of the dataset, so their passes do
        not advance it). Without calls, each pass in this process advances it.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_buffer
            >>> ds = TorchRLBufferDataset(toy_buffer(8), 8, epoch=True, shuffle=True, seed=0)
            >>> ds.set_epoch(3)
            >>> first = [int(r["x"]) for r in ds]
            >>> ds.set_epoch(3)
            >>> first == [int(r["x"]) for r in ds]
            True
        """
        self._passes.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this reader is: the epoch of the pass, the rows it yielded, its stream seed.

        The protocol of torchdata's ``StatefulDataLoader`` (which calls it in each DataLoader
        worker) and of ``accelerate``: :meth:`load_state_dict` on a new dataset over the same
        buffer makes the next pass yield exactly the rows an uninterrupted run would have
        yielded next. Between passes the state names the next epoch and 0 rows.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_buffer
            >>> ds = TorchRLBufferDataset(toy_buffer(6), 2, epoch=True, shuffle=True)
            >>> whole = [int(r["x"]) for r in ds]  # epoch 0, uninterrupted
            >>> ds.set_epoch(0)
            >>> it = iter(ds)
            >>> first = [int(next(it)["x"]) for _ in range(4)]
            >>> state = ds.state_dict()
            >>> state["epoch"], state["rows"]
            (0, 4)
            >>> resumed = TorchRLBufferDataset(toy_buffer(6), 2, epoch=True, shuffle=True)
            >>> resumed.load_state_dict(state)
            >>> first + [int(r["x"]) for r in resumed] == whole
            True
        """
        return self._passes.state_dict()

    @boundary("TorchRLBufferDataset.load_state_dict")
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next pass resumes that epoch after its rows.

        Raises:
            ValueError: if ``state_dict`` is not a state of this dataset.
        """
        self._passes.load_state_dict(state_dict)

    def _shard_info(self) -> ShardInfo:
        """This process's rank and DataLoader worker: the rank is decided here, only."""
        in_worker = torch.utils.data.get_worker_info() is not None
        rank_world = self._parent_rank if in_worker else None
        return shard_info(split_by_rank=self._mode.split_by_rank, rank_world=rank_world)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self._passes.run(self._reader, self._mode, self._shard_info())

    def _iter_hf_slots(
        self, slots: list[int], num_slots: int, epoch: int, skip: int, view: View
    ) -> Iterator[dict[str, Any]]:
        """What the streaming view reads: ``datasets`` gives the slots, epoch and position."""
        return slot_pass(
            self._reader, self._mode, self._shard_info(), slots, num_slots, epoch, skip, view
        )

    def iter_storage(self, chunk_size: int | None = None) -> Iterator[dict[str, Any]]:
        """Yields every stored row exactly once, in storage order (no sampling, no splitting).

        Keyword Args:
            chunk_size (int, optional): rows read per storage access; defaults to
                ``max(batch_size, 1024)``.
        """
        for rows in self._storage_reads(chunk_size):
            yield from rows

    @boundary("TorchRLBufferDataset.iter_storage")
    def _storage_reads(self, chunk_size: int | None) -> Iterator[list[dict[str, Any]]]:
        """:meth:`iter_storage`'s reads, one list of rows each: signed read by read, not per row."""
        for batch in self._reader.storage_batches(self._chunk_size(chunk_size, 1024)):
            yield self._reader.rows(batch)

    def _chunk_size(self, chunk_size: int | None, default: int) -> int:
        check_positive_int(chunk_size, "chunk_size", allow_none=True)
        return chunk_size or max(self._reader.batch_size, default)

    @boundary("TorchRLBufferDataset")
    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing.context import get_spawning_popen

        state = self.__dict__.copy()
        if get_spawning_popen() is not None:
            # Sent to a DataLoader worker: one that can read the buffer. It has no process group
            # of its own: it splits by the rank decided here. (The reader makes its buffer safe
            # to send.)
            check_picklable_for_workers(self.replay_buffer)
            state["_parent_rank"] = distributed_rank(self._mode.split_by_rank)
        return state

    # -- Hugging Face views --------------------------------------------------------------------

    @boundary("TorchRLBufferDataset.hf_features")
    def hf_features(self) -> datasets.Features | None:
        """The ``datasets.Features`` of the first ``batch_size`` stored rows: what
        :meth:`as_hf_dataset` declares (``docs/overview.rst``, "Types in the Hugging Face views").

        Raises:
            TypeError: if a column holds values Arrow cannot store (complex numbers) or rows with
                no common type (a bool and a number); the column is named.
        """
        require("datasets", "TorchRLBufferDataset.hf_features")
        from ._hf_views import features_of

        return features_of(self._reader.declared_schema())

    @boundary("TorchRLBufferDataset.as_hf_dataset")
    def as_hf_dataset(self, *, num_shards: int | None = None) -> datasets.IterableDataset:
        """Returns a streaming :class:`datasets.IterableDataset` over this buffer.

        Sampling mode: each pass draws ``num_batches`` batches per shard (``None``: forever, so
        give the trainer ``max_steps``). Epoch mode: one pass yields every stored row exactly
        once, ordered by ``(seed, epoch)`` with ``shuffle=True``; the epoch is ``datasets``' own
        (``set_epoch``, ``load_state_dict``), and DataLoader workers, ``accelerate`` and
        ``split_dataset_by_node`` split the shards (``docs/scale.rst``). Built in microseconds:
        the buffer is never pickled to fingerprint it.

        The view declares :meth:`hf_features`, the types of the first ``batch_size`` stored
        rows. A later batch that only adds struct fields (``tool_calls`` first appearing in an
        online agentic buffer) widens them, as :meth:`to_hf_dataset` types such rows; any other
        row those types cannot hold exactly raises a :class:`TypeError` naming the column, never
        a silent cast (``docs/overview.rst``, "Types in the Hugging Face views").

        Keyword Args:
            num_shards (int, optional): shards of the view. Defaults to ``64`` with
                ``epoch=True`` (enough for ranks x workers up to 64) and ``1`` when sampling
                (one stream, upstream's behaviour).

        Raises:
            ValueError: if ``num_shards`` is not a positive int.
            TypeError: while iterating, if a row does not fit the declared features.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_buffer
            >>> rb = toy_buffer(4)  # a LazyTensorStorage holding x = 0, 1, 2, 3
            >>> hf = TorchRLBufferDataset(rb, batch_size=2).as_hf_dataset()
            >>> hf.features["x"]
            Value('int64')
            >>> len(list(hf))
            2

            In epoch mode, ranks (here through ``split_dataset_by_node``) read disjoint rows:

            >>> from datasets.distributed import split_dataset_by_node
            >>> hf = TorchRLBufferDataset(rb, batch_size=2, epoch=True).as_hf_dataset(num_shards=4)
            >>> [sorted(r["x"] for r in split_dataset_by_node(hf, rank=k, world_size=2)) for k in (0, 1)]
            [[0, 1], [2, 3]]
        """
        call = "TorchRLBufferDataset.as_hf_dataset"
        require("datasets", call)
        from ._hf_views import features_of, iterable_view

        if num_shards is None:
            num_shards = DEFAULT_HF_EPOCH_SHARDS if self._mode.epoch else 1
        check_positive_int(num_shards, "num_shards")
        declared = self._reader.declared_schema() if len(self._reader) > 0 else None
        view = View(call, python=True, declared=declared)  # its rows typed as declared, signed
        read = functools.partial(self._iter_hf_slots, view=view)
        return iterable_view(read, num_shards, features_of(declared))

    @boundary("TorchRLBufferDataset.to_hf_dataset")
    def to_hf_dataset(
        self, *, chunk_size: int | None = None, cache_file: str | os.PathLike | None = None
    ) -> datasets.Dataset:
        """Returns a map-style :class:`datasets.Dataset` holding every stored row exactly once.

        Rows are read in storage order (no sampling), which is what trainers need for epochs and
        ``len``. Tensors become Arrow lists/numbers; History becomes message lists. Each read
        is converted column by column, straight from its tensors to Arrow (values and offsets).
        Each column is typed from every stored row, as ``datasets.Dataset.from_list`` types the
        same Python values (``docs/overview.rst``, "Types in the Hugging Face views").

        Keyword Args:
            chunk_size (int, optional): rows read per storage access; defaults to
                ``max(batch_size, 4096)``.
            cache_file (str or path, optional): write the rows to this Arrow file, chunk by
                chunk, and memory-map it (as ``datasets`` does with hub data): for buffers
                larger than memory. Defaults to ``None``: the table is kept in memory (no disk
                writes, nothing to clean up; see ``docs/scale.rst``).

        Raises:
            TypeError: if a column holds values Arrow cannot store, or rows with no common type
                (a bool and a number, a str and a number); the column is named.

        Examples:
            Ragged rows keep their own length; a column's type holds all its rows:

            >>> import torch
            >>> from tensordict import TensorDict, lazy_stack
            >>> from torchrl.data import LazyStackStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyStackStorage(10))
            >>> rows = [TensorDict({"ids": torch.arange(n), "score": s}) for n, s in ((1, 1), (3, 0.5))]
            >>> _ = rb.extend(lazy_stack(rows))
            >>> ds = TorchRLBufferDataset(rb, batch_size=2).to_hf_dataset()
            >>> ds["ids"][:], ds["score"][:]
            ([[0], [0, 1, 2]], [1.0, 0.5])
        """
        require("datasets", "TorchRLBufferDataset.to_hf_dataset")
        from ._hf_views import table_view

        chunk_size = self._chunk_size(chunk_size, 4096)
        batches = self._reader.storage_batches(chunk_size)
        tables = (self._reader.arrow_table(batch) for batch in batches)
        return table_view(tables, cache_file)

    def __repr__(self) -> str:
        selection = self._reader.selection
        keys = selection.keys
        keys = "<all>" if keys is None else [key_to_str(k, selection.sep) for k in keys]
        rb = self._reader.replay_buffer
        storage = "<remote>" if is_remote(rb) else type(rb.storage).__name__
        mode = f"epoch=True, shuffle={self._mode.shuffle}" if self._mode.epoch else "epoch=False"
        return (
            f"{type(self).__name__}(replay_buffer={type(rb).__name__}("
            f"storage={storage}, len={len(rb)}), "
            f"batch_size={self.batch_size}, keys={keys}, num_batches={self._mode.num_batches}, "
            f"{mode}, seed={self._mode.seed}, device={self._reader.device})"
        )
