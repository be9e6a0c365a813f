"""Scale: exactly-once epochs across DataLoader workers and ranks, distinct sampling streams,
online streaming into workers, and a 2-rank ``torchrun`` run of real HF/TRL trainers.

DataLoader worker tests use the ``spawn`` start method (torchrl's default). A spawned worker
costs a few seconds of start-up (it imports torch, tensordict and torchrl), so the tests share
them: two DataLoader sessions (:func:`two_workers`, :func:`one_worker`) each read several
datasets in a row (``ChainDataset``), and each test reads what its own dataset yielded.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from _background import background
from tensordict import TensorDict
from torch.utils.data import ChainDataset, DataLoader
from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
)

from torchrl_trl_interop import CommittedWriter, TorchRLBufferDataset
from torchrl_trl_interop.data._committed import read_committed, read_committed_rows
from torchrl_trl_interop.data._sharding import (
    ShardInfo,
    distributed_rank,
    interleaved_shard_order,
    shard_indices,
)

WIDTH = 16


def rows(start: int, n: int) -> TensorDict:
    """Rows whose payload is derived from their id, so any torn or stale row is detectable."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"row_id": ids, "payload": ids[:, None] * 1000 + torch.arange(WIDTH)}, batch_size=[n]
    )


def whole(row_id: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    return (payload == row_id[..., None] * 1000 + torch.arange(WIDTH)).all(-1)


def buffer(n: int, capacity: int | None = None, *, start: int = 0, **kwargs) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity or max(n, 1)), **kwargs)
    if n:
        rb.extend(rows(start, n))
    return rb


def loader(ds, num_workers: int, batch_size: int = 8, context: str = "spawn") -> DataLoader:
    kwargs = {}
    if num_workers:
        kwargs = dict(multiprocessing_context=context, persistent_workers=False)
    return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, **kwargs)


def first_batch(data_loader: DataLoader):
    """The first batch, with the workers shut down at once (not when garbage collected)."""
    it = iter(data_loader)
    try:
        return next(it)
    finally:
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def ids_of(batches) -> list[int]:
    return [int(i) for b in batches for i in b["row_id"]]


@pytest.fixture
def fake_reader(monkeypatch):
    """Makes the dataset believe it runs as a given (rank, worker): ``fake_reader(ShardInfo(...))``.

    Through torch's own seams only (``torch.distributed`` and ``get_worker_info``), as a real
    rank or DataLoader worker would see them.
    """

    def install(info: ShardInfo) -> None:
        distributed = info.world_size > 1
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: distributed)
        monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: info.rank)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: info.world_size)
        worker = None
        if info.in_worker or info.num_workers > 1:
            worker = type("WorkerInfo", (), {"id": info.worker_id, "num_workers": info.num_workers})
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: worker)

    return install


@pytest.fixture
def fake_process_group(monkeypatch):
    """A 2-rank ``torch.distributed`` seen from rank 1, without starting one."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)


def fake_accelerate(monkeypatch, num_processes: int) -> None:
    class PartialState:
        _shared_state = {"num_processes": num_processes}

    module = type(sys)("accelerate.state")
    module.PartialState = PartialState
    monkeypatch.setitem(sys.modules, "accelerate.state", module)


# ---------------------------------------------------------------------------------------------
# Spawned DataLoader workers, shared: each session reads several datasets in a row
# ---------------------------------------------------------------------------------------------

#: the first row id of each session dataset's buffer, so that a row tells which one it came from
#: (the online buffer's ids start at 0 and stay below its capacity)
EPOCH_ROWS, SEEDED_ROWS, ONLINE_CAPACITY = 1_000_000, 500_000, 40_000


@dataclass
class Session:
    """What a DataLoader session yielded: each worker's row ids in order, and what was read."""

    per_worker: list[list[int]]
    payload_ok: list[bool]  # per row, in the order read: whole (not torn)
    ids: list[int]  # every row id, in the order read
    extra: dict = field(default_factory=dict)

    def of(self, low: int, high: int, worker: int | None = None) -> list[int]:
        """The ids in ``[low, high)``, of one worker (in its order) or of all."""
        ids = self.ids if worker is None else self.per_worker[worker]
        return [i for i in ids if low <= i < high]


