"""TorchRL environments as TRL GRPO's rollout engine: ``GRPOTrainer(rollout_func=as_trl_rollout_func(env))``.

Real ``GRPOTrainer.train()`` runs on toy models, single-turn and multi-turn (an environment that
answers every assistant turn with a tool message), conversational prompts. Log-probs are checked
against the trainer model's own forward pass at the time of the rollout.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torchrl.envs import PendulumEnv
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer
from torchrl.modules.llm import TransformersWrapper

from torchrl_trl_interop import RewardTransform, as_trl_rollout_func, score_final_answer
from torchrl_trl_interop.testing import (
    IM_END,
    IM_START,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_prompts,
    toy_tokenizer,
)
from torchrl_trl_interop.testing._tokenizer import PAD_TOKEN

# GRPOTrainer warns that rollout_func is experimental (TRL 1.16); expected here
pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

TOL = 1e-4


def answer_length(completions, **kwargs):
    """A TRL reward function, run inside the environment: length of the last answer."""
    return [float(len(c[-1]["content"])) for c in completions]


def own_logprobs(model, prompt_ids, completion_ids, temperature):
    """The model's own log-probs of ``completion_ids`` after ``prompt_ids``: one plain forward."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    p = len(prompt_ids)
    targets = torch.tensor(completion_ids)[:, None]
    return logits[p - 1 : -1].log_softmax(-1).gather(-1, targets).squeeze(-1)


class RolloutRecorder:
    """Wraps a rollout function; keeps each call's prompts, output and the model's own log-probs."""

    def __init__(self, rollout_func):
        self.rollout_func = rollout_func
        self.calls = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        own = [
            own_logprobs(model, p, c, trainer.temperature)
            for p, c in zip(out["prompt_ids"], out["completion_ids"])
        ]
        self.calls.append((copy.deepcopy(prompts), out, own))
        return out


class RewardRecorder:
    """A one-line GRPO reward function: the environment's reward. Records its keyword arguments."""

    __name__ = "env_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, history, env_reward, **kwargs):
        self.calls.append({"history": history, "env_reward": env_reward, "n": len(completions)})
        return list(env_reward)


def conversational_dataset(n=8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(n)]})


