"""OpenEnv episodes of several steps through TorchRL: rewards given only at the last step, and
rows of one batch that end at different steps (issue 34)."""

from __future__ import annotations

import pytest
import torch
from _openenv_helpers import last_step_env_class
from tensordict import TensorDict
from torchrl.collectors.llm import LLMCollector

from torchrl_trl_interop import OpenEnvChatEnv, as_trl_rollout_func, history_to_messages
from torchrl_trl_interop.testing import (
    ScriptedChatPolicy,
    toy_causal_lm,
    toy_grpo_args,
    toy_tokenizer,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
    pytest.mark.filterwarnings("ignore:The env passed to LLMCollector"),
]

#: rows that end at steps 1, 3, 2 and never get a reward (3 steps)
PROMPTS = [
    "Finish in 1 steps.",
    "Finish in 3 steps.",
    "Finish in 2 steps.",
    "Finish in 3 steps, unrewarded.",
]


def chats(prompts=PROMPTS):
    return [[{"role": "user", "content": p}] for p in prompts]


def grpo_trainer(tok, rollout_func, reward_funcs, tmp_path, prompts):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=reward_funcs,
        args=GRPOConfig(**toy_grpo_args(str(tmp_path), tokenizer=tok, max_steps=2)),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        rollout_func=rollout_func,
    )


def test_a_reward_only_at_the_last_step_reaches_trl(tmp_path):
    env = OpenEnvChatEnv(last_step_env_class(), batch_size=4)
    tok = toy_tokenizer()
    policy = ScriptedChatPolicy(lambda messages: "ok", tokenizer=tok)
    prompts = chats(["Finish in 3 steps."] * 2 + ["Finish in 2 steps, unrewarded."] * 2)
    trainer = grpo_trainer(tok, None, [lambda completions, **kw: [0.0] * 4], tmp_path, prompts)
    out = as_trl_rollout_func(env, policy=policy, max_turns=3)(prompts, trainer)
    # (None, None, 1.0) twice, then (None, None) twice: never rewarded
    assert out["env_reward"] == [1.0, 1.0, None, None]
    assert [sum(m["role"] == "assistant" for m in h) for h in out["history"]] == [3, 3, 2, 2]
    env.close()


def test_torchrl_sees_no_nan_and_which_steps_were_rewarded():
    env = OpenEnvChatEnv(last_step_env_class(), batch_size=4)
    td = env.reset(TensorDict({"query": PROMPTS}, batch_size=[4]))
    assert td["rewarded"].flatten().tolist() == [False] * 4
    rollout = env.rollout(
        3,
        ScriptedChatPolicy(lambda m: "ok"),
        tensordict=td,
        auto_reset=False,
        break_when_all_done=True,
    )
    reward = rollout["next", "reward"].reshape(4, 3)
    assert torch.isfinite(reward).all()
    given = rollout["next", "rewarded"].reshape(4, 3)
    steps = [1, 3, 2, 3]  # torchrl repeats a done row's last step (partial steps)
    assert [reward[i, :k].tolist() for i, k in enumerate(steps)] == [
        [1.0],
        [0.0, 0.0, 1.0],
        [0.0, 1.0],
        [0.0, 0.0, 0.0],
    ]
    assert [given[i, :k].tolist() for i, k in enumerate(steps)] == [
        [True],
        [False, False, True],
        [False, True],
        [False, False, False],
    ]
    env.close()


def transformers_wrapper():
    """torchrl's ``TransformersWrapper`` on the toy model, sampling 4 tokens a turn."""
    from torchrl.modules.llm import TransformersWrapper

    tok = toy_tokenizer(padding_side="left")
    return TransformersWrapper(
        toy_causal_lm(tokenizer=tok),
        tokenizer=tok,
        input_mode="history",
        generate=True,
        generate_kwargs={"max_new_tokens": 4, "do_sample": True},
        pad_output=False,
    )


def test_rows_ending_at_different_steps_under_transformers_wrapper():
    policy = transformers_wrapper()
    env = OpenEnvChatEnv(last_step_env_class(), batch_size=4)
    td = env.reset(TensorDict({"query": PROMPTS}, batch_size=[4]))
    rollout = env.rollout(3, policy, tensordict=td, auto_reset=False, break_when_all_done=True)
    done = rollout["next", "done"].reshape(4, 3).tolist()
    assert done == [[True] * 3, [False, False, True], [False, True, True], [False, False, True]]
    last = history_to_messages(rollout[:, -1]["next", "history", "prompt"])
    # the done rows keep their conversation (the placeholder turns are torchrl's padding)
    turns = [[m["role"] for m in chat if m["role"] != "<none>"] for chat in last]
    assert turns[0] == ["user", "assistant"]
    assert turns[2] == ["user", "assistant", "user", "assistant"]
    env.close()


