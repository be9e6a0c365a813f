"""TorchRLBufferDataset on real torchrl buffers and storages."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from torch.utils.data import DataLoader
from torchrl.data import (
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.llm import History

from torchrl_trl_interop import PaddingCollator, TorchRLBufferDataset, messages_to_history
from torchrl_trl_interop.testing import toy_buffer, toy_chats, toy_padded

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")
ALL_STORAGES = [ListStorage, LazyStackStorage, LazyTensorStorage, LazyMemmapStorage]
RAGGED_STORAGES = [ListStorage, LazyStackStorage]
STRING_STORAGES = [ListStorage, LazyStackStorage, LazyTensorStorage]


def ragged_rows(n: int, *, strings: bool = True, seed: int = 0) -> list[TensorDict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        length = int(torch.randint(1, 12, (), generator=g))
        data = {
            "row_id": torch.tensor(i),
            "tokens": {"full": torch.randint(3, 300, (length,), generator=g)},
            "masks": {"all_attention_mask": torch.ones(length, dtype=torch.bool)},
            "score": torch.tensor(float(i) / 2),
        }
        if strings:
            data["prompt"] = f"prompt number {i} ✓"
        rows.append(TensorDict(data, batch_size=[]))
    return rows


def padded_batch(n: int, width: int, side: str, *, mask_dtype=torch.bool, seed: int = 0):
    """A dense [n, width] batch and the true rows it pads."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    true_rows = [torch.randint(3, 300, (int(k),), generator=g) for k in lengths]
    ids, mask = toy_padded(true_rows, side, width=width, mask_dtype=mask_dtype)
    td = TensorDict(
        {"row_id": torch.arange(n), "tokens": {"full": ids}, "masks": {"all_attention_mask": mask}},
        batch_size=[n],
    )
    return td, true_rows


def make_buffer(storage_cls, data, size: int = 100, **kwargs) -> ReplayBuffer:
    rb = ReplayBuffer(storage=storage_cls(size), **kwargs)
    rb.extend(data)
    return rb


class TestRaggedData:
    @pytest.mark.parametrize("storage_cls", RAGGED_STORAGES)
    def test_ragged_rows_keep_their_own_length(self, storage_cls):
        rows = ragged_rows(20)
        rb = make_buffer(storage_cls, lazy_stack(rows))
        ds = TorchRLBufferDataset(rb, batch_size=8, num_batches=4)
        seen = 0
        for out in ds:
            expected = rows[int(out["row_id"])]
            assert torch.equal(out["tokens.full"], expected["tokens", "full"])
            assert torch.equal(
                out["masks.all_attention_mask"], expected["masks", "all_attention_mask"]
            )
            assert out["prompt"] == expected["prompt"]
            assert isinstance(out["prompt"], str)
            assert out["score"].ndim == 0 and out["score"].item() == expected["score"].item()
            seen += 1
        assert seen == 32

    def test_upstream_crashes_where_we_do_not(self):
        from torchrl.modules.llm import TorchRLBufferDataset as Upstream

        rb = make_buffer(LazyStackStorage, lazy_stack(ragged_rows(10)))
        # the sampler draws from torch's global generator: seeded, the batch of 4 always holds
        # rows of different lengths (unseeded, 4 draws of one length let upstream through)
        with torch.random.fork_rng(devices=[]), pytest.raises(RuntimeError):
            torch.manual_seed(0)
            next(iter(Upstream(rb, batch_size=4)))
        assert len(list(TorchRLBufferDataset(rb, batch_size=4))) == 4

    @pytest.mark.parametrize("storage_cls", RAGGED_STORAGES)
    def test_iter_storage_every_row_once_in_order(self, storage_cls):
        rows = ragged_rows(13)
        rb = make_buffer(storage_cls, lazy_stack(rows))
        out = list(TorchRLBufferDataset(rb, batch_size=4).iter_storage(chunk_size=5))
        assert [int(r["row_id"]) for r in out] == list(range(13))
        for r, expected in zip(out, rows):
            assert torch.equal(r["tokens.full"], expected["tokens", "full"])


