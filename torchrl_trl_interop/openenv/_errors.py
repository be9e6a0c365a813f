"""How the served app answers a client's mistakes: over HTTP as over the WebSocket.

OpenEnv's server (0.10) answers an exception of the environment over the WebSocket with an
``EXECUTION_ERROR`` carrying its message, but over HTTP with a bare 500, and a message that
fails its schema over the WebSocket with ``VALIDATION_ERROR: Invalid message``, the fields
only in a side list its clients do not show. :func:`answer_mistakes_clearly` makes the app
answer both alike: a :class:`~._wire.RequestError` (a missing prompt, an action of another
schema, a step before reset) over HTTP with a 4xx and the message the WebSocket gives, and a
WebSocket ``VALIDATION_ERROR`` with the fields named in its message, a ``FACTORY_ERROR`` (a
session's environment failed to build) with the reason OpenEnv leaves out; a reply to a client
that already left is dropped instead of ending in a traceback.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from ._wire import RequestError

__all__ = ["answer_mistakes_clearly", "name_fields"]


def name_fields(errors: list[dict[str, Any]]) -> str:
    """pydantic's ``errors()`` as one line naming each field and what is wrong with it.

    Examples:
        >>> name_fields([{"loc": ("data", "content"), "msg": "Field required"},
        ...              {"loc": ("data", "message"), "msg": "Extra inputs are not permitted"}])
        "'data.content': Field required; 'data.message': Extra inputs are not permitted"
    """
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ())) or "the message"
        parts.append(f"'{where}': {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def _named(text: str) -> str:
    """A WebSocket ``VALIDATION_ERROR`` reply with its fields named in its message."""
    try:
        reply = json.loads(text)
        data = reply["data"]
        fields = name_fields(data.get("errors") or [])
    except (ValueError, KeyError, TypeError, AttributeError):
        return text  # not the reply we know: as it is
    if fields:
        data["message"] = f"{data.get('message', 'Invalid message')}: {fields}"
    return json.dumps(reply)


def _with_reason(text: str, failures: deque) -> str:
    """A WebSocket ``FACTORY_ERROR`` reply with the reason of the oldest failure not yet
    reported (OpenEnv's says only that the factory failed)."""
    try:
        reply = json.loads(text)
        data = reply["data"]
        reason = failures.popleft()
    except (ValueError, KeyError, TypeError, IndexError):
        return text
    data["message"] = f"{data.get('message', 'The environment factory failed')} {reason}"
    return json.dumps(reply)


class _WebSocketAnswers:
    """ASGI middleware of the WebSocket: ``VALIDATION_ERROR`` replies name their fields,
    ``FACTORY_ERROR`` replies give the factory's reason, and a reply to a client that already
    left (it timed out on a slow step) is dropped.

    The reasons come from ``factory_failures``, where the served class records each failure of
    its ``make_env`` in order (OpenEnv builds a session's environment in a thread of its own,
    out of reach of the reply); two sessions failing at the same moment for different
    reasons may get each other's.

    OpenEnv's handler (0.10) answers the failed send of such a reply by sending an error to the
    same closed socket, which fails again: an "Exception in ASGI application" traceback at
    every client timeout. Dropped here, the handler reads the client's disconnect next and
    ends the session as it does for a client that closes.
    """

    def __init__(self, app: Any, factory_failures: deque | None = None) -> None:
        self.app = app
        self.factory_failures = factory_failures

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        gone = False

        async def answer(message: dict) -> None:
            nonlocal gone
            if gone:
                return
            text = message.get("text") if message.get("type") == "websocket.send" else None
            if text and "VALIDATION_ERROR" in text:
                message = {**message, "text": _named(text)}
            elif text and "FACTORY_ERROR" in text and self.factory_failures is not None:
                message = {**message, "text": _with_reason(text, self.factory_failures)}
            try:
                await send(message)
            except OSError:  # uvicorn's ClientDisconnected: the client left
                gone = True

        return await self.app(scope, receive, answer)


def answer_mistakes_clearly(app: Any, factory_failures: deque | None = None) -> Any:
    """Makes OpenEnv's FastAPI ``app`` answer a client's mistakes alike over HTTP and WebSocket,
    and a session's ``FACTORY_ERROR`` with a reason recorded in ``factory_failures`` (module
    docstring); returns ``app``."""
    from fastapi.responses import JSONResponse

    async def request_error(request: Any, err: RequestError) -> JSONResponse:
        return JSONResponse(status_code=err.status_code, content={"detail": str(err)})

    app.add_exception_handler(RequestError, request_error)
    app.add_middleware(_WebSocketAnswers, factory_failures=factory_failures)
    return app
