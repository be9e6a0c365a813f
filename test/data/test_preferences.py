"""Tests for torchrl_trl_interop.preferences.build_preference_pairs."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from torchrl.data import LazyStackStorage, ListStorage, ReplayBuffer

from torchrl_trl_interop import (
    TorchRLBufferDataset,
    build_preference_pairs,
    history_to_messages,
    messages_to_history,
)

SYSTEM = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def chat(question: str, answer: str) -> list[dict[str, str]]:
    return [SYSTEM, user(question), assistant(answer)]


def group_rollouts(groups: list[list[tuple[str, str, float]]]) -> TensorDict:
    """[E, G] rollouts: one (question, answer, reward) triple per completion."""
    history = messages_to_history([[chat(q, a) for q, a, _ in g] for g in groups])
    reward = torch.tensor([[r for _, _, r in g] for g in groups])
    return TensorDict({"history": {"full": history}, "reward": reward}, batch_size=reward.shape)


def flat_rollouts(items: list[tuple[str, str, float]], reward_shape=()) -> TensorDict:
    """[N] rollouts as TorchRL's LLM collectors write them: a ragged lazy stack of rows."""
    rows = [
        TensorDict(
            {
                "history": {"full": messages_to_history(chat(q, a))},
                "reward": torch.full(reward_shape, r),
            }
        )
        for q, a, r in items
    ]
    with set_list_to_stack(True):
        return lazy_stack(rows)


def hf_rows(rb: ReplayBuffer) -> list[dict]:
    return TorchRLBufferDataset(rb, batch_size=4).to_hf_dataset().to_list()


class TestGroups:
    def test_best_and_worst_per_group(self):
        rollouts = group_rollouts(
            [
                [("2+2?", "4", 1.0), ("2+2?", "5", -2.0), ("2+2?", "four", 0.5)],
                [("Hi", "Hello", 0.25), ("Hi", "Go away", -0.5), ("Hi", "Hey", 0.0)],
            ]
        )
        rb = build_preference_pairs(rollouts)
        assert isinstance(rb.storage, LazyStackStorage)
        assert hf_rows(rb) == [
            {
                "chosen": [assistant("4")],
                "margin": 3.0,
                "prompt": [SYSTEM, user("2+2?")],
                "rejected": [assistant("5")],
            },
            {
                "chosen": [assistant("Hello")],
                "margin": 0.75,
                "prompt": [SYSTEM, user("Hi")],
                "rejected": [assistant("Go away")],
            },
        ]

    def test_ties_and_single_completions_are_skipped(self):
        tie = group_rollouts(
            [[("a", "x", 1.0), ("a", "y", 1.0)], [("b", "x", 0.0), ("b", "y", 2.0)]]
        )
        rb = build_preference_pairs(tie)
        assert [r["prompt"][-1]["content"] for r in hf_rows(rb)] == ["b"]
        single = group_rollouts([[("a", "x", 1.0)], [("b", "y", 2.0)]])
        assert len(build_preference_pairs(single)) == 0

    def test_partial_tie_picks_first_in_order(self):
        rollouts = group_rollouts(
            [[("a", "x", 1.0), ("a", "y", 1.0), ("a", "z", 0.0), ("a", "w", 0.0)]]
        )
        (row,) = hf_rows(build_preference_pairs(rollouts))
        assert row["chosen"] == [assistant("x")] and row["rejected"] == [assistant("z")]

    def test_same_completion_is_skipped(self):
        rollouts = group_rollouts([[("a", "x", 1.0), ("a", "x", 0.0)]])
        assert len(build_preference_pairs(rollouts)) == 0

    def test_nan_rewards_are_left_out(self):
        rollouts = group_rollouts(
            [
                [("a", "x", math.nan), ("a", "y", 1.0), ("a", "z", 0.0)],
                [("b", "x", math.nan), ("b", "y", 1.0), ("b", "z", math.nan)],
            ]
        )
        (row,) = hf_rows(build_preference_pairs(rollouts))
        assert row["chosen"] == [assistant("y")] and row["rejected"] == [assistant("z")]

    def test_min_margin(self):
        rollouts = group_rollouts(
            [[("a", "x", 1.0), ("a", "y", 0.9)], [("b", "x", 1.0), ("b", "y", -1.0)]]
        )
        rb = build_preference_pairs(rollouts, min_margin=0.5)
        assert [r["prompt"][-1]["content"] for r in hf_rows(rb)] == ["b"]

    def test_empty_result(self):
        rb = build_preference_pairs(group_rollouts([[("a", "x", 1.0), ("a", "y", 1.0)]]))
        assert len(rb) == 0


