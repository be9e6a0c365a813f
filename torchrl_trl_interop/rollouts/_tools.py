"""TorchRL's tools as TRL tools: what each tool transform offers, and how it reads a call.

TorchRL's tool transforms read a call from the text of an assistant turn, each in its own syntax:
``SimpleToolTransform`` and ``MCPToolTransform`` ``<tool>name\\n{json}</tool>`` (or their
parser's), ``ExecuteToolsInOrder`` its parser's (``XMLBlockParser``: ``<tool name="...">{json}
</tool>``, ``JSONCallParser``: a JSON object), ``PythonInterpreter`` a fenced ``python`` block.
TRL's tool loop instead parses the model's calls itself and calls Python functions by name.
:func:`find_tools` lists the tools a TorchRL environment carries as :class:`TorchRLTool`\\ s: a
signature TRL can render, and :meth:`TorchRLTool.render`, which writes a call in the syntax of
the transform that runs it and checks that transform reads it back unchanged.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._checks import as_mapping
from .._upstream._env_step import flat_transforms
from .._upstream._tools import (
    mcp_tools,
    process_one,
    python_blocks,
    registry_services,
    tool_calls,
)
from ._tool_outcome import awaited, run_tool
from ._tool_schemas import (
    ToolSignature,
    check_renders,
    function_with_signature,
    signature_from_callable,
    signature_from_schema,
)

__all__ = [
    "CatalogueEntry",
    "TorchRLTool",
    "check_name",
    "env_transforms",
    "find_tools",
    "no_op",
    "service_signature",
    "tool_catalogue",
    "tool_transforms",
]

_MCP_CONNECT_S = 60.0  # how long to wait for an MCPToolTransform's servers to list their tools
_PYTHON_DOC = (
    "Runs Python code and returns what it printed.\n\n"
    "Args:\n    code: the Python source to run; print what you want to see.\n"
)


def _syntaxes(name: str, args: dict) -> dict[str, str]:
    """A call written in each syntax TorchRL's parsers read."""
    body = json.dumps(args)
    return {
        "tag": f"<tool>{name}\n{body}</tool>",  # SimpleToolTransform / MCPToolTransform default
        "xml": f'<tool name="{name}">{body}</tool>',  # XMLBlockParser
        "json": json.dumps({"message": "", "tools": [{"tool": name, "args": args}]}),
    }


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return None


def _reader(transform: Any) -> Callable[[str], list[tuple[str, Any]]]:
    """The calls ``transform`` reads in a text, as ``(name, arguments)``, with its own parser."""
    from torchrl.envs.llm.transforms import (
        ExecuteToolsInOrder,
        MCPToolTransform,
        PythonInterpreter,
        SimpleToolTransform,
    )

    if isinstance(transform, SimpleToolTransform):
        return lambda text: [(n, _loads(a)) for n, a in tool_calls(transform, text)]
    if isinstance(transform, MCPToolTransform):
        return lambda text: [(f"{s}.{n}", _loads(a)) for s, n, a in tool_calls(transform, text)]
    if isinstance(transform, ExecuteToolsInOrder):
        return lambda text: [(c.tool, c.args) for c in transform.parser(text)["calls"]]
    if isinstance(transform, PythonInterpreter):
        return lambda text: [("python", {"code": c}) for c in python_blocks(transform, text)]
    raise TypeError(f"no reader for {type(transform).__name__}")


@dataclass
class TorchRLTool:
    """One tool of a TorchRL tool transform: its TRL signature and the syntax its transform reads.

    ``env_name`` is the name the transform knows (``"server.tool"`` for MCP), ``signature.name``
    the name TRL shows the model.
    """

    signature: ToolSignature
    env_name: str
    transform: Any
    syntax: str  # "tag", "xml", "json" or "python"

    @property
    def name(self) -> str:
        return self.signature.name

    def render(self, arguments: dict[str, Any]) -> str:
        """The call as the transform reads it; raises if it would not read it back unchanged.

        Raises:
            ValueError: if the transform's parser reads another call back (e.g. a ``</tool>``
                inside an argument ends the call early), naming what it read.
        """
        if self.syntax == "python":
            text = f"```python\n{arguments.get('code', '')}\n```"
        else:
            text = _syntaxes(self.env_name, arguments)[self.syntax]
        read = _reader(self.transform)(text)
        if read != [(self.env_name, arguments)]:
            raise ValueError(
                f"tool {self.name!r}: {type(self.transform).__name__} reads the call "
                f"{text!r:.300} back as {read!r:.300}, not as this one call; change the "
                "arguments (they hold text the tool's parser treats as syntax)."
            )
        return text

    def call(self, **arguments: Any) -> Any:
        """Runs the call outside an environment: the transform's own execution and formatting.

        Raises:
            ToolFailed: if the tool raised; the message is the reply the transform wrote.
        """
        return run_tool(self.transform, self.env_name, lambda: self._reply(arguments))

    async def acall(self, **arguments: Any) -> Any:
        """:meth:`call` for a coroutine function: awaited once, then formatted by the transform."""
        outcome = await awaited(self.transform, self.env_name, arguments)
        return run_tool(self.transform, self.env_name, lambda: self._reply(arguments), outcome)

    def _reply(self, arguments: dict[str, Any]) -> Any:
        results = process_one(self.transform, self.render(arguments))
        if not results or len(results) != 1:
            raise RuntimeError(
                f"tool {self.name!r}: {type(self.transform).__name__} answered the call with "
                f"{results!r:.300}; expected one reply."
            )
        return results[0]


