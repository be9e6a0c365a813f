"""OpenEnv's own server tests, ported and pointed at a served TorchRL environment (issue 34).

The assertions of OpenEnv's ``tests/envs/test_websockets.py`` (HTTP protocol endpoints, the
WebSocket client, concurrent sessions) and ``tests/core/test_production_mode_routes.py``
(simulation mode: ``/reset``, ``/step``, ``/state``), on our toy environments, with OpenEnv's
own client (``GenericEnvClient``). Then what OpenEnv's tests expect of any server: the same
answer over HTTP and the WebSocket (a client's mistake is a 4xx, never a 500), and
``VALIDATION_ERROR`` messages that name the fields.
"""

from __future__ import annotations

from functools import partial

import httpx
import pytest
from _openenv_helpers import PROMPT
from openenv.core import GenericEnvClient

from torchrl_trl_interop import openenv_server
from torchrl_trl_interop.testing import toy_tool_call, toy_tool_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def primed_url():
    """An environment that serves its own prompts: ``POST /reset {}`` starts an episode, as
    OpenEnv's echo environment does."""
    with openenv_server(partial(toy_tool_env, prompts=[PROMPT]), max_concurrent_envs=4) as url:
        yield url


@pytest.fixture(scope="module")
def prompted_url():
    """An environment that takes its prompt at reset (``reset(prompt=...)``)."""
    with openenv_server(toy_tool_env, max_concurrent_envs=4) as url:
        yield url


def http(method, url, **kwargs):
    return httpx.request(method, url, timeout=30, **kwargs)


def client(url):
    return GenericEnvClient(base_url=url, message_timeout_s=30).sync()


class TestProtocolHttpEndpoints:
    def test_health(self, primed_url):
        reply = http("GET", f"{primed_url}/health")
        assert reply.status_code == 200 and reply.json().get("status") == "healthy"

    def test_schema(self, primed_url):
        reply = http("GET", f"{primed_url}/schema")
        assert reply.status_code == 200
        assert {"action", "observation", "state"} <= set(reply.json())

    def test_reset(self, primed_url):
        reply = http("POST", f"{primed_url}/reset", json={})
        assert reply.status_code == 200
        assert reply.json()["observation"]["messages"] == [{"role": "user", "content": PROMPT}]

    def test_state(self, primed_url):
        http("POST", f"{primed_url}/reset", json={})
        reply = http("GET", f"{primed_url}/state")
        assert reply.status_code == 200 and "step_count" in reply.json()

    def test_metadata(self, primed_url):
        assert http("GET", f"{primed_url}/metadata").status_code == 200


class TestProtocolWebSocketClient:
    def test_connect_and_reset(self, primed_url):
        with client(primed_url) as c:
            result = c.reset()
            assert result.observation["messages"][0]["content"] == PROMPT

    def test_step_and_state(self, primed_url):
        with client(primed_url) as c:
            c.reset()
            result = c.step({"content": toy_tool_call(2, 3)})
            assert result.observation["messages"][0]["role"] == "tool"
            assert c.state()["step_count"] == 1

    def test_multiple_episodes(self, primed_url):
        with client(primed_url) as c:
            c.reset()
            c.step({"content": toy_tool_call(2, 3)})
            c.step({"content": "2 plus 3 is 5."})
            assert c.state()["step_count"] == 2
            c.reset()
            assert c.state()["step_count"] == 0
            c.step({"content": toy_tool_call(2, 3)})
            assert c.state()["step_count"] == 1

    def test_two_independent_sessions(self, primed_url):
        with client(primed_url) as one, client(primed_url) as two:
            one.reset()
            two.reset()
            for _ in range(2):
                one.step({"content": toy_tool_call(2, 3)})
            two.step({"content": "5"})
            assert (one.state()["step_count"], two.state()["step_count"]) == (2, 1)


class TestSameAnswersOverHttpAndWebSocket:
    """Regression: ``POST /reset {}`` answered a bare 500 where the WebSocket gave a message."""

    def test_a_reset_without_a_prompt(self, prompted_url):
        reply = http("POST", f"{prompted_url}/reset", json={})
        with client(prompted_url) as c, pytest.raises(RuntimeError) as over_ws:
            c.reset()
        assert reply.status_code == 422
        assert "needs prompt=" in reply.json()["detail"]
        assert reply.json()["detail"] in str(over_ws.value)

    def test_a_reset_with_a_prompt(self, prompted_url):
        reply = http("POST", f"{prompted_url}/reset", json={"prompt": PROMPT})
        with client(prompted_url) as c:
            over_ws = c.reset(prompt=PROMPT)
        assert reply.status_code == 200
        assert reply.json()["observation"]["messages"] == over_ws.observation["messages"]

    def test_a_step_before_reset(self, prompted_url):
        # OpenEnv's HTTP routes build an environment per request: a step there is always first
        reply = http("POST", f"{prompted_url}/step", json={"action": {"content": "hi"}})
        with client(prompted_url) as c, pytest.raises(RuntimeError) as over_ws:
            c.step({"content": "hi"})
        assert reply.status_code == 409
        assert "before reset()" in reply.json()["detail"]
        assert reply.json()["detail"] in str(over_ws.value)

    def test_an_action_of_another_schema(self, prompted_url):
        reply = http("POST", f"{prompted_url}/step", json={"action": {"message": "hi"}})
        assert reply.status_code == 422
        assert {tuple(e["loc"]) for e in reply.json()["detail"]} >= {("content",), ("message",)}


def test_validation_errors_name_the_fields(prompted_url):
    """Regression: ``VALIDATION_ERROR: Invalid message``, no field named (docs/openenv.rst)."""
    with client(prompted_url) as c:
        c.reset(prompt=PROMPT)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR") as err:
            c.step({"message": "wrong field"})
        assert "'content': Field required" in str(err.value)
        assert "'message': Extra inputs are not permitted" in str(err.value)
        # the session is still usable
        assert c.step({"content": toy_tool_call(2, 3)}).observation["messages"][0]["role"] == "tool"
