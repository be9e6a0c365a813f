"""Regressions of issue 10: places that returned wrong data without a word."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from datasets import Dataset, IterableDataset
from tensordict import TensorDict, lazy_stack
from torchrl.data import LazyStackStorage, ReplayBuffer

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    TorchRLBufferDataset,
    TRLRewardFuncWrapper,
    build_preference_pairs,
    history_to_messages,
    messages_to_history,
    replay_buffer_from_hf,
)
from torchrl_trl_interop.testing import toy_reward_model

EOS = 2  # the toy tokenizer's <|im_end|>


def chat(answer: str) -> list[dict]:
    return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]


def ragged(rows) -> TensorDict:
    return lazy_stack([TensorDict({("tokens", "full"): r}) for r in rows])


class TestRewardModelNeverMutatesTheModel:
    """Item 3: the wrapper swapped ``config.pad_token_id`` during the call, with no lock."""

    @pytest.mark.parametrize("pad_token_id", [EOS, None])  # pad == eos; no pad id at all
    def test_config_untouched_during_the_call(self, pad_token_id):
        model = toy_reward_model("llama", pad_token_id=pad_token_id)
        seen = []
        model.register_forward_pre_hook(lambda *_: seen.append(model.config.pad_token_id))
        rows = [torch.tensor([5, 6, EOS]), torch.tensor([7, 8, 9, 10, EOS])]
        HFRewardModelWrapper(model, attention_mask_key=None, inference_mode=True)(ragged(rows))
        assert seen == [pad_token_id]  # before: the swapped pad id, seen by every other caller

    def test_one_model_scored_from_several_threads(self):
        model = toy_reward_model("llama", pad_token_id=EOS)
        g = torch.Generator().manual_seed(0)
        batches = []
        for b in range(4):
            rows = [torch.randint(3, 300, (int(n),), generator=g) for n in range(3, 9)]
            for row in rows[b % 2 :: 2]:
                row[-1] = EOS  # half the rows end with the pad id: those calls need a fill id
            batches.append(rows)
        wrapper = HFRewardModelWrapper(model, attention_mask_key=None, inference_mode=True)
        expected = [wrapper(ragged(rows))["reward"] for rows in batches]
        wrong = []

        def score(k: int) -> None:
            for _ in range(10):
                out = wrapper(ragged(batches[k]))["reward"]
                if not torch.allclose(out, expected[k], atol=1e-6):
                    wrong.append(k)

        threads = [threading.Thread(target=score, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []
        assert model.config.pad_token_id == EOS


def test_preference_pairs_refuse_infinite_rewards():
    """Item 5: ±inf rewards gave pairs with margin=inf (NaN is left out, as before)."""
    td = TensorDict(
        {"history": {"full": messages_to_history([chat("4"), chat("5"), chat("6")])}}, [3]
    )
    td["reward"] = torch.tensor([math.inf, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"'reward'\] holds 1 infinite reward.*indices \[0\]"):
        build_preference_pairs(td)
    td["reward"] = torch.tensor([math.nan, 1.0, 0.0])
    assert build_preference_pairs(td)[:]["margin"].tolist() == [1.0]


class TestRewardFunctionOutputs:
    """Item 6: a NaN weight zeroed scored rows, inf was written, strings became floats."""

    def td(self) -> TensorDict:
        return TensorDict({"history": {"full": messages_to_history([chat("4"), chat("5")])}}, [2])

    def test_weights_must_be_finite_numbers(self):
        def one(completions, **kwargs):
            return [1.0, 2.0]

        for bad, error in ((math.nan, ValueError), (-math.inf, ValueError), ("2", TypeError)):
            with pytest.raises(error, match=r"weights\[0\]"):
                TRLRewardFuncWrapper([one], weights=[bad])
        assert TRLRewardFuncWrapper([one], weights=[2])(self.td())["reward"].tolist() == [2, 4]

    @pytest.mark.parametrize(
        ("output", "error", "message"),
        [
            ([math.inf, 1.0], ValueError, r"'graded' returned infinite reward\(s\) at \[0\]"),
            (["1.5", 2.0], TypeError, r"'graded': reward \[0\] must be a real number"),
            ([[1.0], [2.0]], TypeError, r"'graded': reward \[0\] must be a real number"),
            (torch.ones(2, 1), ValueError, r"'graded' returned a tensor of shape \[2, 1\]"),
        ],
    )
    def test_bad_rewards_name_the_function(self, output, error, message):
        def graded(completions, **kwargs):
            return output

        with pytest.raises(error, match=message):
            TRLRewardFuncWrapper(graded)(self.td())

    def test_none_numpy_and_tensors_still_pass(self):
        import numpy as np

        def mixed(completions, **kwargs):
            return [None, np.float32(0.5)]

        out = TRLRewardFuncWrapper(mixed, reward_per_func_key="per")(self.td())
        assert math.isnan(out["reward"][0]) and out["reward"][1] == 0.5


class TestBufferFromHFRefusesToOverwrite:
    """Item 7: data larger than the storage kept the last rows, in ring order, without a word."""

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


class TestToolCalls:
    """Item 9: ``history_to_messages`` dropped tool calls; ``messages_to_history`` refused them."""

    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    tool_chat = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]

    def test_round_trip_in_trl_format(self):
        chats = [self.tool_chat, chat("4")]
        history = messages_to_history(chats)
        assert history_to_messages(history) == chats
        assert history_to_messages(history[0], keep_system=False) == self.tool_chat[1:]
        nested = [[self.tool_chat, chat("5")], [chat("4"), chat("6")]]
        assert history_to_messages(messages_to_history(nested)) == nested

    def test_content_none_next_to_tool_calls(self):
        turn = {"role": "assistant", "content": None, "tool_calls": [self.call]}
        out = history_to_messages(messages_to_history([chat("4")[0], turn]))
        assert out[1] == {**turn, "content": ""}
        with pytest.raises(ValueError, match=r"needs a str 'content', got None"):
            messages_to_history([{"role": "assistant", "content": None}])

    def test_torchrl_bare_calls_come_out_in_trl_format(self):
        from tensordict import set_list_to_stack
        from torchrl.data.llm import History

        bare = {"name": "add", "arguments": {"a": 2, "b": 2}}
        with set_list_to_stack(True):
            history = lazy_stack(
                [
                    History(role="assistant", content="", tool_calls=[bare]),
                    History(role="tool", content="4"),
                ]
            )
        assert history_to_messages(history) == self.tool_chat[2:4]

    def test_tool_name_must_match_the_call(self):
        wrong = [*self.tool_chat[:3], {"role": "tool", "name": "mul", "content": "4"}]
        with pytest.raises(ValueError, match=r"messages\[3\] is a tool turn named 'mul'.*'add'"):
            messages_to_history(wrong)
        with pytest.raises(TypeError, match=r"\['tool_calls'\] should be a list of dicts"):
            messages_to_history([{"role": "assistant", "content": "", "tool_calls": "add(2)"}])

    def test_through_a_buffer_and_both_hf_views(self):
        rows = [{"messages": self.tool_chat}, {"messages": chat("4")}]
        rb = replay_buffer_from_hf(rows)
        ds = TorchRLBufferDataset(rb, 2, epoch=True)
        assert [r["messages"] for r in ds] == [self.tool_chat, chat("4")]
        assert [r["messages"] for r in ds.as_hf_dataset(num_shards=1)] == [
            self.tool_chat,
            chat("4"),
        ]
        first = TorchRLBufferDataset(replay_buffer_from_hf(rows[:1]), 1).to_hf_dataset()[0]
        calls = [m for m in first["messages"] if m["tool_calls"]]
        assert calls[0]["tool_calls"] == [self.call]
