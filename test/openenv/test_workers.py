"""``serve --workers 2`` under load, then through the loss of a worker (issue 55).

One command-line server in two worker processes behind one address (loopback), 32 session
slots in all: 32 sessions of one ``OpenEnvChatEnv`` play a few episodes each with every step
answered, spread evenly over both workers (16 and 16: the supervisor hands each connection to
the worker with the fewest); a 33rd session is refused (capacity is the total); once closed, no
session is left open. Then a worker is killed: the rows it served fail with a
``ConnectionError`` naming the server, the others play on, its slots are given back and the
supervisor starts another worker, which is handed its share of the next sessions. One test, in
that order, so the server is started once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _background import background
from _openenv_helpers import (
    PROMPT,
    answers,
    cli_server,
    health,
    serve_in_background,
    wait_until,
)
from openenv.core import GenericEnvClient
from tensordict import TensorDict

from torchrl_trl_interop import OpenEnvChatEnv, history_to_messages
from torchrl_trl_interop.testing import ScriptedChatPolicy

SESSIONS = 32
EPISODES = 3


def children(pid: int) -> list[int]:
    """The worker processes ``pid`` started (Linux; not multiprocessing's resource tracker)."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
        except OSError:  # gone since
            pass
    return out


def play(env, episodes):
    """``episodes`` scripted episodes on every row: ``[rewards of each row's last step]``."""
    n = env.batch_size[0]
    out = []
    for _ in range(episodes):
        td = env.reset(TensorDict({"query": [PROMPT] * n}, batch_size=[n]))
        rollout = env.rollout(2, ScriptedChatPolicy(answers()), tensordict=td, auto_reset=False)
        assert rollout["next", "done"].reshape(n, 2)[:, -1].all()
        last = history_to_messages(rollout[:, -1]["next", "history", "prompt"])
        assert all(
            [m["role"] for m in chat][-3:] == ["assistant", "tool", "assistant"] for chat in last
        )
        out.append(rollout["next", "reward"].reshape(n, 2)[:, -1].tolist())
    return out


@background(timeout_s=300)
def two_workers_server(job):
    """The command-line server in 2 worker processes, 32 session slots in all."""
    spec = "torchrl_trl_interop.testing:toy_tool_env"
    return serve_in_background(job, spec, "--workers", "2", "--max-concurrent-envs", str(SESSIONS))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
@pytest.mark.timeout(600)
def test_two_workers_under_load_then_one_killed(two_workers_server):
    with cli_server(two_workers_server) as (url, proc):
        # -- 32 concurrent sessions x a few episodes: every step answered -------------------
        env = OpenEnvChatEnv(url, batch_size=SESSIONS, message_timeout_s=120)
        assert play(env, EPISODES) == [[1.0] * SESSIONS] * EPISODES
        sessions = health(url)["sessions"]  # opened at once, spread evenly
        assert sessions["open"] == SESSIONS and sessions["per_worker"] == [16, 16], sessions
        with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as late:
            with pytest.raises(RuntimeError, match=f"{SESSIONS}/{SESSIONS} sessions active over 2"):
                late.reset(prompt=PROMPT)
        env.close()
        wait_until(lambda: health(url)["sessions"]["open"] == 0, 60, "every session closed")

        # -- a worker killed: its rows fail, naming the server; its slots are given back ----
        env = OpenEnvChatEnv(url, batch_size=16, message_timeout_s=120)
        td = env.reset(TensorDict({"query": [PROMPT] * 16}, batch_size=[16]))
        assert health(url)["sessions"]["per_worker"] == [8, 8]  # rows on both workers
        workers = children(proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        # OpenEnv's client finds its socket closed and reconnects (to the other worker): its
        # step reaches a session without an episode
        lost = f"the OpenEnv server at {url} (went away|no longer holds this session)"
        with pytest.raises(ConnectionError, match=lost):
            env.step(ScriptedChatPolicy(answers())(td))
        replaced = wait_until(lambda: set(children(proc.pid)) - set(workers), 60, "a new worker")
        assert len(replaced) == 1 and len(children(proc.pid)) == 2
        env.close()
        # the dead worker's slots were given back: nothing is counted open once the rows close
        wait_until(lambda: health(url)["sessions"]["open"] == 0, 60, "every slot given back")
        assert proc.poll() is None  # the server still serves
        # ... and the new worker is handed its share of the next sessions
        env = OpenEnvChatEnv(url, batch_size=4, message_timeout_s=120)
        assert play(env, 1) == [[1.0] * 4]
        assert health(url)["sessions"]["per_worker"] == [2, 2]
        env.close()
