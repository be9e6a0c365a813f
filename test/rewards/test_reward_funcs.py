"""Tests for torchrl_trl_interop.rewards: reward functions both ways, TorchRL <-> TRL."""

from __future__ import annotations

import asyncio
import functools
import math

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from tensordict.nn import TensorDictModuleBase, TensorDictSequential

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    TRLRewardFuncWrapper,
    as_trl_reward_func,
    history_to_messages,
    messages_to_history,
    split_prompt_completion,
)
from torchrl_trl_interop.testing import toy_chats, toy_reward_model, toy_tokenizer

# -- fixtures ------------------------------------------------------------------------------


def conversations(n: int = 6) -> list[list[dict[str, str]]]:
    """Ragged chats that end with an assistant turn, as rollouts do."""
    answers = ["4", "<think>hmm</think>four", "", "Hello world! ✓", "2", "日本"]
    chats = [c[:-1] if c[-1]["role"] == "assistant" else c for c in toy_chats(n)]
    return [
        c + [{"role": "assistant", "content": answers[i % len(answers)]}]
        for i, c in enumerate(chats)
    ]


def trl_inputs(chats):
    """What GRPOTrainer passes for these conversations: prompts and completions."""
    pairs = [split_prompt_completion(c) for c in chats]
    return [p for p, _ in pairs], [c for _, c in pairs]


def history_td(chats, shape=None) -> TensorDict:
    shape = shape or [len(chats)]
    if len(shape) == 2:
        g = shape[1]
        nested = [chats[i : i + g] for i in range(0, len(chats), g)]
        return TensorDict({"history": {"full": messages_to_history(nested)}}, batch_size=shape)
    return TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=shape)


class AnswerLength(TensorDictModuleBase):
    """A TorchRL reward module reading History: length of the last turn."""

    def __init__(self, history_key=("history", "full"), reward_key="reward"):
        super().__init__()
        self.in_keys, self.out_keys = [history_key], [reward_key]
        self.calls = 0

    def forward(self, td):
        self.calls += 1
        chats = history_to_messages(td.get(self.in_keys[0]))
        lengths = [float(len(c[-1]["content"])) for c in chats]
        return td.set(self.out_keys[0], torch.tensor(lengths).reshape(td.batch_size))


class ReadsEverything(TensorDictModuleBase):
    """Records what it was given: text, completion ids and an extra column."""

    in_keys = ["text", "completion_ids", "answer"]
    out_keys = ["reward"]

    def forward(self, td):
        self.seen = {
            "text": td.get("text").tolist(),
            "ids": [t.tolist() for t in td.get("completion_ids", as_list=True)],
            "answer": td.get("answer").tolist(),
        }
        return td.set("reward", torch.arange(td.batch_size[0], dtype=torch.float32))


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def rm_model(tok):
    return toy_reward_model("llama", tokenizer=tok)


def trl_native_reward_model_scores(model, tok, prompts, completions) -> list[float]:
    """How GRPOTrainer._calculate_rewards scores an nn.Module reward model (trl 1.16)."""
    from trl.data_utils import apply_chat_template, is_conversational

    if is_conversational({"prompt": prompts[0]}):
        texts = [
            apply_chat_template({"messages": p + c}, tok)["text"]
            for p, c in zip(prompts, completions)
        ]
    else:
        texts = [p + c for p, c in zip(prompts, completions)]
    inputs = tok(
        text=texts,
        return_tensors="pt",
        padding=True,
        padding_side="right",
        add_special_tokens=False,
    )
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].tolist()


# -- TorchRL -> TRL ------------------------------------------------------------------------


