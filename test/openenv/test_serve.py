"""TorchRL environments served with OpenEnv's server, driven over OpenEnv's protocols.

FastAPI's ``TestClient`` speaks the WebSocket protocol (``{"type": "reset" | "step", "data":
...}``) to ``create_app``'s app in this process; a real uvicorn server on 127.0.0.1 and the CLI in
a subprocess are driven by OpenEnv's own ``GenericEnvClient``. Every way must play the episode the
TorchRL environment plays itself (``torchrl_episode``).
"""

from __future__ import annotations

import signal

import pytest
from _background import background
from _openenv_helpers import (
    PROMPT,
    answers,
    cli_server,
    serve_in_background,
    sleepy_tool_env,
    torchrl_episode,
)
from fastapi.testclient import TestClient
from openenv.core import GenericEnvClient
from openenv.core.env_server import create_app
from tensordict import TensorDict

from torchrl_trl_interop import OpenEnvChatEnv, as_openenv_environment, openenv_app
from torchrl_trl_interop.openenv.__main__ import main
from torchrl_trl_interop.testing import ScriptedChatPolicy, toy_tool_env

pytestmark = pytest.mark.timeout(300)


def ws_play(ws, prompt=PROMPT, script=None):
    """An episode over the WebSocket protocol: ``[(messages, reward, done), ...]``."""
    script = answers() if script is None else script
    ws.send_json({"type": "reset", "data": {"prompt": prompt}})
    replies = [ws.receive_json()]
    for content in script:
        ws.send_json({"type": "step", "data": {"content": content}})
        replies.append(ws.receive_json())
    assert all(r["type"] == "observation" for r in replies), replies
    return [
        (r["data"]["observation"]["messages"], r["data"]["reward"], r["data"]["done"])
        for r in replies
    ]


def client_play(client, prompt=PROMPT, script=None):
    """An episode through OpenEnv's ``GenericEnvClient`` (sync)."""
    script = answers() if script is None else script
    results = [client.reset(prompt=prompt)]
    results += [client.step({"content": content}) for content in script]
    return [(r.observation["messages"], r.reward, r.done) for r in results]


@pytest.fixture(scope="module")
def reference():
    return torchrl_episode()


class TestWebSocket:
    def test_create_app_serves_the_class(self, reference):
        cls = as_openenv_environment(toy_tool_env)
        app = create_app(cls, cls.action_type, cls.observation_type)  # OpenEnv's own call
        with TestClient(app) as client, client.websocket_connect("/ws") as ws:
            assert ws_play(ws) == reference
            ws.send_json({"type": "state"})
            state = ws.receive_json()["data"]
            assert state["step_count"] == 2 and state["episode_id"]

    def test_two_sessions_are_isolated(self, reference):
        app = openenv_app(toy_tool_env, max_concurrent_envs=2)
        script = answers()
        with TestClient(app) as client:
            with client.websocket_connect("/ws") as a, client.websocket_connect("/ws") as b:
                got = {"a": [], "b": []}
                for name, ws, prompt in (("a", a, PROMPT), ("b", b, "What is 1 plus 1?")):
                    ws.send_json({"type": "reset", "data": {"prompt": prompt}})
                    got[name].append(ws.receive_json()["data"])
                for content_a, content_b in zip(script, ["It is 3.", "1 plus 1 is 2."]):
                    for name, ws, content in (("a", a, content_a), ("b", b, content_b)):
                        ws.send_json({"type": "step", "data": {"content": content}})
                        got[name].append(ws.receive_json()["data"])
        episode_a = [(d["observation"]["messages"], d["reward"], d["done"]) for d in got["a"]]
        assert episode_a == reference
        assert [d["reward"] for d in got["b"]] == [None, 0.0, 1.0]
        assert got["b"][-1]["observation"]["conversation"][0]["content"] == "What is 1 plus 1?"

    def test_wrong_schema_and_step_before_reset(self):
        with TestClient(openenv_app(toy_tool_env)) as client, client.websocket_connect("/ws") as ws:
            ws.send_json({"type": "step", "data": {"content": "too early"}})
            error = ws.receive_json()
            assert error["type"] == "error" and error["data"]["code"] == "EXECUTION_ERROR"
            assert "before reset()" in error["data"]["message"]
            ws.send_json({"type": "reset", "data": {"prompt": PROMPT}})
            assert ws.receive_json()["type"] == "observation"
            ws.send_json({"type": "step", "data": {"message": "wrong field"}})
            error = ws.receive_json()
            assert error["data"]["code"] == "VALIDATION_ERROR"
            assert {e["loc"][0] for e in error["data"]["errors"]} == {"content", "message"}
            ws.send_json({"type": "step", "data": {"content": answers()[0]}})  # still usable
            assert ws.receive_json()["data"]["observation"]["messages"][0]["role"] == "tool"

    def test_capacity_is_reported(self):
        with TestClient(openenv_app(toy_tool_env)) as client:  # one session, as OpenEnv's default
            with client.websocket_connect("/ws") as a, client.websocket_connect("/ws") as b:
                error = b.receive_json()
                assert error["data"]["code"] == "CAPACITY_REACHED"
                a.send_json({"type": "reset", "data": {"prompt": PROMPT}})
                assert a.receive_json()["type"] == "observation"

    def test_http_routes(self):
        with TestClient(openenv_app(toy_tool_env)) as client:
            schema = client.get("/schema").json()
            assert schema["action"]["required"] == ["content"]
            assert {"messages", "conversation", "tools"} <= set(schema["observation"]["properties"])
            reset = client.post("/reset", json={"prompt": PROMPT}).json()
            assert reset["observation"]["messages"] == [{"role": "user", "content": PROMPT}]
            bad = client.post("/step", json={"action": {"text": "x"}})
            assert bad.status_code == 422


