"""Fixtures of the OpenEnv tests: OpenEnv's server in a thread for a module's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def served_url():
    """``toy_tool_env`` served by OpenEnv's server (uvicorn, 127.0.0.1) for the module's tests."""
    from torchrl_trl_interop import openenv_server
    from torchrl_trl_interop.testing import toy_tool_env

    with openenv_server(toy_tool_env, max_concurrent_envs=8) as url:
        yield url
