"""Benchmark: a TorchRL environment served with OpenEnv, under load, on CPU.

Each figure is measured in one run (the machines are shared: compare within a run):

* **Served** (``python -m torchrl_trl_interop.openenv serve``): the toy task with a tool
  (``toy_tool_env``: a ``ChatEnv``, a ``SimpleToolTransform``, a ``StepCounter`` and the
  reward function) served with ``--workers 1`` and ``--workers 2`` (64 session slots), and
  OpenEnv's own server (``create_app`` under uvicorn, 64 slots) on an echo environment built
  from OpenEnv's public API, as its template's. At 1, 8, 32 and 64 concurrent sessions, held
  by OpenEnv's own client (``GenericEnvClient``, async) in 4 client processes of their own,
  each session plays episodes (reset, tool call, answer; the echo: reset and two messages):
  **sessions opened per second** (connect and first reset, all at once), **steps per second**
  (``--seconds`` after a warm-up; the resets between episodes are in the time, not the count),
  **p50, p99 and mean step latency**, and the **CPU time per step** of the server's processes
  and of the clients' (``/proc``): what the 2 cores are spent on. No session is left open after
  a point (the server's ``/health``).
* **The floor**: the same episodes on the served class in this process
  (``as_openenv_environment(toy_tool_env)``), one session, serial: ``env.step`` without the
  wire, and the rate one session alone plays at.

Targets (issue 55): ``--workers 2`` >= 1.3x the steps/s of ``--workers 1`` at 8 sessions;
p99 <= 2x the mean at 32 sessions; served steps/s at 32 sessions >= the floor's serial rate.

Run with ``python benchmarks/bench_openenv.py`` (``make bench``); ``--serve-echo PORT`` is the
echo server's own entry point.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SESSIONS = (1, 8, 32, 64)
CLIENT_PROCESSES = 4
SLOTS = 64
PROMPT = "What is 2 plus 3?"
HERE = Path(__file__).resolve()


# -- OpenEnv's echo environment, from its public API (as its template's) -------------------------


def echo_app():
    from openenv.core.env_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        echoed_message: str = ""
        message_length: int = 0

    class EchoEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id=episode_id, step_count=0)
            return EchoObservation(echoed_message="Echo environment ready!", reward=0.0)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            message = action.message
            return EchoObservation(
                echoed_message=message,
                message_length=len(message),
                reward=min(len(message) * 0.1, 1.0),
                metadata={"original_message": message, "step": self._state.step_count},
            )

        @property
        def state(self):
            return self._state

    return create_app(
        EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=SLOTS
    )


def serve_echo(port: int) -> None:
    import uvicorn

    uvicorn.run(echo_app(), host="127.0.0.1", port=port, log_level="warning")


# -- servers in processes of their own -----------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
        return json.loads(reply.read())


class Server:
    """A server process: ours (the CLI, ``workers``) or OpenEnv's echo (``workers=None``)."""

    def __init__(self, workers: int | None, *options: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if workers is None:
            command = [sys.executable, str(HERE), "--serve-echo", str(port)]
        else:
            command = [sys.executable, "-m", "torchrl_trl_interop.openenv", "serve"]
            command += ["torchrl_trl_interop.testing:toy_tool_env", "--port", str(port)]
            command += ["--workers", str(workers), "--max-concurrent-envs", str(SLOTS)]
            command += ["--log-level", "warning", *options]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 600
        if workers is not None:  # announced once every worker listens
            line = self.proc.stdout.readline()
            assert "serving" in line, f"the server did not start: {line!r}"
        while True:
            try:
                health(self.url)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server at {self.url} did not start") from None
                time.sleep(0.2)

    def pids(self) -> list[int]:
        """The server's process and its workers."""
        out = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if children.exists():
            out += [int(p) for p in children.read_text().split()]
        return out

    def open_sessions(self) -> int | None:
        return health(self.url).get("sessions", {}).get("open")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (Linux ``/proc``)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


# -- clients: OpenEnv's async client, several sessions per process -------------------------------


def client_process(commands, results, barrier) -> None:  # runs in a client process
    import asyncio

    from openenv.core import GenericEnvClient

    results.put(("ready", os.getpid()))
    while True:
        command = commands.get()
        if command is None:
            return
        out = asyncio.run(_play_sessions(GenericEnvClient, barrier, *command))
        latencies = [x for lat, _, _ in out for x in lat]
        firsts = [f for _, f, _ in out if f is not None]
        lasts = [e for _, _, e in out if e is not None]
        window = (max(lasts) - min(firsts)) if firsts else 0.0
        results.put((latencies, window))


async def _play_sessions(client_cls, barrier, url, n, reset_kwargs, actions, warmup, seconds):
    """``n`` sessions opened at once, then playing episodes for ``warmup + seconds``: each
    session's step latencies after the warm-up, its first counted step's start and its last's
    end."""
    import asyncio

    clients = [client_cls(base_url=url, message_timeout_s=300) for _ in range(n)]
    barrier.wait()  # everyone ready: open at once
    await asyncio.gather(*(c.connect() for c in clients))
    await asyncio.gather(*(c.reset(**reset_kwargs) for c in clients))
    barrier.wait()  # every session open: play
    start = time.perf_counter()
    counting, stop = start + warmup, start + warmup + seconds

    async def play(client):
        latencies, first, last = [], None, None
        while True:
            for action in actions:
                began = time.perf_counter()
                if began >= stop:
                    return latencies, first, last
                await client.step(action)
                ended = time.perf_counter()
                if began >= counting:
                    latencies.append(ended - began)
                    first = began if first is None else first
                    last = ended
            await client.reset(**reset_kwargs)

    out = await asyncio.gather(*(play(c) for c in clients))
    await asyncio.gather(*(c.close() for c in clients))
    return out


class Clients:
    """``CLIENT_PROCESSES`` client processes (spawned once: OpenEnv's client imports gradio)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(CLIENT_PROCESSES + 1)
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(CLIENT_PROCESSES)]
        self.procs = [
            ctx.Process(target=client_process, args=(q, self.results, self.barrier), daemon=True)
            for q in self.commands
        ]
        for p in self.procs:
            p.start()
        self.pids = [self.results.get(timeout=300)[1] for _ in self.procs]

    def run(self, server: Server, sessions: int, kind: str, warmup: float, seconds: float):
        if kind == "echo":
            reset_kwargs, actions = {}, [{"message": "2 plus 3 is 5."}] * 2
        else:
            from torchrl_trl_interop.testing import toy_tool_call

            reset_kwargs = {"prompt": PROMPT}
            actions = [{"content": toy_tool_call(2, 3)}, {"content": "2 plus 3 is 5."}]
        shares = [
            sessions // CLIENT_PROCESSES + (i < sessions % CLIENT_PROCESSES)
            for i in range(CLIENT_PROCESSES)
        ]
        for q, n in zip(self.commands, shares):
            q.put((server.url, n, reset_kwargs, actions, warmup, seconds))
        self.barrier.wait(timeout=300)
        opening = time.perf_counter()
        self.barrier.wait(timeout=300)
        opened = time.perf_counter() - opening
        cpu = (cpu_seconds(server.pids()), cpu_seconds(self.pids))
        replies = [self.results.get(timeout=300 + warmup + seconds) for _ in self.procs]
        cpu = (cpu_seconds(server.pids()) - cpu[0], cpu_seconds(self.pids) - cpu[1])
        latencies = [x for lat, _ in replies for x in lat]
        window = max(w for _, w in replies)
        return {
            "opened/s": sessions / opened,
            "steps/s": len(latencies) / window,
            "p50": statistics.median(latencies) * 1e3,
            "p99": statistics.quantiles(latencies, n=100)[98] * 1e3 if len(latencies) > 1 else 0,
            "mean": statistics.mean(latencies) * 1e3,
            # CPU over the whole run (opening, warm-up, resets): per counted step
            "server cpu": cpu[0] / len(latencies) * 1e3,
            "client cpu": cpu[1] / len(latencies) * 1e3,
        }

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(30)


# -- the floor: the served class in this process -------------------------------------------------


def floor(seconds: float) -> dict:
    from torchrl_trl_interop import as_openenv_environment
    from torchrl_trl_interop.testing import toy_tool_call, toy_tool_env

    cls = as_openenv_environment(toy_tool_env)
    env = cls()
    actions = [
        cls.action_type(content=toy_tool_call(2, 3)),
        cls.action_type(content="2 plus 3 is 5."),
    ]
    latencies = []
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        env.reset(prompt=PROMPT)
        for action in actions:
            began = time.perf_counter()
            env.step(action)
            latencies.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - start
    env.close()
    return {
        "steps/s": len(latencies) / elapsed,
        "p50": statistics.median(latencies) * 1e3,
        "p99": statistics.quantiles(latencies, n=100)[98] * 1e3,
        "mean": statistics.mean(latencies) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per point")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--sessions", type=int, nargs="+", default=list(SESSIONS))
    parser.add_argument(
        "--servers",
        nargs="+",
        default=["1", "2", "echo"],
        choices=["1", "2", "echo"],
        help="ours with --workers 1 and 2, and OpenEnv's echo server",
    )
    parser.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        return serve_echo(args.serve_echo)

    began = time.time()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    base = floor(args.seconds)
    print(
        f"floor (in this process, one session, serial): {base['steps/s']:.0f} steps/s, "
        f"step p50 {base['p50']:.2f} ms, mean {base['mean']:.2f} ms",
        flush=True,
    )
    clients = Clients()
    rows = []
    try:
        for key, name, workers, kind, options in (
            ("1", "ours, --workers 1", 1, "ours", ()),
            ("2", "ours, --workers 2", 2, "ours", ()),
            ("echo", "OpenEnv's echo", None, "echo", ()),
        ):
            if key not in args.servers:
                continue
            server = Server(workers, *options)
            try:
                for n in args.sessions:
                    row = clients.run(server, n, kind, args.warmup, args.seconds)
                    left = server.open_sessions() if kind == "ours" else None
                    if left:
                        time.sleep(1.0)  # a close a moment ago
                        left = server.open_sessions()
                    rows.append((name, n, row, left))
                    print(
                        f"{name:22} {n:3} sessions: {row['opened/s']:7.1f} opened/s "
                        f"{row['steps/s']:7.1f} steps/s  p50 {row['p50']:7.2f}  "
                        f"p99 {row['p99']:7.2f}  mean {row['mean']:7.2f} ms  "
                        f"cpu/step server {row['server cpu']:.2f} "
                        f"client {row['client cpu']:.2f} ms  left open: {left}",
                        flush=True,
                    )
            finally:
                server.stop()
    finally:
        clients.close()
    after = floor(args.seconds)  # the machine's speed moves: the floor before and after
    print(f"floor again, after the servers: {after['steps/s']:.0f} steps/s", flush=True)
    serial = (base["steps/s"] + after["steps/s"]) / 2

    print()
    print(
        "=" * 22 + "  ========  ========  =======  ======  ======  ======  ==========  =========="
    )
    print(
        f"{'server':22}  {'sessions':>8}  {'opened/s':>8}  {'steps/s':>7}  {'p50 ms':>6}  "
        f"{'p99 ms':>6}  {'mean':>6}  {'server CPU':>10}  {'client CPU':>10}"
    )
    print(
        "=" * 22 + "  ========  ========  =======  ======  ======  ======  ==========  =========="
    )
    for label, row in (("floor, before", base), ("floor, after", after)):
        print(
            f"{label:22}  {1:8}  {'':8}  {row['steps/s']:7.0f}  {row['p50']:6.2f}  "
            f"{row['p99']:6.2f}  {row['mean']:6.2f}  {'':10}  {'':10}"
        )
    for name, n, row, _ in rows:
        print(
            f"{name:22}  {n:8}  {row['opened/s']:8.1f}  {row['steps/s']:7.0f}  {row['p50']:6.2f}  "
            f"{row['p99']:6.2f}  {row['mean']:6.2f}  {row['server cpu']:10.2f}  "
            f"{row['client cpu']:10.2f}"
        )
    print(
        "=" * 22 + "  ========  ========  =======  ======  ======  ======  ==========  =========="
    )
    print("(CPU: milliseconds of CPU time per step, the resets included)")

    def at(name, n):
        return next((row for nm, k, row, _ in rows if nm == name and k == n), None)

    print()
    one, two = at("ours, --workers 1", 8), at("ours, --workers 2", 8)
    if one and two:
        ratio = two["steps/s"] / one["steps/s"]
        print(
            f"--workers 2 / --workers 1 at 8 sessions: {ratio:.2f}x (target >= 1.3x): "
            f"{'met' if ratio >= 1.3 else 'NOT met'}"
        )
    for name in ("ours, --workers 1", "ours, --workers 2"):
        row = at(name, 32)
        if row:
            ratio = row["p99"] / row["mean"]
            print(
                f"{name} at 32 sessions: p99 {ratio:.2f}x the mean (target <= 2x): "
                f"{'met' if ratio <= 2 else 'NOT met'}"
            )
            ratio = row["steps/s"] / serial
            print(
                f"{name} at 32 sessions: {ratio:.2f}x the floor's serial rate "
                f"({serial:.0f} steps/s, the mean of before and after; target >= 1x): "
                f"{'met' if ratio >= 1 else 'NOT met'}"
            )
    left = [(name, n, lo) for name, n, _, lo in rows if lo]
    print(f"sessions left open after a point: {left or 'none'}")
    print(f"load average after: {os.getloadavg()[0]:.1f}; {time.time() - began:.0f} s")


if __name__ == "__main__":
    main()