class Writer(threading.Thread):
    """Extends the buffer with consecutive row ids until stopped or full."""

    def __init__(self, rb, start: int, limit: int, chunk: int = 32, pause: float = 0.0005):
        super().__init__(daemon=True)
        self.rb, self.written, self.limit, self.chunk, self.pause = rb, start, limit, chunk, pause
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set() and self.written + self.chunk <= self.limit:
            self.rb.extend(rows(self.written, self.chunk))
            self.written += self.chunk
            time.sleep(self.pause)


@pytest.fixture(scope="module")
def two_workers():
    """Two spawn workers read, in a row: an epoch pass (45 rows, shuffled), seeded sampling on a
    buffer built with a seeded generator (3 batches), then an online stream while a writer
    extends its ``CommittedWriter`` buffer (read for 2.5 s once the workers are up). Each
    worker's iterator never ends, so the loader takes batches from the workers in turn:
    ``batches[w::2]`` are worker ``w``'s."""
    epoch = TorchRLBufferDataset(buffer(45, start=EPOCH_ROWS), 4, epoch=True, shuffle=True, seed=0)
    seeded_rb = buffer(1000, start=SEEDED_ROWS, generator=torch.Generator().manual_seed(0))
    rng_state = seeded_rb._rng.get_state()
    seeded = TorchRLBufferDataset(seeded_rb, 8, num_batches=3, seed=7)
    online_rb = buffer(64, capacity=ONLINE_CAPACITY, writer=CommittedWriter())
    online = TorchRLBufferDataset(online_rb, 64, num_batches=None, seed=0)
    it = iter(loader(ChainDataset([epoch, seeded, online]), 2, batch_size=64))
    writer = Writer(online_rb, 64, ONLINE_CAPACITY, chunk=64, pause=0.0002)
    try:
        batches = [next(it)]  # the workers are up
        writer.start()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            batches.append(next(it))
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join()
        it._shutdown_workers()
    per_worker = [[int(i) for b in batches[w::2] for i in b["row_id"]] for w in range(2)]
    ids = [int(i) for b in batches for i in b["row_id"]]
    ok = [bool(x) for b in batches for x in whole(b["row_id"], b["payload"])]
    extra = {"epoch": epoch, "seeded_rb": seeded_rb, "rng_state": rng_state, "writer": writer}
    return Session(per_worker, ok, ids, extra)


@pytest.fixture(scope="module")
def one_worker():
    """One spawn worker reads an epoch pass (45 rows, in batches of 9 so that no batch mixes
    datasets), then streams a buffer without a ``CommittedWriter``, which it must refuse."""
    epoch = TorchRLBufferDataset(buffer(45, start=EPOCH_ROWS), 4, epoch=True, shuffle=True, seed=0)
    stream_ds = TorchRLBufferDataset(buffer(16), 4, num_batches=None)
    it = iter(loader(ChainDataset([epoch, stream_ds]), 1, batch_size=9))
    batches, error = [], None
    try:
        for batch in it:
            batches.append(batch)
    except RuntimeError as err:
        error = err
    finally:
        it._shutdown_workers()
    ids = [int(i) for b in batches for i in b["row_id"]]
    return Session([ids], [], ids, {"epoch": epoch, "error": error})


# ---------------------------------------------------------------------------------------------
# Epoch mode: every stored row exactly once
# ---------------------------------------------------------------------------------------------


