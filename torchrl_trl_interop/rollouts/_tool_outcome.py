"""A TorchRL tool call's outcome as TRL sees a plain function's: raised failures, awaited coroutines.

TorchRL's tool transforms catch a failing tool and write the error into the reply
(``SimpleToolTransform``: ``"Tool add failed:\\n..."``), and call a coroutine function without
awaiting it (the reply then holds ``<coroutine object ...>``). TRL instead awaits coroutine
functions and counts a raised exception in ``tools/failure_frequency``. :func:`run_tool` runs one
call through the transform (so an environment still records the turn as TorchRL writes it) while
watching the tool itself: the function's exception is raised again as :class:`ToolFailed`
(its message the reply the transform wrote) and a coroutine function is awaited first
(:func:`awaited`), its result handed to the transform in place of the coroutine.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from .._checks import Reply
from .._upstream._tools import registry_services, watch_mcp_execute

__all__ = ["EpisodeOver", "ToolFailed", "awaited", "is_async_tool", "run_tool"]


class ToolFailed(Reply, RuntimeError):
    """The tool raised (or its transform reported a failure); the message is the tool's reply,
    which TRL shows the model (a :class:`~torchrl_trl_interop._checks.Reply`: never signed)."""


class EpisodeOver(Reply, RuntimeError):
    """A tool called after the environment ended the episode; the message, which TRL shows the
    model, tells it to answer."""


def _function(transform: Any, env_name: str) -> Callable[..., Any] | None:
    """The Python callable behind a ``SimpleToolTransform``'s tool, ``None`` for other transforms."""
    from torchrl.envs.llm.transforms import SimpleToolTransform

    if isinstance(transform, SimpleToolTransform):
        return transform.tools.get(env_name)
    return None


def is_async_tool(transform: Any, env_name: str) -> bool:
    """Whether the tool is a coroutine function (TRL awaits those).

    Examples:
        >>> from torchrl.envs.llm.transforms import SimpleToolTransform
        >>> async def add(a: int, b: int) -> int: ...
        >>> is_async_tool(SimpleToolTransform(tools={"add": add}), "add")
        True
    """
    return inspect.iscoroutinefunction(_function(transform, env_name))


async def awaited(transform: Any, env_name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """Awaits an async tool once: ``(True, result)``, or ``(False, exception)`` if it raised."""
    try:
        return True, await _function(transform, env_name)(**arguments)
    except Exception as err:  # the transform reports it, then run_tool raises it for TRL
        return False, err


@contextlib.contextmanager
def _watched(transform: Any, env_name: str, outcome: tuple[bool, Any] | None) -> Iterator[list]:
    """For the duration of one call, the tool's executor replaced by one that records failures
    (and, for an awaited async tool, answers with its ``outcome``); yields the failures."""
    from torchrl.envs.llm.transforms import ExecuteToolsInOrder, MCPToolTransform

    failures: list[str] = []
    function = _function(transform, env_name)
    if function is not None:

        def watched(**arguments: Any) -> Any:
            if outcome is not None:
                ok, value = outcome
            else:
                try:
                    ok, value = True, function(**arguments)
                except Exception as err:
                    ok, value = False, err
            if not ok:
                failures.append(str(value))
                raise value
            return value

        transform.tools[env_name] = watched
        try:
            yield failures
        finally:
            transform.tools[env_name] = function
    elif isinstance(transform, ExecuteToolsInOrder):
        services = registry_services(transform.registry)
        service = services[env_name]

        def call_service(**arguments: Any) -> Any:
            try:
                return service(**arguments)
            except Exception as err:
                failures.append(str(err))
                raise

        services[env_name] = call_service
        try:
            yield failures
        finally:
            services[env_name] = service
    elif isinstance(transform, MCPToolTransform):

        def on_result(result: dict) -> None:
            if not result.get("success", False):
                failures.append(str(result.get("error")))

        with watch_mcp_execute(transform, on_result):
            yield failures
    else:  # PythonInterpreter: an error in the code is the program's output, as TRL would show it
        yield failures


def run_tool(
    transform: Any, env_name: str, run: Callable[[], Any], outcome: tuple[bool, Any] | None = None
) -> Any:
    """``run()`` (one call through ``transform``) with the tool watched; raises
    :class:`ToolFailed` with ``reply(result)`` when the tool failed.

    ``run`` returns the reply the transform wrote (a string); ``outcome`` is what
    :func:`awaited` returned for an async tool.

    Raises:
        ToolFailed: if the tool raised (or an MCP server reported a failure); its message is the
            reply the transform wrote, which TRL feeds back to the model as ``{"error": ...}``.
    """
    with _watched(transform, env_name, outcome) as failures:
        reply = run()
    if failures:
        raise ToolFailed(str(reply))
    return reply