class TestLayouts:
    def test_flat_rollouts_grouped_by_prompt(self):
        rollouts = flat_rollouts(
            [("b", "1", 0.0), ("a", "1", 1.0), ("b", "2", 3.0), ("a", "2", -1.0), ("c", "1", 0.0)]
        )
        rows = hf_rows(build_preference_pairs(rollouts))
        assert [r["prompt"][-1]["content"] for r in rows] == ["b", "a"]  # first appearance
        assert [r["chosen"][0]["content"] for r in rows] == ["2", "1"]
        assert [r["margin"] for r in rows] == [3.0, 2.0]

    def test_trailing_reward_dim(self):
        rollouts = flat_rollouts([("a", "1", 0.0), ("a", "2", 1.0)], reward_shape=(1,))
        assert len(build_preference_pairs(rollouts)) == 1
        grouped = group_rollouts([[("a", "1", 0.0), ("a", "2", 1.0)]])
        grouped.set("reward", grouped.get("reward").unsqueeze(-1))
        assert len(build_preference_pairs(grouped)) == 1

    def test_group_key(self):
        rollouts = flat_rollouts([("a", "1", 0.0), ("a", "2", 1.0), ("a", "3", 5.0)])
        rollouts.set("prompt_id", torch.tensor([0, 0, 1]))
        rows = hf_rows(build_preference_pairs(rollouts, group_key="prompt_id"))
        assert len(rows) == 1 and rows[0]["chosen"] == [assistant("2")]

    def test_list_of_batches_and_replay_buffer(self):
        first = flat_rollouts([("a", "1", 0.0), ("b", "1", 0.0)])
        second = flat_rollouts([("a", "2", 1.0), ("b", "2", -1.0)])
        rows = hf_rows(build_preference_pairs([first, second]))
        assert [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows] == [
            ("2", "1"),
            ("1", "2"),
        ]
        source = ReplayBuffer(storage=LazyStackStorage(10))
        source.extend(first)
        source.extend(second)
        assert hf_rows(build_preference_pairs(source)) == rows

    def test_implicit_prompt_and_custom_keys(self):
        rollouts = group_rollouts([[("a", "x", 1.0), ("a", "y", 0.0)]])
        rb = build_preference_pairs(
            rollouts,
            prompt_key=None,
            chosen_key=("pairs", "chosen"),
            rejected_key=("pairs", "rejected"),
            margin_key=None,
        )
        (row,) = hf_rows(rb)
        assert row == {"pairs.chosen": chat("a", "x"), "pairs.rejected": chat("a", "y")}

    def test_extends_a_given_buffer(self):
        rb = ReplayBuffer(storage=ListStorage(10))
        rollouts = group_rollouts([[("a", "x", 1.0), ("a", "y", 0.0)]])
        build_preference_pairs(rollouts, replay_buffer=rb)
        out = build_preference_pairs(rollouts, replay_buffer=rb)
        assert out is rb and len(rb) == 2
        with set_list_to_stack(True):
            assert history_to_messages(rb[0]["chosen"]) == [assistant("x")]

    def test_tool_turns_in_completion(self):
        tool = {"role": "tool", "content": "42"}
        conversations = [
            [user("q"), assistant("call"), tool, assistant("good")],
            [user("q"), assistant("call"), tool, assistant("bad")],
        ]
        rollouts = TensorDict(
            {
                "history": {"full": messages_to_history(conversations)},
                "reward": torch.tensor([1.0, 0.0]),
            },
            batch_size=[2],
        )
        (row,) = hf_rows(build_preference_pairs(rollouts, completion_roles=("assistant", "tool")))
        assert row["prompt"] == [user("q")]
        assert row["chosen"] == conversations[0][1:]

    def test_global_mode_off(self):
        rollouts = group_rollouts([[("a", "x", 1.0), ("a", "y", 0.0)]])
        with set_list_to_stack(False):
            rb = build_preference_pairs(rollouts)
        assert len(rb) == 1