class TestEpoch:
    @pytest.mark.parametrize("world_size,num_workers", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2)])
    @pytest.mark.parametrize("shuffle", [False, True])
    def test_readers_split_the_epoch(self, fake_reader, world_size, num_workers, shuffle):
        rb = buffer(37)
        seen = []
        for rank in range(world_size):
            for worker in range(num_workers):
                fake_reader(ShardInfo(rank, world_size, worker, num_workers, in_worker=False))
                ds = TorchRLBufferDataset(rb, 5, epoch=True, shuffle=shuffle, seed=3)
                seen += [int(r["row_id"]) for r in ds]
        assert sorted(seen) == list(range(37))

    def test_readers_that_saw_different_lengths_never_overlap(self):
        # A collector wrote rows between the readers' snapshots of len(buffer).
        parts = [shard_indices(n, k, 3, shuffle=True, seed=1) for k, n in enumerate([10, 14, 20])]
        flat = torch.cat(parts).tolist()
        assert len(flat) == len(set(flat))
        assert set(range(10)) <= set(flat)

    def test_shuffle_changes_with_epoch_and_reproduces(self):
        rb = buffer(50)
        ds = TorchRLBufferDataset(rb, 8, epoch=True, shuffle=True, seed=0)
        first, second = [[int(r["row_id"]) for r in ds] for _ in range(2)]
        assert sorted(first) == sorted(second) == list(range(50)) and first != second
        ds.set_epoch(0)
        assert [int(r["row_id"]) for r in ds] == first
        other_seed = TorchRLBufferDataset(rb, 8, epoch=True, shuffle=True, seed=1)
        assert [int(r["row_id"]) for r in other_seed] != first

    @pytest.mark.parametrize("num_workers", [0, 1, 2])
    def test_dataloader_workers(self, num_workers, request):
        """Every row once, split across the spawn workers (shared sessions, see above)."""
        if num_workers:
            session = request.getfixturevalue(("one_worker", "two_workers")[num_workers - 1])
            ds, got = session.extra["epoch"], session.of(EPOCH_ROWS, EPOCH_ROWS + 45)
        else:
            ds = TorchRLBufferDataset(
                buffer(45, start=EPOCH_ROWS), 4, epoch=True, shuffle=True, seed=0
            )
            got = ids_of(loader(ds, 0, batch_size=6))
        assert sorted(got) == list(range(EPOCH_ROWS, EPOCH_ROWS + 45))
        assert sorted(ds.to_hf_dataset()["row_id"]) == sorted(got)
        if num_workers == 2:  # each worker read its own share
            shares = [set(session.of(EPOCH_ROWS, EPOCH_ROWS + 45, w)) for w in (0, 1)]
            assert shares[0] and shares[1] and not shares[0] & shares[1]

    def test_hf_view_every_row_once_and_shardable(self):
        from datasets.distributed import split_dataset_by_node

        rb = buffer(8)
        hf = TorchRLBufferDataset(rb, 3, epoch=True, shuffle=True).as_hf_dataset()
        assert hf.num_shards == 64
        assert sorted(r["row_id"] for r in hf) == list(range(8))
        assert sorted(r["row_id"] for r in hf) == sorted(
            TorchRLBufferDataset(rb, 3).to_hf_dataset()["row_id"]
        )
        for world in (2, 4):
            # accelerate (dispatch_batches=False): each rank keeps a contiguous block of shards.
            parts = [[r["row_id"] for r in hf.shard(world, k)] for k in range(world)]
            assert sorted(sum(parts, [])) == list(range(8))
            assert {len(p) for p in parts} == {8 // world}, parts  # even, even with 8 rows
            parts = [
                [r["row_id"] for r in split_dataset_by_node(hf, rank=k, world_size=world)]
                for k in range(world)
            ]
            assert sorted(sum(parts, [])) == list(range(8))

    def test_hf_view_in_dataloader_workers(self, monkeypatch):
        """``datasets`` gives each worker some shards; the view must not split them again."""
        rb = buffer(30)
        hf = TorchRLBufferDataset(rb, 4, epoch=True).as_hf_dataset(num_shards=4)
        got = []
        for worker_id in (0, 1):  # what each of 2 workers runs (datasets reads get_worker_info)
            info = type("WorkerInfo", (), {"id": worker_id, "num_workers": 2, "seed": 0})
            monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda info=info: info)
            got.append([r["row_id"] for r in hf])
        assert got[0] and got[1] and not set(got[0]) & set(got[1])
        assert sorted(got[0] + got[1]) == list(range(30))

    def test_hf_view_interleaved_and_closed_early(self, monkeypatch):
        """``interleave_datasets`` of two views, left after two rows: closing it asks each view
        whether to wait for threads (it raised an AttributeError, lost as unraisable)."""
        from datasets import interleave_datasets

        lost = []
        monkeypatch.setattr(sys, "unraisablehook", lost.append)
        mixed = interleave_datasets(
            [TorchRLBufferDataset(buffer(8), 3, epoch=True).as_hf_dataset() for _ in range(2)]
        )
        rows = iter(mixed)
        assert [next(rows)["row_id"], next(rows)["row_id"]] == [0, 0]  # one row of each view
        rows.close()
        gc.collect()
        assert [(u.exc_type, str(u.exc_value)) for u in lost] == []

    def test_interleaved_shard_order(self):
        order = interleaved_shard_order(64)
        assert sorted(order) == list(range(64))
        assert sorted(order[:32]) == list(range(0, 64, 2))

    def test_bad_options(self):
        rb = buffer(4)
        with pytest.raises(ValueError, match="shuffle=True only applies to epoch=True"):
            TorchRLBufferDataset(rb, 2, shuffle=True)
        with pytest.raises(ValueError, match="num_batches has no effect with epoch=True"):
            TorchRLBufferDataset(rb, 2, epoch=True, num_batches=3)
        with pytest.raises(ValueError, match="seed must be an int"):
            TorchRLBufferDataset(rb, 2, seed=1.5)
        with pytest.raises(ValueError, match="split_by_rank must be None, True or False"):
            TorchRLBufferDataset(rb, 2, split_by_rank="yes")
        with pytest.raises(ValueError, match="num_shards must be a positive int"):
            TorchRLBufferDataset(rb, 2).as_hf_dataset(num_shards=0)