class TestAsTRLRewardFunc:
    def test_conversational(self):
        prompts, completions = trl_inputs(conversations())
        func = as_trl_reward_func(AnswerLength())
        out = func(prompts=prompts, completions=completions, completion_ids=None)
        assert out == [float(len(c[0]["content"])) for c in completions]
        assert all(isinstance(r, float) for r in out)

    def test_names(self):
        from trl.trainer.utils import get_callable_name, is_async_callable

        func = as_trl_reward_func(AnswerLength())
        assert func.__name__ == "AnswerLength" == get_callable_name(func)
        assert not is_async_callable(func)
        assert not isinstance(func, torch.nn.Module)  # else TRL would feed it token ids
        assert as_trl_reward_func(AnswerLength(), name="len").__name__ == "len"

    def test_named_after_the_model_id(self, rm_model, tok):
        rm = HFRewardModelWrapper(rm_model, tokenizer=tok, history_key=("history", "full"))
        assert as_trl_reward_func(rm).__name__ == "HFRewardModelWrapper"
        rm_model.config._name_or_path = "org/tiny-rm"
        try:
            assert as_trl_reward_func(rm).__name__ == "tiny-rm"
        finally:
            rm_model.config._name_or_path = ""

    def test_reward_model_history_matches_trl(self, rm_model, tok):
        prompts, completions = trl_inputs(conversations())
        rm = HFRewardModelWrapper(rm_model, tokenizer=tok, history_key=("history", "full"))
        out = as_trl_reward_func(rm)(prompts, completions, None)
        expected = trl_native_reward_model_scores(rm_model, tok, prompts, completions)
        torch.testing.assert_close(torch.tensor(out), torch.tensor(expected), atol=1e-5, rtol=0)

    def test_reward_model_text_matches_trl(self, rm_model, tok):
        prompts = ["The sky is", "Two plus", "Hello"]
        completions = [" blue.", " two is four", ""]
        rm = HFRewardModelWrapper(rm_model, tokenizer=tok, text_key="text", append_eos=False)
        out = as_trl_reward_func(rm, text_key="text")(prompts, completions, None)
        expected = trl_native_reward_model_scores(rm_model, tok, prompts, completions)
        torch.testing.assert_close(torch.tensor(out), torch.tensor(expected), atol=1e-5, rtol=0)

    @pytest.mark.parametrize("conversational", [True, False])
    def test_reward_model_tokens_match_trl(self, rm_model, tok, conversational):
        if conversational:
            prompts, completions = trl_inputs(conversations(4))
        else:
            prompts, completions = ["The sky is", "Two plus"], [" blue.", " two"]
        rm = HFRewardModelWrapper(rm_model)  # reads ("tokens", "full") + its mask
        func = as_trl_reward_func(rm, token_key=("tokens", "full"), processing_class=tok)
        out = func(prompts, completions, None)
        expected = trl_native_reward_model_scores(rm_model, tok, prompts, completions)
        torch.testing.assert_close(torch.tensor(out), torch.tensor(expected), atol=1e-5, rtol=0)

    def test_text_completion_ids_and_kwargs(self, tok):
        module = ReadsEverything()
        func = as_trl_reward_func(
            module,
            history_key=None,
            text_key="text",
            completion_ids_key="completion_ids",
            kwargs_keys={"answer": "answer"},
        )
        out = func(
            prompts=["a", "b"],
            completions=["1", "2"],
            completion_ids=[[5, 6], [7]],
            answer=["x", "y"],
            trainer_state=None,  # TRL's extra kwargs are accepted and not forwarded
        )
        assert out == [0.0, 1.0]
        assert module.seen == {"text": ["a1", "b2"], "ids": [[5, 6], [7]], "answer": ["x", "y"]}

    def test_conversational_text_rendered_with_the_chat_template(self, tok):
        module = ReadsEverything()
        func = as_trl_reward_func(
            module,
            text_key="text",
            completion_ids_key="completion_ids",
            kwargs_keys={"answer": "answer"},
            processing_class=tok,
        )
        prompts, completions = trl_inputs(conversations(2))
        func(prompts, completions, [[1], [2]], answer=["x", "y"])
        expected = [
            tok.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)
        ]
        assert module.seen["text"] == expected

    def test_max_batch_size(self):
        prompts, completions = trl_inputs(conversations(5))
        module = AnswerLength()
        whole = as_trl_reward_func(module)(prompts, completions, None)
        module.calls = 0
        chunked = as_trl_reward_func(module, max_batch_size=2)(prompts, completions, None)
        assert chunked == whole and module.calls == 3

    def test_buckets_sorted_by_length(self):
        """Rows reach the module sorted by length, ``max_batch_size`` at a time (as
        HFRewardModelWrapper buckets its rows); the rewards come back in the callers' order."""
        answers = ["x" * n for n in (9, 1, 7, 3, 5, 8, 2)]
        prompts = [[{"role": "user", "content": "Hi"}]] * len(answers)
        completions = [[{"role": "assistant", "content": a}] for a in answers]
        module = AnswerLength()
        seen = []
        module.register_forward_hook(lambda m, args, out: seen.append(out["reward"].tolist()))
        out = as_trl_reward_func(module, max_batch_size=3)(prompts, completions, None)
        assert out == [float(len(a)) for a in answers]
        assert seen == [[1.0, 2.0, 3.0], [5.0, 7.0, 8.0], [9.0]]
        seen.clear()
        assert as_trl_reward_func(module, max_batch_size=None)(prompts, completions, None) == out
        assert len(seen) == 1

    def test_empty_batch(self):
        assert as_trl_reward_func(AnswerLength())([], [], []) == []

    def test_async_and_sync_trl_reward_funcs_from_grpo(self):
        """The callable also works in a TRLRewardFuncWrapper (a round trip through TRL's form)."""
        td = history_td(conversations())
        expected = AnswerLength()(td.clone()).get("reward")
        got = TRLRewardFuncWrapper(as_trl_reward_func(AnswerLength()))(td).get("reward")
        assert torch.equal(got, expected)


