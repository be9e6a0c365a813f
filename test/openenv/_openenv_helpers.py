"""Helpers of the OpenEnv tests: the CLI server in a subprocess, the reference episode.

Every server a test starts is stopped when the test ends, whatever happens; the CLI subprocess
also dies with the test process (``PR_SET_PDEATHSIG``), and every wait has a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from torchrl_trl_interop._processes import end_with_parent
from torchrl_trl_interop.testing._torchrun import free_port

STARTUP_TIMEOUT_S = 180.0  # the CLI imports torch, torchrl and OpenEnv (gradio) on 2 busy cores


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def serve_in_background(job, spec: str, *args: str) -> tuple[str, subprocess.Popen, Path]:
    """``python -m torchrl_trl_interop.openenv serve spec`` on a free port, started by a
    background job (``test/_background.py``: its start-up, seconds of imports, runs while other
    tests do) and returned once it serves: ``(url, process, log)``. The test that reads it
    serves its clients and stops it with :func:`cli_server`."""
    port = free_port()
    command = [sys.executable, "-m", "torchrl_trl_interop.openenv", "serve", spec]
    command += ["--port", str(port), "--log-level", "warning", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = job.popen(command, log="server.log", env=env, niced=False)  # its test times it
    url, log = f"http://127.0.0.1:{port}", job.folder / "server.log"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    # announced once every worker listens (/health answers as soon as one does)
    while not (_healthy(url) and "serving" in log.read_text()):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not answer in time:\n{log.read_text()}")
        time.sleep(0.2)
    return url, proc, log


@contextmanager
def cli_server(started: tuple[str, subprocess.Popen, Path]):
    """The server :func:`serve_in_background` started, until the block ends (then terminated,
    killed if it does not stop). Yields ``(url, process)``."""
    url, proc, _ = started
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)


# -- the scripted episode every way must agree on ------------------------------------------------

PROMPT = "What is 2 plus 3?"


def answers() -> list[str]:
    """Call the tool in torchrl's tool format, then answer."""
    from torchrl_trl_interop.testing import toy_tool_call

    return [toy_tool_call(2, 3), "2 plus 3 is 5."]


def torchrl_episode(prompt=PROMPT, script=None, make_env=None) -> list[tuple]:
    """The episode as the TorchRL environment itself plays it (``env.rollout`` with a scripted
    policy): ``[(messages added, reward, done), ...]``, the reset first (reward ``None``)."""
    from tensordict import TensorDict

    from torchrl_trl_interop import history_to_messages
    from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_tool_env

    script = answers() if script is None else script
    env = (make_env or toy_tool_env)()
    td = env.reset(TensorDict({"query": [prompt]}, batch_size=[1]))
    rollout = env.rollout(len(script), ScriptedChatPolicy(script), tensordict=td, auto_reset=False)
    out = [(history_to_messages(td["history", "prompt"])[0], None, False)]
    for t in range(rollout.shape[1]):
        step = rollout[0, t]
        answered = history_to_messages(step["history", "full"])
        after = history_to_messages(step["next", "history", "prompt"])
        reward = float(step["next", "reward"].sum())
        out.append((after[len(answered) :], reward, bool(step["next", "done"].any())))
    return out


# -- an OpenEnv environment that rewards only at its last step -----------------------------------


