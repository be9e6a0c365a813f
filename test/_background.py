"""The long process runs of a few tests, started in the background when the session starts.

A few tests spend most of their time waiting on processes of their own (the tutorial's run, the
kill-and-resume children, ``torchrun`` launches, interpreters importing the package, servers
starting up), while the rest of the suite leaves the second core mostly idle. Such a test's
work is a function of a :class:`Job`, registered with :func:`background` in its test module,
which makes it a session fixture of the same name::

    @background(timeout_s=300)
    def my_launch(job):
        (code,) = job.wait(job.popen([sys.executable, "worker.py"], log="worker.log"))
        assert code == 0, job.log("worker.log")
        return (job.folder / "out.json").read_text()

    def test_it(my_launch): ...

Once collection has kept the tests, ``conftest.py`` starts the jobs they ask for (directly or
through another fixture) one after another, in the order of their first test, in one thread:
the lane. A test reads its job's result when its turn comes (and waits for it if the job is
not done). A job asked for outside the lane (a fixture requested dynamically) runs then.

A job may also hand its test a process that still runs (a server, once it serves), which the
test stops (that one is not niced). Nothing outlives the session: a job's processes run niced,
write to files in the job's folder (not pipes: nobody reads them before the test), die with the
lane's thread (``PR_SET_PDEATHSIG``; it lives until the session ends) and are killed, with their
process group, when the session ends; every wait has the job's timeout, counted from the job's
start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchrl_trl_interop._processes import end_with_parent

#: how much the jobs' processes yield the cores to the tests running meanwhile
NICE = 5

#: the registered jobs' work and timeout, by name (the fixture's name)
WORK: dict[str, tuple[Callable[[Job], Any], float]] = {}


class Job:
    """One test's background work: ``work(job)``, run in the lane; :meth:`result` is its value.

    The work starts its processes with :meth:`popen` and waits for them with :meth:`wait`, within
    ``timeout_s`` of the job's start. Its files go to :attr:`folder`, removed when the session ends.
    """

    def __init__(self, name: str, work: Callable[[Job], Any], timeout_s: float) -> None:
        self.name, self.work, self.timeout_s = name, work, timeout_s
        self.folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.started: float | None = None
        self.ended: float | None = None
        self.waited = 0.0  # by its test (a session fixture: read once)
        self.done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._procs: list[subprocess.Popen] = []
        self._stopped = False
        self._lock = threading.Lock()

    def run(self) -> None:
        """Runs the work once (in the calling thread) and keeps its value or error."""
        self.started = time.monotonic()
        try:
            self._value = self.work(self)
        except BaseException as err:  # noqa: BLE001 - re-raised by result()
            self._error = err
        finally:
            self.ended = time.monotonic()
            self.done.set()

    def left(self) -> float:
        """Seconds left before the job's timeout (its whole time counts from its start)."""
        started = time.monotonic() if self.started is None else self.started
        return self.timeout_s - (time.monotonic() - started)

    def popen(
        self,
        command: list[str],
        *,
        log: str,
        err: str | None = None,
        new_session: bool = False,
        niced: bool = True,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """``command`` started, niced (:data:`NICE`), its stdout written to ``folder / log`` and
        its stderr there too, or to ``folder / err``.

        ``new_session`` puts it in a process group of its own (killed whole at the end: a
        launcher's children go with it). A process the job hands to its test (a server) is not
        ``niced``: its test's timeouts count on it. Other keyword arguments go to
        :class:`subprocess.Popen`.
        """
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the session ended before the job {self.name} started {log}")
            files = [open(self.folder / name, "w") for name in (log, err) if name]  # noqa: SIM115
            try:  # the child holds its own copies of the files
                proc = subprocess.Popen(
                    command,
                    stdout=files[0],
                    stderr=files[1] if err else subprocess.STDOUT,
                    start_new_session=new_session,
                    preexec_fn=_in_child(os.getpid(), NICE if niced else 0),
                    **kwargs,
                )
            finally:
                for file in files:
                    file.close()
            self._procs.append(proc)
        return proc

    def wait(self, *procs: subprocess.Popen) -> list[int]:
        """The exit codes of ``procs``, once they all ended; raises ``TimeoutError`` past the
        job's timeout (the session's end kills what is left)."""
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(self.left(), 0.1)))
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"the background job {self.name} did not finish in {self.timeout_s:.0f} s: "
                    f"{proc.args}"
                ) from None
        return codes

    def torchrun(self, script: Path, *args: Any, nproc: int = 2) -> None:
        """Runs ``script`` on ``nproc`` ranks under ``torchrun`` (gloo, CPU: its command from
        ``torchrun_command``), in a process group of its own; fails with its output unless it
        exits 0."""
        from torchrl_trl_interop.testing._torchrun import torchrun_command

        cmd, env = torchrun_command(script, *args, nproc=nproc)
        log = f"torchrun-{Path(script).stem}.log"
        (code,) = self.wait(self.popen(cmd, log=log, env=env, new_session=True))
        assert code == 0, f"torchrun {Path(script).name} exited {code}:\n{self.log(log)[-9000:]}"

    def log(self, name: str) -> str:
        """What a process of the job wrote to ``folder / name``."""
        return (self.folder / name).read_text(errors="replace")

    def result(self) -> Any:
        """The work's value once it is done (raises its error); raises ``TimeoutError`` past the
        job's timeout."""
        # a job not started yet waits for those before it in the lane, each bounded the same way
        asked = time.monotonic()
        while not self.done.wait(timeout=1.0):
            if self.started is not None and self.left() < -30:  # 30 s for the work's own code
                raise TimeoutError(f"the background job {self.name} did not finish in time")
        self.waited = time.monotonic() - asked
        if self._error is not None:
            raise self._error
        return self._value

    def stop(self) -> None:
        """Kills what still runs (with its process group) and removes the job's folder."""
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                try:  # a process started in a session of its own leads its process group
                    own_group = os.getpgid(proc.pid) == proc.pid
                    (os.killpg if own_group else os.kill)(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _in_child(parent: int, nice: int) -> Callable[[], None]:
    def setup() -> None:  # pragma: no cover - runs in the child, between fork and exec
        end_with_parent(parent)  # SIGKILL when the lane's thread ends
        if nice:
            os.nice(nice)

    return setup


class Lane:
    """Runs jobs one after another in a thread of its own, from the session's start."""

    def __init__(self, names: list[str]) -> None:
        self.started = time.monotonic()
        self.jobs = {name: Job(name, *WORK[name]) for name in names}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-jobs", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for job in self.jobs.values():
            if not job.done.is_set():
                job.run()
        # a job may leave a process running for its test (a server): it dies with this thread
        self._stopping.wait()

    def job(self, name: str) -> Job:
        """The job ``name``: the lane's, or a new one run now (a fixture asked for outside the
        lane)."""
        if name not in self.jobs:
            self.jobs[name] = Job(name, *WORK[name])
            self.jobs[name].run()
        return self.jobs[name]

    def stop(self) -> None:
        for job in self.jobs.values():
            job.stop()
        self._stopping.set()
        self._thread.join(timeout=30)


_LANE = pytest.StashKey[Lane]()


def start(session: pytest.Session) -> None:
    """Starts the lane with the jobs the kept tests ask for, in the order of their first test
    (none when the session only collects)."""
    if session.config.option.collectonly:
        return
    names = {}
    for item in session.items:
        names.update(dict.fromkeys(n for n in getattr(item, "fixturenames", ()) if n in WORK))
    session.config.stash[_LANE] = Lane(list(names))


def stop(session: pytest.Session) -> None:
    lane = session.config.stash.get(_LANE, None)
    if lane is not None:
        lane.stop()


def summary(config: pytest.Config) -> list[str]:
    """One line per job the session ran: when it started, how long it ran, how long its test
    waited for it (the terminal summary shows them with ``--durations``)."""
    lane = config.stash.get(_LANE, None)
    lines = []
    for job in lane.jobs.values() if lane is not None else ():
        if job.started is not None and job.ended is not None:
            lines.append(
                f"{job.name}: from {job.started - lane.started:.0f} s, ran "
                f"{job.ended - job.started:.1f} s, its test waited {job.waited:.1f} s"
            )
    return lines


def background(*, timeout_s: float) -> Callable[[Callable[[Job], Any]], Any]:
    """Registers ``work(job)`` as a background job, and returns the session fixture of its name
    whose value is the work's value (see the module's docstring)."""

    def register(work: Callable[[Job], Any]) -> Any:
        name = work.__name__
        WORK[name] = (work, timeout_s)

        @pytest.fixture(scope="session", name=name)
        def fixture(request: pytest.FixtureRequest) -> Any:
            if _LANE not in request.config.stash:
                request.config.stash[_LANE] = Lane([])
            return request.config.stash[_LANE].job(name).result()

        fixture.__doc__ = work.__doc__
        return fixture

    return register
