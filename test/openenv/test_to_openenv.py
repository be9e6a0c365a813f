"""TorchRL environments as OpenEnv environments, in this process: ``as_openenv_environment``.

The reference is the TorchRL environment itself, driven by a scripted policy (``env.rollout``):
an OpenEnv session must add the same messages and get the same rewards.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest
from _openenv_helpers import PROMPT, answers, torchrl_episode
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State
from torchrl.envs.llm.transforms import SimpleToolTransform

from torchrl_trl_interop import RewardTransform, as_openenv_environment
from torchrl_trl_interop.testing import (
    toy_add,
    toy_chat_env,
    toy_tool_call,
    toy_tool_env,
)


def play(env, prompt=PROMPT, script=None, **row):
    """An OpenEnv session's episode: ``[(messages, reward, done), ...]``, the reset first."""
    script = answers() if script is None else script
    obs = env.reset(prompt=prompt, **row)
    out = [(obs.messages, obs.reward, obs.done)]
    for content in script:
        obs = env.step(type(env).action_type(content=content))
        out.append((obs.messages, obs.reward, obs.done))
    return out


class TestEpisode:
    def test_tool_call_and_answer_as_torchrl_plays_them(self):
        env = as_openenv_environment(toy_tool_env)()
        episode = play(env)
        assert episode == torchrl_episode()
        (_, _, _), (tool_turn, r1, d1), (after, r2, d2) = episode
        assert tool_turn[0]["role"] == "tool" and tool_turn[0]["content"].endswith(":\n5")
        assert (r1, d1, r2, d2, after) == (0.0, False, 1.0, True, [])
        assert env.state == State(episode_id=env.state.episode_id, step_count=2)
        env.close()

    def test_reset_gives_conversation_tools_and_episode_id(self):
        env = as_openenv_environment(toy_tool_env)()
        obs = env.reset(prompt=[{"role": "user", "content": PROMPT}], episode_id="ep-1")
        assert obs.messages == obs.conversation == [{"role": "user", "content": PROMPT}]
        (tool,) = obs.tools
        assert tool["function"]["name"] == "add"
        assert set(tool["function"]["parameters"]["properties"]) == {"a", "b"}
        assert (obs.reward, obs.done, env.state.episode_id) == (None, False, "ep-1")
        obs = env.step({"content": toy_tool_call(2, 3)})
        assert obs.conversation[:1] == [{"role": "user", "content": PROMPT}]
        assert obs.conversation[-1] == obs.messages[-1] and obs.tools is None
        assert obs.metadata == {"terminated": False, "truncated": False}

    def test_declared_schema_wins(self):
        schema = {"type": "function", "function": {"name": "add", "description": "declared"}}
        tool = SimpleToolTransform(tools={"add": toy_add}, tool_schemas={"add": schema})
        env = as_openenv_environment(partial(toy_chat_env, batch_size=1, transforms=[tool]))()
        assert env.reset(prompt=PROMPT).tools == [schema]

    def test_row_columns_reach_the_reward(self):
        def matches_answer(completions, answer, **kwargs):
            return [float(a in c[-1]["content"]) for c, a in zip(completions, answer)]

        reward = RewardTransform(matches_answer, kwargs_keys={"answer": "answer"})
        make_env = partial(toy_chat_env, batch_size=1, transforms=[reward])
        env = as_openenv_environment(make_env)()
        env.reset(prompt=PROMPT, answer="5")
        assert env.step({"content": "It is 5."}).reward == 1.0
        env.reset(prompt=PROMPT, answer="6")
        assert env.step({"content": "It is 5."}).reward == 0.0

    def test_environment_that_serves_its_own_prompts(self):
        env = as_openenv_environment(partial(toy_tool_env, prompts=["What is 1 plus 1?"]))()
        assert env.reset().messages == [{"role": "user", "content": "What is 1 plus 1?"}]
        with pytest.raises(ValueError, match="DataLoadingPrimer"):
            env.reset(prompt=PROMPT)

    def test_seed(self):
        env = as_openenv_environment(toy_tool_env)()
        seeds = []
        env.env.set_seed = lambda seed, **kwargs: seeds.append(seed)
        env.reset(prompt=PROMPT, seed=3)
        env.reset(prompt=PROMPT)
        assert seeds == [3]

    def test_no_reward_written_is_none(self):
        env = as_openenv_environment(partial(toy_chat_env, batch_size=1))()
        env.reset(prompt=PROMPT)
        obs = env.step({"content": "Hi"})
        assert obs.reward is None and obs.done is False and obs.messages == []


