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
