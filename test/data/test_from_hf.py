"""Tests for torchrl_trl_interop.buffer_from_hf.replay_buffer_from_hf."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset, Features, IterableDataset, Value
from tensordict import set_list_to_stack
from torchrl.data import LazyStackStorage, ListStorage, ReplayBuffer
from torchrl.data.llm import History

from torchrl_trl_interop import TorchRLBufferDataset, history_to_messages, replay_buffer_from_hf
from torchrl_trl_interop.testing import toy_chats


def msgs(*pairs: str) -> list[dict[str, str]]:
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": c} for i, c in enumerate(pairs)]


SYSTEM = [{"role": "system", "content": "Be brief. ✓"}]

# One small dataset per TRL format (standard and conversational), with ragged turn counts.
FORMATS = {
    "preference_standard": [
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
        {"prompt": "2+2=", "chosen": "4", "rejected": ""},
    ],
    "preference_conversational": [
        {"prompt": msgs("2+2?"), "chosen": [msgs("", "4")[1]], "rejected": [msgs("", "5")[1]]},
        {
            "prompt": SYSTEM + msgs("Hi", "Hello", "How are you?"),
            "chosen": [msgs("", "Fine.")[1]],
            "rejected": [msgs("", "")[1]],
        },
    ],
    "preference_implicit_prompt": [
        {"chosen": msgs("2+2?", "4"), "rejected": msgs("2+2?", "5")},
        {"chosen": SYSTEM + msgs("Hi", "Hello"), "rejected": SYSTEM + msgs("Hi", "Go.")},
    ],
    "prompt_only_standard": [{"prompt": "The sky is"}, {"prompt": "日本語"}],
    "prompt_only_conversational": [{"prompt": msgs("2+2?")}, {"prompt": SYSTEM + msgs("Hi")}],
    "prompt_completion_standard": [
        {"prompt": "The sky is", "completion": " blue."},
        {"prompt": "", "completion": "x"},
    ],
    "prompt_completion_conversational": [
        {"prompt": msgs("2+2?"), "completion": [msgs("", "4")[1]]},
        {"prompt": SYSTEM + msgs("a", "b", "c"), "completion": [msgs("", "d")[1]]},
    ],
    "messages": [{"messages": c} for c in toy_chats(4)],
    "language_modeling": [{"text": "Hello world!"}, {"text": "The quick brown fox."}],
    "extra_columns": [
        {
            "prompt": msgs("q"),
            "score": 0.1,
            "label": True,
            "n": 3,
            "ids": [1, 2, 3],
            "note": None,
            "tags": ["a", "b"],
        },
        {
            "prompt": msgs("r", "s", "t"),
            "score": -2.5,
            "label": False,
            "n": -1,
            "ids": [4],
            "note": "x",
            "tags": [],
        },
    ],
}


def round_trip(rb: ReplayBuffer, **kwargs) -> list[dict]:
    return TorchRLBufferDataset(rb, batch_size=2, **kwargs).to_hf_dataset().to_list()


class TestRoundTrip:
    @pytest.mark.parametrize("fmt", sorted(FORMATS))
    def test_every_trl_format(self, fmt):
        data = Dataset.from_list(FORMATS[fmt])
        rb = replay_buffer_from_hf(data)
        assert len(rb) == len(data)
        assert isinstance(rb.storage, LazyStackStorage)
        assert round_trip(rb) == data.to_list()

    def test_conversational_columns_are_history(self):
        data = Dataset.from_list(FORMATS["preference_conversational"])
        rb = replay_buffer_from_hf(data)
        with set_list_to_stack(True):
            stored = rb[:]
            for column in ("prompt", "chosen", "rejected"):
                history = stored.get(column)
                assert isinstance(history, History)
                assert history_to_messages(history) == data[column]

    def test_float32_column(self):
        features = Features({"prompt": Value("string"), "score": Value("float32")})
        data = Dataset.from_dict({"prompt": ["a", "b"], "score": [0.1, 1 / 3]}, features=features)
        assert round_trip(replay_buffer_from_hf(data)) == data.to_list()

    @pytest.mark.parametrize("chunk_size", [1, 3, 1024])
    def test_chunks(self, chunk_size):
        data = Dataset.from_list(FORMATS["messages"] * 2)
        rb = replay_buffer_from_hf(data, chunk_size=chunk_size)
        assert round_trip(rb) == data.to_list()

    def test_iterable_dataset(self):
        data = Dataset.from_list(FORMATS["prompt_completion_conversational"] * 3)
        rb = replay_buffer_from_hf(data.to_iterable_dataset())
        assert round_trip(rb) == data.to_list()
        rb = replay_buffer_from_hf(data.to_iterable_dataset(), max_rows=4)
        assert len(rb) == 4 and round_trip(rb) == data.to_list()[:4]

    def test_list_of_rows(self):
        rows = FORMATS["extra_columns"]
        assert round_trip(replay_buffer_from_hf(rows)) == rows

    def test_rename_to_nested_keys(self):
        data = Dataset.from_list(FORMATS["prompt_only_conversational"])
        rb = replay_buffer_from_hf(data, rename={"prompt": ("history", "prompt")})
        with set_list_to_stack(True):
            assert history_to_messages(rb[:].get(("history", "prompt"))) == data["prompt"]
        back = round_trip(rb, rename={("history", "prompt"): "prompt"})
        assert back == data.to_list()

    def test_columns(self):
        data = Dataset.from_list(FORMATS["extra_columns"])
        rb = replay_buffer_from_hf(data, columns=["prompt", "ids"])
        assert round_trip(rb) == data.select_columns(["prompt", "ids"]).to_list()


class TestBuffers:
    def test_storage_and_batch_size(self):
        data = Dataset.from_list(FORMATS["messages"])
        rb = replay_buffer_from_hf(data, storage=ListStorage(10), batch_size=3)
        assert isinstance(rb.storage, ListStorage)
        assert rb.sample().batch_size == torch.Size([3])
        assert round_trip(rb) == data.to_list()

    def test_extends_a_given_buffer(self):
        rb = ReplayBuffer(storage=LazyStackStorage(10))
        data = Dataset.from_list(FORMATS["prompt_only_conversational"])
        assert replay_buffer_from_hf(data, replay_buffer=rb) is rb
        replay_buffer_from_hf(data, replay_buffer=rb)
        assert round_trip(rb) == data.to_list() * 2


class TestErrors:
    def test_replay_buffer_type(self):
        with pytest.raises(TypeError, match="replay_buffer must be a torchrl ReplayBuffer"):
            replay_buffer_from_hf(FORMATS["messages"], replay_buffer=[])

    def test_replay_buffer_with_storage(self):
        rb = ReplayBuffer(storage=LazyStackStorage(10))
        with pytest.raises(ValueError, match="cannot be combined with replay_buffer="):
            replay_buffer_from_hf(FORMATS["messages"], replay_buffer=rb, batch_size=2)

    @pytest.mark.parametrize("rows", [[], Dataset.from_dict({"a": []})])
    def test_empty(self, rows):
        with pytest.raises(ValueError, match="the dataset has no rows"):
            replay_buffer_from_hf(rows)

    @pytest.mark.parametrize("arg", ["max_rows", "chunk_size"])
    def test_sizes(self, arg):
        with pytest.raises(ValueError, match=f"{arg} must be a positive int"):
            replay_buffer_from_hf(FORMATS["messages"], **{arg: 0})

    def test_unknown_columns(self):
        data = Dataset.from_list(FORMATS["messages"])
        with pytest.raises(KeyError, match=r"columns= names \['prompt'\]"):
            replay_buffer_from_hf(data, columns=["prompt"])
        with pytest.raises(KeyError, match=r"rename= names \['prompt'\]"):
            replay_buffer_from_hf(data, rename={"prompt": "x"})
        with pytest.raises(KeyError, match="column 'prompt' from columns= is missing"):
            replay_buffer_from_hf(FORMATS["messages"], columns=["prompt"])

    def test_rename_outside_columns(self):
        data = Dataset.from_list(FORMATS["extra_columns"])
        with pytest.raises(
            KeyError, match=r"rename= names \[.ids.\], not among the columns kept by columns="
        ):
            replay_buffer_from_hf(data, columns=["prompt"], rename={"ids": "x"})

    def test_row_type(self):
        with pytest.raises(TypeError, match="row 1 is a str"):
            replay_buffer_from_hf([{"a": 1}, "b"])

    def test_mixed_column(self):
        with pytest.raises(ValueError, match="column 'prompt' holds conversations"):
            replay_buffer_from_hf([{"prompt": msgs("a")}, {"prompt": "a"}])

    def test_column_type_changes_between_chunks(self):
        with pytest.raises(ValueError, match="column 'x' was stored as"):
            replay_buffer_from_hf([{"x": 1}, {"x": "one"}], chunk_size=1)


class TestBufferFromHFRefusesToOverwrite:
    """Regression (issue 10, item 7): data larger than the storage kept the last rows, in ring order, without a word."""

    rows = [{"a": i} for i in range(10)]

    def test_storage_too_small(self):
        with pytest.raises(ValueError, match=r"has 10 rows but .*LazyStackStorage holds 4"):
            replay_buffer_from_hf(Dataset.from_list(self.rows), storage=LazyStackStorage(4))

    def test_stream_into_a_given_buffer_writes_nothing(self):
        rb = ReplayBuffer(storage=LazyStackStorage(4))
        stream = IterableDataset.from_generator(lambda: iter(self.rows))
        with pytest.raises(ValueError, match="more than 4 rows"):
            replay_buffer_from_hf(stream, replay_buffer=rb)
        assert len(rb) == 0  # checked before writing

    def test_max_rows_or_a_fitting_storage(self):
        rb = replay_buffer_from_hf(self.rows, storage=LazyStackStorage(4), max_rows=4)
        assert rb[:]["a"].tolist() == [0, 1, 2, 3]
        stream = IterableDataset.from_generator(lambda: iter(self.rows))
        rb = replay_buffer_from_hf(stream, storage=LazyStackStorage(10))
        assert rb[:]["a"].tolist() == list(range(10))


# Every conversational TRL layout, with message fields History has no slot for.
CALL = {"type": "function", "id": "call_1", "function": {"name": "add", "arguments": {"a": 2}}}
THINK = {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}
NAMED = {"role": "user", "content": "2+2?", "name": "Ann"}
TOOL_EPISODE = [
    NAMED,
    {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning_content": "add them"},
    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    THINK,
]
FIELDED_FORMATS = {
    "preference_conversational": [
        {"prompt": [NAMED], "chosen": [THINK], "rejected": [msgs("", "5")[1]]},
        {"prompt": SYSTEM + msgs("Hi"), "chosen": msgs("", "Hey")[1:], "rejected": [THINK]},
    ],
    "preference_implicit_prompt": [
        {"chosen": [NAMED, THINK], "rejected": [NAMED, msgs("", "5")[1]]},
        {"chosen": msgs("Hi", "Hey"), "rejected": TOOL_EPISODE},
    ],
    "prompt_only_conversational": [{"prompt": [NAMED]}, {"prompt": SYSTEM + msgs("Hi")}],
    "prompt_completion_conversational": [
        {"prompt": [NAMED], "completion": TOOL_EPISODE[1:]},
        {"prompt": msgs("Hi"), "completion": [THINK]},
    ],
    "messages": [{"messages": TOOL_EPISODE}, {"messages": msgs("Hi", "Hey")}],
}


class TestMessageFieldsRoundTrip:
    """Regression (issue 20, item 8): fields other than role/content/tool calls were dropped
    (``reasoning_content``, a user's ``name``) or replaced (``tool_call_id`` by a derived
    ``name``), although every TRL layout was promised to come back unchanged."""

    @pytest.mark.parametrize("source", ["list", "datasets"])
    @pytest.mark.parametrize("fmt", sorted(FIELDED_FORMATS))
    def test_every_view_gives_the_rows_back(self, fmt, source):
        rows = FIELDED_FORMATS[fmt]
        data = Dataset.from_list(rows)
        # a datasets.Dataset gives every message every field of its schema (None if unset)
        expected = rows if source == "list" else data.to_list()
        rb = replay_buffer_from_hf(rows if source == "list" else data)
        ds = TorchRLBufferDataset(rb, batch_size=2, epoch=True)
        assert [dict(row) for row in ds] == expected
        assert ds.to_hf_dataset().to_list() == data.to_list()
        assert list(ds.as_hf_dataset(num_shards=1)) == expected

    def test_one_class_per_column_across_chunks(self):
        rows = FIELDED_FORMATS["messages"]
        rb = replay_buffer_from_hf(rows, chunk_size=1)  # fields first, then a plain chat
        assert {type(rb[i]["messages"]).__name__ for i in range(2)} == {"MessageHistory"}
        assert round_trip(rb) == Dataset.from_list(rows).to_list()
        with pytest.raises(
            ValueError,
            match=r"column 'messages' was stored as plain History so "
            r"far, but row 0 of these rows holds message fields \['name', ",
        ):
            replay_buffer_from_hf(rows[::-1], chunk_size=1)
        ds = TorchRLBufferDataset(replay_buffer_from_hf(rows[::-1]), batch_size=2, epoch=True)
        assert [dict(row) for row in ds] == rows[::-1]

    @pytest.mark.parametrize("later", [TOOL_EPISODE[:2], [NAMED]])
    def test_to_hf_dataset_after_a_plain_first_row(self, later):
        rows = [{"messages": msgs("Hi", "Hey")}, {"messages": later}]
        ds = TorchRLBufferDataset(replay_buffer_from_hf(rows), batch_size=2)
        assert ds.to_hf_dataset().to_list() == Dataset.from_list(rows).to_list()
