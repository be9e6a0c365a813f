"""The listening socket of the package's servers (the OpenEnv server, the OpenAI-compatible
endpoint): one way to bind it, for uvicorn to listen on."""

from __future__ import annotations

import socket

__all__ = ["bound_socket"]


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` (``port=0``: a free one), for uvicorn to listen on.

    Its connections send at once (``TCP_NODELAY``, which accepted sockets inherit): uvicorn's
    h11 writes a response's head and body apart, and Nagle's algorithm would hold the body until
    the client's delayed ACK, about 40 ms a request on Linux.

    Raises:
        OSError: naming the address, if it cannot be bound (in use, not this machine's).

    Examples:
        >>> sock = bound_socket("127.0.0.1", 0)
        >>> sock.getsockname()[1] > 0
        True
        >>> sock.close()
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(
            f"cannot serve on {host}:{port} ({err}); pick another port (or 0 for a free one)."
        ) from err
    return sock