class TestErrors:
    def test_rollouts_type(self):
        with pytest.raises(TypeError, match="rollouts must be a TensorDict"):
            build_preference_pairs([{"history": None}])

    def test_replay_buffer_type(self):
        with pytest.raises(TypeError, match="replay_buffer must be a torchrl ReplayBuffer"):
            build_preference_pairs(group_rollouts([[("a", "x", 1.0)]]), replay_buffer=[])

    def test_missing_history(self):
        with pytest.raises(KeyError, match=r"history_key='messages' not found in rollouts"):
            build_preference_pairs(group_rollouts([[("a", "x", 1.0)]]), history_key="messages")

    def test_history_type(self):
        td = TensorDict({"history": {"full": torch.zeros(2, 3)}, "reward": torch.zeros(2)}, [2])
        with pytest.raises(TypeError, match="expected a torchrl.data.llm.History"):
            build_preference_pairs(td)

    def test_missing_reward(self):
        with pytest.raises(KeyError, match="reward_key='score' not found"):
            build_preference_pairs(group_rollouts([[("a", "x", 1.0)]]), reward_key="score")

    def test_reward_type(self):
        td = group_rollouts([[("a", "x", 1.0)]])
        td.set("score", "high")
        with pytest.raises(TypeError, match="expected a float tensor"):
            build_preference_pairs(td, reward_key="score")

    def test_reward_shape(self):
        td = group_rollouts([[("a", "x", 1.0), ("a", "y", 0.0)]])
        td.set("reward", torch.zeros(1, 2, 3))
        with pytest.raises(ValueError, match=r"has shape \(1, 2, 3\); expected one reward"):
            build_preference_pairs(td)

    def test_missing_group_key(self):
        with pytest.raises(KeyError, match="group_key='pid' not found"):
            build_preference_pairs(group_rollouts([[("a", "x", 1.0)]]), group_key="pid")

    def test_no_batch_dim(self):
        td = group_rollouts([[("a", "x", 1.0)]])[0, 0]
        with pytest.raises(ValueError, match=r"batch_size=\[\] \(a single rollout\)"):
            build_preference_pairs(td)

    def test_no_completion_turn(self):
        history = messages_to_history([[user("a")], [user("a"), assistant("b")]])
        td = TensorDict({"history": {"full": history}, "reward": torch.zeros(2)}, [2])
        # one name opens the message: the call the user made (not the split it runs per rollout)
        match = (
            r"^build_preference_pairs: rollout 0 of rollouts: the conversation ends with a 'user'"
        )
        with pytest.raises(ValueError, match=match):
            build_preference_pairs(td)

    def test_group_with_different_prompts(self):
        rollouts = group_rollouts([[("a", "x", 1.0), ("b", "y", 0.0)]])
        with pytest.raises(ValueError, match="same group as earlier rollouts but has a different"):
            build_preference_pairs(rollouts)

    def test_empty_prompt(self):
        history = messages_to_history([[assistant("x")], [assistant("y")]])
        td = TensorDict({"history": {"full": history}, "reward": torch.tensor([1.0, 0.0])}, [2])
        with pytest.raises(ValueError, match="Pass prompt_key=None"):
            build_preference_pairs(td)
        assert len(build_preference_pairs(td, prompt_key=None)) == 1

    @pytest.mark.parametrize("bad", [-1.0, math.nan])
    def test_min_margin(self, bad):
        with pytest.raises(ValueError, match="min_margin must be a float >= 0"):
            build_preference_pairs(group_rollouts([[("a", "x", 1.0)]]), min_margin=bad)


class TestTRLFormat:
    def test_rows_are_trl_conversational_preferences(self):
        from trl.data_utils import is_conversational

        rollouts = group_rollouts(
            [[("a", "x", 1.0), ("a", "y", 0.0)], [("b", "x", 0.0), ("b", "y", 2.0)]]
        )
        data = TorchRLBufferDataset(build_preference_pairs(rollouts), batch_size=2).to_hf_dataset()
        assert set(data.column_names) == {"prompt", "chosen", "rejected", "margin"}
        assert all(is_conversational(row) for row in data)
        assert data.features["margin"].dtype == "float64"


