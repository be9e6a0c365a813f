"""What crosses the wire between OpenEnv and a TorchRL chat environment.

The action (the assistant's message) and the observation (the new messages, the conversation,
the tools, reward and done) as OpenEnv's pydantic models, and the JSON schemas of the tools a
TorchRL environment's tool transforms run, which the observation carries at reset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._checks import require

require("openenv", "torchrl_trl_interop's OpenEnv adapters")

from openenv.core.env_server.types import Action, Observation  # noqa: E402
from pydantic import Field  # noqa: E402

__all__ = [
    "RequestError",
    "RequestStateError",
    "RequestTypeError",
    "RequestValueError",
    "TorchRLChatAction",
    "TorchRLChatObservation",
    "all_transforms",
    "check_chat_env",
    "tool_schemas",
]


class RequestError(Exception):
    """A client's mistake, refused before the environment runs: a missing prompt, an action of
    another schema, a step before reset. The served app answers it over HTTP with a 4xx and the
    message the WebSocket gives (OpenEnv's HTTP routes would answer 500)."""

    status_code = 422


class RequestValueError(RequestError, ValueError):
    """A request's value is wrong (a ``ValueError``)."""


class RequestTypeError(RequestError, TypeError):
    """A request's value has the wrong type (a ``TypeError``)."""


class RequestStateError(RequestError, RuntimeError):
    """A request the episode's state refuses (a ``RuntimeError``): a step before reset or
    after the episode ended. HTTP 409 (OpenEnv's HTTP routes build a new environment per
    request: a step there always comes before a reset)."""

    status_code = 409


class TorchRLChatAction(Action):
    """The assistant's message: one turn of the conversation."""

    content: str = Field(
        description="The assistant's message. The environment's transforms parse it (tool calls "
        "in the environment's own format) as they do under a TorchRL policy."
    )


class TorchRLChatObservation(Observation):
    """What a reset or a step returns: the new messages, the conversation, the tools."""

    messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The messages this call added, as TRL messages: at reset the prompt (system "
        "and user turns), after a step the environment's turns (tool results, replies).",
    )
    conversation: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The whole conversation so far, the assistant's turns included.",
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description="At reset, the JSON schemas of the environment's tools; None after a step.",
    )


def all_transforms(env: Any) -> list:
    """Every transform of ``env``, inside ``Compose``\\ s too, in order."""
    out, stack = [], [getattr(env, "transform", None)]
    while stack:
        t = stack.pop(0)
        if t is not None:
            out.append(t)
            stack[:0] = list(getattr(t, "transforms", []))
    return out


def _schema_of(name: str, func: Callable) -> dict[str, Any]:
    """A tool's JSON schema from its annotations and docstring, else one naming it only."""
    try:
        from transformers.utils import get_json_schema

        schema = get_json_schema(func)
    except Exception:  # no transformers, no docstring, untyped arguments: the name alone
        return {"type": "function", "function": {"name": name}}
    schema["function"]["name"] = name  # the name the environment calls it by
    return schema


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The JSON schemas of the named tools of ``env``'s tool transforms, in order.

    A tool transform holding a ``tools`` mapping (torchrl's ``SimpleToolTransform``) gives, per
    tool, its declared ``tool_schemas`` entry, else one built from the function's annotations and
    Google-style docstring (``transformers.utils.get_json_schema``), else one naming it only.
    Tool transforms without named tools (``PythonInterpreter``) add nothing.
    """
    from torchrl.envs.llm.transforms.tools import ToolTransformBase

    out = []
    for t in all_transforms(env):
        tools = getattr(t, "tools", None)
        if isinstance(t, ToolTransformBase) and isinstance(tools, Mapping):
            declared = getattr(t, "tool_schemas", None) or {}
            out.extend(declared.get(n) or _schema_of(n, f) for n, f in tools.items())
    return out


def check_chat_env(env: Any, owner: str) -> Any:
    """``env``'s base ChatEnv; raises unless ``env`` plays one history-mode episode at a time
    (what an OpenEnv session serves: one conversation)."""
    from torchrl.envs import EnvBase

    if not isinstance(env, EnvBase):
        raise TypeError(
            f"{owner}: make_env returned {env!r:.100} of type {type(env).__name__}; expected a "
            "torchrl environment: a ChatEnv (input_mode='history') or a TransformedEnv around one."
        )
    base = getattr(env, "base_env", env)
    if not hasattr(base, "data_key") or not hasattr(base, "input_mode"):
        raise TypeError(
            f"{owner}: the environment's base is a {type(base).__name__}, which reads no prompt "
            "at reset; use a torchrl.envs.llm.ChatEnv (or a TransformedEnv around one)."
        )
    if base.input_mode != "history":
        raise ValueError(
            f"{owner}: the ChatEnv has input_mode={base.input_mode!r}; OpenEnv messages are a "
            "conversation: build it with input_mode='history'."
        )
    if tuple(env.batch_size) != (1,):
        raise ValueError(
            f"{owner}: the environment has batch_size={tuple(env.batch_size)}; an OpenEnv session "
            "plays one episode, so build it with batch_size=(1,) (the server runs one "
            "environment per session: max_concurrent_envs)."
        )
    return base