class TestAsTRLRewardFuncInputMode:
    """``input_mode="history" | "text" | "tokens"`` (issue 19): one form written, at its key."""

    def test_history_is_the_default(self):
        func = as_trl_reward_func(AnswerLength(), input_mode="history")
        assert as_trl_reward_func(AnswerLength()).input_mode == func.input_mode == "history"
        assert func.history_key == ("history", "full") and func.text_key is None
        prompts, completions = trl_inputs(conversations())
        assert func(prompts, completions, None) == [
            float(len(c[0]["content"])) for c in completions
        ]

    @pytest.mark.parametrize(
        ("mode", "written"),
        [
            ("text", {"text_key": ("text", "full")}),
            (
                "tokens",
                {
                    "token_key": ("tokens", "full"),
                    "attention_mask_key": ("masks", "all_attention_mask"),
                },
            ),
        ],
    )
    @pytest.mark.parametrize("conversational", [True, False])
    def test_writes_torchrls_keys(self, rm_model, tok, mode, written, conversational):
        if conversational:
            prompts, completions = trl_inputs(conversations(3))
        else:
            prompts, completions = ["The sky is", "Two plus"], [" blue.", " two is four"]
        text = {"tokenizer": tok, "append_eos": False} if mode == "text" else {}
        rm = HFRewardModelWrapper(rm_model, input_mode=mode, **text)
        func = as_trl_reward_func(rm, input_mode=mode, processing_class=tok)
        assert {arg: getattr(func, arg) for arg in written} == written
        assert func.history_key is None
        assert f"input_mode={mode!r}" in repr(func)
        expected = trl_native_reward_model_scores(rm_model, tok, prompts, completions)
        torch.testing.assert_close(
            torch.tensor(func(prompts, completions, None)),
            torch.tensor(expected),
            atol=1e-5,
            rtol=0,
        )