class TestFromCollector:
    def test_llm_collector_rollouts(self):
        """Rollouts collected by TorchRL's LLMCollector (ragged History), scored, paired."""
        from torchrl.collectors.llm import LLMCollector
        from torchrl.envs.llm import ChatEnv
        from torchrl.envs.llm.transforms import DataLoadingPrimer
        from torchrl.modules.llm import TransformersWrapper

        from torchrl_trl_interop import TRLRewardFuncWrapper
        from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer

        tok = toy_tokenizer(padding_side="left")
        queries = ["What is two plus two?", "Hello world!"]
        dataloader = torch.utils.data.DataLoader(
            [{"query": q} for q in queries],
            batch_size=2,
            collate_fn=lambda batch: {"query": [b["query"] for b in batch]},
        )
        with torch.random.fork_rng(devices=[]):  # seeded sampling, global RNG untouched
            torch.manual_seed(0)
            rollouts = ReplayBuffer(storage=LazyStackStorage(100))
            with set_list_to_stack(True):
                env = ChatEnv(
                    batch_size=(2,), tokenizer=tok, input_mode="history", system_prompt="Hi."
                )
                env = env.append_transform(
                    DataLoadingPrimer(dataloader=dataloader, repeats=2, batch_size=(2,))
                )
                policy = TransformersWrapper(
                    toy_causal_lm(tokenizer=tok),
                    tokenizer=tok,
                    input_mode="history",
                    generate=True,
                    generate_kwargs={"max_new_tokens": 4, "do_sample": True},
                    pad_output=False,
                )
                collector = LLMCollector(
                    env,
                    policy=policy,
                    dialog_turns_per_batch=4,
                    total_dialog_turns=8,
                    replay_buffer=rollouts,
                )
                for _ in collector:
                    pass
        assert len(rollouts) == 8

        def length(completions, **kwargs):
            return [float(sum(len(m["content"]) for m in c)) for c in completions]

        scored = TRLRewardFuncWrapper(length)(rollouts[:])
        rb = build_preference_pairs(scored)
        rows = hf_rows(rb)
        assert 1 <= len(rows) <= len(queries)
        for row in rows:
            assert [m["role"] for m in row["prompt"]] == ["system", "user"]
            assert row["prompt"][1]["content"] in queries
            assert {m["role"] for m in row["chosen"] + row["rejected"]} == {"assistant"}
            assert row["margin"] == length([row["chosen"]])[0] - length([row["rejected"]])[0] > 0


def test_preference_pairs_refuse_infinite_rewards():
    """Regression (issue 10, item 5): ±inf rewards gave pairs with margin=inf (NaN is left out, as before)."""
    td = TensorDict(
        {
            "history": {
                "full": messages_to_history(
                    [chat("2+2?", "4"), chat("2+2?", "5"), chat("2+2?", "6")]
                )
            }
        },
        [3],
    )
    td["reward"] = torch.tensor([math.inf, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"'reward'\] holds 1 infinite reward.*indices \[0\]"):
        build_preference_pairs(td)
    td["reward"] = torch.tensor([math.nan, 1.0, 0.0])
    assert build_preference_pairs(td)[:]["margin"].tolist() == [1.0]


def test_preference_pairs_refuse_a_margin_that_overflows():
    """Regression (issue 20, item 10): two finite rewards far apart (±1e308) gave margin=inf."""
    history = messages_to_history([[chat("2+2?", "4"), chat("2+2?", "5")]])
    td = TensorDict({"history": {"full": history}}, [1, 2])
    td["reward"] = torch.tensor([[1e308, -1e308]], dtype=torch.float64)
    assert math.isinf(1e308 - -1e308)
    with pytest.raises(ValueError, match=r"rewards 1e\+308 and -1e\+308 .* overflows float64"):
        build_preference_pairs(td)
    # without a margin the pair is well defined; with rewards half as far apart, the margin is finite
    row = hf_rows(build_preference_pairs(td, margin_key=None))[0]
    assert (row["chosen"], row["rejected"], "margin" in row) == (
        [assistant("4")],
        [assistant("5")],
        False,
    )
    td["reward"] = td["reward"] / 2
    assert build_preference_pairs(td)[:]["margin"].tolist() == [1e308]
