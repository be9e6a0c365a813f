"""What a served environment and ``OpenEnvChatEnv`` do through faults (issue 55): each ends in a
clear outcome within its timeout.

Clients that die mid-episode give their sessions back (at once when their connection drops,
within the session timeout when it does not); the session timeout closes idle sessions, a
one-session server then admits the next client, and the closed session's client is told; a
session's ``make_env`` failure reaches the client with its reason; a closed or refused
environment says so and how to open new sessions; a server gone from a batch of several is
named. The server is OpenEnv's (uvicorn, loopback) in a thread; the clients of the first tests
are processes of their own.
"""

from __future__ import annotations

import itertools
import os
import signal
from functools import partial

import pytest
from _openenv_helpers import (
    PROMPT,
    answers,
    client_process,
    open_sessions,
    slow_tool_env,
    wait_until,
)
from fastapi.testclient import TestClient
from openenv.core import GenericEnvClient
from tensordict import TensorDict

from torchrl_trl_interop import OpenEnvChatEnv, openenv_app, openenv_server
from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_tool_env

pytestmark = pytest.mark.timeout(180)

IDLE_S = 1.0  # the session timeout of the servers below


def reset(env):
    n = env.batch_size[0]
    return env.reset(TensorDict({"query": [PROMPT] * n}, batch_size=[n]))


@pytest.fixture(scope="module")
def idle_closing():
    """``toy_tool_env`` served with one session slot, sessions closed after ``IDLE_S`` idle."""
    with openenv_server(toy_tool_env, max_concurrent_envs=1, session_timeout_s=IDLE_S) as url:
        yield url


@pytest.fixture(scope="module")
def one_slot():
    with openenv_server(toy_tool_env, max_concurrent_envs=1) as url:
        yield url


@pytest.fixture(scope="module")
def four_slots():
    with openenv_server(toy_tool_env, max_concurrent_envs=4) as url:
        yield url


class TestClientsThatDie:
    def test_killed_mid_episode_their_sessions_are_given_back(self, four_slots):
        with client_process(four_slots, sessions=3) as proc:
            assert open_sessions(four_slots) == 3
            os.kill(proc.pid, signal.SIGKILL)  # the kernel closes its connections
            wait_until(lambda: open_sessions(four_slots) == 0, 30, "the sessions given back")

    def test_a_client_that_stops_answering_is_closed_by_the_session_timeout(self, idle_closing):
        with client_process(idle_closing, sessions=1) as proc:
            os.kill(proc.pid, signal.SIGSTOP)  # alive, its connection open, silent
            wait_until(lambda: open_sessions(idle_closing) == 0, 30, "the idle session closed")
            os.kill(proc.pid, signal.SIGCONT)


class TestSessionTimeout:
    def test_an_idle_session_is_closed_and_the_next_client_admitted(self, idle_closing):
        env = OpenEnvChatEnv(idle_closing, message_timeout_s=30)
        td = reset(env)
        wait_until(lambda: open_sessions(idle_closing) == 0, 30, "the idle session closed")
        # a one-session server admits the next client once the idle one is closed
        with GenericEnvClient(base_url=idle_closing, message_timeout_s=30).sync() as other:
            other.reset(prompt=PROMPT)
            assert open_sessions(idle_closing) == 1  # never two at once
            with pytest.raises(ConnectionError, match="no longer holds this session.*reset"):
                env.step(ScriptedChatPolicy(answers())(td))
        td = reset(env)  # a new session, once the slot is free again
        assert td["history", "prompt"].shape[0] == 1
        env.close()

    def test_a_long_step_is_not_idle(self):
        # the server works for the session while its step runs: only waiting for the client
        # counts as idle
        with openenv_server(partial(slow_tool_env, 2.5 * IDLE_S), session_timeout_s=IDLE_S) as url:
            with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as client:
                client.reset(prompt=PROMPT)
                result = client.step({"content": answers()[0]})
                assert result.observation["messages"][0]["role"] == "tool"


def one_environment_only():
    """A ``make_env`` whose second call fails: the resource holds one environment."""
    calls = itertools.count()

    def make_env():
        if next(calls) >= 1:
            raise RuntimeError("the accelerator holds one environment")
        return toy_tool_env()

    return make_env


class TestFactoryFailure:
    def test_the_reason_reaches_the_websocket_client(self):
        app = openenv_app(one_environment_only(), max_concurrent_envs=2)
        with TestClient(app) as client, client.websocket_connect("/ws") as first:
            first.send_json({"type": "reset", "data": {"prompt": PROMPT}})
            assert first.receive_json()["type"] == "observation"
            with client.websocket_connect("/ws") as second:
                error = second.receive_json()["data"]
        assert error["code"] == "FACTORY_ERROR"
        assert "RuntimeError: the accelerator holds one environment" in error["message"]

    def test_the_reason_reaches_open_env_chat_env(self):
        with openenv_server(one_environment_only(), max_concurrent_envs=2) as url:
            env = OpenEnvChatEnv(url, batch_size=2, message_timeout_s=30)
            with pytest.raises(RuntimeError, match=f"{url} refused.*holds one environment"):
                reset(env)
            env.close()
            wait_until(lambda: open_sessions(url) == 0, 30, "the sessions given back")


class TestClosedEnvironment:
    def test_reset_and_step_after_close_say_so(self, four_slots):
        env = OpenEnvChatEnv(four_slots, batch_size=2)
        td = reset(env)
        env.close()
        message = r"closed \(close\(\) was called\).*Build a new OpenEnvChatEnv"
        with pytest.raises(RuntimeError, match=message):
            reset(env)
        with pytest.raises(RuntimeError, match=message):
            env.step(ScriptedChatPolicy(answers())(td))
        assert "closed" in repr(env)

    def test_reset_after_a_refusal_says_so(self, one_slot):
        env = OpenEnvChatEnv(one_slot, batch_size=2)  # one slot for two rows
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            reset(env)
        with pytest.raises(RuntimeError, match="a full server refused a reset.*Build a new"):
            reset(env)


class TestSeveralServers:
    def test_rows_spread_as_each_server_admits(self):
        with (
            openenv_server(toy_tool_env, max_concurrent_envs=1) as small,
            openenv_server(toy_tool_env, max_concurrent_envs=3) as large,
        ):
            env = OpenEnvChatEnv([small, large], batch_size=4, message_timeout_s=30)
            td = reset(env)
            assert (open_sessions(small), open_sessions(large)) == (1, 3)
            assert "2 servers" in repr(env)
            rollout = env.rollout(2, ScriptedChatPolicy(answers()), tensordict=td, auto_reset=False)
            assert rollout["next", "reward"].reshape(4, 2)[:, -1].tolist() == [1.0] * 4
            env.close()

    def test_a_server_gone_is_named(self):
        with openenv_server(toy_tool_env, max_concurrent_envs=2) as staying:
            with openenv_server(toy_tool_env, max_concurrent_envs=2) as leaving:
                env = OpenEnvChatEnv([staying, leaving], batch_size=4, message_timeout_s=30)
                td = reset(env)
            # the second server stopped (its sessions closed): the next step names it
            with pytest.raises(ConnectionError, match=f"the OpenEnv server at {leaving} went"):
                env.step(ScriptedChatPolicy(answers())(td))
            env.close()
            wait_until(lambda: open_sessions(staying) == 0, 30, "the sessions given back")

    @pytest.mark.parametrize("env", [[], ["http://a", 3], ["http://a", "http://a"]])
    def test_bad_lists(self, env):
        with pytest.raises((TypeError, ValueError), match="OpenEnvChatEnv: env"):
            OpenEnvChatEnv(env, batch_size=2)
