"""``as_hf_dataset()`` over an online agentic buffer whose early rollouts made no tool call
(issue 34): tool calls first met after the view's first batch are read, as ``to_hf_dataset()``
reads them, instead of stopping the stream with a ``TypeError``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from test_hf_arrow import PLAIN, TOOLS  # the conversations the types are read from
from torchrl.data import LazyStackStorage, ReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset, messages_to_history

pytest.importorskip("datasets")


def agentic_buffer(chats):
    rb = ReplayBuffer(storage=LazyStackStorage(len(chats)))
    with set_list_to_stack(True):
        rows = [TensorDict({("history", "full"): messages_to_history(c)}) for c in chats]
        rb.extend(lazy_stack(rows))
    return TorchRLBufferDataset(
        rb, 2, epoch=True, shuffle=False, rename={("history", "full"): "messages"}
    )


def test_tool_calls_after_the_first_batch_are_read_as_to_hf_dataset_reads_them():
    ds = agentic_buffer([PLAIN, PLAIN, TOOLS, PLAIN])
    view = ds.as_hf_dataset(num_shards=1)
    rows = [r["messages"] for r in view]  # formerly: TypeError at the second batch
    table = ds.to_hf_dataset()["messages"]
    assert rows[:2] == [PLAIN, PLAIN]  # the first batch, as declared
    assert rows[2:] == table[2:]  # later batches, typed as to_hf_dataset types them
    calls = [m.get("tool_calls") for m in rows[2]]
    assert calls[1][0]["function"]["name"] == "add" and calls[0] is None


def test_through_a_dataloader_as_a_trainer_reads_it():
    view = agentic_buffer([PLAIN, PLAIN, TOOLS, TOOLS]).as_hf_dataset(num_shards=1)
    loader = torch.utils.data.DataLoader(view, batch_size=2, collate_fn=list)
    assert [len(batch) for batch in loader] == [2, 2]


def test_a_type_no_wider_type_holds_is_still_refused():
    rb = ReplayBuffer(storage=LazyStackStorage(4))
    for value in (1, 2, 0.5, 1):  # int64, then a float: the declared int64 cannot hold it
        rb.add(TensorDict({"score": value}))
    view = TorchRLBufferDataset(rb, 2, epoch=True, shuffle=False).as_hf_dataset(num_shards=1)
    with pytest.raises(TypeError, match=r"column 'score'.*to_hf_dataset\(\)"):
        list(view)


# -- rows whose optional message fields differ (issue 53) ---------------------------------------

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
#: real conversations: plain, a tool turn without name, reasoning, a tool_call_id
MIXED = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
    [
        {"role": "user", "content": "Add"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "3"},
    ],
    [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "So.", "reasoning_content": "Because."},
    ],
    [
        {"role": "user", "content": "Add"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"},
    ],
]


def mixed_buffer(storage_cls, order):
    rb = ReplayBuffer(storage=storage_cls(len(order)))
    with set_list_to_stack(True):
        for i in order:  # one row at a time: each its own History class
            rb.add(TensorDict({("history", "full"): messages_to_history(MIXED[i])}))
    return rb


def without_nones(chat):
    """A message list without the keys Arrow fills with ``None`` (its struct holds every key of
    the column); chat templates and TRL drop them too."""
    return [{k: v for k, v in m.items() if v is not None} for m in chat]


@pytest.mark.parametrize("storage", ["LazyStackStorage", "ListStorage"])
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (2, 0, 3, 1), (0, 0, 1, 1)])
def test_rows_whose_optional_message_fields_differ(storage, order):
    import torchrl.data

    rb = mixed_buffer(getattr(torchrl.data, storage), order)
    ds = TorchRLBufferDataset(
        rb, 2, epoch=True, shuffle=False, rename={("history", "full"): "messages"}
    )
    expected = [MIXED[i] for i in order]
    assert [row["messages"] for row in ds] == expected  # batches of 2: two classes in one
    assert [without_nones(c) for c in ds.to_hf_dataset()["messages"]] == expected
    streamed = [row["messages"] for row in ds.as_hf_dataset(num_shards=1)]
    assert [without_nones(c) for c in streamed] == expected