class TestAsTRLRewardFuncErrors:
    def test_module_type(self):
        with pytest.raises(
            TypeError,
            match=r"^as_trl_reward_func: module must be a tensordict TensorDictModuleBase that writes a reward",
        ):
            as_trl_reward_func(lambda td: td)

    def test_name_type(self):
        with pytest.raises(TypeError, match="name must be a str"):
            as_trl_reward_func(AnswerLength(), name=3)

    def test_max_batch_size(self):
        with pytest.raises(
            ValueError, match="max_batch_size must be a positive int or None, got max_batch_size=0"
        ):
            as_trl_reward_func(AnswerLength(), max_batch_size=0)

    def test_tokens_need_a_tokenizer(self):
        with pytest.raises(ValueError, match="token_key=.* needs processing_class="):
            as_trl_reward_func(AnswerLength(), token_key=("tokens", "full"))

    def test_no_input(self):
        with pytest.raises(ValueError, match="are all None"):
            as_trl_reward_func(AnswerLength(), history_key=None)

    def test_duplicate_keys(self):
        with pytest.raises(ValueError, match="used for two inputs"):
            as_trl_reward_func(AnswerLength(), text_key="x", kwargs_keys={"a": "x"})

    def test_standard_input_without_text_key(self):
        func = as_trl_reward_func(AnswerLength())
        with pytest.raises(ValueError, match="cannot be written as History; pass text_key="):
            func(["a"], ["b"], None)

    def test_conversational_text_without_tokenizer(self):
        func = as_trl_reward_func(AnswerLength(), text_key="text")
        prompts, completions = trl_inputs(conversations(1))
        with pytest.raises(ValueError, match="need processing_class= to be rendered"):
            func(prompts, completions, None)

    def test_missing_reward(self):
        func = as_trl_reward_func(AnswerLength(), reward_key="score")
        prompts, completions = trl_inputs(conversations(1))
        with pytest.raises(KeyError, match="wrote no reward at reward_key='score'"):
            func(prompts, completions, None)

    def test_missing_kwargs_column(self):
        func = as_trl_reward_func(AnswerLength(), kwargs_keys={"answer": "answer"})
        prompts, completions = trl_inputs(conversations(1))
        with pytest.raises(KeyError, match="names the column 'answer', which the trainer"):
            func(prompts, completions, None, trainer_state=None)

    def test_kwargs_column_length(self):
        func = as_trl_reward_func(AnswerLength(), kwargs_keys={"answer": "answer"})
        prompts, completions = trl_inputs(conversations(2))
        with pytest.raises(ValueError, match="should be a list with one value per completion"):
            func(prompts, completions, None, answer=["x"])

    def test_completion_ids_missing(self):
        func = as_trl_reward_func(AnswerLength(), completion_ids_key="ids")
        prompts, completions = trl_inputs(conversations(1))
        with pytest.raises(ValueError, match="caller passed completion_ids=None"):
            func(prompts, completions, None)

    def test_reward_count(self):
        class TwoRewards(TensorDictModuleBase):
            in_keys, out_keys = [("history", "full")], ["reward"]

            def forward(self, td):
                return td.set("reward", torch.zeros(*td.batch_size, 2))

        func = as_trl_reward_func(TwoRewards())
        prompts, completions = trl_inputs(conversations(2))
        with pytest.raises(ValueError, match=r"expected one value per completion \(2\)"):
            func(prompts, completions, None)

    def test_prompt_completion_mismatch(self):
        func = as_trl_reward_func(AnswerLength())
        with pytest.raises(ValueError, match="got 2 prompts but 1 completions"):
            func(
                [[{"role": "user", "content": "a"}]] * 2, [[{"role": "assistant", "content": "b"}]]
            )


# -- TRL -> TorchRL ------------------------------------------------------------------------


def brevity(prompts, completions, completion_ids=None, **kwargs):
    return [-float(len(c[0]["content"])) for c in completions]


def only_digits(completions, **kwargs):
    return [1.0 if c[0]["content"].isdigit() else None for c in completions]


async def async_has_think(completions, **kwargs):
    await asyncio.sleep(0)
    return [float("<think>" in c[0]["content"]) for c in completions]


class Scaled:
    """A callable class instance (TRL names it by its class)."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, prompts, completions, **kwargs):
        return [self.scale * len(p) for p in prompts]


def expected_trl_aggregate(
    per_func: list[list[float | None]], weights: list[float]
) -> torch.Tensor:
    """GRPOTrainer's sum_then_normalize aggregation before normalisation (trl 1.16)."""
    rewards = torch.tensor(
        [[math.nan if r is None else r for r in col] for col in per_func], dtype=torch.float32
    ).T
    out = (rewards * torch.tensor(weights)).nansum(dim=1)
    out[torch.isnan(rewards).all(dim=1)] = math.nan
    return out


