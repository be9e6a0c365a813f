"""OpenEnv environments driven by TorchRL: ``OpenEnvChatEnv``.

The round trip is the proof: a TorchRL environment served through OpenEnv and wrapped back must
play exactly the episodes of the environment itself, under ``env.rollout``, torchrl's
``LLMCollector`` and ``as_trl_rollout_func`` (and train ``GRPOTrainer``). Other OpenEnv
environments plug in with ``action_fn`` / ``observation_fn``.
"""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch
from _openenv_helpers import PROMPT, answers, free_port, torchrl_episode
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from tensordict import TensorDict
from torchrl.collectors.llm import LLMCollector
from torchrl.envs.llm.transforms import SimpleToolTransform

from torchrl_trl_interop import (
    OpenEnvChatEnv,
    RewardTransform,
    as_openenv_environment,
    as_trl_rollout_func,
    history_to_messages,
    openenv_server,
)
from torchrl_trl_interop.testing import (
    ScriptedChatPolicy,
    correct_answer,
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_tokenizer,
    toy_tool_call,
    toy_tool_env,
)

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
    pytest.mark.filterwarnings("ignore:The env passed to LLMCollector"),
]

QUESTIONS = ["What is 2 plus 3?", "What is 1 plus 1?"]


def script(messages):
    """Call the tool with the question's numbers, then answer with the tool's result, except
    for ``1 plus 1``, answered wrong (so that rewards differ between prompts)."""
    from torchrl_trl_interop.testing import parse_question

    a, b = parse_question(messages[0]["content"])
    if not any(m["role"] == "assistant" for m in messages):
        return toy_tool_call(a, b)
    result = messages[-1]["content"].split()[-1]
    return f"{a} plus {b} is {'3' if (a, b) == (1, 1) else result}."


def right_answer(messages):
    from torchrl_trl_interop.testing import parse_question

    a, b = parse_question(messages[0]["content"])
    return f"{a} plus {b} is {a + b}."


def rollout_episode(env, prompt=PROMPT, steps=2):
    """``env.rollout`` of the scripted answers: ``[(messages added, reward, done), ...]``."""
    td = env.reset(TensorDict({"query": [prompt]}, batch_size=[1]))
    rollout = env.rollout(steps, ScriptedChatPolicy(answers()), tensordict=td, auto_reset=False)
    out = [(history_to_messages(td["history", "prompt"])[0], None, False)]
    for t in range(rollout.shape[1]):
        step = rollout[0, t]
        answered = history_to_messages(step["history", "full"])
        after = history_to_messages(step["next", "history", "prompt"])
        out.append(
            (
                after[len(answered) :],
                float(step["next", "reward"].sum()),
                bool(step["next", "done"]),
            )
        )
    return out


class TestInProcess:
    def test_rollout_plays_the_torchrl_episode(self):
        env = OpenEnvChatEnv(as_openenv_environment(toy_tool_env))
        assert rollout_episode(env) == torchrl_episode()
        env.close()

    def test_an_environment_instance(self):
        env = OpenEnvChatEnv(as_openenv_environment(toy_tool_env)())
        assert rollout_episode(env) == torchrl_episode()

    def test_rows_are_sessions_and_done_rows_wait(self):
        # one answer ends each episode; a done row is not sent again: it keeps its conversation
        make_env = partial(toy_tool_env, max_steps=1)
        env = OpenEnvChatEnv(as_openenv_environment(make_env), batch_size=2)
        td = env.reset(TensorDict({"query": QUESTIONS}, batch_size=[2]))
        td = env.step(ScriptedChatPolicy(right_answer)(td))
        assert td["next", "reward"].flatten().tolist() == [1.0, 1.0]
        assert td["next", "done"].flatten().tolist() == [True, True]
        td = env.step_mdp(td)
        again = env.step(ScriptedChatPolicy(lambda m: "more")(td))  # done rows are not sent
        assert again["next", "reward"].flatten().tolist() == [0.0, 0.0]
        assert history_to_messages(again["next", "history", "prompt"])[1][-1]["content"] == "more"


