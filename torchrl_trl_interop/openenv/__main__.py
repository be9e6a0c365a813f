"""``python -m torchrl_trl_interop.openenv serve MODULE:make_env --port N``.

Serves a TorchRL LLM environment with OpenEnv's server (FastAPI, uvicorn), as OpenEnv's own
environments are served: HTTP ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health`` and
the WebSocket ``/ws`` that OpenEnv's clients (``GenericEnvClient``) and trainers use.
``MODULE:make_env`` names a function building the environment (a ``ChatEnv`` in history mode,
batch size ``(1,)``), the environment itself, or a class made by ``as_openenv_environment``. It
listens on loopback unless ``--host`` says otherwise, and stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchrl_trl_interop.openenv",
        description="Serve TorchRL LLM environments with OpenEnv's server.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve MODULE:make_env over OpenEnv's HTTP/WebSocket protocol"
    )
    serve.add_argument(
        "env", help="MODULE:NAME of a function building the environment (or the environment)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port; 0 takes a free one")
    serve.add_argument(
        "--max-concurrent-envs",
        type=int,
        default=1,
        help="most WebSocket sessions at once, one environment each (default: 1)",
    )
    serve.add_argument(
        "--session-timeout",
        type=float,
        default=None,
        help="close sessions idle for this many seconds (default: never)",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn's log level (default: info)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    from ._serve import serve

    try:
        serve(
            args.env,
            host=args.host,
            port=args.port,
            max_concurrent_envs=args.max_concurrent_envs,
            session_timeout_s=args.session_timeout,
            log_level=args.log_level,
        )
    except (ValueError, TypeError, RuntimeError, ImportError, AttributeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