class TestTRLRewardFuncWrapper:
    @pytest.mark.parametrize("shape", [[6], [2, 3], [3, 2]])
    def test_batch_shapes(self, shape):
        chats = conversations(6)
        td = history_td(chats, shape)
        funcs = [brevity, only_digits, async_has_think, Scaled(0.5)]
        weights = [1.0, 2.0, 0.5, -1.0]
        out = TRLRewardFuncWrapper(funcs, weights=weights, reward_per_func_key="per_func")(td)
        prompts, completions = trl_inputs(chats)
        per_func = [
            brevity(prompts, completions),
            only_digits(completions),
            asyncio.run(async_has_think(completions)),
            Scaled(0.5)(prompts, completions),
        ]
        expected = expected_trl_aggregate(per_func, weights)
        assert out.get("reward").shape == torch.Size(shape)
        assert out.get("reward").dtype == torch.float32
        torch.testing.assert_close(out.get("reward").reshape(-1), expected, equal_nan=True)
        assert out.get("per_func").shape == torch.Size([*shape, 4])
        assert torch.isnan(out.get("per_func").reshape(-1, 4)[:, 1]).sum() == sum(
            r is None for r in per_func[1]
        )

    def test_single_rollout(self):
        td = history_td(conversations(1))[0]
        out = TRLRewardFuncWrapper(brevity)(td)
        assert out.get("reward").shape == torch.Size([])

    def test_all_none_is_nan(self):
        td = history_td(conversations(6))
        reward = TRLRewardFuncWrapper(only_digits)(td).get("reward")
        digits = [c[-1]["content"].isdigit() for c in conversations(6)]
        assert [not math.isnan(r) for r in reward.tolist()] == digits

    def test_ragged_rollouts_as_collected(self):
        """Lazy stacks of rows, as TorchRL's LLM collectors write them (pad_output=False)."""
        chats = conversations(4)
        rows = [
            TensorDict(
                {
                    "history": {"full": messages_to_history(c)},
                    "tokens": {"response": torch.arange(i + 1)},
                }
            )
            for i, c in enumerate(chats)
        ]
        with set_list_to_stack(True):
            td = lazy_stack(rows)
        seen = {}

        def record(prompts, completions, completion_ids, **kwargs):
            seen["ids"] = completion_ids
            return [float(len(ids)) for ids in completion_ids]

        out = TRLRewardFuncWrapper(record, completion_ids_key=("tokens", "response"))(td)
        assert seen["ids"] == [list(range(i + 1)) for i in range(4)]
        assert out.get("reward").tolist() == [1.0, 2.0, 3.0, 4.0]

    def test_trl_builtin_reward_funcs(self):
        from trl.rewards import get_soft_overlong_punishment, think_format_reward

        chats = conversations(6)
        ids = [list(range(3 * i)) for i in range(6)]
        td = history_td(chats)
        td.set("ids", torch.nn.utils.rnn.pad_sequence([torch.tensor(i) for i in ids], True)[:, :0])
        overlong = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=5)
        rows = [
            TensorDict({"history": {"full": messages_to_history(c)}, "ids": torch.tensor(i)})
            for c, i in zip(chats, ids)
        ]
        with set_list_to_stack(True):
            td = lazy_stack(rows)
        out = TRLRewardFuncWrapper(
            [think_format_reward, overlong], completion_ids_key="ids", reward_per_func_key="each"
        )(td)
        prompts, completions = trl_inputs(chats)
        assert out.get("each")[:, 0].tolist() == think_format_reward(completions)
        assert out.get("each")[:, 1].tolist() == pytest.approx(overlong(completion_ids=ids))

    def test_text_mode_and_kwargs(self):
        td = TensorDict(
            {
                "text": {"prompt": ["2+2=", "3+3="], "response": ["4", "7"]},
                "answer": ["4", "6"],
            },
            batch_size=[2],
        )

        def correct(prompts, completions, answer, **kwargs):
            assert prompts == ["2+2=", "3+3="]
            return [float(c == a) for c, a in zip(completions, answer)]

        wrapper = TRLRewardFuncWrapper(
            correct,
            prompt_key=("text", "prompt"),
            completion_key=("text", "response"),
            kwargs_keys={"answer": "answer"},
        )
        assert wrapper.in_keys == [("text", "prompt"), ("text", "response"), "answer"]
        assert wrapper(td).get("reward").tolist() == [1.0, 0.0]

    def test_partial_and_names(self):
        scaled = functools.partial(Scaled(2.0).__call__)
        wrapper = TRLRewardFuncWrapper([brevity, async_has_think, Scaled(1.0), scaled])
        assert wrapper.reward_func_names == ["brevity", "async_has_think", "Scaled", "__call__"]
        assert "reward_funcs=['brevity', 'async_has_think', 'Scaled', '__call__']" in repr(wrapper)

    def test_inside_a_running_event_loop(self):
        td = history_td(conversations(3))

        async def main():
            return TRLRewardFuncWrapper(async_has_think)(td).get("reward")

        assert asyncio.run(main()).tolist() == [0.0, 1.0, 0.0]

    def test_inference_mode(self):
        td = history_td(conversations(3))
        with torch.inference_mode():
            reward = TRLRewardFuncWrapper(brevity)(td).get("reward")
        assert not reward.is_inference()

    def test_in_a_torchrl_pipeline(self):
        from torchrl.envs.transforms import ModuleTransform

        td = history_td(conversations(4))
        seq = TensorDictSequential(TRLRewardFuncWrapper(brevity, reward_key="r"))
        assert seq(td.clone()).get("r").tolist() == brevity(*trl_inputs(conversations(4)))
        transform = ModuleTransform(module=TRLRewardFuncWrapper(brevity, reward_key="r"))
        assert transform(td.clone()).get("r").tolist() == brevity(*trl_inputs(conversations(4)))

    def test_global_mode_off(self):
        td = history_td(conversations(2))
        with set_list_to_stack(False):
            reward = TRLRewardFuncWrapper(brevity)(td).get("reward")
        assert reward.tolist() == brevity(*trl_inputs(conversations(2)))