# ---------------------------------------------------------------------------------------------
# Ranks: who splits, the dataset or accelerate
# ---------------------------------------------------------------------------------------------


class TestRanks:
    def test_no_process_group(self):
        assert distributed_rank() == (0, 1)
        with pytest.raises(RuntimeError, match="split_by_rank=True but torch.distributed"):
            distributed_rank(split_by_rank=True)
        rb = buffer(4)
        with pytest.raises(RuntimeError, match="split_by_rank=True but torch.distributed"):
            next(iter(TorchRLBufferDataset(rb, 2, epoch=True, split_by_rank=True)))

    def test_process_group_splits(self, fake_process_group):
        assert distributed_rank() == (1, 2)
        assert distributed_rank(split_by_rank=False) == (0, 1)
        ds = TorchRLBufferDataset(buffer(9), 4, epoch=True)
        assert [int(r["row_id"]) for r in ds] == [1, 3, 5, 7]

    def test_accelerate_splits_instead(self, fake_process_group, monkeypatch):
        fake_accelerate(monkeypatch, num_processes=2)
        assert distributed_rank() == (0, 1)  # a Trainer shards its DataLoaders itself
        assert distributed_rank(split_by_rank=True) == (1, 2)
        fake_accelerate(monkeypatch, num_processes=1)
        assert distributed_rank() == (1, 2)

    def test_spawned_worker_splits_by_its_parents_rank(self, fake_process_group, monkeypatch):
        from multiprocessing import context

        ds = TorchRLBufferDataset(buffer(16), 4, epoch=True)
        monkeypatch.setattr(context, "get_spawning_popen", lambda: object())
        state = ds.__getstate__()
        assert state["_parent_rank"] == (1, 2)
        # In the worker: no process group, worker 1 of 2.
        monkeypatch.undo()
        worker = TorchRLBufferDataset.__new__(TorchRLBufferDataset)
        worker.__dict__.update(state)  # what unpickling does
        monkeypatch.setattr(
            torch.utils.data, "get_worker_info", lambda: type("W", (), {"id": 1, "num_workers": 2})
        )
        # Reader 1 * 2 + 1 = 3 of 4.
        assert [int(r["row_id"]) for r in worker] == [3, 7, 11, 15]


