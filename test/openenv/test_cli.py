"""``python -m torchrl_trl_interop.openenv serve`` (issue 34): it builds one environment before
it announces itself (a ``make_env`` that cannot serve fails at start, with its reason), prints
its URL only once it listens, and stops with status 0 and no traceback on SIGINT and SIGTERM,
even after a client timed out on a slow step."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
from _background import background
from _openenv_helpers import (
    PROMPT,
    STARTUP_TIMEOUT_S,
    cli_server,
    free_port,
    serve_in_background,
)
from openenv.core import GenericEnvClient

from torchrl_trl_interop._processes import end_with_parent
from torchrl_trl_interop.openenv.__main__ import main

HERE = Path(__file__).parent


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "spec, message",
    [
        ("torchrl_trl_interop.testing:toy_chat_env", r"batch_size=\(2,\)"),  # batch size 2
        ("torchrl_trl_interop.testing:toy_tokenizer", "expected a torchrl environment"),
    ],
)
def test_a_make_env_that_cannot_serve_fails_at_start(spec, message, capsys):
    assert main(["serve", spec, "--port", str(free_port())]) == 2
    err = capsys.readouterr()
    assert f"{spec} cannot be served" in err.err
    assert pytest.importorskip("re").search(message, err.err)
    assert "serving" not in err.out


@pytest.mark.parametrize(
    "args, named",
    [
        (["--port", "70000"], "argument --port: expected a port number from 0 to 65535"),
        (["--port", "-1"], "argument --port: expected a port number"),
        (["--port", "eighty"], "argument --port: expected a port number"),
        (["--workers", "0"], "argument --workers: expected a positive number of processes"),
        (["--max-concurrent-envs", "0"], "argument --max-concurrent-envs: expected a positive"),
        (["--session-timeout", "0"], "argument --session-timeout: expected a number of seconds"),
        (["--session-timeout", "nan"], "argument --session-timeout: expected a number"),
        (["--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
        (["--wrokers", "2"], "unrecognized arguments: --wrokers 2"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, named, capsys):
    """Regression: ``serve --port 70000`` ended in an ``OverflowError`` traceback."""
    with pytest.raises(SystemExit) as out:
        main(["serve", "torchrl_trl_interop.testing:toy_tool_env", *args])
    assert out.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert "Traceback" not in err


def test_a_port_taken_exits_2_with_one_line(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "torchrl_trl_interop.testing:toy_tool_env", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot serve on 127.0.0.1:{port}" in err, err


def start(spec):
    """The CLI on a free port; yields ``(process, lines)``, its output lines in a queue."""
    port = free_port()
    command = [sys.executable, "-m", "torchrl_trl_interop.openenv", "serve", spec]
    command += ["--port", str(port), "--log-level", "warning"]
    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=partial(end_with_parent, os.getpid()),
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    return proc, lines, f"http://127.0.0.1:{port}"


def announced(proc, lines, url) -> list[str]:
    seen = []
    while True:
        try:
            line = lines.get(timeout=STARTUP_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"no announcement: {seen}") from None
        seen.append(line)
        if "serving" in line:
            assert url in line
            return seen


def stop(proc, lines, sig) -> str:
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)
    out = []
    while not lines.empty():
        out.append(lines.get())
    return "".join(out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_announced_when_listening_and_stopped_cleanly_after_a_client_timed_out():
    proc, lines, url = start("_openenv_helpers:slow_tool_env")
    try:
        before = announced(proc, lines, url)
        # the line means it listens: OpenEnv's client connects at once, no retry
        with GenericEnvClient(base_url=url, message_timeout_s=1.0).sync() as client:
            client.reset(prompt=PROMPT)
            with pytest.raises((TimeoutError, OSError)):
                client.step({"content": "slow"})  # the step takes 3 s: the client gives up
    finally:
        output = stop(proc, lines, signal.SIGINT)
    output = "".join(before) + output
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "CancelledError" not in output, output


@background(timeout_s=300)
def toy_server(job):
    return serve_in_background(job, "torchrl_trl_interop.testing:toy_tool_env")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_exits_zero(toy_server):
    with cli_server(toy_server) as (url, proc):  # stopped with SIGTERM (killed if it hangs)
        with GenericEnvClient(base_url=url, message_timeout_s=60).sync() as client:
            client.reset(prompt=PROMPT)
    output = toy_server[2].read_text()
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
