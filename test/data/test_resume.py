"""Epoch passes: shuffling in every view, resuming from a state_dict, overwrites during a pass."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset
from torchrl_trl_interop.testing import toy_buffer


def ids(rows) -> list[int]:
    return [int(r["x"]) for r in rows]


def fake_worker(monkeypatch, worker_id: int, num_workers: int) -> None:
    info = type("WorkerInfo", (), {"id": worker_id, "num_workers": num_workers, "seed": 0})
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)


class TestHFViewShuffle:
    """Regression: the HF view shuffled only inside each of its 64 shards, in a fixed shard order."""

    @pytest.mark.parametrize("n", [48, 256])
    def test_same_permutation_as_the_torch_view(self, n):
        ds = TorchRLBufferDataset(toy_buffer(n), 8, epoch=True, shuffle=True, seed=5)
        hf = ds.as_hf_dataset()
        for epoch in (0, 1, 2):
            ds.set_epoch(epoch)
            hf.set_epoch(epoch)
            order = ids(hf)
            assert sorted(order) == list(range(n))
            assert order == ids(ds)
            assert order != list(range(n))
        hf.set_epoch(1)
        first = ids(hf)
        hf.set_epoch(2)
        assert ids(hf) != first  # a fresh permutation every epoch

    def test_batches_mix_the_whole_buffer(self):
        n = 256
        order = ids(
            TorchRLBufferDataset(toy_buffer(n), 8, epoch=True, shuffle=True).as_hf_dataset()
        )
        batches = [order[i : i + 4] for i in range(0, n, 4)]
        # Before: every batch of 4 came from one shard, rows {s, s + 64, s + 128, s + 192}.
        assert not any(len({r % 64 for r in batch}) == 1 for batch in batches)
        assert len({r // 64 for r in order[:8]}) > 1

    def test_exactly_once_across_ranks_and_workers(self, monkeypatch):
        n = 200
        hf = TorchRLBufferDataset(toy_buffer(n), 8, epoch=True, shuffle=True).as_hf_dataset()
        hf.set_epoch(3)
        seen = []
        for rank in range(2):
            shard = hf.shard(2, rank)  # what accelerate gives each rank
            for worker in range(2):
                fake_worker(monkeypatch, worker, 2)
                part = ids(shard)
                assert len({r % 64 for r in part[:8]}) > 1  # spread over the reader's shards
                seen += part
        assert sorted(seen) == list(range(n))


class TestResumeHFView:
    def test_from_datasets_state_dict_after_the_first_epoch(self):
        """Regression: the permutation followed a per-process pass counter (256 seen, 251 unique)."""
        rb = toy_buffer(256)
        ds = TorchRLBufferDataset(rb, 16, epoch=True, shuffle=True)
        hf = ds.as_hf_dataset()
        hf.set_epoch(1)
        uninterrupted = ids(hf)
        hf.set_epoch(1)
        it = iter(hf)
        before = [int(next(it)["x"]) for _ in range(100)]
        state = hf.state_dict()
        resumed = TorchRLBufferDataset(rb, 16, epoch=True, shuffle=True).as_hf_dataset()
        resumed.set_epoch(1)
        resumed.load_state_dict(state)
        after = ids(resumed)
        assert before + after == uninterrupted
        assert len(set(before + after)) == 256


class TestResumeTorchDataset:
    @pytest.mark.parametrize("epoch", [0, 2])
    def test_epoch_mode_mid_pass(self, epoch):
        rb = toy_buffer(50)
        ds = TorchRLBufferDataset(rb, 7, epoch=True, shuffle=True, seed=1)
        ds.set_epoch(epoch)
        uninterrupted = ids(ds)
        ds.set_epoch(epoch)
        it = iter(ds)
        before = [int(next(it)["x"]) for _ in range(23)]
        state = ds.state_dict()
        assert state["epoch"] == epoch and state["rows"] == 23
        resumed = TorchRLBufferDataset(rb, 7, epoch=True, shuffle=True, seed=1)
        resumed.load_state_dict(state)
        assert before + ids(resumed) == uninterrupted
        assert resumed.state_dict() == {"epoch": epoch + 1, "rows": 0, "base": None}

    def test_seeded_sampling_mid_pass(self):
        rb = toy_buffer(50)
        uninterrupted = ids(TorchRLBufferDataset(rb, 8, num_batches=4, seed=3))
        ds = TorchRLBufferDataset(rb, 8, num_batches=4, seed=3)
        it = iter(ds)
        before = [int(next(it)["x"]) for _ in range(11)]
        resumed = TorchRLBufferDataset(rb, 8, num_batches=4, seed=3)
        resumed.load_state_dict(ds.state_dict())
        assert before + ids(resumed) == uninterrupted

    def test_unseeded_streams_of_several_readers_resume_their_own_draw(self, monkeypatch):
        fake_worker(monkeypatch, 1, 2)  # a worker: its stream needs a base seed of its own
        rb = toy_buffer(50)
        ds = TorchRLBufferDataset(rb, 8, num_batches=3)
        it = iter(ds)
        before = [int(next(it)["x"]) for _ in range(10)]
        state = ds.state_dict()
        rest = [int(r["x"]) for r in it]
        assert state["base"] is not None
        resumed = TorchRLBufferDataset(rb, 8, num_batches=3)
        resumed.load_state_dict(state)
        torch.manual_seed(123)  # another draw would give another stream: the state's is used
        assert ids(resumed) == rest and len(before + rest) == 24

    def test_set_epoch_to_another_epoch_drops_the_loaded_position(self):
        ds = TorchRLBufferDataset(toy_buffer(10), 4, epoch=True)
        ds.load_state_dict({"epoch": 1, "rows": 6, "base": None})
        ds.set_epoch(4)
        assert ids(ds) == list(range(10))

    def test_with_stateful_dataloader_workers(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        def make():
            ds = TorchRLBufferDataset(toy_buffer(40), 4, epoch=True, shuffle=True, seed=2)
            kw = dict(batch_size=3, num_workers=2, multiprocessing_context="spawn")
            return StatefulDataLoader(ds, snapshot_every_n_steps=1, **kw)

        loader = make()
        it = iter(loader)
        before = [int(i) for _ in range(5) for i in next(it)["x"]]
        state = loader.state_dict()
        rest = [int(i) for b in it for i in b["x"]]  # the same pass, uninterrupted
        resumed = make()  # (2 spawn workers per loader: one loader less than a fresh pass)
        resumed.load_state_dict(state)
        after = [int(i) for b in resumed for i in b["x"]]
        assert after == rest
        assert sorted(before + after) == list(range(40))

    def test_bad_state(self):
        ds = TorchRLBufferDataset(toy_buffer(4), 2)
        with pytest.raises(ValueError, match="expected the dict returned by"):
            ds.load_state_dict({"epoch": 1})
        with pytest.raises(ValueError, match="set_epoch: expected an int >= 0"):
            ds.set_epoch(-1)


class TestOverwriteDuringAPass:
    """Regression: a circular buffer overwritten mid-pass yielded the new rows in the old slots."""

    def test_full_buffer_overwritten_raises(self):
        rb = toy_buffer(8)
        it = iter(TorchRLBufferDataset(rb, 2, epoch=True))
        assert [int(next(it)["x"]) for _ in range(2)] == [0, 1]
        rb.extend(TensorDict({"x": torch.arange(100, 103)}, batch_size=[3]))  # slots 0, 1, 2
        with pytest.raises(RuntimeError, match=r"storage indices \[2\]\) were overwritten"):
            next(it)  # the next read, [2, 3], holds a replaced row

    def test_rows_written_into_free_slots_wait_for_the_next_pass(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(20))
        rb.extend(TensorDict({"x": torch.arange(6)}, batch_size=[6]))
        ds = TorchRLBufferDataset(rb, 2, epoch=True, shuffle=True)
        it = iter(ds)
        first = int(next(it)["x"])
        rb.extend(TensorDict({"x": torch.arange(6, 10)}, batch_size=[4]))
        assert sorted([first] + ids(it)) == list(range(6))
        assert sorted(ids(ds)) == list(range(10))

    def test_to_hf_dataset_refuses_a_torn_snapshot(self):
        rb = toy_buffer(8)
        ds = TorchRLBufferDataset(rb, 2)
        it = ds.iter_storage(chunk_size=4)
        next(it)
        rb.extend(TensorDict({"x": torch.arange(100, 106)}, batch_size=[6]))
        with pytest.raises(RuntimeError, match="overwritten"):
            list(it)


class TestBadArguments:
    def test_storage_with_two_batch_dims(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
        rb.extend(TensorDict({"x": torch.arange(12).reshape(4, 3)}, [4, 3]))
        with pytest.raises(ValueError, match="ndim=2.*reshape"):
            TorchRLBufferDataset(rb, 2)

    @pytest.mark.parametrize("flag", ["epoch", "shuffle"])
    def test_bool_flags(self, flag):
        kwargs = {"epoch": True, flag: "yes"}
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            TorchRLBufferDataset(toy_buffer(4), 2, **kwargs)

    @pytest.mark.parametrize("mask", [torch.rand(4, 3), torch.ones(4, dtype=torch.bool)])
    def test_attention_mask_key_must_name_a_token_mask(self, mask):
        td = TensorDict({"ids": torch.ones(4, 3, dtype=torch.long), "m": mask}, [4])
        rb = ReplayBuffer(storage=LazyTensorStorage(4))
        rb.extend(td)
        with pytest.raises(TypeError, match="attention_mask_key 'm' holds"):
            TorchRLBufferDataset(rb, 2, attention_mask_key="m")

    def test_rename_must_be_a_mapping(self):
        with pytest.raises(TypeError, match="rename must be a dict"):
            TorchRLBufferDataset(toy_buffer(4), 2, rename=[("x", "y")])

    def test_a_str_key_is_one_key(self):
        assert TorchRLBufferDataset(toy_buffer(4), 2, keys="x").column_names == ["x"]

    @pytest.mark.parametrize("bad", [0, -2, 1.5, True])
    def test_chunk_size(self, bad):
        with pytest.raises(ValueError, match="chunk_size must be a positive int"):
            TorchRLBufferDataset(toy_buffer(4), 2).to_hf_dataset(chunk_size=bad)

    @pytest.mark.parametrize("view", ["to_hf_dataset", "as_hf_dataset"])
    def test_complex_tensors_are_refused_before_arrow(self, view):
        rb = ReplayBuffer(storage=LazyTensorStorage(4))
        rb.extend(TensorDict({"z": torch.ones(4, 2, dtype=torch.complex64)}, [4]))
        with pytest.raises(TypeError, match="column 'z' holds torch.complex64"):
            getattr(TorchRLBufferDataset(rb, 2), view)()
