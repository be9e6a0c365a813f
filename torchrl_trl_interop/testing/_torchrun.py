"""Running a script on several local ranks with ``torchrun`` (gloo on CPU), for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port free on this machine now (for ``--master_port``).

    Examples:
        >>> 1024 <= free_port() < 65536
        True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(
    script: str | Path, *args: str, nproc: int = 2
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``script`` under ``torchrun --nproc_per_node=nproc``
    on a free port, with this checkout's package on ``PYTHONPATH``, one OpenMP thread per rank,
    offline (:func:`run_torchrun` runs them; a test may start them in the background).

    Examples:
        >>> cmd, env = torchrun_command("worker.py", "out", nproc=2)
        >>> cmd[2:4], cmd[-2:], env["OMP_NUM_THREADS"]
        (['torch.distributed.run', '--nproc_per_node=2'], ['worker.py', 'out'], '1')
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # this checkout's package
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env[name] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    cmd += [f"--master_port={free_port()}", str(script), *map(str, args)]
    return cmd, env


def run_torchrun(
    script: str | Path, *args: str, nproc: int = 2, timeout: float = 300.0
) -> subprocess.CompletedProcess:
    """Runs ``script`` under ``torchrun --nproc_per_node=nproc`` (:func:`torchrun_command`)
    within ``timeout`` seconds; returns the finished process (its output captured as text).

    torchrun and its ranks run in a process group of their own: on a timeout the whole group is
    killed, so no rank outlives a hang.

    Raises:
        subprocess.TimeoutExpired: if the ranks do not finish within ``timeout`` (its ``stderr``
            holds what they wrote).
    """
    cmd, env = torchrun_command(script, *args, nproc=nproc)
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        cmd, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
