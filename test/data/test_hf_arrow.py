"""The Arrow-native Hugging Face views give exactly the rows and features of the row-by-row path.

``to_hf_dataset()`` builds Arrow arrays per column from a batch's tensors, and ``as_hf_dataset()``
converts each batch's columns to Python once; the reference here is the row-by-row conversion
they replaced: every row of the torch view (``iter_storage``) turned into Python values, given to
``datasets.Dataset.from_list`` with the same features (and, for the streaming view, encoded and
decoded by those features as ``datasets`` did for each row).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from torchrl.data import LazyStackStorage, LazyTensorStorage, ListStorage, ReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset, messages_to_history, replay_buffer_from_hf
from torchrl_trl_interop._keys import to_python
from torchrl_trl_interop.testing import toy_chats

pytest.importorskip("datasets")

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")


def reference_dataset(ds: TorchRLBufferDataset):
    from datasets import Dataset

    rows = [{k: to_python(v) for k, v in row.items()} for row in ds.iter_storage()]
    return Dataset.from_list(rows, features=ds.hf_features())


def assert_same_dataset(got, expected) -> None:
    assert got.features == expected.features
    assert got.data.schema == expected.data.schema  # the Arrow types, nested ones included
    assert len(got) == len(expected)
    assert got[:] == expected[:]
    assert list(got) == list(expected)


def build_buffer(draw, ragged: bool, columns: set[str], n: int) -> tuple[ReplayBuffer, dict]:
    """A buffer of ``n`` rows with the chosen columns; returns it and the dataset's options."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    lengths = torch.randint(0, 6, (n,), generator=g).tolist()
    width = max(lengths + [1])
    chats = toy_chats(n, seed=int(torch.randint(100, (1,), generator=g)))
    rows = []
    for i, length in enumerate(lengths):
        row = {}
        if "tokens" in columns:
            tokens = torch.randint(0, 50, (length if ragged else width,), generator=g)
            row[TOKENS] = tokens
            mask = torch.zeros(tokens.shape[0], dtype=torch.bool)
            start = int(torch.randint(0, max(length, 1), (1,), generator=g)) if length else 0
            mask[start:length] = True  # holes at either end: the span is what is kept
            row[MASK] = mask
        if "scalar" in columns:
            row["score"] = torch.randn((), generator=g)
        if "pairs" in columns:  # an inner dimension per token
            row["pairs"] = torch.randn(length if ragged else width, 2, generator=g)
        if "half" in columns:
            row["half"] = torch.randn(3, generator=g).to(torch.bfloat16)
        if "flag" in columns:
            row["flag"] = torch.tensor(bool(i % 2))
        if "text" in columns:
            row["text"] = f"row {i} " * (i % 3)
        if "history" in columns and ragged:
            from torchrl.data.llm import History

            with set_list_to_stack(True):
                row["history"] = History.from_chats([chats[i]])[0]
        rows.append(TensorDict(row))
    with set_list_to_stack(True):
        data = lazy_stack(rows) if ragged else torch.stack(rows)
        rb = ReplayBuffer(storage=(LazyStackStorage if ragged else LazyTensorStorage)(n))
        rb.extend(data)
    options: dict = {}
    if "tokens" in columns and draw(st.booleans()):
        options["attention_mask_key"] = MASK
    if "tokens" in columns and draw(st.booleans()):
        options["rename"] = {TOKENS: "input_ids"}
    if draw(st.booleans()) and len(columns) > 1:
        keep = sorted(columns)[: max(1, len(columns) - 1)]
        keys = {"tokens": ["tokens", "masks"], "scalar": ["score"], "history": ["history"]}
        options["keys"] = [k for c in keep for k in keys.get(c, [c])]
        if "history" in options["keys"] and not ragged:
            options["keys"].remove("history")
        if not options["keys"] or (
            "rename" in options and "tokens" not in options["keys"]
        ):  # rename needs its key selected
            options.pop("keys")
    return rb, options


@st.composite
def schemas(draw):
    ragged = draw(st.booleans())
    choices = ["tokens", "scalar", "pairs", "half", "flag", "text", "history"]
    columns = set(draw(st.lists(st.sampled_from(choices), min_size=1, max_size=4, unique=True)))
    if not ragged:
        columns.discard("history")
        columns = columns or {"tokens"}
    n = draw(st.integers(1, 9))
    rb, options = build_buffer(draw, ragged, columns, n)
    return rb, options, draw(st.integers(1, n))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas())
