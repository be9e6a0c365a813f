"""OpenEnv sessions of ``OpenEnvChatEnv`` (issue 34): given back when the environment is dropped
or refused by a full server, the capacity error says when this process still holds sessions,
and a reset right after a slot frees works. OpenEnv's own client (``GenericEnvClient``) checks
the server's side: a slot it can take."""

from __future__ import annotations

import gc

import pytest
from _openenv_helpers import PROMPT, open_sessions, wait_until
from openenv.core import GenericEnvClient
from tensordict import TensorDict

from torchrl_trl_interop import OpenEnvChatEnv, openenv_server
from torchrl_trl_interop.testing import toy_tool_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def one_slot():
    """``toy_tool_env`` served with a single session slot."""
    with openenv_server(toy_tool_env, max_concurrent_envs=1) as url:
        yield url


def reset(env):
    n = env.batch_size[0]
    return env.reset(TensorDict({"query": [PROMPT] * n}, batch_size=[n]))


def openenv_client_resets(url) -> list:
    """OpenEnv's own client takes the slot and resets (raises if the server is full), once the
    server has given back the slots of the sessions closed before. The server frees a slot a
    moment after its client's close returns, within the 2 s our own client waits for it;
    OpenEnv's client does not wait."""
    wait_until(lambda: open_sessions(url) == 0, 2.0, "the server giving the slot back")
    with GenericEnvClient(base_url=url, message_timeout_s=20).sync() as client:
        return client.reset(prompt=PROMPT).observation["messages"]


def test_a_dropped_environment_gives_its_session_back(one_slot):
    env = OpenEnvChatEnv(one_slot)
    reset(env)
    del env  # a re-run notebook cell: never closed
    gc.collect()
    assert openenv_client_resets(one_slot) == [{"role": "user", "content": PROMPT}]


def test_an_environment_refused_by_a_full_server_gives_its_sessions_back(one_slot):
    env = OpenEnvChatEnv(one_slot, batch_size=2)
    with pytest.raises(RuntimeError, match=r"CAPACITY_REACHED.*2 session\(s\) on it.*closed"):
        reset(env)
    # row 0's slot was given back at once, not at close()
    assert openenv_client_resets(one_slot) == [{"role": "user", "content": PROMPT}]


def test_the_capacity_error_names_sessions_this_process_still_holds(one_slot):
    held = OpenEnvChatEnv(one_slot)
    reset(held)
    late = OpenEnvChatEnv(one_slot)
    with pytest.raises(RuntimeError, match=r"still holds 1 other session.*close\(\)"):
        reset(late)
    held.close()


def test_a_reset_right_after_a_slot_frees(one_slot):
    for _ in range(5):
        env = OpenEnvChatEnv(one_slot)
        assert reset(env)["history", "prompt"].shape[0] == 1
        env.close()  # the next one takes the slot at once
