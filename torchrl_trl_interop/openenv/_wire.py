"""What crosses the wire between OpenEnv and a TorchRL chat environment.

The action (the assistant's message) and the observation (the new messages, the conversation,
the tools, reward and done) as OpenEnv's pydantic models, and the JSON schemas of the tools a
TorchRL environment's tool transforms run, which the observation carries at reset.
"""

from __future__ import annotations

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


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The JSON schemas of the tools of ``env``'s tool transforms, in order, named as the
    environment reads them in a call.

    They come from the tool catalogue TRL's tools come from too
    (:func:`~torchrl_trl_interop.rollouts._tools.tool_catalogue`): a ``SimpleToolTransform``'s
    declared ``tool_schemas`` entry, else the schema ``transformers.utils.get_json_schema``
    renders from the function (or, for ``ExecuteToolsInOrder``'s services, ``MCPToolTransform``'s
    tools and ``PythonInterpreter``'s ``python(code)``, from the signature TRL renders), else one
    naming the tool only. A tool transform whose tools cannot be listed adds nothing.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tool_env
        >>> [s["function"]["name"] for s in tool_schemas(toy_tool_env())]
        ['add']
    """
    from ..rollouts._tools import tool_catalogue, tool_transforms

    catalogue = tool_catalogue(tool_transforms(env), skip_unknown=True)  # signed by the caller
    return [entry.schema() for entry in catalogue]