class TestServed:
    def test_rollout_func_rows_equal_the_unwrapped_envs(self, served_url):
        tok = toy_tokenizer()
        trainer = grpo_trainer(tok, None, max_steps=1)
        policy = ScriptedChatPolicy(script, tokenizer=tok)
        prompts = [[{"role": "user", "content": q}] for q in QUESTIONS for _ in range(2)]
        wrapped = OpenEnvChatEnv(served_url, batch_size=4)
        got = as_trl_rollout_func(wrapped, policy=policy, max_turns=2)(prompts, trainer)
        want = as_trl_rollout_func(toy_tool_env(batch_size=4), policy=policy, max_turns=2)(
            prompts, trainer
        )
        assert got == want
        assert got["env_reward"] == [1.0, 1.0, 0.0, 0.0]
        assert [[m["role"] for m in h] for h in got["history"]] == [
            ["user", "assistant", "tool", "assistant"]
        ] * 4
        assert any(m == 0 for m in got["env_mask"][0])  # the tool's reply: environment tokens
        wrapped.close()

    def test_grpo_on_scripted_answers_gets_the_unwrapped_envs_rewards(self, served_url, tmp_path):
        tok = toy_tokenizer()
        runs = {}
        for name, env in (
            ("unwrapped", toy_tool_env(batch_size=4)),
            ("round trip", OpenEnvChatEnv(served_url, batch_size=4)),
        ):
            seen = []

            def env_reward(completions, history, env_reward, _seen=seen, **kwargs):
                _seen.append((history, env_reward))
                return list(env_reward)

            policy = ScriptedChatPolicy(script, tokenizer=tok)
            rollout_func = as_trl_rollout_func(env, policy=policy, max_turns=2)
            trainer = grpo_trainer(tok, rollout_func, [env_reward], tmp_path / name)
            trainer.train()
            assert trainer.state.global_step == 2
            logged = [row["rewards/env_reward/mean"] for row in trainer.state.log_history[:-1]]
            runs[name] = (seen, logged)
            env.close()
        assert runs["round trip"] == runs["unwrapped"]
        rewards = [r for _, step in runs["unwrapped"][0] for r in step]
        assert sorted(set(rewards)) == [0.0, 1.0]  # both prompts seen: right and wrong answers

    def test_grpo_trains_through_the_round_trip(self, served_url, tmp_path):
        tok = toy_tokenizer()
        seen = []

        def env_reward(prompts, completions, history, env_reward, **kwargs):
            seen.append((history, env_reward))
            return list(env_reward)

        wrapped = OpenEnvChatEnv(served_url, batch_size=4)
        rollout_func = as_trl_rollout_func(wrapped, max_turns=2)
        trainer = grpo_trainer(tok, rollout_func, [env_reward, toy_answer_length], tmp_path)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train()
        assert trainer.state.global_step == 2
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        assert len(seen) == 2
        for histories, rewards in seen:  # the served env's reward, as the env computes it
            prompts = [h[:1] for h in histories]
            completions = [[h[-1]] for h in histories]
            assert rewards == correct_answer(prompts, completions)
            assert all(h[1]["role"] == "assistant" for h in histories)
        wrapped.close()

    def test_collector_plays_the_same_episodes(self):
        make_env = partial(toy_tool_env, prompts=QUESTIONS)  # the env serves its own prompts
        with openenv_server(make_env) as url:
            wrapped = OpenEnvChatEnv(url)
            assert collect(wrapped) == collect(make_env())
            wrapped.close()

    def test_reward_transforms_drive_it(self, served_url):
        reward = RewardTransform(toy_answer_length, reward_key="length")
        env = OpenEnvChatEnv(served_url).append_transform(reward)
        td = env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
        rollout = env.rollout(2, ScriptedChatPolicy(answers()), tensordict=td, auto_reset=False)
        assert rollout["next", "length"].flatten().tolist() == [float(len(a)) for a in answers()]
        assert rollout["next", "reward"].flatten().tolist() == [0.0, 1.0]  # the served env's
        env.close()