class TestSessions:
    def test_a_factory_gives_each_instance_its_own_env(self):
        cls = as_openenv_environment(toy_tool_env)
        assert issubclass(cls, Environment) and cls.SUPPORTS_CONCURRENT_SESSIONS
        a, b = cls(), cls()
        assert a.env is not b.env
        a.reset(prompt=PROMPT)
        b.reset(prompt="What is 1 plus 1?")
        first_a = a.step({"content": toy_tool_call(2, 3)})  # interleaved: episodes stay apart
        first_b = b.step({"content": "It is 3."})
        last_a = a.step({"content": "2 plus 3 is 5."})
        last_b = b.step({"content": "1 plus 1 is 2."})
        assert [(o.reward, o.done) for o in (first_a, last_a)] == [(0.0, False), (1.0, True)]
        assert [(o.reward, o.done) for o in (first_b, last_b)] == [(0.0, False), (1.0, True)]
        assert first_b.messages == [] and last_a.conversation[0]["content"] == PROMPT
        assert (a.state.step_count, b.state.step_count) == (2, 2)
        closed = []
        a.env.close = lambda **kwargs: closed.append("a")
        b.env.close = lambda **kwargs: closed.append("b")
        a.close()
        assert closed == ["a"]

    def test_one_env_is_shared_one_session_at_a_time(self):
        env = toy_tool_env()
        cls = as_openenv_environment(env)
        assert not cls.SUPPORTS_CONCURRENT_SESSIONS
        first = cls()
        assert first.env is env and cls().env is env
        closed = []
        env.close = lambda **kwargs: closed.append(True)
        first.close()
        assert closed == []  # not ours to close

    def test_a_factory_returning_one_env_twice(self):
        env = toy_tool_env()
        cls = as_openenv_environment(lambda: env)
        keep = cls()
        with pytest.raises(ValueError, match="another live instance"):
            cls()
        keep.close()
        cls().close()  # free again once the first instance closed


class TestTimeout:
    def test_a_step_past_timeout_abandons_the_episode(self):
        release = threading.Event()

        def wait() -> str:
            release.wait(30)
            return "done"

        tool = SimpleToolTransform(tools={"wait": wait})
        env = as_openenv_environment(partial(toy_chat_env, batch_size=1, transforms=[tool]))()
        env.reset(prompt=PROMPT)
        with pytest.raises(TimeoutError, match="timeout_s=0.2"):
            env.step({"content": "<tool>wait\n{}</tool>"}, timeout_s=0.2)
        with pytest.raises(RuntimeError, match="still running"):
            env.reset(prompt=PROMPT)
        release.set()
        deadline = time.monotonic() + 30
        while True:
            try:
                env.reset(prompt=PROMPT)
                break
            except RuntimeError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert env.step({"content": "Hi"}, timeout_s=30).done is False


BAD = [
    # (what, call, exception, message)
    ("step before reset", lambda e: e.step({"content": "x"}), RuntimeError, "before reset"),
    ("action of another schema", lambda e: e.step({"message": "x"}), ValueError, "content"),
    ("action content not a str", lambda e: e.step({"content": 3}), ValueError, "content"),
    ("action of another type", lambda e: e.step("x"), TypeError, "TorchRLChatAction"),
    (
        "unexpected step keyword",
        lambda e: e.step({"content": "x"}, render=True),
        TypeError,
        "render",
    ),
    ("bad timeout", lambda e: e.step({"content": "x"}, timeout_s=0), ValueError, "timeout_s"),
    ("no prompt", lambda e: e.reset(), ValueError, "prompt="),
    ("prompt of another type", lambda e: e.reset(prompt=3), TypeError, "prompt"),
    (
        "row column named like the prompt",
        lambda e: e.reset(prompt="x", query="y"),
        ValueError,
        "prompt=",
    ),
    (
        "row column named like an entry",
        lambda e: e.reset(prompt="x", history="y"),
        ValueError,
        "'history'",
    ),
    ("seed of another type", lambda e: e.reset(prompt="x", seed="1"), TypeError, "seed"),
]


@pytest.mark.parametrize("what, call, error, match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, call, error, match):
    env = as_openenv_environment(toy_tool_env)()
    with pytest.raises(error, match=match):
        call(env)
    env.close()


def test_step_after_the_episode_is_done():
    env = as_openenv_environment(toy_tool_env)()
    play(env)
    with pytest.raises(RuntimeError, match="is done"):
        env.step({"content": "more"})


@pytest.mark.parametrize(
    "make_env, error, match",
    [
        (partial(toy_tool_env, batch_size=2), ValueError, r"batch_size=\(1,\)"),
        (lambda: "not an env", TypeError, "expected a torchrl environment"),
        (lambda: __import__("torchrl.envs").envs.PendulumEnv(), TypeError, "ChatEnv"),
    ],
    ids=["batch of two", "not an env", "not a chat env"],
)
def test_bad_environment(make_env, error, match):
    cls = as_openenv_environment(make_env)
    with pytest.raises(error, match=match):
        cls()


def test_not_history_mode():
    from torchrl.envs.llm import ChatEnv

    with pytest.raises(ValueError, match="input_mode='history'"):
        as_openenv_environment(ChatEnv(batch_size=(1,), input_mode="text"))


def test_not_a_factory():
    with pytest.raises(TypeError, match="make_env must be a function"):
        as_openenv_environment("toy_tool_env")