class TestPaddedData:
    @pytest.mark.parametrize("storage_cls", ALL_STORAGES)
    @pytest.mark.parametrize("side", ["left", "right"])
    @pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64])
    def test_trimmed_to_attended_tokens(self, storage_cls, side, mask_dtype, tmp_path):
        td, true_rows = padded_batch(16, 10, side, mask_dtype=mask_dtype)
        kwargs = {"scratch_dir": tmp_path} if storage_cls is LazyMemmapStorage else {}
        rb = ReplayBuffer(storage=storage_cls(32, **kwargs))
        rb.extend(td)
        ds = TorchRLBufferDataset(rb, batch_size=8, num_batches=3, attention_mask_key=MASK)
        for out in ds:
            expected = true_rows[int(out["row_id"])]
            assert torch.equal(out["tokens.full"], expected)
            mask = out["masks.all_attention_mask"]
            assert mask.dtype == mask_dtype and mask.shape == expected.shape and bool(mask.all())

    @pytest.mark.parametrize("storage_cls", ALL_STORAGES)
    def test_without_mask_rows_keep_padding(self, storage_cls, tmp_path):
        td, _ = padded_batch(6, 10, "right")
        kwargs = {"scratch_dir": tmp_path} if storage_cls is LazyMemmapStorage else {}
        rb = ReplayBuffer(storage=storage_cls(32, **kwargs))
        rb.extend(td)
        rows = list(TorchRLBufferDataset(rb, batch_size=4).iter_storage())
        assert [r["tokens.full"].shape for r in rows] == [torch.Size([10])] * 6
        assert all(
            torch.equal(r["tokens.full"], td["tokens", "full"][i]) for i, r in enumerate(rows)
        )

    def test_mask_with_no_attended_token_gives_empty_row(self):
        td = TensorDict(
            {"ids": torch.tensor([[1, 2], [0, 0]]), "mask": torch.tensor([[1, 1], [0, 0]])},
            batch_size=[2],
        )
        rb = make_buffer(LazyTensorStorage, td)
        rows = list(TorchRLBufferDataset(rb, 2, attention_mask_key="mask").iter_storage())
        assert rows[1]["ids"].shape == (0,)
        assert torch.equal(rows[0]["ids"], torch.tensor([1, 2]))

    def test_tensordict_replay_buffer(self):
        td, true_rows = padded_batch(8, 6, "left")
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
        rb.extend(td)
        ds = TorchRLBufferDataset(rb, 4, keys=["row_id", TOKENS], attention_mask_key=MASK)
        for out in ds:
            assert sorted(out) == ["row_id", "tokens.full"]
            assert torch.equal(out["tokens.full"], true_rows[int(out["row_id"])])


class TestKeys:
    def setup_method(self):
        self.rows = ragged_rows(6)
        self.rb = make_buffer(LazyStackStorage, lazy_stack(self.rows))

    def test_keys_select_and_subtree(self):
        ds = TorchRLBufferDataset(self.rb, 3, keys=["prompt", "tokens"])
        assert sorted(next(iter(ds))) == ["prompt", "tokens.full"]
        assert ds.column_names == ["prompt", "tokens.full"]

    def test_missing_key_raises_listing_available(self):
        with pytest.raises(KeyError, match=r"'nope'.*stored keys are \[.*'tokens.full'"):
            TorchRLBufferDataset(self.rb, 3, keys=["nope"])

    def test_missing_key_raises_at_first_batch_when_built_empty(self):
        rb = ReplayBuffer(storage=LazyStackStorage(10))
        ds = TorchRLBufferDataset(rb, 3, keys=[("tokens", "nope")])
        rb.extend(lazy_stack(self.rows))
        with pytest.raises(KeyError, match="nope"):
            next(iter(ds))

    def test_rename_for_collators(self):
        ds = TorchRLBufferDataset(
            self.rb, 3, rename={TOKENS: "input_ids", MASK: "attention_mask"}, keys=[TOKENS, MASK]
        )
        assert sorted(next(iter(ds))) == ["attention_mask", "input_ids"]

    def test_rename_unknown_key(self):
        with pytest.raises(KeyError, match="rename"):
            TorchRLBufferDataset(self.rb, 3, rename={("tokens", "other"): "x"})

    def test_rename_collision(self):
        with pytest.raises(ValueError, match="output name"):
            TorchRLBufferDataset(self.rb, 3, rename={"prompt": "score"})

    def test_sep(self):
        ds = TorchRLBufferDataset(self.rb, 3, sep="/", keys=[TOKENS])
        assert list(next(iter(ds))) == ["tokens/full"]

    def test_mask_key_missing(self):
        with pytest.raises(KeyError, match="attention_mask_key"):
            TorchRLBufferDataset(self.rb, 3, attention_mask_key=("masks", "nope"))

    def test_device(self):
        ds = TorchRLBufferDataset(self.rb, 3, device="meta", keys=[TOKENS, "score"])
        row = next(iter(ds))
        assert row["tokens.full"].device.type == "meta"
        assert row["score"].device.type == "meta"