def primed(env_class, prompts, **kwargs):
    """``OpenEnvChatEnv`` of ``env_class`` whose resets (the collector's, which send no prompt)
    take their prompts from ``prompts(row)``."""

    class Primed(OpenEnvChatEnv):
        def _reset(self, tensordict=None, **kw):
            n = self.batch_size[0]
            td = TensorDict({"query": [prompts(i) for i in range(n)]}, batch_size=[n])
            if tensordict is not None and "_reset" in tensordict.keys():
                td.set("_reset", tensordict.get("_reset"))
            return super()._reset(td, **kw)

    return Primed(env_class, batch_size=len(prompts.rows), **kwargs)


class Rows:
    """The prompts of each row, in turn at each of its resets."""

    def __init__(self, *rows):
        self.rows, self.resets = rows, [0] * len(rows)

    def __call__(self, i):
        prompt = self.rows[i][self.resets[i] % len(self.rows[i])]
        self.resets[i] += 1
        return prompt


def check_transition(step):
    """A collected step is one of its episode's: the conversation so far, done at the step its
    prompt asks for, rewarded 1.0 then (and 0.0 before)."""
    chat = [
        m for m in history_to_messages(step["next", "history", "prompt"]) if m["role"] != "<none>"
    ]
    length = int(chat[0]["content"].split()[2])
    taken = sum(m["role"] == "assistant" for m in chat)
    expected = [chat[0]]
    for k in range(1, taken + 1):
        expected.append({"role": "assistant", "content": "ok"})
        if k < length:
            expected.append({"role": "user", "content": f"Step {k} done."})
    assert chat == expected
    assert step["next", "done"].item() == (taken == length)
    assert step["next", "reward"].item() == (1.0 if taken == length else 0.0)


@pytest.mark.parametrize("rows", [2, 3])
def test_rows_ending_at_different_steps_under_llm_collector(rows):
    """Regression: with rows of 3, 1 and 2 steps, the policy failed on the batch the collector
    reset in part (``zip() argument 3 is longer than arguments 1-2``)."""
    prompts = Rows(*[[f"Finish in {k} steps."] for k in (3, 1, 2)[:rows]])
    env = primed(last_step_env_class(), prompts)
    collector = LLMCollector(
        env,
        policy=ScriptedChatPolicy(lambda m: "ok"),
        dialog_turns_per_batch=2 * rows,
        total_dialog_turns=12 * rows,
    )
    steps = [step for batch in collector for step in batch.reshape(-1).unbind(0)]
    collector.shutdown()
    env.close()
    assert len(steps) == 12 * rows
    for step in steps:
        check_transition(step)
    assert sum(s["next", "done"].item() for s in steps) >= 4 * rows  # episodes ended, restarted


def test_llm_collector_under_transformers_wrapper():
    policy = transformers_wrapper()
    env = primed(
        last_step_env_class(),
        Rows(["Finish in 3 steps."], ["Finish in 1 steps."], ["Finish in 2 steps."]),
    )
    collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=6, total_dialog_turns=18)
    done = [batch["next", "done"].sum().item() for batch in collector]
    collector.shutdown()
    env.close()
    assert sum(done) >= 6


def test_a_reset_prompt_longer_than_the_rows_playing_is_refused():
    base = last_step_env_class()

    class WholePrompt(base):  # the reset observation is the whole prompt
        def reset(self, seed=None, episode_id=None, prompt="Finish in 1 steps.", **kwargs):
            out = super().reset(seed, episode_id, prompt, **kwargs)
            out.messages = list(prompt) if isinstance(prompt, list) else out.messages
            return out

    few_shot = [{"role": "user", "content": "Finish in 1 steps."}] * 5  # a 5-turn prompt
    prompts = Rows(["Finish in 1 steps.", few_shot], ["Finish in 3 steps."])
    env = primed(WholePrompt, prompts)
    collector = LLMCollector(
        env,
        policy=ScriptedChatPolicy(lambda m: "ok"),
        dialog_turns_per_batch=2,
        total_dialog_turns=8,
    )
    with pytest.raises(
        ValueError,
        match=r"conversations of 5 turns, longer than those still playing \(3\).*env.rollout",
    ):
        for _ in collector:
            pass
    collector.shutdown()
    env.close()


def test_grpo_trains_on_last_step_rewards(tmp_path):
    tok = toy_tokenizer()
    seen = []

    def env_reward(completions, env_reward, **kwargs):
        seen.append(list(env_reward))
        return list(env_reward)

    env = OpenEnvChatEnv(last_step_env_class(), batch_size=4)
    rollout_func = as_trl_rollout_func(env, max_turns=3)
    prompts = chats(["Finish in 3 steps.", "Finish in 1 steps, unrewarded."])
    trainer = grpo_trainer(tok, rollout_func, [env_reward], tmp_path, prompts * 2)
    trainer.train()
    assert trainer.state.global_step == 2
    rewards = [r for step in seen for r in step]
    assert rewards.count(1.0) == rewards.count(None) == 4  # (None, None, 1.0) and never rewarded
    logged = [row["rewards/env_reward/mean"] for row in trainer.state.log_history[:-1]]
    assert logged == [1.0, 1.0]  # TRL's nanmean: the unrewarded rows are not scored
    env.close()