class TestOpenEnvClient:
    def test_same_episode_over_a_real_server(self, served_url, reference):
        with GenericEnvClient(base_url=served_url, message_timeout_s=60).sync() as client:
            assert client_play(client) == reference
            assert client.state()["step_count"] == 2

    def test_two_clients_are_isolated(self, served_url, reference):
        a = GenericEnvClient(base_url=served_url, message_timeout_s=60).sync()
        b = GenericEnvClient(base_url=served_url, message_timeout_s=60).sync()
        with a, b:
            b.reset(prompt="What is 1 plus 1?")
            a.reset(prompt=PROMPT)
            a_first = a.step({"content": answers()[0]})
            b_first = b.step({"content": "1 plus 1 is 2."})
            a_last = a.step({"content": answers()[1]})
            assert [(r.observation["messages"], r.reward, r.done) for r in (a_first, a_last)] == (
                reference[1:]
            )
            assert (b_first.reward, b_first.done, b.state()["step_count"]) == (0.0, False, 1)

    def test_refusals_are_errors(self, served_url):
        with GenericEnvClient(base_url=served_url, message_timeout_s=60).sync() as client:
            with pytest.raises(RuntimeError, match="before reset"):
                client.step({"content": "too early"})
            client.reset(prompt=PROMPT)
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                client.step({"message": "wrong field"})


def test_a_slow_step_does_not_hold_up_another_session(upstream_branch):
    """A step that waits (a tool in a subprocess, a network call) holds up no other session:
    the sessions' calls run on one thread of the package's executor, and a stalled one lets the
    next start on another (``openenv/_step_executor``); on OpenEnv's plain server, each session's
    calls run in a thread of their own."""
    import threading
    from functools import partial

    from torchrl_trl_interop import openenv_server

    asleep, steps = threading.Event(), []
    with openenv_server(partial(sleepy_tool_env, asleep, steps), max_concurrent_envs=2) as url:
        slow = GenericEnvClient(base_url=url, message_timeout_s=60).sync()
        quick = GenericEnvClient(base_url=url, message_timeout_s=60).sync()
        with slow, quick:
            slow.reset(prompt=PROMPT)
            quick.reset(prompt=PROMPT)
            sleeping = threading.Thread(target=slow.step, args=({"content": "sleep"},))
            sleeping.start()
            assert asleep.wait(60)  # the slow step runs on the server
            quick.step({"content": answers()[0]})
            sleeping.join(60)
    assert [content for content, _ in steps] == [answers()[0], "sleep"]  # the quick one first
    quick_thread, slow_thread = [name for _, name in steps]
    assert quick_thread != slow_thread
    ours = upstream_branch == "fast"
    assert all(name.startswith("openenv-step-") == ours for _, name in steps), steps


SPEC = "torchrl_trl_interop.testing:toy_tool_env"


@background(timeout_s=300)
def two_slot_server(job):
    return serve_in_background(job, SPEC, "--max-concurrent-envs", "2")


@background(timeout_s=300)
def one_slot_server(job):
    return serve_in_background(job, SPEC)


@pytest.mark.slow
def test_command_line_serves_then_stops_on_sigterm(two_slot_server, reference):
    log = two_slot_server[2]
    with cli_server(two_slot_server) as (url, proc):
        assert f"serving {SPEC} with OpenEnv at {url}" in log.read_text()
        with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as client:
            assert client_play(client) == reference
        proc.terminate()
        proc.wait(timeout=60)
    # uvicorn shuts down, then re-raises the signal; a server that hung would have been killed
    assert proc.returncode in (0, -signal.SIGTERM)


@pytest.mark.slow
def test_server_hung_then_killed_mid_episode(one_slot_server):
    """A server that stops answering mid-episode makes the step raise a ``ConnectionError``
    naming it once ``message_timeout_s`` passed; killed, the next call raises at once."""
    with cli_server(one_slot_server) as (url, proc):
        env = OpenEnvChatEnv(url, message_timeout_s=3)
        td = env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
        proc.send_signal(signal.SIGSTOP)  # alive, its connections open, silent
        try:
            silent = f"the OpenEnv server at {url} gave no reply within message_timeout_s=3"
            with pytest.raises(ConnectionError, match=silent):
                env.step(ScriptedChatPolicy(answers())(td))
        finally:
            proc.kill()  # a stopped process dies of SIGKILL too
            proc.wait(timeout=30)
        with pytest.raises(ConnectionError, match=f"the OpenEnv server at {url} went away"):
            env.reset(TensorDict({"query": [PROMPT]}, batch_size=[1]))
        env.close()  # the socket is gone too: closing still returns


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "expected MODULE:NAME"),
        ("torchrl_trl_interop.testing:nope", "has no 'nope'"),
        ("no_such_module_xyz:make", "No module named 'no_such_module_xyz'"),
    ],
)
def test_command_line_bad_spec(spec, message, capsys):
    assert main(["serve", spec, "--port", "0"]) == 2
    assert message in capsys.readouterr().err