def collect(env):
    """Two batches of ``LLMCollector`` with the scripted policy: each turn's conversation,
    reward and done flag."""
    collector = LLMCollector(
        env, policy=ScriptedChatPolicy(script), dialog_turns_per_batch=4, total_dialog_turns=8
    )
    out = []
    for batch in collector:
        for step in batch.reshape(-1).unbind(0):
            out.append(
                (
                    history_to_messages(step["next", "history", "prompt"]),
                    step["next", "reward"].item(),
                    step["next", "done"].item(),
                )
            )
    collector.shutdown()
    return out


def grpo_trainer(tok, rollout_func, reward_funcs=None, tmp_path=None, max_steps=2):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS * 2]
    args = toy_grpo_args(tmp_path or "/tmp/openenv-grpo", tokenizer=tok, max_steps=max_steps)
    return GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=reward_funcs or [toy_answer_length],
        args=GRPOConfig(**args),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        rollout_func=rollout_func,
    )


# -- an OpenEnv environment of another format ------------------------------------------------


class ShoutAction(Action):
    message: str


class ShoutObservation(Observation):
    shouted: str = ""


class ShoutEnvironment(Environment):
    """Shouts the message back; no reward at the first step, the length at the second (done)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.steps = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.steps, self.seed, self.reset_kwargs = 0, seed, kwargs
        return ShoutObservation()

    def step(self, action, timeout_s=None, **kwargs):
        self.steps += 1
        reward = None if self.steps == 1 else float(len(action.message))
        return ShoutObservation(shouted=action.message.upper(), reward=reward, done=self.steps == 2)

    @property
    def state(self):
        return State(step_count=self.steps)


def test_seed_and_columns_are_sent_at_reset():
    sessions = []

    def make():
        sessions.append(ShoutEnvironment())
        return sessions[-1]

    env = OpenEnvChatEnv(
        make, batch_size=2, observation_fn=shouted, reset_kwargs_keys={"answer": "answer"}
    )
    env.set_seed(7)
    env.reset(TensorDict({"query": ["hi", "hey"], "answer": ["5", "6"]}, batch_size=[2]))
    env.reset(TensorDict({"query": ["hi", "hey"], "answer": ["5", "6"]}, batch_size=[2]))
    assert [s.seed for s in sessions] == [None, None]  # the seed went with the first reset only
    env.set_seed(7)
    env.reset(TensorDict({"query": ["hi", "hey"], "answer": ["5", "6"]}, batch_size=[2]))
    assert [(s.seed, s.reset_kwargs) for s in sessions] == [
        (7, {"answer": "5", "prompt": "hi"}),
        (8, {"answer": "6", "prompt": "hey"}),
    ]


def test_reset_columns_reach_a_served_reward():
    def matches_answer(completions, answer, **kwargs):
        return [float(a in c[-1]["content"]) for c, a in zip(completions, answer)]

    def make_env():
        reward = RewardTransform(matches_answer, kwargs_keys={"answer": "answer"})
        return toy_chat_env(batch_size=1, transforms=[reward])

    env = OpenEnvChatEnv(
        as_openenv_environment(make_env), batch_size=2, reset_kwargs_keys={"answer": "answer"}
    )
    td = env.reset(TensorDict({"query": [PROMPT] * 2, "answer": ["5", "6"]}, batch_size=[2]))
    td = env.step(ScriptedChatPolicy(["It is 5."])(td))
    assert td["next", "reward"].flatten().tolist() == [1.0, 0.0]


def shouted(observation):
    return [{"role": "user", "content": observation["shouted"]}] if observation["shouted"] else []


def test_another_format_with_action_and_observation_functions():
    env = OpenEnvChatEnv(
        ShoutEnvironment,
        batch_size=2,
        action_fn=lambda content: ShoutAction(message=content),
        observation_fn=shouted,
    )
    td = env.reset(TensorDict({"query": ["hi", "hey"]}, batch_size=[2]))
    assert history_to_messages(td["history", "prompt"]) == [
        [{"role": "user", "content": "hi"}],  # no messages at reset: the prompt, as ChatEnv
        [{"role": "user", "content": "hey"}],
    ]
    rollout = env.rollout(2, ScriptedChatPolicy(["hello", "bye"]), tensordict=td, auto_reset=False)
    first, last = rollout[0, 0], rollout[0, 1]
    assert history_to_messages(first["next", "history", "prompt"])[-1]["content"] == "HELLO"
    # the environment gave none: 0.0, which adds nothing, and rewarded=False says so
    assert (first["next", "reward"].item(), first["next", "rewarded"].item()) == (0.0, False)
    assert last["next", "rewarded"].item()
    assert (last["next", "reward"].item(), last["next", "done"].item()) == (3.0, True)


# -- failures: clear errors, no hang ---------------------------------------------------------


def test_server_that_stops_answering():
    release = threading.Event()

    def wait() -> str:
        release.wait(60)
        return "late"

    def make_env():
        return toy_chat_env(batch_size=1, transforms=[SimpleToolTransform(tools={"wait": wait})])

    with openenv_server(make_env) as url:
        env = OpenEnvChatEnv(url, message_timeout_s=1.0)
        td = env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
        try:
            with pytest.raises(ConnectionError, match=r"no reply within message_timeout_s=1\.0"):
                env.step(ScriptedChatPolicy(["<tool>wait\n{}</tool>"])(td))
        finally:
            release.set()  # let the server's session end, so the server stops
        env.close()


def test_no_server():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match="could not connect"):
        OpenEnvChatEnv(url, connect_timeout_s=5)


def test_more_rows_than_the_server_allows():
    with openenv_server(toy_tool_env, max_concurrent_envs=1) as url:
        env = OpenEnvChatEnv(url, batch_size=2)
        with pytest.raises(RuntimeError, match=r"2 session\(s\) on it.*more max_concurrent_envs"):
            env.reset(TensorDict({"query": QUESTIONS}, batch_size=[2]))
        env.close()


def test_policy_that_adds_two_turns():
    env = OpenEnvChatEnv(as_openenv_environment(toy_tool_env))
    td = env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
    td = ScriptedChatPolicy(["one"])(td)
    # answer again on top of the first answer, as if the policy had written two turns
    td = ScriptedChatPolicy(["one", "two"])(td.set(("history", "prompt"), td["history", "full"]))
    with pytest.raises(ValueError, match="one 'assistant' turn"):
        env.step(td)


def test_step_before_reset():
    cls = as_openenv_environment(toy_tool_env)
    td = OpenEnvChatEnv(cls).reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
    never_reset = OpenEnvChatEnv(cls)
    with pytest.raises(RuntimeError, match="step before reset"):
        never_reset.step(ScriptedChatPolicy(["x"])(td))


def test_observation_without_messages():
    env = OpenEnvChatEnv(ShoutEnvironment, action_fn=lambda c: ShoutAction(message=c))
    with pytest.raises(KeyError, match="observation_fn"):
        env.reset(TensorDict({"query": ["hi"]}, batch_size=[1]))


def _env_class():
    return as_openenv_environment(toy_tool_env)


@pytest.mark.parametrize(
    "make_arg, kwargs, error, match",
    [
        (_env_class, {"batch_size": 0}, ValueError, "batch_size"),
        (lambda: _env_class()(), {"batch_size": 2}, ValueError, "is one OpenEnv session"),
        (lambda: 3, {}, TypeError, "server URL"),
        (lambda: lambda: 3, {}, TypeError, "got 3"),
        (_env_class, {"action_fn": "content"}, TypeError, "action_fn must be callable"),
        (_env_class, {"message_timeout_s": 0}, ValueError, "message_timeout_s"),
        (_env_class, {"reset_kwargs_keys": ["answer"]}, TypeError, "reset_kwargs_keys"),
    ],
    ids=[
        "batch of 0",
        "one instance for 2 rows",
        "not an environment",
        "a factory of something else",
        "action_fn not callable",
        "timeout not positive",
        "reset keys not a dict",
    ],
)
def test_bad_arguments(make_arg, kwargs, error, match):
    with pytest.raises(error, match=match):
        OpenEnvChatEnv(make_arg(), **kwargs)


def test_prompt_without_a_prompt_keyword():
    env = OpenEnvChatEnv(as_openenv_environment(toy_tool_env), prompt_kwarg=None)
    with pytest.raises(ValueError, match="prompt_kwarg=None"):
        env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
