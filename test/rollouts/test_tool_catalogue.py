"""One tool catalogue, two renderings: the tools offered to TRL and to OpenEnv are the same.

For each kind of torchrl tool transform, the environment is handed to TRL
(``as_trl_environment_factory``, ``as_trl_tools``) and to OpenEnv (``as_openenv_environment``,
at reset and through a served app's WebSocket): the tool names and the JSON schemas each side
renders must agree. The names differ only where the environment reads another name than TRL
shows (MCP's ``server.tool``).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import pytest
from test_env_factory import chat_env, mcp_env, python_env, registry_env
from torchrl.envs import Compose
from torchrl.envs.llm.transforms import JSONCallParser, XMLBlockParser
from torchrl.envs.llm.transforms.tools import ToolTransformBase
from transformers.utils import get_json_schema

from torchrl_trl_interop import (
    as_openenv_environment,
    as_trl_environment_factory,
    as_trl_tools,
    openenv_server,
)
from torchrl_trl_interop.testing import toy_calculator_env

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")

PROMPT = "What is 2 plus 3?"
MCP_SERVER = str(Path(__file__).with_name("_mcp_calculator.py"))


def trl_schemas(make_env) -> dict[str, dict]:
    """What TRL renders for an environment_factory: every public method but reset and
    get_reward, through ``get_json_schema``."""
    env = as_trl_environment_factory(make_env)()
    try:
        methods = inspect.getmembers(type(env), inspect.isfunction)
        names = [
            n for n, _ in methods if not n.startswith("_") and n not in ("reset", "get_reward")
        ]
        return {n: get_json_schema(getattr(env, n))["function"] for n in names}
    finally:
        env.env.close(raise_if_closed=False)


def openenv_schemas(make_env) -> dict[str, dict]:
    env = as_openenv_environment(make_env)()
    try:
        return {s["function"]["name"]: s["function"] for s in env.reset(prompt=PROMPT).tools}
    finally:
        env.close()


def renamed(schema: dict, name: str) -> dict:
    return {**schema, "name": name}


KINDS = {
    "SimpleToolTransform": (toy_calculator_env, {"add": "add"}),
    "ExecuteToolsInOrder/XML": (
        functools.partial(registry_env, XMLBlockParser()),
        {"add": "add", "echo": "echo"},
    ),
    "ExecuteToolsInOrder/JSON": (
        functools.partial(registry_env, JSONCallParser()),
        {"add": "add", "echo": "echo"},
    ),
    "PythonInterpreter": (python_env, {"python": "python"}),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_tools_are_offered_to_trl_and_openenv(kind):
    make_env, names = KINDS[kind]  # {name TRL shows: name the environment reads}
    trl, openenv = trl_schemas(make_env), openenv_schemas(make_env)
    assert sorted(trl) == sorted(names)
    assert sorted(openenv) == sorted(names.values())
    for trl_name, env_name in names.items():
        assert openenv[env_name] == renamed(trl[trl_name], env_name)
    # the stateless tools TRL gets (GRPOTrainer(tools=...)) render the same
    transform = make_env().transform
    transforms = list(transform) if isinstance(transform, Compose) else [transform]
    transforms = [t for t in transforms if isinstance(t, ToolTransformBase)]
    plain = {f.__name__: get_json_schema(f)["function"] for f in as_trl_tools(transforms)}
    assert plain == trl


def test_a_served_environment_offers_the_python_tool():
    """Through OpenEnv's own WebSocket client: the served app offers the ``python`` tool TRL
    gets (before the catalogue, OpenEnv offered a PythonInterpreter as no tool at all)."""
    from openenv.core import GenericEnvClient

    with openenv_server(python_env) as url, GenericEnvClient(base_url=url).sync() as client:
        tools = client.reset(prompt=PROMPT).observation["tools"]
    assert [t["function"] for t in tools] == list(trl_schemas(python_env).values())


def test_a_tool_transform_whose_tools_cannot_be_listed():
    """TRL refuses it (nothing to call by name); OpenEnv serves the environment, with no tools."""

    class AnswersEveryTurn(ToolTransformBase):
        def _process_batch_item(self, content, index):
            return ["ok"]

    make_env = functools.partial(chat_env, AnswersEveryTurn())
    with pytest.raises(TypeError, match="cannot be listed"):
        as_trl_environment_factory(make_env)
    assert openenv_schemas(make_env) == {}


@pytest.mark.slow
def test_mcp_tools_are_offered_to_both():
    """A real stdio MCP server: TRL shows ``add``, OpenEnv ``calc.add`` (the name the
    environment reads in a call), with one schema."""
    make_env = functools.partial(mcp_env, MCP_SERVER)
    envs = []

    def make_and_keep():
        envs.append(make_env())
        return envs[-1]

    try:
        trl, openenv = trl_schemas(make_and_keep), openenv_schemas(make_and_keep)
    finally:
        for env in envs:
            env.transform.close()  # stops the MCP thread, which ends the server process
    assert list(trl) == ["add"] and list(openenv) == ["calc.add"]
    assert openenv["calc.add"] == renamed(trl["add"], "calc.add")