# ---------------------------------------------------------------------------------------------
# Sampling mode: one stream per reader
# ---------------------------------------------------------------------------------------------


def stream(rb, info: ShardInfo, fake_reader, seed, n: int = 3) -> list[int]:
    fake_reader(info)
    return [int(r["row_id"]) for r in TorchRLBufferDataset(rb, 8, num_batches=n, seed=seed)]


class TestSampling:
    @pytest.mark.parametrize("seed", [None, 7])
    def test_distinct_streams_per_rank_and_worker(self, fake_reader, seed):
        rb = buffer(1000, generator=torch.Generator().manual_seed(0))
        readers = [ShardInfo(r, 2, w, 2, in_worker=True) for r in range(2) for w in range(2)]
        streams = [stream(rb, info, fake_reader, seed) for info in readers]
        assert len({tuple(s) for s in streams}) == 4
        if seed is not None:
            assert streams == [stream(rb, info, fake_reader, seed) for info in readers]

    def test_real_workers_match_their_seeded_streams(self, fake_reader, two_workers):
        """Two spawn workers on a buffer built with a seeded generator (upstream: one stream twice)."""
        rb = two_workers.extra["seeded_rb"]
        per_worker = [two_workers.of(SEEDED_ROWS, EPOCH_ROWS, w) for w in (0, 1)]
        assert per_worker[0] != per_worker[1]
        expected = [
            stream(rb, ShardInfo(0, 1, w, 2, in_worker=True), fake_reader, 7) for w in (0, 1)
        ]
        assert per_worker == expected  # reproducible: seed, rank and worker id decide the stream
        assert torch.equal(rb._rng.get_state(), two_workers.extra["rng_state"])  # untouched

    def test_in_process_reader_keeps_the_buffers_own_sampler(self):
        rb = buffer(1000, generator=torch.Generator().manual_seed(0))
        ds = TorchRLBufferDataset(rb, 8, num_batches=2)
        rb.set_rng(torch.Generator().manual_seed(3))
        a = [int(r["row_id"]) for r in ds]
        rb.set_rng(torch.Generator().manual_seed(3))
        assert [int(r["row_id"]) for r in ds] == a  # upstream behaviour, no seed of our own

    def test_without_replacement_copied_into_readers_raises(self, fake_reader):
        rb = buffer(64, sampler=SamplerWithoutReplacement())
        fake_reader(ShardInfo(0, 1, 0, 2, in_worker=True))
        with pytest.raises(RuntimeError, match="samples without replacement.*epoch=True"):
            next(iter(TorchRLBufferDataset(rb, 8)))
        fake_reader(ShardInfo())
        ds = TorchRLBufferDataset(rb, 8, num_batches=8)
        assert sorted(int(r["row_id"]) for r in ds) == list(range(64))  # one reader: fine


# ---------------------------------------------------------------------------------------------
# Online streaming
# ---------------------------------------------------------------------------------------------


