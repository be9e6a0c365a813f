"""TorchRL's tools as plain TRL tools (``GRPOTrainer(tools=[...])``), and the template check.

:func:`as_trl_tools` gives the tools of TorchRL tool transforms (or a ``ToolRegistry``) as
picklable callables with the signature, type hints and docstring TRL renders; each runs the call
the way its transform does in an environment (``_tools``). :func:`check_tool_template` says
whether TRL can render and parse tool calls with a tokenizer's chat template.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

from .._checks import as_mapping, boundary, check_tokenizer, require
from .._upstream._tools import registry_services
from ._tool_schemas import ToolSignature, check_renders, function_with_signature
from ._tools import check_name, find_tools, no_op, service_signature

__all__ = ["as_trl_tools", "check_tool_template"]


class _ToolBox:
    """Holds tools, each given out as a bound method carrying its signature (see :func:`as_trl_tools`).

    ``transformers`` renders only functions and methods as tools, and TRL's spawned workers need
    them to pickle. A bound method pickles as ``getattr(box, name)``, so the box pickles with
    its tools (when their transforms pickle) and builds each method again where unpickled.
    """

    def __init__(self, tools: dict[str, tuple[ToolSignature, Callable[..., Any]]]) -> None:
        self.tools = tools

    def __getstate__(self) -> dict[str, Any]:
        return {"tools": self.tools}

    def __getattr__(self, name: str) -> Any:
        tools = self.__dict__.get("tools", {})
        if name not in tools:
            raise AttributeError(name)
        cache = self.__dict__.setdefault("_methods", {})
        if name not in cache:
            signature, call = tools[name]
            function = function_with_signature(_checked(signature, call), signature, method=True)
            # a tool TRL calls (an async one stays a coroutine function)
            cache[name] = types.MethodType(boundary("as_trl_tools")(function), self)
        return cache[name]


def _checked(signature: ToolSignature, call: Callable[..., Any]) -> Callable[..., Any]:
    def body(box: _ToolBox, **arguments: Any) -> Any:
        signature.signature.bind(**arguments)  # a missing or unknown argument: TypeError
        return call(**arguments)  # an awaitable for an async tool, awaited by the method

    return body


@boundary("as_trl_tools")
def as_trl_tools(
    tools: Any, *, rename: Mapping[str, str] | None = None, processing_class: Any = None
) -> list[Callable[..., Any]]:
    """TorchRL tools as plain callables for ``GRPOTrainer(tools=[...])``, for stateless tools.

    Each callable is a method (``transformers`` renders functions and methods only) with the
    tool's name, signature, type hints and Google-style docstring, which TRL renders into the
    prompt (``transformers.utils.get_json_schema``). Called by TRL's tool
    loop with the model's arguments, it runs the tool the way the transform does in an
    environment, through the transform's own parser, execution and formatting
    (``_process_batch_item``), and returns the reply the environment would write into its
    History (``SimpleToolTransform``: ``"Tool add executed successfully:\\n5"``). No
    environment is involved: a tool that keeps state between calls (a persistent interpreter,
    an MCP session) shares it across every rollout; use
    :func:`~torchrl_trl_interop.as_trl_environment_factory` to give each rollout its own.

    Args:
        tools: a ``SimpleToolTransform``, ``ExecuteToolsInOrder``, ``MCPToolTransform``,
            ``PythonInterpreter``, a list of them, or a ``ToolRegistry`` (each service then is
            called with the arguments and its output returned as the service returns it).

    Keyword Args:
        rename (dict, optional): ``{tool name: name shown to the model}``, for names that are
            not Python identifiers (MCP's ``"browser-navigate"``) or clash.
        processing_class (tokenizer, optional): when given, checked to render and parse tool
            calls (:func:`check_tool_template`).

    Returns:
        a list of picklable callables (when the transform pickles), one per tool.

    Raises:
        TypeError: if ``tools`` holds something else, or a tool cannot be read.
        ValueError: naming the tool and the field, if a schema cannot become a signature; if a
            name is not an identifier or two tools share one.

    Examples:
        >>> import inspect
        >>> from torchrl.envs.llm.transforms import SimpleToolTransform
        >>> from torchrl_trl_interop.testing import toy_add  # typed, with a Google-style docstring
        >>> [tool] = as_trl_tools(SimpleToolTransform(tools={"add": toy_add}))
        >>> tool.__name__, inspect.signature(tool)
        ('add', <Signature (*, a: int, b: int) -> int>)
        >>> tool(a=2, b=3)
        'Tool add executed successfully:\\n5'
    """
    require("transformers", "as_trl_tools")
    from torchrl.envs.llm.transforms.tools import ToolRegistry, ToolTransformBase

    if processing_class is not None:
        check_tool_template(processing_class)
    found: dict[str, tuple[ToolSignature, Callable[..., Any]]] = {}
    if isinstance(tools, ToolRegistry):
        names = as_mapping(rename, "rename", "{tool name: new name}")
        for env_name, service in registry_services(tools).items():
            name = names.get(env_name, env_name)
            check_name(name, env_name, {"reset", "get_reward"})
            sig = service_signature(service)(name)
            check_renders(function_with_signature(no_op, sig, method=False))
            found[name] = (sig, service)
    else:
        transforms = list(tools) if isinstance(tools, (list, tuple)) else [tools]
        bad = [t for t in transforms if not isinstance(t, ToolTransformBase)]
        if bad:
            raise TypeError(
                "tools should be TorchRL tool transforms (SimpleToolTransform, "
                "ExecuteToolsInOrder, MCPToolTransform, PythonInterpreter) or a ToolRegistry, "
                f"got {type(bad[0]).__name__}."
            )
        found = {
            t.name: (t.signature, t.acall if t.signature.is_async else t.call)
            for t in find_tools(transforms, rename)
        }
    box = _ToolBox(found)
    return [getattr(box, name) for name in found]


def check_tool_template(processing_class: Any) -> None:
    """Raises unless TRL can render tool calls with ``processing_class`` and parse them back.

    Raises:
        TypeError: if ``processing_class`` is not a tokenizer (or processor).
        ValueError: if the chat template cannot render a tool-calling conversation
            (``trl.chat_template_utils.supports_tool_calling``), or TRL knows no response parser
            for it (``add_response_schema`` recognises TRL's shipped templates by equality).
    """
    import copy

    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    check_tokenizer(processing_class, "processing_class")
    shipped = (
        "TRL ships templates that can: trl/chat_templates/*.jinja, e.g. "
        "tokenizer.chat_template = trl.chat_template_utils.qwen2_5_chat_template"
    )
    if not supports_tool_calling(processing_class):
        raise ValueError(
            "the tokenizer's chat template cannot render a tool-calling conversation "
            f"(trl.chat_template_utils.supports_tool_calling is False). {shipped}."
        )
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if any(
        getattr(tokenizer, a, None) is not None for a in ("response_template", "response_schema")
    ):
        return
    try:
        add_response_schema(copy.copy(processing_class))
    except ValueError as err:
        raise ValueError(
            "TRL cannot parse the model's tool calls with this chat template: "
            "add_response_schema recognises TRL's shipped templates only, by equality "
            f"({err}). {shipped}, or set tokenizer.response_template yourself."
        ) from err