class TestTRLRewardFuncWrapperInputMode:
    """``input_mode="history" | "text"``, as ``ChatEnv`` names them (issue 19)."""

    def text_td(self) -> TensorDict:
        texts = {"prompt": ["2+2=", "3+3="], "response": ["4", "10"]}
        return TensorDict({"text": texts, "q": ["a", "b"]}, batch_size=[2])

    @staticmethod
    def record(seen):
        def f(prompts, completions, **kwargs):
            seen.append((prompts, completions))
            return [float(len(c)) for c in completions]

        return f

    def test_text_mode_reads_torchrls_text_keys(self):
        seen = []
        wrapper = TRLRewardFuncWrapper(self.record(seen), input_mode="text")
        assert wrapper.input_mode == "text"
        assert wrapper.in_keys == [("text", "prompt"), ("text", "response")]
        assert wrapper(self.text_td())["reward"].tolist() == [1.0, 2.0]
        legacy = TRLRewardFuncWrapper(
            self.record(seen), prompt_key=("text", "prompt"), completion_key=("text", "response")
        )
        assert legacy.input_mode == "text"
        assert legacy(self.text_td())["reward"].tolist() == [1.0, 2.0]
        assert seen[0] == seen[1] == (["2+2=", "3+3="], ["4", "10"])

    def test_text_mode_with_one_key_of_its_own(self):
        seen = []
        wrapper = TRLRewardFuncWrapper(self.record(seen), input_mode="text", prompt_key="q")
        assert wrapper.in_keys == ["q", ("text", "response")]
        wrapper(self.text_td())
        assert seen == [(["a", "b"], ["4", "10"])]

    def test_history_mode_is_the_default(self):
        td = history_td(conversations(3))
        explicit = TRLRewardFuncWrapper(brevity, input_mode="history")
        assert TRLRewardFuncWrapper(brevity).input_mode == "history"
        assert explicit.in_keys == [("history", "full")]
        assert "input_mode='history'" in repr(explicit)
        assert explicit(td)["reward"].tolist() == brevity(*trl_inputs(conversations(3)))


class TestTRLRewardFuncWrapperErrors:
    def test_empty(self):
        with pytest.raises(ValueError, match="reward_funcs is empty"):
            TRLRewardFuncWrapper([])

    def test_model_id(self):
        with pytest.raises(TypeError, match="is the string 'org/rm' \\(a model id\\)"):
            TRLRewardFuncWrapper("org/rm")

    @pytest.mark.parametrize("bad", [torch.nn.Linear(1, 1), 3])
    def test_not_a_reward_function(self, bad):
        with pytest.raises(TypeError, match="expected a TRL reward function"):
            TRLRewardFuncWrapper([brevity, bad])

    def test_weights(self):
        with pytest.raises(ValueError, match="got 1 weights for 2 reward functions"):
            TRLRewardFuncWrapper([brevity, only_digits], weights=[1.0])

    def test_half_text_mode(self):
        with pytest.raises(ValueError, match="text mode needs both prompt_key and completion_key"):
            TRLRewardFuncWrapper(brevity, prompt_key="p")

    def test_history_and_text(self):
        with pytest.raises(ValueError, match="select two different inputs"):
            TRLRewardFuncWrapper(brevity, history_key="h", prompt_key="p", completion_key="c")

    def test_no_input(self):
        with pytest.raises(ValueError, match="history_key=None needs prompt_key="):
            TRLRewardFuncWrapper(brevity, history_key=None)

    def test_reserved_kwargs(self):
        with pytest.raises(ValueError, match=r"reserved name\(s\) \['prompts'\]"):
            TRLRewardFuncWrapper(brevity, kwargs_keys={"prompts": "p"})

    def test_duplicate_keys(self):
        with pytest.raises(ValueError, match="used for two inputs"):
            TRLRewardFuncWrapper(brevity, kwargs_keys={"h": ("history", "full")})

    def test_missing_key(self):
        with pytest.raises(KeyError, match="history_key='messages' not found in the input"):
            TRLRewardFuncWrapper(brevity, history_key="messages")(history_td(conversations(2)))

    def test_wrong_input_type(self):
        td = history_td(conversations(2))
        with pytest.raises(TypeError, match="holds a TensorDict; expected a History, strings"):
            TRLRewardFuncWrapper(brevity, history_key="history")(td)

    def test_no_completion_turn(self):
        chats = [c[:-1] for c in conversations(2)]  # now ends on a user turn
        with pytest.raises(ValueError, match="rollout 0 \\(flattened\\): .*holds no completion"):
            TRLRewardFuncWrapper(brevity)(history_td(chats))

    def test_wrong_count(self):
        with pytest.raises(ValueError, match="'short' returned 1 rewards but 2 were expected"):

            def short(completions, **kwargs):
                return [1.0]

            TRLRewardFuncWrapper(short)(history_td(conversations(2)))

    def test_wrong_output_type(self):
        with pytest.raises(TypeError, match="'scalar' returned a float"):

            def scalar(completions, **kwargs):
                return 1.0

            TRLRewardFuncWrapper(scalar)(history_td(conversations(2)))