class TestOnline:
    def test_in_process_stream_sees_rows_written_during_training(self):
        rb = buffer(32, capacity=20_000)
        writer = Writer(rb, 32, 20_000)
        ds = TorchRLBufferDataset(rb, 64, num_batches=None)
        it = iter(loader(ds, 0, batch_size=64))
        writer.start()
        seen_max, n = 0, 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            b = next(it)
            assert whole(b["row_id"], b["payload"]).all()
            seen_max, n = max(seen_max, int(b["row_id"].max())), n + len(b["row_id"])
        writer.stop.set()
        writer.join()
        assert seen_max > 32 * 10, (seen_max, writer.written)

    def test_workers_stream_only_whole_rows(self, two_workers):
        """Two spawn workers sample while a writer extends: every yielded row is whole."""
        online = two_workers.of(0, ONLINE_CAPACITY)
        assert online, "the workers streamed no online row"
        assert all(two_workers.payload_ok)  # no torn row, in any dataset of the session
        writer, seen_max = two_workers.extra["writer"], max(online)
        assert seen_max < writer.written
        assert seen_max > writer.written // 2, (seen_max, writer.written)  # new rows arrive

    def test_worker_stream_needs_committed_writer(self, one_worker):
        error = one_worker.extra["error"]
        assert error is not None, "the worker streamed a buffer without a CommittedWriter"
        assert "writer=torchrl_trl_interop.CommittedWriter" in str(error)

    def test_list_storage_cannot_go_to_spawn_workers(self):
        rb = ReplayBuffer(storage=LazyStackStorage(16))
        rb.extend(rows(0, 16))
        ds = TorchRLBufferDataset(rb, 4, num_batches=None)
        with pytest.raises(RuntimeError, match="LazyStackStorage cannot be sent to DataLoader"):
            first_batch(loader(ds, 1))

    def test_list_storage_stream_in_fork_worker_raises(self):
        rb = ReplayBuffer(storage=ListStorage(16))
        rb.extend(rows(0, 16))
        ds = TorchRLBufferDataset(rb, 4, num_batches=None)
        with pytest.raises(RuntimeError, match="private copy.*rows written later are never seen"):
            first_batch(loader(ds, 1, context="fork"))

    def test_unshared_storage_in_fork_worker_raises(self):
        rb = buffer(16, capacity=32, writer=CommittedWriter())
        ds = TorchRLBufferDataset(rb, 4, num_batches=None)
        with pytest.raises(RuntimeError, match="not in shared memory"):
            first_batch(loader(ds, 1, context="fork"))

    def test_strings_in_workers_raise(self, fake_reader):
        rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        rb.extend(TensorDict({"x": torch.arange(4), "prompt": list("abcd")}, batch_size=[4]))
        rb.storage._storage.share_memory_()
        fake_reader(ShardInfo(in_worker=True))
        with pytest.raises(RuntimeError, match=r"\['prompt'\].*stale strings"):
            next(iter(TorchRLBufferDataset(rb, 2, num_batches=None)))
        row = next(iter(TorchRLBufferDataset(rb, 2, num_batches=None, keys=["x"])))
        assert list(row) == ["x"]  # tensors only: fine

    def test_committed_workers_need_uniform_sampling(self, fake_reader):
        rb = buffer(16, capacity=16, writer=CommittedWriter(), sampler=SliceSampler(num_slices=2))
        rb.storage._storage.share_memory_()
        fake_reader(ShardInfo(in_worker=True))
        with pytest.raises(RuntimeError, match="SliceSampler.*RandomSampler"):
            next(iter(TorchRLBufferDataset(rb, 4)))
        # Epoch mode reads by index and works with any sampler.
        assert len(list(TorchRLBufferDataset(rb, 4, epoch=True))) == 16

    def test_read_waits_for_a_write_in_progress(self):
        rb = buffer(8, capacity=8, writer=CommittedWriter())
        log = rb.writer._commit_log
        log[0] += 1  # a write in progress
        threading.Timer(0.1, lambda: log.__setitem__(0, log[0] + 1)).start()
        start = time.monotonic()
        batch = read_committed_rows(rb, torch.arange(8))
        assert time.monotonic() - start >= 0.09
        assert whole(batch["row_id"], batch["payload"]).all()
        log[0] += 1
        with pytest.raises(TimeoutError, match="no consistent read"):
            read_committed_rows(rb, torch.arange(8), timeout=0.05)

    def test_empty_buffer_read_times_out(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        with pytest.raises(TimeoutError, match="stayed empty"):
            read_committed(rb, 4, None, timeout=0.05)

    def test_committed_writer_tracks_empty_and_write_at(self):
        rb = buffer(6, capacity=8, writer=CommittedWriter())
        assert rb.writer.committed == (2, 6)
        rb.empty()
        assert rb.writer.committed == (4, 0)
        rb.extend(rows(0, 3))
        rb.writer.write_at(torch.tensor([5]), rows(9, 1))
        assert rb.writer.committed[0] % 2 == 0 and rb.writer.committed[1] == len(rb)


# ---------------------------------------------------------------------------------------------
# TRL settings for an online buffer
# ---------------------------------------------------------------------------------------------


class TestTRLOnline:
    def test_grpo_reads_rows_written_after_construction(self, tokenizer, tmp_path):
        """GRPO on an online buffer: ``max_steps``, ``shuffle_dataset=False``, num_batches=None."""
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from torchrl_trl_interop.testing import toy_causal_lm, toy_trainer_args

        def prompts(version: int) -> TensorDict:
            return TensorDict(
                {
                    "prompt": [f"Count to {i}:" for i in range(4)],
                    "version": torch.full((4,), version),
                },
                batch_size=[4],
            )

        rb = ReplayBuffer(storage=LazyTensorStorage(4))  # a small circular buffer
        rb.extend(prompts(0))
        seen = []

        def reward(prompts, completions, completion_ids, version, **kwargs):
            seen.extend(version)
            return [float(len(c)) for c in completions]

        class Collector(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                rb.extend(prompts(1))  # overwrites every row written before

        trainer = GRPOTrainer(
            model=toy_causal_lm(tokenizer=tokenizer),
            reward_funcs=reward,
            args=GRPOConfig(
                shuffle_dataset=False,
                num_generations=2,
                generation_batch_size=2,
                max_completion_length=4,
                **toy_trainer_args(tmp_path, bf16=False),
            ),
            train_dataset=TorchRLBufferDataset(rb, 1, num_batches=None).as_hf_dataset(),
            processing_class=tokenizer,
            callbacks=[Collector()],
        )
        trainer.train()
        assert trainer.state.global_step == 2
        assert seen and set(seen) == {1}, seen  # only rows written after training started


# ---------------------------------------------------------------------------------------------
# Two ranks under torchrun, real trainers
# ---------------------------------------------------------------------------------------------


@background(timeout_s=540)  # ~15 s alone
def scale_torchrun(job):
    """``_torchrun_worker.py`` on 2 ranks: the rows each rank read, per scenario."""
    job.torchrun(Path(__file__).with_name("_torchrun_worker.py"), job.folder)
    return [json.loads((job.folder / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_torchrun_two_ranks_read_disjoint_rows_covering_the_epoch(scale_torchrun):
    """``torchrun --nproc_per_node=2`` (gloo, CPU): each rank trains 2 steps; rows split once."""
    ranks = scale_torchrun
    assert ranks[0]["_world_size"] == 2
    scenarios = [k for k in ranks[0] if not k.startswith("_")]
    assert set(scenarios) == {
        "ddp_loop",
        "reward_map",
        "reward_iterable",
        "torch_trainer_dispatch",
        "torch_trainer_shard",
    }
    for name in scenarios:
        a, b = ranks[0][name], ranks[1][name]
        assert len(a) == len(b) == 4, (name, a, b)
        assert not set(a) & set(b), (name, a, b)  # disjoint
        assert sorted(a + b) == list(range(8)), (name, a, b)  # together: the whole epoch
    loaders = ranks[0]["_loaders"]
    # What accelerate did: sharded the datasets view, dispatched or sliced the torch dataset.
    assert loaders["reward_iterable"] == "DataLoaderShard(IterableDataset)"
    assert loaders["torch_trainer_dispatch"] == "DataLoaderDispatcher(TorchRLBufferDataset)"
    assert loaders["torch_trainer_shard"] == "DataLoaderShard(IterableDatasetShard)"