def test_to_hf_dataset_matches_the_row_by_row_build(schema):
    rb, options, chunk = schema
    ds = TorchRLBufferDataset(rb, 4, **options)
    assert_same_dataset(ds.to_hf_dataset(chunk_size=chunk), reference_dataset(ds))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas())
def test_as_hf_dataset_rows_match_the_row_by_row_path(schema):
    rb, options, _ = schema
    ds = TorchRLBufferDataset(rb, 4, epoch=True, **options)
    features = ds.hf_features()
    expected = [features.decode_example(features.encode_example(r)) for r in reference_dataset(ds)]
    assert list(ds.as_hf_dataset(num_shards=1)) == expected
    assert ds.as_hf_dataset().features == features


def test_streaming_view_can_still_be_cast():
    """Rows are handed over already typed, but a cast of the view still applies to them."""
    from datasets import Value

    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    hf = TorchRLBufferDataset(rb, 2, epoch=True).as_hf_dataset(num_shards=1)
    assert [r["x"] for r in hf] == [0, 1, 2, 3]
    cast = hf.cast_column("x", Value("float32"))
    assert [r["x"] for r in cast] == [0.0, 1.0, 2.0, 3.0]
    assert all(isinstance(r["x"], float) for r in cast)


def test_llm_rows_with_history(tmp_path):
    """TorchRL's LLM layout: ragged tokens and mask, a History, a text, nested keys."""
    with set_list_to_stack(True):
        rb, _ = _llm_buffer(7)
    ds = TorchRLBufferDataset(rb, 3, attention_mask_key=MASK)
    expected = reference_dataset(ds)
    assert_same_dataset(ds.to_hf_dataset(), expected)
    assert expected.features["history.full"].feature["role"].dtype == "string"
    assert expected[0]["history.full"] == toy_chats(7)[0]


def test_cache_file_is_memory_mapped(tmp_path):
    """``cache_file=`` writes an Arrow file chunk by chunk and memory-maps it."""
    with set_list_to_stack(True):
        rb, _ = _llm_buffer(10)
    ds = TorchRLBufferDataset(rb, 3)
    path = tmp_path / "rows.arrow"
    mapped = ds.to_hf_dataset(chunk_size=4, cache_file=path)
    assert [f["filename"] for f in mapped.cache_files] == [str(path)]
    assert path.stat().st_size > 0
    assert_same_dataset(mapped, reference_dataset(ds))
    assert ds.to_hf_dataset().cache_files == []  # the default: in memory


def _llm_buffer(n: int) -> tuple[ReplayBuffer, list]:
    from torchrl.data.llm import History

    chats = toy_chats(n)
    history = History.from_chats(chats)
    rows = [
        TensorDict(
            {
                TOKENS: torch.arange(3 + i),
                MASK: torch.arange(3 + i) > 0,
                ("history", "full"): history[i],
                ("text", "full"): f"answer {i}",
            }
        )
        for i in range(n)
    ]
    rb = ReplayBuffer(storage=LazyStackStorage(n))
    rb.extend(lazy_stack(rows))
    return rb, chats


# -- types come from every row (issue 20, items 4 and 15) ----------------------------------------

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
PLAIN = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
TOOLS = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "4"},
    {"role": "assistant", "content": "4"},
]


def per_row_buffer(storage_cls, values: list, key: str = "score") -> ReplayBuffer:
    """One TensorDict per row holding ``values[i]`` as TensorDict stores a Python value."""
    rb = ReplayBuffer(storage=storage_cls(len(values)))
    for value in values:
        rb.add(TensorDict({key: value}))
    return rb


def torch_view_rows(ds: TorchRLBufferDataset | ReplayBuffer) -> list[dict]:
    """What the torch view yields, as Python values: the rows ``Dataset.from_list`` is given."""
    if isinstance(ds, ReplayBuffer):
        ds = TorchRLBufferDataset(ds, len(ds))
    return [{k: to_python(v) for k, v in row.items()} for row in ds.iter_storage()]


