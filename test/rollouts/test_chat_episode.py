"""One chat episode, two drivers: TRL's ``environment_factory`` and the OpenEnv server play a
ChatEnv episode through ``rollouts/_chat_episode``, so the same row and the same turns give the
same conversation, rewards and reset tensordict on both sides."""

from __future__ import annotations

import functools

import pytest
import torch
from torchrl.envs import Transform
from torchrl.envs.llm import ChatEnv

from torchrl_trl_interop import as_openenv_environment, as_trl_environment_factory
from torchrl_trl_interop.rollouts._chat_episode import check_chat_env, reset_input, step_episode
from torchrl_trl_interop.testing import toy_tool_call, toy_tool_env

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")

PROMPT = [{"role": "user", "content": "What is 2 plus 3?"}]


class SeesTheRow(Transform):
    """Records the row's columns as the environment's transforms read them at a step."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def _step(self, tensordict, next_tensordict):
        self.seen.append({k: tensordict.get(k) for k in ("answer", "level")})
        return next_tensordict


def with_recorder(seen: list):
    return toy_tool_env().append_transform(SeesTheRow(seen))


def test_a_row_reaches_the_environment_one_way():
    """Numbers as ``[1]`` tensors, text as non-tensor data, on both sides (OpenEnv used to set
    every column as ``NonTensorData``, TRL numbers as tensors)."""
    trl_seen, openenv_seen = [], []
    trl = as_trl_environment_factory(functools.partial(with_recorder, trl_seen))()
    trl.reset(prompt=PROMPT, answer="5", level=3)
    trl.add(a=2, b=3)
    served = as_openenv_environment(functools.partial(with_recorder, openenv_seen))()
    served.reset(prompt=PROMPT, answer="5", level=3)
    served.step({"content": toy_tool_call(2, 3)})
    for seen in (trl_seen[-1], openenv_seen[-1]):
        assert torch.equal(seen["level"], torch.tensor([3]))
        assert seen["answer"].tolist() == ["5"]
    served.close()


def test_the_same_turns_give_the_same_episode():
    trl = as_trl_environment_factory(toy_tool_env)()
    served = as_openenv_environment(toy_tool_env)()
    assert trl.reset(prompt=PROMPT) is None
    assert served.reset(prompt=PROMPT).conversation == trl.messages == PROMPT
    reply = trl.add(a=2, b=3)
    obs = served.step({"content": toy_tool_call(2, 3)})
    assert obs.messages == [{"role": "tool", "content": reply}]
    assert obs.conversation == trl.messages
    assert (obs.reward, obs.done) == (trl.reward, False)
    served.close()


class TestDriver:
    def test_a_step_reports_the_turns_added_reward_and_done(self):
        env = toy_tool_env(max_steps=2)
        td = env.reset(reset_input(env, PROMPT, {}))
        keys = {"reward_key": ("next", "reward"), "done_key": ("next", "done")}
        first = step_episode(env, td, toy_tool_call(2, 3), **keys)
        assert [m["role"] for m in first.conversation] == ["user", "assistant", "tool"]
        assert first.added == first.conversation[2:] and not first.done
        last = step_episode(env, first.td, "2 plus 3 is 5.", **keys)
        assert (last.added, last.reward, last.done) == ([], 1.0, True)

    def test_run_wraps_the_environment_step(self):
        env, calls = toy_tool_env(), []
        td = env.reset(reset_input(env, "What is 2 plus 3?", {}))

        def run(step):
            calls.append(step)
            return step()

        keys = {"reward_key": ("next", "reward"), "done_key": ("next", "done")}
        out = step_episode(env, td, toy_tool_call(2, 3), run=run, **keys)
        assert len(calls) == 1 and out.added[0]["role"] == "tool"

    @pytest.mark.parametrize(
        "make_env, error, match",
        [
            (lambda: "not an env", TypeError, "expected a torchrl environment"),
            (lambda: ChatEnv(batch_size=(1,), input_mode="text"), ValueError, "'history'"),
            (lambda: ChatEnv(batch_size=(2,), input_mode="history"), ValueError, "why"),
        ],
        ids=["not an env", "text mode", "batch of two"],
    )
    def test_check_chat_env(self, make_env, error, match):
        with pytest.raises(error, match=match):
            check_chat_env(make_env(), "why")

    def test_reset_input_refuses_bad_input(self):
        env = toy_tool_env()
        with pytest.raises(TypeError, match="prompt should be a str or a list"):
            reset_input(env, 3, {})
        with pytest.raises(KeyError, match=r"^.the row columns \['query'\].*prompt="):
            reset_input(env, "Hi", {"query": "x"}, error=KeyError)