def last_step_env_class():
    """An OpenEnv environment (OpenEnv's own classes, no TorchRL inside) that plays as many steps
    as its prompt asks (``"Finish in 3 steps."``), says which step it is after each, and rewards
    only the last one: ``reward=None`` before, ``1.0`` at the end (``None`` throughout when the
    prompt says ``"unrewarded"``), as OpenEnv's environments usually do. Built in a function so
    that importing the helpers does not import OpenEnv's server."""
    import re

    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class TextAction(Action):
        content: str

    class TextObservation(Observation):
        messages: list[dict] = []

    class LastStepRewardEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True
        action_type = TextAction

        def __init__(self):
            super().__init__()
            self.steps, self.length, self.prompt = 0, 1, ""

        def reset(self, seed=None, episode_id=None, prompt="Finish in 1 steps.", **kwargs):
            if not isinstance(prompt, str):  # TRL messages
                prompt = prompt[-1]["content"]
            self.steps, self.prompt = 0, prompt
            self.length = int(re.search(r"(\d+) step", prompt).group(1))
            return TextObservation(messages=[{"role": "user", "content": prompt}])

        def step(self, action, timeout_s=None, **kwargs):
            self.steps += 1
            done = self.steps >= self.length
            reward = 1.0 if done and "unrewarded" not in self.prompt else None
            said = [] if done else [{"role": "user", "content": f"Step {self.steps} done."}]
            return TextObservation(messages=said, reward=reward, done=done)

        @property
        def state(self):
            return State(step_count=self.steps)

    return LastStepRewardEnv


def slow_tool_env(seconds=3.0):
    """``toy_tool_env`` whose steps take ``seconds`` (a slow tool): for clients that time out.
    Module-level, so the CLI serves it (``_openenv_helpers:slow_tool_env``)."""
    from torchrl.envs import Transform

    from torchrl_trl_interop.testing import toy_tool_env

    class Slow(Transform):
        def _step(self, tensordict, next_tensordict):
            time.sleep(seconds)
            return next_tensordict

    return toy_tool_env().append_transform(Slow())


# -- the server's side: its /health, clients in processes of their own --------------------------


def health(url: str) -> dict:
    """The server's ``GET /health``."""
    import json

    with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
        return json.loads(reply.read())


def open_sessions(url: str) -> int:
    """The sessions the server at ``url`` holds open (its ``GET /health``)."""
    return health(url)["sessions"]["open"]


def wait_until(check, timeout_s: float, what: str):
    """Polls ``check()`` until it returns a truthy value (returned), for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s (last: {value!r})")
        time.sleep(0.1)


#: a client in a process of its own: ``argv[1]`` sessions of the server at ``argv[2]``, each reset
#: and stepped once, then it prints "playing" and waits to be killed (or stopped)
_RAW_CLIENT = """
import json, sys, time
from websockets.sync.client import connect
sessions = [connect(sys.argv[2].replace("http", "ws") + "/ws") for _ in range(int(sys.argv[1]))]
for ws in sessions:
    ws.send(json.dumps({"type": "reset", "data": {"prompt": "What is 2 plus 3?"}}))
    assert json.loads(ws.recv(timeout=60))["type"] == "observation"
    ws.send(json.dumps({"type": "step", "data": {"content": "thinking"}}))
    assert json.loads(ws.recv(timeout=60))["type"] == "observation"
print("playing", flush=True)
time.sleep(600)
"""


@contextmanager
def client_process(url: str, sessions: int):
    """A client process holding ``sessions`` sessions of ``url`` mid-episode (OpenEnv's
    WebSocket protocol, the ``websockets`` library); yields the process once they play, kills
    it when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _RAW_CLIENT, str(sessions), url],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=partial(end_with_parent, os.getpid()),
    )
    try:
        assert proc.stdout.readline().strip() == "playing", "the client process failed"
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def sleepy_tool_env(asleep=None, steps=None, seconds=1.5):
    """``toy_tool_env`` whose step sleeps ``seconds`` when the assistant says ``"sleep"`` (a
    tool waiting on a subprocess or the network), setting the ``threading.Event`` ``asleep``
    first, and answers at once otherwise; each step's content and the name of the thread that
    ran it are appended to the list ``steps`` as it ends."""
    from torchrl.envs import Transform

    from torchrl_trl_interop import history_to_messages
    from torchrl_trl_interop.testing import toy_tool_env

    class Sleepy(Transform):
        def _step(self, tensordict, next_tensordict):
            content = history_to_messages(tensordict["history", "full"])[0][-1]["content"]
            if content == "sleep":
                if asleep is not None:
                    asleep.set()
                time.sleep(seconds)
            if steps is not None:
                steps.append((content, threading.current_thread().name))
            return next_tensordict

    return toy_tool_env().append_transform(Sleepy())