class TestHistory:
    @pytest.mark.parametrize("storage_cls", STRING_STORAGES)
    def test_history_becomes_messages(self, storage_cls):
        chats = toy_chats(6)
        if storage_cls is LazyTensorStorage:  # rectangular only: same turn count
            chats = [c[:2] for c in chats]
        with set_list_to_stack(True):
            history = History.from_chats(chats)
        td = TensorDict({"row_id": torch.arange(6), "history": {"full": history}}, batch_size=[6])
        rb = make_buffer(storage_cls, td)
        ds = TorchRLBufferDataset(rb, 4, num_batches=3)
        for row in ds:
            assert row["history.full"] == chats[int(row["row_id"])]
        hf = ds.to_hf_dataset()
        assert hf["history.full"][:] == chats

    def test_rollouts_from_a_real_policy_and_collector(self, left_tokenizer):
        """What TorchRL's LLM wrappers write by default: ragged tokens plus History."""
        from torchrl_trl_interop.testing import toy_collected_buffer

        rb = toy_collected_buffer(left_tokenizer, total_dialog_turns=4)
        ds = TorchRLBufferDataset(rb, 4, keys=[TOKENS, MASK, ("history", "full")])
        stored = rb[torch.arange(len(rb))]
        tokens = stored.get(TOKENS, as_list=True)
        for i, row in enumerate(ds.iter_storage()):
            assert torch.equal(row["tokens.full"], tokens[i])
            assert row["history.full"][-1]["role"] == "assistant"
            assert all(set(m) == {"role", "content"} for m in row["history.full"])


class TestErrors:
    def test_not_a_replay_buffer(self):
        with pytest.raises(TypeError, match="must be a torchrl ReplayBuffer"):
            TorchRLBufferDataset([1, 2, 3], 2)

    @pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True])
    def test_bad_batch_size(self, bad):
        rb = ReplayBuffer(storage=ListStorage(4))
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            TorchRLBufferDataset(rb, bad)

    @pytest.mark.parametrize("bad", [0, -2, 1.5, "x"])
    def test_bad_num_batches(self, bad):
        rb = ReplayBuffer(storage=ListStorage(4))
        with pytest.raises(ValueError, match="num_batches must be a positive int or None"):
            TorchRLBufferDataset(rb, 2, num_batches=bad)

    def test_empty_buffer_says_so_before_sampling(self):
        ds = TorchRLBufferDataset(ReplayBuffer(storage=LazyStackStorage(4)), 2)
        with pytest.raises(RuntimeError, match="replay buffer is empty"):
            next(iter(ds))
        with pytest.raises(RuntimeError, match="replay buffer is empty"):
            ds.to_hf_dataset()

    def test_memmap_with_per_row_strings(self, tmp_path):
        td = TensorDict({"x": torch.arange(3), "prompt": ["a", "b", "c"]}, batch_size=[3])
        rb = make_buffer(lambda n: LazyMemmapStorage(n, scratch_dir=tmp_path), td)
        with pytest.raises(ValueError, match=r"LazyMemmapStorage.*\['prompt'\].*keys="):
            TorchRLBufferDataset(rb, 2)
        # Leaving the string out is fine.
        assert len(list(TorchRLBufferDataset(rb, 2, keys=["x"]))) == 2

    def test_unconvertible_value_type(self):
        rb = ReplayBuffer(storage=ListStorage(4))
        rb.extend([torch.tensor(1.0), torch.tensor(2.0)])
        with pytest.raises(TypeError, match="not a TensorDict"):
            TorchRLBufferDataset(rb, 2)


class TestStreaming:
    def test_num_batches_none_streams_new_rows(self):
        rb = make_buffer(LazyStackStorage, lazy_stack(ragged_rows(4)))
        it = iter(TorchRLBufferDataset(rb, 2, num_batches=None))
        first = [int(next(it)["row_id"]) for _ in range(20)]
        assert set(first) <= set(range(4))
        rb.empty()
        rb.extend(lazy_stack(ragged_rows(8)[4:]))
        later = [int(next(it)["row_id"]) for _ in range(20)]
        assert set(later) <= set(range(4, 8)) and later

    def test_each_iteration_resamples(self):
        rb = make_buffer(LazyTensorStorage, padded_batch(50, 4, "right")[0])
        ds = TorchRLBufferDataset(rb, 10, num_batches=2)
        a = [int(r["row_id"]) for r in ds]
        b = [int(r["row_id"]) for r in ds]
        assert len(a) == len(b) == 20 and a != b