def no_op(**arguments: Any) -> str:
    return ""


def _pick_syntax(transform: Any, env_name: str) -> str:
    """The first syntax whose probe call ``transform`` reads back unchanged."""
    from torchrl.envs.llm.transforms import PythonInterpreter

    if isinstance(transform, PythonInterpreter):
        return "python"
    probe = {"x": 1, "y": "a b"}
    read = _reader(transform)
    for syntax, text in _syntaxes(env_name, probe).items():
        if read(text) == [(env_name, probe)]:
            return syntax
    raise ValueError(
        f"{type(transform).__name__} reads tool calls in a syntax this package cannot write (a "
        "custom tool_call_pattern or parser). Use its default pattern, an XMLBlockParser or a "
        "JSONCallParser."
    )


@dataclass(frozen=True)
class CatalogueEntry:
    """One tool an environment carries, before either side renders it.

    TRL renders it as a method named ``default_name`` (or its ``rename``) with the signature
    ``signature(name)`` builds; OpenEnv as the JSON schema :meth:`schema` returns, named
    ``env_name``, the name the environment reads in a call.
    """

    env_name: str
    default_name: str
    transform: Any
    signature: Callable[[str], ToolSignature]
    declared: dict[str, Any] | None = None  # a SimpleToolTransform's tool_schemas entry
    function: Callable[..., Any] | None = None  # a SimpleToolTransform's function

    def schema(self) -> dict[str, Any]:
        """The tool's JSON schema: the declared one, else the one ``get_json_schema`` renders
        (from the function, or the signature TRL renders), else one naming the tool only."""
        if self.declared:
            return self.declared
        try:
            from transformers.utils import get_json_schema

            sig = None if self.function else self.signature(self.default_name)
            schema = get_json_schema(
                self.function or function_with_signature(no_op, sig, method=False)
            )
        except Exception:  # no transformers, no docstring, untyped arguments: the name alone
            return {"type": "function", "function": {"name": self.env_name}}
        schema["function"]["name"] = self.env_name
        return schema


_SUPPORTED = "SimpleToolTransform, ExecuteToolsInOrder, MCPToolTransform, PythonInterpreter"


def tool_catalogue(
    transforms: Iterable[Any], *, skip_unknown: bool = False
) -> list[CatalogueEntry]:
    """Every tool the TorchRL tool ``transforms`` carry, in order: the one list TRL's
    (:func:`find_tools`) and OpenEnv's (``openenv._wire.tool_schemas``) tools come from.

    Keyword Args:
        skip_unknown (bool, optional): skip a tool transform whose tools cannot be listed (an
            environment that answers every turn) instead of raising. Defaults to ``False``.

    Raises:
        TypeError: if a transform's tools cannot be listed (unless ``skip_unknown``).
        RuntimeError: if an ``MCPToolTransform`` lists no tools (its servers did not connect).

    Examples:
        >>> from torchrl.envs.llm.transforms import PythonInterpreter, SimpleToolTransform
        >>> from torchrl_trl_interop.testing import toy_add
        >>> tools = [SimpleToolTransform(tools={"add": toy_add}), PythonInterpreter(persistent=False)]
        >>> [(e.env_name, e.schema()["function"]["name"]) for e in tool_catalogue(tools)]
        [('add', 'add'), ('python', 'python')]
    """
    from torchrl.envs.llm.transforms import (
        ExecuteToolsInOrder,
        MCPToolTransform,
        PythonInterpreter,
        SimpleToolTransform,
    )

    out: list[CatalogueEntry] = []
    for t in transforms:
        if isinstance(t, SimpleToolTransform):
            declared = t.tool_schemas or {}
            for n, f in t.tools.items():
                build = (
                    (lambda m, s=declared[n]: signature_from_schema(m, s))
                    if n in declared
                    else (lambda m, f=f: signature_from_callable(m, f))
                )
                out.append(CatalogueEntry(n, n, t, build, declared.get(n), f))
        elif isinstance(t, ExecuteToolsInOrder):
            for n, service in registry_services(t.registry).items():
                out.append(CatalogueEntry(n, n, t, service_signature(service)))
        elif isinstance(t, MCPToolTransform):
            for server, tools in mcp_tools(t, _MCP_CONNECT_S).items():
                for name, tool in tools.items():
                    build = lambda m, tool=tool: signature_from_schema(  # noqa: E731
                        m, tool.inputSchema, description=tool.description
                    )
                    out.append(CatalogueEntry(f"{server}.{name}", name, t, build))
        elif isinstance(t, PythonInterpreter):
            out.append(CatalogueEntry("python", "python", t, _python_signature))
        elif not skip_unknown:
            raise TypeError(
                f"{type(t).__name__} is a TorchRL tool transform whose tools cannot be listed "
                f"(supported: {_SUPPORTED}). An environment that answers every turn is a "
                "multi-turn environment, not a tool: use as_trl_rollout_func for it."
            )
    return out


