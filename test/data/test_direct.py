"""Reading a plain tensor-storage buffer directly: the rows ``rb.sample`` and ``rb[index]`` give.

``_upstream._direct`` reads a plain ``ReplayBuffer``'s ``LazyTensorStorage`` without tensordict's
index of string columns. On real torchrl buffers (tensors, nested TensorDicts, strings, one
string shared by every row, History, a buffer not yet full, two samplers) every sampled batch and
every read must equal the buffer's own, draw for draw; buffers whose rows the buffer itself
changes (a transform, a ``TensorDictReplayBuffer``, ragged storage) are left to the buffer.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    is_non_tensor,
    is_tensor_collection,
)
from torchrl.data import (
    LazyStackStorage,
    LazyTensorStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.envs import Compose, RenameTransform

from torchrl_trl_interop import TorchRLBufferDataset, messages_to_history
from torchrl_trl_interop._upstream._direct import direct_read, direct_sample, take
from torchrl_trl_interop.data._processes import sample
from torchrl_trl_interop.data._reader import BufferReader

#: every test runs on both branches of the _upstream speed paths (fast and plain upstream)
pytestmark = pytest.mark.usefixtures("upstream_branch")


def _rows(n: int, *, same_text: bool = False, history: bool = False) -> TensorDict:
    g = torch.Generator().manual_seed(n)
    td = TensorDict(
        {
            "ids": torch.randint(0, 50, (n, 6), generator=g),
            ("reward", "score"): torch.randn(n, generator=g),
            "prompt": ["same"] * n if same_text else [f"What is {i} plus {i}?" for i in range(n)],
        },
        batch_size=[n],
    )
    if history:
        td["history"] = messages_to_history(
            [
                [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
                for i in range(n)
            ]
        )
    return td


LAYOUTS = {
    "tensors, nested, strings": lambda: (_rows(12), {}),
    "one string for every row": lambda: (_rows(12, same_text=True), {}),
    "with History": lambda: (_rows(12, history=True), {}),
    "not full": lambda: (_rows(7), {"capacity": 20}),
    "without replacement": lambda: (_rows(12), {"sampler": SamplerWithoutReplacement}),
}


def _buffer(data: TensorDict, capacity: int | None = None, sampler=None, seed: int = 0):
    kwargs = {"sampler": sampler()} if sampler is not None else {}
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity or data.shape[0]), **kwargs)
    rb.extend(data)
    rb.set_rng(torch.Generator().manual_seed(seed))
    return rb


def _leaf(cls) -> bool:
    return not is_tensor_collection(cls) or issubclass(cls, (NonTensorData, NonTensorStack))


def _same(ours, theirs) -> None:
    """Same batch size, keys, leaf types and values (strings and History leaves included)."""
    assert ours.batch_size == theirs.batch_size
    keys = list(theirs.keys(True, True, is_leaf=_leaf))
    assert sorted(map(str, ours.keys(True, True, is_leaf=_leaf))) == sorted(map(str, keys))
    assert any(issubclass(type(theirs.get(k)), (NonTensorData, NonTensorStack)) for k in keys)
    for key in keys:
        a, b = ours.get(key), theirs.get(key)
        assert type(a) is type(b), key
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b), key
        else:
            assert a.tolist() == b.tolist(), key


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_direct_sample_is_the_buffers_sample(layout, upstream_branch):
    data, options = LAYOUTS[layout]()
    ours = _buffer(data, options.get("capacity"), options.get("sampler"))
    theirs = _buffer(data, options.get("capacity"), options.get("sampler"))
    for _ in range(4):  # draw for draw, the sampler's state advancing alike
        # plain branch: no direct read, the package's sampler goes through rb.sample
        assert (direct_sample(_buffer(data), 2) is None) == (upstream_branch == "plain")
        _same(sample(ours, 5, None), theirs.sample(5))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_direct_read_is_the_buffers_read(layout, upstream_branch):
    data, options = LAYOUTS[layout]()
    rb = _buffer(data, options.get("capacity"))
    index = torch.tensor([3, 0, 3, len(rb) - 1])
    ours = direct_read(rb, index)
    assert (ours is None) == (upstream_branch == "plain")
    _same(BufferReader(rb, 4).read(index) if ours is None else ours, rb[index])


def test_out_of_range_is_left_to_the_buffer():
    rb = _buffer(_rows(7), capacity=20)
    assert direct_read(rb, torch.tensor([7])) is None  # stored: 7 rows of 20
    assert direct_read(rb, torch.tensor([-1])) is None
    assert direct_read(rb, torch.tensor([], dtype=torch.long)) is None
    with pytest.raises(IndexError):
        rb[torch.tensor([7])]


def test_buffers_that_change_their_rows_are_left_to_them():
    data = _rows(6)
    transformed = ReplayBuffer(
        storage=LazyTensorStorage(6), transform=Compose(RenameTransform(["ids"], ["tokens"]))
    )
    dict_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(6))  # adds "index"
    ragged = ReplayBuffer(storage=LazyStackStorage(6))
    for rb in (transformed, dict_buffer, ragged):
        rb.extend(data)
        assert direct_sample(rb, 3) is None and direct_read(rb, torch.tensor([0])) is None
    assert "index" in dict_buffer.sample(3).keys()
    empty = ReplayBuffer(storage=LazyTensorStorage(4))
    assert direct_sample(empty, 2) is None  # not initialized: the buffer says so


class _Subclass(ReplayBuffer):
    """A buffer the direct read leaves alone: the rows come through ``rb.sample``."""


def test_the_dataset_yields_the_same_rows(upstream_branch):
    data = _rows(40, history=True)
    rows = {}
    for name, cls in (("direct", ReplayBuffer), ("through the buffer", _Subclass)):
        rb = cls(storage=LazyTensorStorage(40))
        rb.extend(data)
        dataset = TorchRLBufferDataset(rb, 8, num_batches=3, seed=0)
        rows[name] = list(dataset)
    assert (direct_sample(_buffer(data), 2) is None) == (upstream_branch == "plain")
    ours, theirs = rows["direct"], rows["through the buffer"]
    assert len(ours) == len(theirs) == 24
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for key in b:
            if isinstance(b[key], torch.Tensor):
                assert torch.equal(a[key], b[key])
            else:
                assert a[key] == b[key] and type(a[key]) is type(b[key])
    assert isinstance(ours[0]["prompt"], str) and ours[0]["prompt"].startswith("What is")


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=40),  # tensordict: none empty
    texts=st.lists(st.text(max_size=8), min_size=30, max_size=30),
)
def test_take_is_tensordict_indexing(n, picks, texts):
    td = TensorDict(
        {"x": torch.arange(n * 2).reshape(n, 2), ("a", "b"): torch.arange(n), "t": texts[:n]},
        batch_size=[n],
    )
    index = torch.tensor([p % n for p in picks], dtype=torch.long)
    ours, theirs = take(td, index), td[index]
    _same(ours, theirs)
    assert all(is_non_tensor(v) for v in (ours.get("t"), theirs.get("t")))