class TestTypesFromEveryRow:
    """Regression: the views typed every column from the first row (``0.5`` became ``0``)."""

    @pytest.mark.parametrize("chunk_size", [None, 1])
    def test_ints_then_floats_are_floats(self, chunk_size):
        from datasets import Dataset

        rb = per_row_buffer(LazyStackStorage, [1, 0.5, 2])  # int64, float32, int64 tensors
        hf = TorchRLBufferDataset(rb, 2).to_hf_dataset(chunk_size=chunk_size)
        assert hf["score"][:] == [1.0, 0.5, 2.0]
        assert hf.features["score"].dtype == "float64"
        assert_same_dataset(hf, Dataset.from_list(torch_view_rows(rb)))

    def test_list_storage_reads_the_same_rows(self):
        """``ListStorage``: formerly a raw ``ArrowInvalid`` (first row int64, then a float)."""
        rb = per_row_buffer(ListStorage, [1, 0.5])
        hf = TorchRLBufferDataset(rb, 2).to_hf_dataset()
        assert hf["score"][:] == [r["score"] for r in torch_view_rows(rb)] == [1.0, 0.5]

    def test_a_cache_file_is_rewritten_when_a_later_read_widens_a_type(self, tmp_path):
        rb = per_row_buffer(LazyStackStorage, [1, 2, 0.5])
        path = tmp_path / "rows.arrow"
        hf = TorchRLBufferDataset(rb, 1).to_hf_dataset(chunk_size=1, cache_file=path)
        assert hf["score"][:] == [1.0, 2.0, 0.5]
        assert [f["filename"] for f in hf.cache_files] == [str(path)]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.arrow"]

    def test_rows_through_replay_buffer_from_hf(self):
        rb = replay_buffer_from_hf([{"score": 1}, {"score": 0.5}])
        assert TorchRLBufferDataset(rb, 2).to_hf_dataset()["score"][:] == [1.0, 0.5]

    @pytest.mark.parametrize("values", [[True, 0.5], [1, "a"], [torch.ones(2), 1.0]])
    def test_rows_without_a_common_type_are_refused(self, values):
        """A bool first row formerly turned ``0.5`` into ``True``."""
        rb = per_row_buffer(LazyStackStorage, values)
        with pytest.raises(TypeError, match=r"to_hf_dataset: column 'score' holds"):
            TorchRLBufferDataset(rb, 2).to_hf_dataset()

    def test_streaming_view_promotes_its_first_batch(self):
        rb = per_row_buffer(LazyStackStorage, [1, 0.5, 2])
        hf = TorchRLBufferDataset(rb, 2, epoch=True).as_hf_dataset(num_shards=1)
        assert hf.features["score"].dtype == "float64"
        rows = [r["score"] for r in hf]
        assert rows == [1.0, 0.5, 2.0] and all(type(v) is float for v in rows)

    def test_streaming_view_refuses_a_later_row_its_features_cannot_hold(self):
        rb = per_row_buffer(LazyStackStorage, [1, 2, 0.5])
        hf = TorchRLBufferDataset(rb, 2, epoch=True).as_hf_dataset(num_shards=1)
        assert hf.features["score"].dtype == "int64"
        with pytest.raises(TypeError, match=r"as_hf_dataset: column 'score'.*to_hf_dataset\(\)"):
            list(hf)


class TestToolCallsAfterTheFirstRow:
    """Regression: tool calls first made after row 0 gave a raw pyarrow cast error."""

    def test_trl_tool_calling_rows_through_replay_buffer_from_hf(self):
        from datasets import Dataset

        rb = replay_buffer_from_hf([{"messages": PLAIN}, {"messages": TOOLS}])
        hf = TorchRLBufferDataset(rb, 1).to_hf_dataset()
        expected = Dataset.from_list(torch_view_rows(rb))
        assert_same_dataset(hf, expected)
        assert Dataset.from_list([{"messages": PLAIN}, {"messages": TOOLS}])[:] == hf[:]

    def test_an_agentic_buffer_whose_first_rollout_made_no_call(self):
        from datasets import Dataset

        chats = [PLAIN, TOOLS, PLAIN]
        rb = ReplayBuffer(storage=LazyStackStorage(3))
        with set_list_to_stack(True):
            rows = [TensorDict({("history", "full"): messages_to_history(c)}) for c in chats]
            rb.extend(lazy_stack(rows))
        ds = TorchRLBufferDataset(rb, 2, rename={("history", "full"): "messages"})
        assert [r["messages"] for r in ds.iter_storage()] == chats
        assert_same_dataset(ds.to_hf_dataset(chunk_size=1), Dataset.from_list(torch_view_rows(ds)))

    def test_streaming_view(self):
        rb = replay_buffer_from_hf([{"messages": PLAIN}, {"messages": TOOLS}])
        seen = TorchRLBufferDataset(rb, 2, epoch=True).as_hf_dataset(num_shards=1)
        assert [r["messages"] for r in seen] == [PLAIN, TOOLS]  # as the torch view yields them
        # tool calls first met in the second batch: read (issue 34), test_hf_widening.py
        later = TorchRLBufferDataset(rb, 1, epoch=True).as_hf_dataset(num_shards=1)
        assert len(list(later)) == 2