def _python_signature(name: str) -> ToolSignature:
    import inspect

    code = inspect.Parameter("code", inspect.Parameter.KEYWORD_ONLY, annotation=str)
    return ToolSignature(name, (code,), {"code": str}, _PYTHON_DOC)


def service_signature(service: Any) -> Callable[[str], ToolSignature]:
    doc = getattr(service, "description", None) or (type(service).__doc__ or "").strip()
    doc = doc or f"The {service.name} service."
    return lambda m: signature_from_schema(m, service.schema_in, description=doc)


def env_transforms(env: Any) -> list:
    """Every transform of ``env`` (a ``TransformedEnv``), in order, those inside a ``Compose`` too."""
    return flat_transforms(getattr(env, "transform", None))


def tool_transforms(env: Any) -> list:
    """The TorchRL tool transforms of ``env``, in order."""
    from torchrl.envs.llm.transforms.tools import ToolTransformBase

    return [t for t in env_transforms(env) if isinstance(t, ToolTransformBase)]


def check_name(name: Any, env_name: str, reserved: Iterable[str]) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        hint = f"; pass rename={{{env_name!r}: 'a_name'}}" if name == env_name else ""
        raise ValueError(
            f"tool {env_name!r} would be called {name!r}, which is not a Python identifier (or "
            f"is a keyword), so it cannot be a method or function name{hint}."
        )
    if name.startswith("_") or name in reserved:
        raise ValueError(
            f"tool {env_name!r} would be called {name!r}, which TRL would not offer as a tool "
            f"(names starting with '_' and {sorted(reserved)} are taken); pass "
            f"rename={{{env_name!r}: 'another_name'}}."
        )


def find_tools(
    transforms: Iterable[Any],
    rename: Mapping[str, str] | None,
    reserved: Iterable[str] = (),
) -> list[TorchRLTool]:
    """Every tool the TorchRL tool ``transforms`` offer, named for TRL and checked to render.

    Raises:
        TypeError: if a transform's tools cannot be listed, or a tool cannot be read (see
            :func:`~._tool_schemas.signature_from_callable`).
        RuntimeError: if an ``MCPToolTransform`` lists no tools (its servers did not connect).
        ValueError: if a name is not an identifier, is reserved, or two tools share one; if a
            ``rename`` key names no tool; if TRL cannot render a tool.
    """
    rename = as_mapping(rename, "rename", "{tool name: new name}")
    reserved = {"reset", "get_reward", *reserved}
    tools: list[TorchRLTool] = []
    for entry in tool_catalogue(transforms):
        transform, env_name, build = entry.transform, entry.env_name, entry.signature
        name = rename.get(env_name, entry.default_name)
        check_name(name, env_name, reserved)
        clash = [t.env_name for t in tools if t.name == name]
        if clash:
            raise ValueError(
                f"tools {clash[0]!r} and {env_name!r} would both be called {name!r}; pass "
                f"rename={{{env_name!r}: 'another_name'}}."
            )
        syntax = _pick_syntax(transform, env_name)
        tool = TorchRLTool(build(name), env_name, transform, syntax)
        check_renders(function_with_signature(no_op, tool.signature, method=False))
        tools.append(tool)
    unknown = sorted(set(rename) - {t.env_name for t in tools})
    if unknown:
        raise ValueError(
            f"rename names {unknown}, which are not tools of the environment (its tools: "
            f"{[t.env_name for t in tools]})."
        )
    return tools