class TestHuggingFace:
    def test_to_hf_dataset_every_row_once(self):
        rows = ragged_rows(30)
        rb = make_buffer(ListStorage, lazy_stack(rows))
        hf = TorchRLBufferDataset(rb, 4, rename={TOKENS: "input_ids"}).to_hf_dataset(chunk_size=7)
        assert len(hf) == 30
        assert hf["row_id"][:] == list(range(30))
        assert hf["input_ids"][:] == [r["tokens", "full"].tolist() for r in rows]
        assert hf["prompt"][:] == [r["prompt"] for r in rows]
        assert hf.features["input_ids"].feature.dtype == "int64"
        assert hf.features["masks.all_attention_mask"].feature.dtype == "bool"
        assert hf.features["score"].dtype == "float32"

    def test_as_hf_dataset_features_and_rows(self):
        rows = ragged_rows(10)
        rb = make_buffer(LazyStackStorage, lazy_stack(rows))
        hf = TorchRLBufferDataset(rb, 5, num_batches=2).as_hf_dataset()
        assert hf.features["prompt"].dtype == "string"
        got = list(hf)
        assert len(got) == 10
        for row in got:
            assert row["tokens.full"] == rows[row["row_id"]]["tokens", "full"].tolist()

    def test_as_hf_dataset_never_hashes_or_pickles_the_buffer(self, monkeypatch):
        """Upstream lets ``datasets`` pickle the whole buffer to fingerprint it (42 s on 20k rows)."""
        import pickle

        from datasets import fingerprint

        def refuse(*args, **kwargs):
            raise AssertionError("the buffer was hashed or pickled to build the view")

        monkeypatch.setattr(fingerprint.Hasher, "hash", classmethod(refuse))
        monkeypatch.setattr(fingerprint.Hasher, "update", refuse)
        monkeypatch.setattr(pickle, "dumps", refuse)
        rb = make_buffer(ListStorage, lazy_stack(ragged_rows(200)), size=200)
        hf = TorchRLBufferDataset(rb, 8).as_hf_dataset()
        assert len(list(hf)) == 8

    def test_through_dataloader_and_data_collator_with_padding(self, tokenizer):
        from transformers import DataCollatorWithPadding

        rows = ragged_rows(24, strings=False)
        rb = make_buffer(LazyStackStorage, lazy_stack(rows))
        ds = TorchRLBufferDataset(
            rb,
            6,
            num_batches=4,
            keys=[TOKENS, MASK, "row_id"],
            rename={TOKENS: "input_ids", MASK: "attention_mask"},
        )
        loader = DataLoader(ds, batch_size=5, collate_fn=DataCollatorWithPadding(tokenizer))
        total = 0
        for batch in loader:
            lengths = batch["attention_mask"].sum(-1)
            assert batch["input_ids"].shape[1] == int(lengths.max())  # only to the batch's longest
            for ids, length, row_id in zip(batch["input_ids"], lengths, batch["row_id"]):
                assert torch.equal(ids[: int(length)], rows[int(row_id)]["tokens", "full"])
                assert (ids[int(length) :] == tokenizer.pad_token_id).all()
            total += len(lengths)
        assert total == 24

    def test_through_dataloader_with_padding_collator(self, left_tokenizer):
        td, true_rows = padded_batch(20, 12, "left", mask_dtype=torch.int64)
        rb = make_buffer(LazyTensorStorage, td)
        ds = TorchRLBufferDataset(
            rb,
            5,
            num_batches=4,
            attention_mask_key=MASK,
            rename={TOKENS: "input_ids", MASK: "attention_mask"},
        )
        loader = DataLoader(ds, batch_size=4, collate_fn=PaddingCollator(left_tokenizer))
        for batch in loader:
            lengths = batch["attention_mask"].sum(-1)
            width = batch["input_ids"].shape[1]
            assert width == int(lengths.max())
            for ids, length, row_id in zip(batch["input_ids"], lengths, batch["row_id"]):
                assert torch.equal(ids[width - int(length) :], true_rows[int(row_id)])


