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
from ._tool_outcome import awaited, run_tool
from ._tool_schemas import (
    ToolSignature,
    check_renders,
    function_with_signature,
    signature_from_callable,
    signature_from_schema,
)

__all__ = [
    "TorchRLTool",
    "check_name",
    "env_transforms",
    "find_tools",
    "no_op",
    "service_signature",
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
        return lambda text: [(n, _loads(a)) for n, a in transform._extract_tool_calls(text)]
    if isinstance(transform, MCPToolTransform):
        calls = transform._extract_tool_calls
        return lambda text: [(f"{s}.{n}", _loads(a)) for s, n, a in calls(text)]
    if isinstance(transform, ExecuteToolsInOrder):
        return lambda text: [(c.tool, c.args) for c in transform.parser(text)["calls"]]
    if isinstance(transform, PythonInterpreter):
        return lambda text: [("python", {"code": c}) for c in transform._extract_python_code(text)]
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
        results = self.transform._process_batch_item(self.render(arguments), 0)
        if not results or len(results) != 1:
            raise RuntimeError(
                f"tool {self.name!r}: {type(self.transform).__name__} answered the call with "
                f"{results!r:.300}; expected one reply."
            )
        return results[0]


def no_op(**arguments: Any) -> str:
    return ""


def _pick_syntax(transform: Any, env_name: str, owner: str) -> str:
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
        f"{owner}: {type(transform).__name__} reads tool calls in a syntax this package cannot "
        "write (a custom tool_call_pattern or parser). Use its default pattern, an "
        "XMLBlockParser or a JSONCallParser."
    )


def _offered(transform: Any, owner: str) -> list[tuple[str, str, Callable[[str], ToolSignature]]]:
    """``(env name, default TRL name, signature builder)`` of every tool ``transform`` offers;
    the builder takes the name TRL shows."""
    from torchrl.envs.llm.transforms import (
        ExecuteToolsInOrder,
        MCPToolTransform,
        PythonInterpreter,
        SimpleToolTransform,
    )

    if isinstance(transform, SimpleToolTransform):
        schemas = transform.tool_schemas or {}
        return [
            (
                n,
                n,
                lambda m, n=n, f=f: (
                    signature_from_schema(m, schemas[n], owner)
                    if n in schemas
                    else signature_from_callable(m, f, owner)
                ),
            )
            for n, f in transform.tools.items()
        ]
    if isinstance(transform, ExecuteToolsInOrder):
        services = transform.registry._svc  # torchrl's ToolRegistry lists no services publicly
        return [(n, n, service_signature(s, owner)) for n, s in services.items()]
    if isinstance(transform, MCPToolTransform):
        ready = getattr(transform, "_ready_event", None)  # torchrl waits only 10 s for servers
        if not transform._tools_cache and ready is not None:
            ready.wait(timeout=_MCP_CONNECT_S)
        if not transform._tools_cache:
            raise RuntimeError(
                f"{owner}: the MCPToolTransform lists no tools after {_MCP_CONNECT_S:.0f} s "
                f"(connection error: {transform._connection_error or 'none reported'}). Check "
                "its servers; note that torchrl 0.14.1 lists tools without the MCP handshake "
                "(session.initialize()), which compliant servers refuse."
            )
        return [
            (
                f"{server}.{name}",
                name,
                lambda m, tool=tool: signature_from_schema(
                    m, tool.inputSchema, owner, description=tool.description
                ),
            )
            for server, tools in transform._tools_cache.items()
            for name, tool in tools.items()
        ]
    if isinstance(transform, PythonInterpreter):
        return [("python", "python", _python_signature)]
    raise TypeError(
        f"{owner}: {type(transform).__name__} is a TorchRL tool transform whose tools cannot be "
        "listed (supported: SimpleToolTransform, ExecuteToolsInOrder, MCPToolTransform, "
        "PythonInterpreter). An environment that answers every turn is a multi-turn "
        "environment, not a tool: use as_trl_rollout_func for it."
    )


def _python_signature(name: str) -> ToolSignature:
    import inspect

    code = inspect.Parameter("code", inspect.Parameter.KEYWORD_ONLY, annotation=str)
    return ToolSignature(name, (code,), {"code": str}, _PYTHON_DOC)


def service_signature(service: Any, owner: str) -> Callable[[str], ToolSignature]:
    doc = getattr(service, "description", None) or (type(service).__doc__ or "").strip()
    doc = doc or f"The {service.name} service."
    return lambda m: signature_from_schema(m, service.schema_in, owner, description=doc)


def env_transforms(env: Any) -> list:
    """Every transform of ``env`` (a ``TransformedEnv``), in order, those inside a ``Compose`` too."""
    from torchrl.envs.transforms import Compose

    found, stack = [], [getattr(env, "transform", None)]
    while stack:
        t = stack.pop(0)
        if isinstance(t, Compose):
            stack[:0] = list(t.transforms)
        elif t is not None:
            found.append(t)
    return found


def tool_transforms(env: Any) -> list:
    """The TorchRL tool transforms of ``env``, in order."""
    from torchrl.envs.llm.transforms.tools import ToolTransformBase

    return [t for t in env_transforms(env) if isinstance(t, ToolTransformBase)]


def check_name(name: Any, env_name: str, reserved: Iterable[str], owner: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        hint = f"; pass rename={{{env_name!r}: 'a_name'}}" if name == env_name else ""
        raise ValueError(
            f"{owner}: tool {env_name!r} would be called {name!r}, which is not a Python "
            f"identifier (or is a keyword), so it cannot be a method or function name{hint}."
        )
    if name.startswith("_") or name in reserved:
        raise ValueError(
            f"{owner}: tool {env_name!r} would be called {name!r}, which TRL would not offer as a "
            f"tool (names starting with '_' and {sorted(reserved)} are taken); pass "
            f"rename={{{env_name!r}: 'another_name'}}."
        )


def find_tools(
    transforms: Iterable[Any],
    rename: Mapping[str, str] | None,
    owner: str,
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
    rename = as_mapping(rename, "rename", owner, "{tool name: new name}")
    reserved = {"reset", "get_reward", *reserved}
    tools: list[TorchRLTool] = []
    for transform in transforms:
        for env_name, default, build in _offered(transform, owner):
            name = rename.get(env_name, default)
            check_name(name, env_name, reserved, owner)
            clash = [t.env_name for t in tools if t.name == name]
            if clash:
                raise ValueError(
                    f"{owner}: tools {clash[0]!r} and {env_name!r} would both be called {name!r}; "
                    f"pass rename={{{env_name!r}: 'another_name'}}."
                )
            syntax = _pick_syntax(transform, env_name, owner)
            tool = TorchRLTool(build(name), env_name, transform, syntax)
            check_renders(function_with_signature(no_op, tool.signature, method=False), owner)
            tools.append(tool)
    unknown = sorted(set(rename) - {t.env_name for t in tools})
    if unknown:
        raise ValueError(
            f"{owner}: rename names {unknown}, which are not tools of the environment (its "
            f"tools: {[t.env_name for t in tools]})."
        )
    return tools