def grpo_trainer(
    tmp_path, tokenizer, rollout_func, reward_func, *, model=None, dataset=None, **overrides
):
    from trl import GRPOConfig, GRPOTrainer

    # fp32 (GRPOConfig defaults to bf16 autocast, on CPU too: compare in fp32), <|im_start|>
    # suppressed (a random toy model may sample it, which torchrl parses as a new turn)
    args = toy_grpo_args(tmp_path, tokenizer=tokenizer, **{"max_steps": 3, **overrides})
    return GRPOTrainer(
        model=model if model is not None else toy_causal_lm(tokenizer=tokenizer),
        reward_funcs=reward_func,
        args=GRPOConfig(**args),
        train_dataset=dataset if dataset is not None else conversational_dataset(),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def runs(mask):
    """``[1, 1, 0, 1]`` -> ``[(1, 0, 2), (0, 2, 3), (1, 3, 4)]``: (value, start, stop) runs."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def check_rows_and_rewards(recorder, rewards, group):
    """One row per prompt entry, in order; reward functions got history and env_reward per row."""
    assert recorder.calls and len(rewards.calls) == len(recorder.calls)
    for (prompts, out, _), got in zip(recorder.calls, rewards.calls):
        assert {k: len(v) for k, v in out.items()} == dict.fromkeys(out, len(prompts))
        for start in range(0, len(prompts), group):
            assert all(p == prompts[start] for p in prompts[start : start + group])
        for prompt, history in zip(prompts, out["history"]):
            assert history[: len(prompt)] == prompt  # row i is prompt i's rollout
        assert got["n"] == len(prompts)
        assert got["history"] == out["history"]
        assert got["env_reward"] == out["env_reward"]
        assert all(isinstance(r, float) for r in got["env_reward"])


def weights_of(model):
    return [p.detach().clone() for p in model.parameters()]


def moved(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


class TestSingleTurn:
    def test_trains_on_env_rollouts(self, tmp_path):
        tok = toy_tokenizer()
        # env batch 2 < 4 prompts per call: every call runs two resets
        env = toy_chat_env(tok, batch_size=2, transforms=[RewardTransform(answer_length)])
        recorder, rewards = RolloutRecorder(as_trl_rollout_func(env)), RewardRecorder()
        trainer = grpo_trainer(tmp_path, tok, recorder, rewards, temperature=0.8)
        before = weights_of(trainer.model)
        trainer.train()

        assert trainer.state.global_step == 3
        assert moved(before, trainer.model)
        check_rows_and_rewards(recorder, rewards, group=2)
        for _, out, own in recorder.calls:
            for i, history in enumerate(out["history"]):
                assert [m["role"] for m in history] == ["user", "assistant"]
                assert out["env_mask"][i] == [1] * len(out["completion_ids"][i])
                assert out["env_reward"][i] == float(len(history[-1]["content"]))
                logprobs = torch.tensor(out["logprobs"][i])
                torch.testing.assert_close(logprobs, own[i], atol=TOL, rtol=0)
                assert logprobs[0] != 0.0  # torchrl 0.14.1 writes 0.0 here

    def test_samples_with_the_trainers_current_weights(self, real_trainer):
        trainer, env = real_trainer
        rollout_func = as_trl_rollout_func(env)
        prompts = [[{"role": "user", "content": "Hi"}]] * 4
        forced = 65

        def force(module, args, output):
            output[..., forced] += 1e4  # in place on the trainer's own model object
            return output

        model = trainer.accelerator.unwrap_model(trainer.model)
        handle = model.lm_head.register_forward_hook(force)
        try:
            out = rollout_func(prompts, trainer)
        finally:
            handle.remove()
        assert all(ids == [forced] * len(ids) and ids for ids in out["completion_ids"])


class TestMultiTurn:
    @pytest.mark.parametrize(
        "pad_token, eos_bias",
        # pad == eos (GPT-2, Llama-3, Mistral), with a model that stops: its eos stays mid-rollout
        [(PAD_TOKEN, 0.0), (IM_END, 4.0)],
        ids=["pad_is_not_eos", "pad_is_eos"],
    )
    def test_env_tokens_are_masked(self, tmp_path, pad_token, eos_bias):
        tok = toy_tokenizer(pad_token=pad_token)
        # the env answers every turn with a tool message and ends the episode after 2 turns
        env = toy_chat_env(
            tok,
            batch_size=4,
            reply=True,
            max_steps=2,
            transforms=[RewardTransform(answer_length)],
        )
        recorder, rewards = RolloutRecorder(as_trl_rollout_func(env, max_turns=3)), RewardRecorder()
        model = toy_causal_lm(tokenizer=tok, eos_bias=eos_bias)
        trainer = grpo_trainer(tmp_path, tok, recorder, rewards, model=model)
        before = weights_of(trainer.model)
        trainer.train()

        assert trainer.state.global_step == 3
        assert moved(before, trainer.model)
        check_rows_and_rewards(recorder, rewards, group=2)
        env_text = re.compile(
            r"(<\|im_end\|>)?\n<\|im_start\|>tool\n(\d+) characters<\|im_end\|>\n<\|im_start\|>assistant\n"
        )
        stopped = 0
        for _, out, own in recorder.calls:
            for i, history in enumerate(out["history"]):
                ids, mask = out["completion_ids"][i], out["env_mask"][i]
                assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
                segments = runs(mask)
                assert [value for value, _, _ in segments] == [1, 0, 1]  # done after 2 turns
                (_, a0, b0), (_, a1, b1), (_, a2, b2) = segments
                first, env_part, second = ids[a0:b0], ids[a1:b1], ids[a2:b2]
                match = env_text.fullmatch(tok.decode(env_part, skip_special_tokens=False))
                assert match is not None
                # the env closes the assistant turn only when the policy did not (no eos)
                assert (match.group(1) is None) == (first[-1] == tok.eos_token_id)
                stopped += first[-1] == tok.eos_token_id
                assert history[2]["content"] == f"{match.group(2)} characters"
                for tokens, message in ((first, history[1]), (second, history[3])):
                    decoded = tok.decode(tokens, skip_special_tokens=True)
                    assert decoded.strip() == message["content"].strip()
                logprobs = torch.tensor(out["logprobs"][i])
                policy = torch.tensor(mask, dtype=torch.bool)
                torch.testing.assert_close(logprobs[policy], own[i][policy], atol=TOL, rtol=0)
                assert torch.all(logprobs[~policy] == 0.0)
                answers = [m["content"] for m in history if m["role"] == "assistant"]
                assert out["env_reward"][i] == float(sum(len(a) for a in answers))
        if eos_bias:
            assert stopped  # the policy's eos was kept (and continued from) in some rollouts


class CompletionRecorder:
    """A stock-style GRPO reward function (0.0, reads ``completions``) that records its inputs."""

    def __init__(self, name="completion_recorder"):
        self.__name__ = name
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        self.calls.append({"completions": completions, "completion_ids": completion_ids, **kwargs})
        return [0.0] * len(completions)


def clipped_ratios(trainer):
    return [h["completions/clipped_ratio"] for h in trainer.state.log_history if "loss" in h]


class TestPadIsEos:
    """Tokenizers whose pad token is the eos token (GPT-2, Llama-3, Mistral...)."""

    def test_completions_keep_the_eos_as_trl_generation_does(self, tmp_path):
        tok = toy_tokenizer(pad_token=IM_END)
        assert tok.pad_token_id == tok.eos_token_id
        runs = {}
        # TRL's own generation, then the env rollout: same model, same seed, same settings
        for name, rollout_func in (("trl", None), ("env", toy_chat_env(tok, batch_size=4))):
            if rollout_func is not None:
                rollout_func = as_trl_rollout_func(rollout_func)
            scored = CompletionRecorder()
            trainer = grpo_trainer(
                tmp_path / name,
                tok,
                rollout_func,
                scored,
                model=toy_causal_lm(tokenizer=tok, eos_bias=4.0),
                max_steps=2,
            )
            trainer.train()
            runs[name] = (scored.calls, clipped_ratios(trainer))

        (trl_calls, trl_clipped), (env_calls, env_clipped) = runs["trl"], runs["env"]
        ids = [c["completion_ids"] for c in env_calls]
        assert ids == [c["completion_ids"] for c in trl_calls]
        stopped = [row for step in ids for row in step if row[-1] == tok.eos_token_id]
        assert stopped and all(tok.eos_token_id not in row[:-1] for row in stopped)
        assert env_clipped == trl_clipped and min(env_clipped) < 1.0
        for call in env_calls:  # one turn: the final answer is the whole completion
            assert call["final_answer_ids"] == call["completion_ids"]
            texts = [c[0]["content"] for c in call["completions"]]
            assert call["final_answer"] == texts

    def test_torchrl_transformers_wrapper_is_refused(self, real_trainer):
        trainer, env = real_trainer
        tok = toy_tokenizer(pad_token=IM_END)
        policy = TransformersWrapper(
            toy_causal_lm(tokenizer=tok), tokenizer=tok, input_mode="history", generate=True
        )
        with pytest.raises(ValueError, match=r"pad token is an eos token \(pad_token_id=2"):
            as_trl_rollout_func(env, policy=policy)


class TestRaggedPrompts:
    """Conversations with different numbers of messages (some with a system message) in one batch."""

    @staticmethod
    def dataset():
        from datasets import Dataset

        short = [[{"role": "user", "content": p}] for p in toy_prompts(4)]
        long = [
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Yes?"},
                {"role": "user", "content": p},
            ]
            for p in toy_prompts(4)
        ]
        return Dataset.from_dict({"prompt": [m for pair in zip(short, long) for m in pair]})

    @pytest.mark.parametrize("max_turns", [1, 2])
    def test_trains(self, tmp_path, max_turns):
        tok = toy_tokenizer()
        env = toy_chat_env(
            tok,
            batch_size=4,
            reply=max_turns > 1,
            max_steps=max_turns,
            transforms=[RewardTransform(answer_length)],
        )
        recorder, rewards = (
            RolloutRecorder(as_trl_rollout_func(env, max_turns=max_turns)),
            RewardRecorder(),
        )
        trainer = grpo_trainer(
            tmp_path, tok, recorder, rewards, dataset=self.dataset(), shuffle_dataset=False
        )
        trainer.train()

        assert trainer.state.global_step == 3
        check_rows_and_rewards(recorder, rewards, group=2)
        for prompts, out, own in recorder.calls:
            assert len({len(p) for p in prompts}) == 2  # both kinds share every env batch
            for i, prompt in enumerate(prompts):
                rendered = tok.apply_chat_template(prompt, add_generation_prompt=True)
                assert out["prompt_ids"][i] == list(rendered["input_ids"])
                assert [m["role"] for m in out["history"][i][len(prompt) :]] == (
                    ["assistant", "tool", "assistant"] if max_turns > 1 else ["assistant"]
                )
                mask = torch.tensor(out["env_mask"][i], dtype=torch.bool)
                logprobs = torch.tensor(out["logprobs"][i])
                torch.testing.assert_close(logprobs[mask], own[i][mask], atol=TOL, rtol=0)

    def test_torchrl_transformers_wrapper_names_the_prompts(self, real_trainer):
        trainer, env = real_trainer
        policy = TestUserPolicy().policy(trainer)
        prompts = self.dataset()["prompt"][:2]
        prompts = [p for p in prompts for _ in range(2)]
        with pytest.raises(ValueError, match="prompts 0 and 2 share an env batch but have 1 and 4"):
            as_trl_rollout_func(env, policy=policy)(prompts, trainer)


class TestFinalAnswer:
    """Multi-turn: TRL's ``completions`` hold the environment's text; the final answer does not."""

    def test_stock_rewards_score_the_policys_last_turn(self, tmp_path):
        from trl.rewards import think_format_reward

        tok = toy_tokenizer()
        env = toy_chat_env(tok, batch_size=4, reply=True, max_steps=2)
        recorder = RolloutRecorder(as_trl_rollout_func(env, max_turns=2))
        stock, whole = CompletionRecorder("stock"), CompletionRecorder("whole_completion")
        reward_funcs = [score_final_answer(stock), score_final_answer(think_format_reward), whole]
        trainer = grpo_trainer(tmp_path, tok, recorder, reward_funcs)
        with pytest.warns(UserWarning, match=r"functions \['whole_completion'\] read only") as seen:
            trainer.train()
        assert sum("read only that" in str(w.message) for w in seen) == 1  # warned once

        assert trainer.state.global_step == 3
        assert len(stock.calls) == len(whole.calls) == len(recorder.calls)
        for (prompts, out, _), got, raw in zip(recorder.calls, stock.calls, whole.calls):
            for i in range(len(prompts)):
                (*_, (value, start, stop)) = runs(out["env_mask"][i])
                last = out["completion_ids"][i][start:stop]
                assert value == 1 and out["final_answer_ids"][i] == last
                assert got["completion_ids"][i] == last
                answer = tok.decode(last, skip_special_tokens=True)
                assert got["completions"][i] == [{"role": "assistant", "content": answer}]
                assert out["final_answer"][i] == answer
                assert out["history"][i][-1]["content"].strip() == answer.strip()
                # unwrapped, a reward function gets the tool's reply as the policy's text
                assert "characters" in raw["completions"][i][0]["content"]
                assert "characters" not in answer

    def test_score_final_answer(self):
        import asyncio
        import inspect

        def length(completions, completion_ids, **kwargs):
            return [float(len(c)) for c in completion_ids]

        async def async_length(completions, completion_ids, **kwargs):
            return length(completions, completion_ids)

        kwargs = {"completions": ["a tool said 5"], "completion_ids": [[5, 6, 7]]}
        answer = {"final_answer": ["5"], "final_answer_ids": [[7]]}
        assert score_final_answer(length)(prompts=["p"], **kwargs, **answer) == [1.0]
        positional = (["p"], kwargs["completions"], kwargs["completion_ids"])  # TRL's signature
        assert score_final_answer(length)(*positional, **answer) == [1.0]
        scored = score_final_answer(async_length)
        assert inspect.iscoroutinefunction(scored) and scored.__name__ == "async_length"
        assert asyncio.run(scored(prompts=["p"], **kwargs, **answer)) == [1.0]
        with pytest.raises(KeyError, match="got no 'final_answer'.*as_trl_rollout_func"):
            score_final_answer(length)(prompts=["p"], **kwargs)
        with pytest.raises(TypeError, match="must be a TRL reward function"):
            score_final_answer("length")


@pytest.fixture(scope="module")
def real_trainer(tmp_path_factory):
    """A constructed (not trained) GRPOTrainer on a toy model, and a batch-4 chat env."""
    tok = toy_tokenizer()
    env = toy_chat_env(tok, batch_size=4)
    trainer = grpo_trainer(
        tmp_path_factory.mktemp("grpo"), tok, as_trl_rollout_func(env), RewardRecorder()
    )
    return trainer, env


class TestUserPolicy:
    def policy(self, trainer, **kwargs):
        model = trainer.accelerator.unwrap_model(trainer.model)
        args = {
            "tokenizer": trainer.processing_class,
            "input_mode": "history",
            "generate": True,
            "generate_kwargs": {"max_new_tokens": 4, "do_sample": True},
            "pad_output": False,
            "return_log_probs": True,
        }
        args.update(kwargs)
        return TransformersWrapper(model, **args)

    def test_transformers_wrapper_logprobs_are_recomputed(self, real_trainer):
        trainer, env = real_trainer
        prompts = [[{"role": "user", "content": p}] for p in toy_prompts(2) for _ in range(2)]
        policy = self.policy(trainer)
        out = as_trl_rollout_func(env, policy=policy)(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        for p, c, lp in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]):
            own = own_logprobs(model, p, c, trainer.temperature)
            torch.testing.assert_close(torch.tensor(lp), own, atol=TOL, rtol=0)
        # without the recompute: torchrl 0.14.1's wrapper writes 0.0 for the first token
        raw = as_trl_rollout_func(env, policy=policy, recompute_logprobs=False)(prompts, trainer)
        assert [lp[0] for lp in raw["logprobs"]] == [0.0] * 4

    def test_pad_output_is_cut_by_its_masks(self, tmp_path):
        tok = toy_tokenizer()
        model = toy_causal_lm(tokenizer=tok, eos_bias=4.0)  # answers that stop early
        banned = [[tok.pad_token_id], [tok.convert_tokens_to_ids(IM_START)]]
        policy = TransformersWrapper(
            model,
            tokenizer=tok,
            input_mode="history",
            generate=True,
            pad_output=True,  # prompts left-padded, answers right-padded, in one batch
            return_log_probs=True,
            generate_kwargs={"max_new_tokens": 6, "do_sample": True, "bad_words_ids": banned},
        )
        env = toy_chat_env(tok, batch_size=4, transforms=[RewardTransform(answer_length)])
        rollout_func = as_trl_rollout_func(env, policy=policy, recompute_logprobs=False)
        recorder, rewards = RolloutRecorder(rollout_func), RewardRecorder()
        trainer = grpo_trainer(tmp_path, tok, recorder, rewards, model=model)
        trainer.train()

        assert trainer.state.global_step == 3
        check_rows_and_rewards(recorder, rewards, group=2)
        prompt_lengths, stopped = set(), 0
        for prompts, out, own in recorder.calls:
            for i, prompt in enumerate(prompts):
                rendered = tok.apply_chat_template(prompt, add_generation_prompt=True)
                assert out["prompt_ids"][i] == list(rendered["input_ids"])  # no left padding
                ids = out["completion_ids"][i]
                assert tok.pad_token_id not in ids and tok.eos_token_id not in ids[:-1]
                assert out["env_mask"][i] == [1] * len(ids)
                logprobs = torch.tensor(out["logprobs"][i])  # the policy's own, padding cut
                torch.testing.assert_close(logprobs[1:], own[i][1:], atol=TOL, rtol=0)
                prompt_lengths.add(len(out["prompt_ids"][i]))
                stopped += ids[-1] == tok.eos_token_id and len(ids) < 6
        assert len(prompt_lengths) > 1 and stopped  # padding on both sides was cut

    @pytest.mark.parametrize("pad_output", [False, True])
    def test_multi_turn_continues_from_the_rollouts_tokens(self, real_trainer, pad_output):
        trainer, _ = real_trainer
        tok = trainer.processing_class
        env = toy_chat_env(tok, batch_size=4, reply=True, max_steps=2)
        banned = [[tok.pad_token_id], [tok.convert_tokens_to_ids(IM_START)]]
        policy = self.policy(
            trainer,
            pad_output=pad_output,
            prefer_tokens=True,
            generate_kwargs={"max_new_tokens": 4, "do_sample": True, "bad_words_ids": banned},
        )
        prompts = [[{"role": "user", "content": p}] for p in toy_prompts(8)[::4] for _ in range(2)]
        out = as_trl_rollout_func(env, policy=policy, max_turns=2)(prompts, trainer)
        for i, prompt in enumerate(prompts):
            rendered = tok.apply_chat_template(prompt, add_generation_prompt=True)
            assert out["prompt_ids"][i] == list(rendered["input_ids"])
            assert [v for v, _, _ in runs(out["env_mask"][i])] == [1, 0, 1]
            assert tok.pad_token_id not in out["completion_ids"][i]

    def test_tokenizer_mismatch(self, real_trainer):
        trainer, env = real_trainer
        policy = self.policy(trainer, tokenizer=toy_tokenizer(vocab_size=300))
        with pytest.raises(ValueError, match="not the trainer's processing_class.*vocabulary"):
            as_trl_rollout_func(env, policy=policy)(
                [[{"role": "user", "content": "Hi"}]] * 4, trainer
            )

    def test_policy_without_logprobs(self, real_trainer):
        trainer, env = real_trainer
        policy = self.policy(trainer, return_log_probs=False)
        with pytest.raises(ValueError, match="returns no log-probs"):
            as_trl_rollout_func(env, policy=policy, recompute_logprobs=False)
        # a policy that says nothing about log-probs, and writes none, fails at the call
        from tensordict.nn import TensorDictModuleBase

        class Opaque(TensorDictModuleBase):
            in_keys, out_keys = policy.in_keys, policy.out_keys

            def forward(self, td):
                return policy(td)

        rollout_func = as_trl_rollout_func(env, policy=Opaque(), recompute_logprobs=False)
        with pytest.raises(KeyError, match="wrote no log-probs"):
            rollout_func([[{"role": "user", "content": "Hi"}]] * 4, trainer)

    def test_multi_turn_needs_prefer_tokens(self, real_trainer):
        trainer, env = real_trainer
        with pytest.raises(ValueError, match="prefer_tokens=False"):
            as_trl_rollout_func(env, policy=self.policy(trainer), max_turns=2)

    def test_several_samples_per_prompt(self, real_trainer):
        trainer, env = real_trainer
        with pytest.raises(ValueError, match="num_samples=2"):
            as_trl_rollout_func(env, policy=self.policy(trainer, num_samples=2))


class TestErrors:
    def test_prompt_count_not_a_multiple_of_num_generations(self, real_trainer):
        trainer, env = real_trainer
        with pytest.raises(ValueError, match="3 prompts, not a multiple of num_generations=2"):
            as_trl_rollout_func(env)([[{"role": "user", "content": "Hi"}]] * 3, trainer)

    def test_prompts_not_grouped(self, real_trainer):
        trainer, env = real_trainer
        prompts = [[{"role": "user", "content": p}] for p in toy_prompts(4)]
        with pytest.raises(ValueError, match="not one prompt repeated num_generations=2 times"):
            as_trl_rollout_func(env)(prompts, trainer)

    def test_prompt_count_not_a_multiple_of_env_batch(self, real_trainer):
        trainer, env = real_trainer
        with pytest.raises(ValueError, match=r"env of batch_size \(4,\)"):
            as_trl_rollout_func(env)([[{"role": "user", "content": "Hi"}]] * 6, trainer)

    def test_env_without_a_prompt_at_reset(self):
        with pytest.raises(TypeError, match="PendulumEnv, which reads no prompt at reset"):
            as_trl_rollout_func(PendulumEnv())

    def test_env_with_its_own_dataloader(self, left_tokenizer):
        primer = DataLoadingPrimer(dataloader=[{"query": ["Hi", "Hi"]}], batch_size=(2,))
        env = toy_chat_env(left_tokenizer, transforms=[primer])
        with pytest.raises(ValueError, match="DataLoadingPrimer"):
            as_trl_rollout_func(env)

    def test_env_not_in_history_mode(self, left_tokenizer):
        env = ChatEnv(batch_size=(2,), tokenizer=left_tokenizer, input_mode="text")
        with pytest.raises(ValueError, match="input_mode='text'"):
            as_trl_rollout_func(env)

    def test_max_turns(self, left_tokenizer):
        with pytest.raises(ValueError, match="max_turns must be a positive int"):
            as_trl_rollout_func(toy_chat_env(left_tokenizer), max_turns=0)