def test_repr():
    rb = make_buffer(LazyStackStorage, lazy_stack(ragged_rows(3)))
    text = repr(TorchRLBufferDataset(rb, 2, keys=[TOKENS]))
    assert "LazyStackStorage" in text and "tokens.full" in text and "batch_size=2" in text


class TestListToStackMode:
    def test_history_read_when_the_user_turned_the_mode_off(self):
        from tensordict.utils import list_to_stack

        chats = toy_chats(4)
        td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[4])
        rb = make_buffer(LazyStackStorage, td)
        with set_list_to_stack(False):
            rows = list(TorchRLBufferDataset(rb, 4).iter_storage())
            assert not list_to_stack()  # the user's choice holds after our reads
        assert [r["history.full"] for r in rows] == chats

    @pytest.mark.parametrize("view", ["to_hf_dataset", "as_hf_dataset"])
    def test_every_view_reads_history_with_the_mode_off(self, view):
        """Regression: ``to_hf_dataset`` split columns outside the scoped mode and raised."""
        chats = toy_chats(4)
        td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[4])
        rb = make_buffer(LazyStackStorage, td)
        with set_list_to_stack(False):
            hf = getattr(TorchRLBufferDataset(rb, 4, epoch=view == "as_hf_dataset"), view)()
            assert sorted(map(str, (r["history.full"] for r in hf))) == sorted(map(str, chats))


class TestDropInForUpstream:
    """Code written for torchrl.modules.llm.TorchRLBufferDataset runs unchanged."""

    def test_signature_is_a_superset_with_the_same_defaults(self):
        import inspect

        from torchrl.modules.llm import TorchRLBufferDataset as Upstream

        ours = inspect.signature(TorchRLBufferDataset).parameters
        theirs = inspect.signature(Upstream).parameters
        for name, param in theirs.items():
            assert name in ours, name
            assert ours[name].kind == param.kind, name
            assert ours[name].default == param.default, name

    @pytest.mark.parametrize(
        "args, kwargs, exc",
        [
            (([1],), {"batch_size": 2}, TypeError),
            ((None, 0), {}, ValueError),
            ((None, 2), {"num_batches": 0}, ValueError),
        ],
    )
    def test_same_exception_types(self, args, kwargs, exc):
        from torchrl.modules.llm import TorchRLBufferDataset as Upstream

        rb = ReplayBuffer(storage=ListStorage(4))
        args = tuple(rb if a is None else a for a in args)
        for cls in (Upstream, TorchRLBufferDataset):
            with pytest.raises(exc):
                cls(*args, **kwargs)

    def test_same_rows_as_upstream_on_dense_data(self):
        from torchrl.modules.llm import TorchRLBufferDataset as Upstream

        td, _ = padded_batch(12, 5, "right")
        rb = make_buffer(LazyTensorStorage, td)
        torch.manual_seed(3)
        theirs = list(Upstream(rb, 6, num_batches=2))
        torch.manual_seed(3)
        ours = list(TorchRLBufferDataset(rb, 6, num_batches=2))
        assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]
        for a, b in zip(ours, theirs):
            assert all(torch.equal(a[k], b[k]) for k in b)


class TestSizes:
    """Regression (issue 20, item 17): sizes that select nothing or allocate terabytes."""

    def test_keys_empty_is_refused_at_construction(self):
        with pytest.raises(ValueError, match=r"TorchRLBufferDataset: keys=\[\] selects no column"):
            TorchRLBufferDataset(toy_buffer(4), 2, keys=[])

    def test_a_sampled_batch_above_the_capacity_is_refused_before_drawing(self):
        ds = TorchRLBufferDataset(toy_buffer(4), 10**12)
        with pytest.raises(ValueError, match=r"batch_size=1000000000000 .*max_size=4"):
            next(iter(ds))
        with pytest.raises(ValueError, match=r"as_hf_dataset: batch_size=1000000000000"):
            list(ds.as_hf_dataset())

    def test_storage_reads_take_at_most_the_stored_rows(self):
        ds = TorchRLBufferDataset(toy_buffer(4), 10**12, epoch=True)
        assert [int(r["x"]) for r in ds] == [0, 1, 2, 3]
        assert ds.to_hf_dataset()["x"][:] == [0, 1, 2, 3]
        assert [int(r["x"]) for r in ds.iter_storage()] == [0, 1, 2, 3]