# -- both directions agree -------------------------------------------------------------------


class TestBothDirectionsAgree:
    def test_same_rollouts_same_numbers(self, rm_model, tok):
        """Rollouts scored on the TorchRL side and on the TRL side give the same rewards."""
        chats = conversations(6)
        td = history_td(chats, [2, 3])
        prompts, completions = trl_inputs(chats)
        rm = HFRewardModelWrapper(
            rm_model, tokenizer=tok, history_key=("history", "full"), inference_mode=True
        )

        # TorchRL side: the module and the wrapped TRL functions, on the TensorDict.
        torchrl_rm = rm(td.clone()).get("reward").reshape(-1)
        torchrl_funcs = TRLRewardFuncWrapper(
            [brevity, only_digits], weights=[1.0, 3.0], reward_per_func_key="each"
        )(td.clone())

        # TRL side: the bridged module and the functions, called as GRPOTrainer calls them.
        trl_rm = as_trl_reward_func(rm)(
            prompts=prompts, completions=completions, completion_ids=None
        )
        trl_brevity = brevity(prompts=prompts, completions=completions, completion_ids=None)
        trl_digits = only_digits(prompts=prompts, completions=completions, completion_ids=None)

        assert torchrl_rm.tolist() == trl_rm
        torch.testing.assert_close(
            torchrl_rm,
            torch.tensor(trl_native_reward_model_scores(rm_model, tok, prompts, completions)),
            atol=1e-5,
            rtol=0,
        )
        each = torchrl_funcs.get("each").reshape(-1, 2)
        assert each[:, 0].tolist() == trl_brevity
        torch.testing.assert_close(
            torchrl_funcs.get("reward").reshape(-1),
            expected_trl_aggregate([trl_brevity, trl_digits], [1.0, 3.0]),
            equal_nan=True,
        )

        # And the full round trip: module -> TRL function -> TorchRL module.
        round_trip = TRLRewardFuncWrapper([as_trl_reward_func(rm), brevity])(td.clone())
        torch.testing.assert_close(
            round_trip.get("reward").reshape(-1),
            torchrl_rm + torch.tensor(trl_brevity),
        )


def test_reward_key_defaults_to_the_modules_out_key():
    from torchrl_trl_interop import HFRewardModelWrapper, as_trl_reward_func
    from torchrl_trl_interop.testing import toy_reward_model, toy_tokenizer

    tok = toy_tokenizer()
    rm = HFRewardModelWrapper(
        toy_reward_model(tokenizer=tok), tokenizer=tok, text_key="text", reward_key="rm_reward"
    )
    func = as_trl_reward_func(rm, history_key=None, text_key="text")
    assert func.reward_key == "rm_reward"
    scores = func(prompts=["Hi"], completions=[" there"], completion_ids=[[1]])
    assert len(scores) == 1 and isinstance(scores[0], float)


def chat(answer: str) -> list[dict]:
    return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]


class TestRewardFunctionOutputs:
    """Regression (issue 10, item 6): a NaN weight zeroed scored rows, inf was written, strings became floats."""

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
