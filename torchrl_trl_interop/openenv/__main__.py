"""``python -m torchrl_trl_interop.openenv serve MODULE:make_env --port N [--workers W]``.

Serves a TorchRL LLM environment with OpenEnv's server (FastAPI, uvicorn), as OpenEnv's own
environments are served: HTTP ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health`` and
the WebSocket ``/ws`` that OpenEnv's clients (``GenericEnvClient``) and trainers use.
``MODULE:make_env`` names a function building the environment (a ``ChatEnv`` in history mode,
batch size ``(1,)``), the environment itself, or a class made by ``as_openenv_environment``. It
listens on loopback unless ``--host`` says otherwise, from ``--workers`` processes behind the
one address, and stops on SIGINT or SIGTERM. A bad argument exits with status 2 and one line
saying which and why.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn


def _int_at_least(least: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    value = _int_at_least(0, "a port number from 0 to 65535 (0: a free one)")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(
            f"expected a port number from 0 to 65535 (0: a free one), got {value}"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, whose mistakes are one line (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m torchrl_trl_interop.openenv",
        description="Serve TorchRL LLM environments with OpenEnv's server.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser(
        "serve", help="serve MODULE:make_env over OpenEnv's HTTP/WebSocket protocol"
    )
    serve.add_argument(
        "env", help="MODULE:NAME of a function building the environment (or the environment)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port; 0 takes a free one")
    serve.add_argument(
        "--max-concurrent-envs",
        type=_int_at_least(1, "a positive number of sessions"),
        default=1,
        help="most WebSocket sessions at once over all the workers, one environment each "
        "(default: 1)",
    )
    serve.add_argument(
        "--workers",
        type=_int_at_least(1, "a positive number of processes"),
        default=1,
        help="processes serving the one address; a session stays with the process that "
        "opened it (default: 1)",
    )
    serve.add_argument(
        "--session-timeout",
        type=_seconds,
        default=None,
        help="close a session whose client sends nothing for this many seconds (default: never)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (default: info)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    from ._workers import serve

    try:
        serve(
            args.env,
            host=args.host,
            port=args.port,
            max_concurrent_envs=args.max_concurrent_envs,
            session_timeout_s=args.session_timeout,
            workers=args.workers,
            log_level=args.log_level,
        )
    except (ValueError, TypeError, RuntimeError, ImportError, AttributeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
