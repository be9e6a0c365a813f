"""``_upstream/_tools``: torchrl's tool-transform internals, read on the measured torchrl only.

Both branches: on the measured torchrl each read gives what the transform itself would (its
parser's calls, its reply, its services, its MCP tools); under ``plain_upstream()`` (what another
torchrl runs) each raises a ``RuntimeError`` naming the versions, and so do the public calls that
need them, while what needs no private read (OpenEnv's schemas of a ``SimpleToolTransform``)
still works.
"""

from __future__ import annotations

import json
import re

import pytest
from torchrl.envs.llm.transforms import (
    ExecuteToolsInOrder,
    MCPToolTransform,
    PythonInterpreter,
    SimpleToolTransform,
    ToolRegistry,
    XMLBlockParser,
)

from torchrl_trl_interop import as_openenv_environment, as_trl_environment_factory, as_trl_tools
from torchrl_trl_interop._upstream import TORCHRL_MEASURED, plain_upstream, use_fast
from torchrl_trl_interop._upstream._tools import (
    mcp_tools,
    process_one,
    python_blocks,
    registry_services,
    tool_calls,
    watch_mcp_execute,
)
from torchrl_trl_interop.testing import toy_add, toy_calculator_env

CALL = '<tool>add\n{"a": 2, "b": 3}</tool>'


class Add:
    name = "add"
    schema_in = {"a": int, "b": int}
    schema_out = {"result": int}

    def __call__(self, a, b, **kwargs):
        return {"result": a + b}


@pytest.fixture
def mcp():
    transform = MCPToolTransform({})  # no server: nothing to list
    yield transform
    transform.close()


def test_measured_on_this_torchrl():
    assert use_fast(TORCHRL_MEASURED)  # the CI's torchrl is the measured one: the fast branch


class TestFastBranch:
    def test_parsers_read_what_the_transform_reads(self):
        simple = SimpleToolTransform(tools={"add": toy_add})
        assert tool_calls(simple, CALL) == [("add", '{"a": 2, "b": 3}')]
        assert tool_calls(simple, CALL) == simple._extract_tool_calls(CALL)
        python = PythonInterpreter(persistent=False)
        assert python_blocks(python, "```python\nprint(1)\n```\ntext") == ["print(1)"]

    def test_one_reply_is_the_one_the_environment_writes(self):
        simple = SimpleToolTransform(tools={"add": toy_add})
        assert process_one(simple, CALL) == ["Tool add executed successfully:\n5"]
        assert process_one(simple, "no call") is None

    def test_registry_services_are_the_registry_s_own(self):
        registry = ToolRegistry([Add()])
        services = registry_services(registry)
        assert list(services) == ["add"] and services["add"] is registry.get("add")
        transform = ExecuteToolsInOrder(registry, XMLBlockParser())
        assert registry_services(transform.registry) is services  # replacing one replaces it

    def test_mcp_without_tools_says_why(self, mcp):
        with pytest.raises(RuntimeError, match=r"lists no tools after 0 s.*connection error"):
            mcp_tools(mcp, 0.0)

    def test_mcp_executor_is_watched_then_restored(self, mcp):
        seen = []
        mcp._execute_tool_sync = lambda *a, **k: {"success": False, "error": "down"}
        own = mcp._execute_tool_sync
        with watch_mcp_execute(mcp, seen.append):
            assert mcp._execute_tool_sync("calc", "add", {}) == {"success": False, "error": "down"}
        assert seen == [{"success": False, "error": "down"}] and mcp._execute_tool_sync is own
        del mcp._execute_tool_sync
        with watch_mcp_execute(mcp, seen.append):
            pass
        assert "_execute_tool_sync" not in vars(mcp)  # the class's method again


class TestPlainBranch:
    """Another torchrl: every private read refuses, naming the measured versions."""

    MESSAGE = re.escape(f"{TORCHRL_MEASURED[0]} >= {TORCHRL_MEASURED[1]}")

    def test_each_read_refuses(self, mcp):
        simple = SimpleToolTransform(tools={"add": toy_add})
        reads = [
            lambda: tool_calls(simple, CALL),
            lambda: python_blocks(PythonInterpreter(persistent=False), ""),
            lambda: process_one(simple, CALL),
            lambda: registry_services(ToolRegistry([Add()])),
            lambda: mcp_tools(mcp, 0.0),
            lambda: watch_mcp_execute(mcp, print).__enter__(),
        ]
        with plain_upstream():
            for read in reads:
                with pytest.raises(RuntimeError, match=r"^reading .*" + self.MESSAGE):
                    read()
        assert "_execute_tool_sync" not in vars(mcp)  # nothing was replaced

    def test_public_calls_refuse_with_the_reason(self):
        with plain_upstream():
            with pytest.raises(RuntimeError, match="as_trl_environment_factory: reading"):
                as_trl_environment_factory(toy_calculator_env)
            with pytest.raises(RuntimeError, match="as_trl_tools: reading"):
                as_trl_tools(ToolRegistry([Add()]))

    def test_openenv_schemas_of_plain_functions_need_no_private_read(self):
        with plain_upstream():
            env = as_openenv_environment(toy_calculator_env)()
            (tool,) = env.reset(prompt="What is 2 plus 3?").tools
        assert tool["function"]["name"] == "add"
        assert json.dumps(tool)  # plain JSON, as the wire carries it
        env.close()
