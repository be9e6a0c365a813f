"""torchrl's tool transforms read from inside: their call parsers, one call's reply, their tools.

TRL calls tools by name with arguments; torchrl's tool transforms (``SimpleToolTransform``,
``MCPToolTransform``, ``ExecuteToolsInOrder``, ``PythonInterpreter``) read calls from the text of
an assistant turn and answer a whole batch in their ``_step``. To offer those tools to TRL and to
OpenEnv (``rollouts/_tools.py``) and to run one call the way the environment would, the package
needs four things torchrl 0.14.1 keeps private:

* the parser a transform reads calls with (``_extract_tool_calls``, ``_extract_python_code``);
* the reply a transform writes for one text (``_process_batch_item``);
* the services of a ``ToolRegistry`` (``_svc``), which it can look up by name but not list;
* the tools an ``MCPToolTransform`` listed from its servers (``_tools_cache``, ``_ready_event``,
  ``_connection_error``), and its one-call executor (``_execute_tool_sync``), replaced for one
  call to see whether the server reported a failure.

Each read runs on the torchrl versions it was written against (:data:`TORCHRL_MEASURED`); on
another version, or under :func:`~torchrl_trl_interop._upstream.plain_upstream`, it raises a
clear ``RuntimeError`` instead of reading attributes that may have moved (torchrl has no public
call that does the same). What would retire this module: a public ``parse_calls(text)`` and
``process_one(text)`` on ``ToolTransformBase``, a ``ToolRegistry.services()`` listing, and an
``MCPToolTransform.list_tools(timeout=...)`` with a failure callback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ._gate import TORCHRL_MEASURED, use_fast

__all__ = [
    "mcp_tools",
    "process_one",
    "python_blocks",
    "registry_services",
    "tool_calls",
    "watch_mcp_execute",
]

#: The torchrl internals this module reads (``test/test_layout.py`` checks the list).
READS = (
    "torchrl.envs.llm.transforms.SimpleToolTransform._extract_tool_calls",
    "torchrl.envs.llm.transforms.MCPToolTransform._extract_tool_calls",
    "torchrl.envs.llm.transforms.PythonInterpreter._extract_python_code",
    "torchrl.envs.llm.transforms.PythonInterpreter._process_batch_item",
    "torchrl.envs.llm.transforms.ToolRegistry._svc",
    "torchrl.envs.llm.transforms.MCPToolTransform._tools_cache",
    "torchrl.envs.llm.transforms.MCPToolTransform._ready_event",
    "torchrl.envs.llm.transforms.MCPToolTransform._connection_error",
    "torchrl.envs.llm.transforms.MCPToolTransform._execute_tool_sync",
)


def _require(what: str) -> None:
    if not use_fast(TORCHRL_MEASURED):
        package, low, high = TORCHRL_MEASURED
        raise RuntimeError(
            f"reading {what} needs torchrl's private attributes, read only on "
            f"{package} >= {low}, < {high} (the versions it was written against); this "
            "torchrl is another (or plain_upstream() is active), and torchrl offers no public "
            "call that does the same. Install a torchrl in that range, or run the environment "
            "through a TorchRL collector (as_trl_rollout_func) instead of TRL's tool loop."
        )


def tool_calls(transform: Any, text: str) -> list[tuple]:
    """The calls a ``SimpleToolTransform`` (``(name, args)``) or an ``MCPToolTransform``
    (``(server, name, args)``) reads in ``text``, with its own parser.

    Examples:
        >>> from torchrl.envs.llm.transforms import SimpleToolTransform
        >>> tool_calls(SimpleToolTransform(tools={"add": print}), '<tool>add\\n{"a": 1}</tool>')
        [('add', '{"a": 1}')]
    """
    _require(f"the calls a {type(transform).__name__} parses")
    return list(transform._extract_tool_calls(text))


def python_blocks(transform: Any, text: str) -> list[str]:
    """The code blocks a ``PythonInterpreter`` reads in ``text``.

    Examples:
        >>> from torchrl.envs.llm.transforms import PythonInterpreter
        >>> python_blocks(PythonInterpreter(persistent=False), "```python\\nprint(1)\\n```")
        ['print(1)']
    """
    _require("the code blocks a PythonInterpreter parses")
    return list(transform._extract_python_code(text))


def process_one(transform: Any, text: str) -> Any:
    """The replies a tool transform writes for one assistant turn ``text`` (``None`` if none).

    Examples:
        >>> from torchrl.envs.llm.transforms import SimpleToolTransform
        >>> from torchrl_trl_interop.testing import toy_add
        >>> process_one(SimpleToolTransform(tools={"add": toy_add}), '<tool>add\\n{"a": 2, "b": 3}</tool>')
        ['Tool add executed successfully:\\n5']
    """
    _require(f"the reply a {type(transform).__name__} writes for one call")
    return transform._process_batch_item(text, 0)


def registry_services(registry: Any) -> dict[str, Any]:
    """The services of a torchrl ``ToolRegistry``, by name: the registry's own dict (replacing
    an entry replaces the service the registry calls).

    Examples:
        >>> from torchrl.envs.llm.transforms import ToolRegistry
        >>> registry_services(ToolRegistry())
        {}
    """
    _require("the services of a ToolRegistry")
    return registry._svc


def mcp_tools(transform: Any, timeout_s: float) -> dict:
    """The tools an ``MCPToolTransform`` listed, ``{server: {name: tool}}``, waiting up to
    ``timeout_s`` for its servers (torchrl waits 10 s).

    Raises:
        RuntimeError: if it lists no tools by then, with the connection error torchrl recorded.
    """
    _require("the tools an MCPToolTransform listed")
    ready = getattr(transform, "_ready_event", None)
    if not transform._tools_cache and ready is not None:
        ready.wait(timeout=timeout_s)
    if not transform._tools_cache:
        raise RuntimeError(
            f"the MCPToolTransform lists no tools after {timeout_s:.0f} s "
            f"(connection error: {transform._connection_error or 'none reported'}). Check "
            "its servers; "
            "note that torchrl 0.14.1 lists tools without the MCP handshake "
            "(session.initialize()), which compliant servers refuse."
        )
    return transform._tools_cache


@contextlib.contextmanager
def watch_mcp_execute(transform: Any, on_result: Callable[[dict], None]) -> Iterator[None]:
    """For the block, every result of the ``MCPToolTransform``'s one-call executor is first
    handed to ``on_result`` (a dict with ``"success"`` and ``"error"``)."""
    _require("an MCPToolTransform's tool executor")
    own = vars(transform).get("_execute_tool_sync")  # normally None: the class's method
    execute = transform._execute_tool_sync

    def watched(*args: Any, **kwargs: Any) -> dict:
        result = execute(*args, **kwargs)
        on_result(result)
        return result

    transform._execute_tool_sync = watched
    try:
        yield
    finally:
        if own is None:
            del transform._execute_tool_sync  # the class's method again
        else:
            transform._execute_tool_sync = own
