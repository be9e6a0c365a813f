"""``as_trl_agent_rollout_func``: any agent calling the endpoint as GRPO's rollout engine. A real
``GRPOTrainer(rollout_func=..., callbacks=[WeightSyncCallback(server)]).train()`` on a plain
function that calls the endpoint twice per episode: each row holds both calls, the text between
masked, log-probs the trainer's own; the rollout function's own contract on a stand-in trainer."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import openai
import pytest
import torch
from _agents_helpers import MODEL, client_of, own_logprobs, toy_policy

from torchrl_trl_interop import (
    OpenAIServer,
    WeightSyncCallback,
    as_trl_agent_rollout_func,
    weights_checksum,
)
from torchrl_trl_interop.testing import toy_causal_lm, toy_grpo_args, toy_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

TOL = 1e-4
AGAIN = {"role": "user", "content": "Once more."}


def runs(mask):
    """``[1, 1, 0, 1]`` -> ``[(1, 2), (0, 1), (1, 1)]``: (value, length) runs."""
    out = []
    for value in mask:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


class TwoCalls:
    """An agent that asks, then asks again after its answer; keeps what the endpoint returned."""

    __name__ = "two_calls"

    def __init__(self):
        self.seen = {}

    def __call__(self, prompt, base_url):
        client = client_of(base_url)
        messages = list(prompt)
        first = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, extra_body={"return_token_ids": True}
        )
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, AGAIN]
        second = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, extra_body={"return_token_ids": True}
        )
        session = OpenAIServer.session_of(base_url)
        self.seen[session] = (first.model_dump(), second.model_dump())
        return float(len(second.choices[0].message.content))


class Recorder:
    """Wraps a rollout function: each call's output and the trainer model's own log-probs."""

    def __init__(self, rollout_func):
        self.rollout_func = rollout_func
        self.reward_func = rollout_func.reward_func
        self.calls = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        own = [own_logprobs(model, p, c) for p, c in zip(out["prompt_ids"], out["completion_ids"])]
        self.calls.append((copy.deepcopy(prompts), out, own, trainer.state.global_step))
        return out


class TestGRPO:
    def test_trains_on_a_function_calling_the_endpoint_twice(self, tmp_path):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        tok = toy_tokenizer()
        policy = toy_policy(tok, toy_causal_lm(tokenizer=tok, seed=1))  # other weights
        agent = TwoCalls()
        prompts = [[{"role": "user", "content": f"What is {i} plus 2?"}] for i in range(4)]
        with OpenAIServer(policy, tokenizer=tok, model_name=MODEL) as server:
            recorder = Recorder(as_trl_agent_rollout_func(agent, server))
            args = toy_grpo_args(tmp_path, tokenizer=tok, max_steps=2)
            trainer = GRPOTrainer(
                model=toy_causal_lm(tokenizer=tok, seed=0),
                reward_funcs=recorder.reward_func,
                args=GRPOConfig(**args),
                train_dataset=Dataset.from_dict({"prompt": prompts}),
                processing_class=tok,
                rollout_func=recorder,
                callbacks=[WeightSyncCallback(server)],
            )
            before = weights_checksum(trainer.model)
            trainer.train()
            final = weights_checksum(trainer.model)
            assert weights_checksum(policy.model) == final != before  # pushed every step
        assert trainer.state.global_step == 2 and len(recorder.calls) == 2
        for prompts_seen, out, own, step in recorder.calls:
            assert out["policy_version"] == [step] * len(prompts_seen)
            assert {len(v) for v in out.values()} == {len(prompts_seen)}
            for i, session in enumerate(out["agent_session"]):
                first, second = agent.seen[session]
                ids1 = first["choices"][0]["token_ids"]
                ids2 = second["choices"][0]["token_ids"]
                mask = out["env_mask"][i]
                # both calls in one row, the text between them masked out
                assert runs(mask) == [
                    (1, len(ids1)),
                    (0, len(mask) - len(ids1) - len(ids2)),
                    (1, len(ids2)),
                ]
                completion = out["completion_ids"][i]
                assert completion[: len(ids1)] == ids1 and completion[-len(ids2) :] == ids2
                between = completion[len(ids1) : -len(ids2)]
                assert tok.decode(between).endswith(
                    "<|im_start|>user\nOnce more.<|im_end|>\n<|im_start|>assistant\n"
                )
                assert out["prompt_ids"][i] == first["prompt_token_ids"]
                assert second["prompt_token_ids"] == out["prompt_ids"][i] + completion[: -len(ids2)]
                assert prompts_seen[i] == out["history"][i][:1]
                assert out["agent_reward"][i] == float(
                    len(second["choices"][0]["message"]["content"])
                )
                assert (out["agent_calls"][i], out["agent_segments"][i]) == (2, 1)
                # the sampler's log-probs are the trainer's own for the whole row
                logprobs = torch.tensor(out["logprobs"][i])
                kept = torch.tensor(mask, dtype=torch.bool)
                torch.testing.assert_close(logprobs[kept], own[i][kept], atol=TOL, rtol=0)
                assert not logprobs[~kept].any()


def stand_in(tok, step=0):
    """What the rollout function reads of a trainer, without one."""
    return SimpleNamespace(processing_class=tok, state=SimpleNamespace(global_step=step))


@pytest.fixture(scope="module")
def small_server():
    tok = toy_tokenizer()
    with OpenAIServer(toy_policy(tok, max_new_tokens=3), tokenizer=tok, model_name=MODEL) as server:
        yield server


class TestContract:
    def test_async_agent_with_dataset_columns(self, small_server):
        calls = []

        async def agent(prompt, base_url, answer):
            client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
            reply = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}]
            )
            calls.append((prompt, answer, asyncio.current_task() is not None, len(reply.choices)))
            return None if answer == "skip" else 1.0

        dataset = [{"prompt": "A?", "answer": "a"}, {"prompt": "B?", "answer": "skip"}]
        rollout_func = as_trl_agent_rollout_func(agent, small_server, dataset=dataset)
        out = rollout_func(["A?", "A?", "B?", "B?"], stand_in(small_server.tokenizer))
        assert sorted(calls) == [("A?", "a", True, 1)] * 2 + [("B?", "skip", True, 1)] * 2
        assert out["agent_reward"] == [1.0, 1.0, None, None]
        assert rollout_func.reward_func([[]] * 4, agent_reward=out["agent_reward"]) == [
            1.0,
            1.0,
            None,
            None,
        ]
        assert "policy_version" not in out  # nothing pushed, the policy stamps none
        assert all(set(m) == {1} for m in out["env_mask"])

    @pytest.mark.parametrize(
        "agent, error, match",
        [
            (
                lambda prompt, base_url: 1.0,
                RuntimeError,
                r"the agent made no call to its base_url on prompts\[0\]",
            ),
            (lambda prompt, base_url: 1 / 0, RuntimeError, r"the agent failed on prompts\[0\]"),
        ],
    )
    def test_a_failed_episode_names_its_row(self, small_server, agent, error, match):
        rollout_func = as_trl_agent_rollout_func(agent, small_server)
        with pytest.raises(error, match=f"as_trl_agent_rollout_func: {match}"):
            rollout_func(["A?"], stand_in(small_server.tokenizer))

    def test_a_reward_that_is_not_a_number(self, small_server):
        def agent(prompt, base_url):
            client_of(base_url).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
            return "good"

        rollout_func = as_trl_agent_rollout_func(agent, small_server)
        with pytest.raises(TypeError, match=r"return value for prompts\[0\] must be a number"):
            rollout_func(["A?"], stand_in(small_server.tokenizer))

    def test_arguments_checked(self, small_server):
        with pytest.raises(TypeError, match="server must be an OpenAIServer"):
            as_trl_agent_rollout_func(lambda p, u: 0.0, "http://localhost:8000/v1")
        with pytest.raises(TypeError, match="agent must be a function"):
            as_trl_agent_rollout_func(None, small_server)
        duplicate = [{"prompt": "A?", "answer": 1}, {"prompt": "A?", "answer": 2}]
        with pytest.raises(ValueError, match=r"dataset\[1\] has the prompt of an earlier row"):
            as_trl_agent_rollout_func(lambda p, u: 0.0, small_server, dataset=duplicate)
        rollout_func = as_trl_agent_rollout_func(lambda p, u, **c: 0.0, small_server, dataset=[])
        with pytest.raises(KeyError, match=r"prompts\[0\] \('C\?'\) is not a prompt"):
            rollout_func(["C?"], stand_in(small_server.tokenizer))
        other = toy_tokenizer(pad_token="<|im_end|>")
        with pytest.raises(ValueError, match="tokenizer is not the trainer's"):
            as_trl_agent_rollout_func(lambda p, u: 0.0, small_server)(["A?"], stand_in(other))
