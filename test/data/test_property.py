"""Property test: buffer -> dataset -> PaddingCollator gives back exactly what was stored."""

from __future__ import annotations

import unittest.mock

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, lazy_stack
from torch.utils.data import DataLoader
from torchrl.data import LazyStackStorage, LazyTensorStorage, ListStorage, ReplayBuffer

from torchrl_trl_interop import PaddingCollator, TorchRLBufferDataset

names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
texts = st.text(min_size=0, max_size=12)  # any unicode, empty included


@st.composite
def schemas(draw):
    n = draw(st.integers(1, 9))
    token_key = tuple(draw(st.lists(names, min_size=1, max_size=3, unique=True)))
    string_key = draw(st.one_of(st.none(), names.map(lambda s: ("s_" + s,))))
    layout = draw(st.sampled_from(["ragged-list", "ragged-stack", "left", "right"]))
    lengths = draw(st.lists(st.integers(1, 7), min_size=n, max_size=n))
    tokens = [draw(st.lists(st.integers(1, 1000), min_size=k, max_size=k)) for k in lengths]
    strings = [draw(texts) for _ in range(n)] if string_key else None
    batch = draw(st.integers(1, 4))
    return n, token_key, string_key, layout, tokens, strings, batch


def build(n, token_key, string_key, layout, tokens, strings):
    mask_key = ("mask_of",) + token_key
    if layout.startswith("ragged"):
        rows = []
        for i in range(n):
            td = TensorDict(batch_size=[])
            td.set(token_key, torch.tensor(tokens[i]))
            td.set(mask_key, torch.ones(len(tokens[i]), dtype=torch.bool))
            td.set("row", torch.tensor(i))
            if strings is not None:
                td.set(string_key, strings[i])
            rows.append(td)
        storage = ListStorage(n) if layout == "ragged-list" else LazyStackStorage(n)
        data = lazy_stack(rows)
    else:
        width = max(map(len, tokens))
        ids = torch.zeros(n, width, dtype=torch.int64)
        mask = torch.zeros(n, width, dtype=torch.int64)
        for i, row in enumerate(tokens):
            sl = slice(0, len(row)) if layout == "right" else slice(width - len(row), width)
            ids[i, sl] = torch.tensor(row)
            mask[i, sl] = 1
        data = TensorDict(batch_size=[n])
        data.set(token_key, ids)
        data.set(mask_key, mask)
        data.set("row", torch.arange(n))
        if strings is not None:
            data.set(string_key, strings)
        storage = LazyTensorStorage(n)
    rb = ReplayBuffer(storage=storage)
    rb.extend(data)
    return rb, mask_key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas(), st.sampled_from(["left", "right"]))
def test_round_trip_through_collator(schema, collate_side):
    n, token_key, string_key, layout, tokens, strings, batch = schema
    rb, mask_key = build(n, token_key, string_key, layout, tokens, strings)
    ds = TorchRLBufferDataset(
        rb,
        batch_size=3,
        attention_mask_key=mask_key,
        rename={token_key: "input_ids", mask_key: "attention_mask"},
    )
    collate = PaddingCollator(pad_token_id=0, padding_side=collate_side)
    seen = []
    for out in DataLoader(
        list(ds.iter_storage(chunk_size=2)), batch_size=batch, collate_fn=collate
    ):
        width = out["input_ids"].shape[1]
        lengths = out["attention_mask"].sum(-1)
        assert width == int(lengths.max())  # padded to the batch's longest row only
        for j, row in enumerate(out["row"].tolist()):
            k = int(lengths[j])
            real = (
                out["input_ids"][j, :k]
                if collate_side == "right"
                else out["input_ids"][j, width - k :]
            )
            assert real.tolist() == tokens[row]
            if strings is not None:
                assert out[".".join(string_key)][j] == strings[row]
            seen.append(row)
    assert seen == list(range(n))


# ---------------------------------------------------------------------------------------------
# Epoch views: exactly once per epoch, for any readers, shards and resume point
# ---------------------------------------------------------------------------------------------


def _worker(worker_id: int, num_workers: int):
    info = type("WorkerInfo", (), {"id": worker_id, "num_workers": num_workers, "seed": 0})
    return unittest.mock.patch.object(torch.utils.data, "get_worker_info", lambda: info)


def _read(make_reader, epoch: int, stop: int | None) -> list[int]:
    """One reader's epoch, interrupted after ``stop`` rows and resumed from its state_dict."""
    reader = make_reader()
    reader.set_epoch(epoch)
    it = iter(reader)
    before = [int(next(it)["x"]) for _ in range(stop)] if stop is not None else []
    if stop is None:
        return [int(r["x"]) for r in it]
    state = reader.state_dict()
    resumed = make_reader()
    resumed.set_epoch(epoch)
    resumed.load_state_dict(state)
    return before + [int(r["x"]) for r in resumed]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    view=st.sampled_from(["torch", "hf"]),
    shuffle=st.booleans(),
    num_shards=st.integers(1, 16),
    ranks=st.integers(1, 3),
    workers=st.integers(1, 3),
    epochs=st.integers(1, 3),
    batch=st.integers(1, 6),
    data=st.data(),
)
def test_epoch_views_read_every_row_once_per_epoch(
    n, view, shuffle, num_shards, ranks, workers, epochs, batch, data
):
    """Every reader (rank x DataLoader worker) of a torch or HF epoch view, interrupted at a
    random row and resumed from its ``state_dict``, yields exactly what it would have yielded
    uninterrupted; together the readers yield every stored row once, every epoch."""
    rb = ReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(TensorDict({"x": torch.arange(n)}, batch_size=[n]))
    if view == "hf":
        ranks = min(ranks, num_shards)  # accelerate gives each rank a block of the shards
    for epoch in range(epochs):
        seen: list[int] = []
        for rank in range(ranks):
            for worker in range(workers):
                if view == "torch":  # the rank decided by the process that started the worker

                    def make_reader(rank=rank):
                        ds = TorchRLBufferDataset(rb, batch, epoch=True, shuffle=shuffle, seed=7)
                        ds._parent_rank = (rank, ranks)
                        return ds

                else:  # the shards accelerate gives the rank, split by datasets among workers

                    def make_reader(rank=rank):
                        ds = TorchRLBufferDataset(rb, batch, epoch=True, shuffle=shuffle, seed=7)
                        return ds.as_hf_dataset(num_shards=num_shards).shard(ranks, rank)

                with _worker(worker, workers):
                    uninterrupted = _read(make_reader, epoch, None)
                    stop = data.draw(st.integers(0, len(uninterrupted)), label="resume at")
                    assert _read(make_reader, epoch, stop) == uninterrupted
                seen += uninterrupted
        assert sorted(seen) == list(range(n)), (epoch, view)
