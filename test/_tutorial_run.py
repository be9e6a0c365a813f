"""The tutorial's end-to-end run (``make demo``), started in the background when the session begins.

The tutorial trains for about a minute and a half on one thread (``demo_setup`` pins torch to
one), while the rest of the suite leaves the second core mostly idle. So ``conftest.py`` starts
it once collection has kept ``test_tutorial_runs_end_to_end``, and that test reads its result
when its turn comes (``TutorialRun.result``). The run writes to files, not pipes (nobody reads
it before the test), dies with the session (``PR_SET_PDEATHSIG``) and is killed when the session
ends.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrl_trl_interop._processes import end_with_parent

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "tutorials" / "trl_interop.py"
RECORDER = ROOT / "test" / "_precision_recorder.py"
#: the whole run's limit, from its start: ~90 s alone, longer on a busy machine
TIMEOUT_S = 1700.0


class TutorialRun:
    """``python tutorials/trl_interop.py`` from a fresh folder, as ``make demo`` runs it, with every
    trainer config it builds recorded (``_precision_recorder.py``) in ``configs``."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tutorial-run-"))
        self.configs = self.folder / "configs.json"
        self._out = open(self.folder / "stdout.txt", "w+")  # noqa: SIM115 - closed in stop()
        self._err = open(self.folder / "stderr.txt", "w+")  # noqa: SIM115
        # no offline switches here: the tutorial's demo_setup() sets them itself
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # as `make demo` runs it
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, str(RECORDER), str(self.configs), str(TUTORIAL)],
            cwd=self.folder,
            stdout=self._out,
            stderr=self._err,
            env=env,
            preexec_fn=functools.partial(end_with_parent, os.getpid()),
        )

    def result(self) -> tuple[int, str, str]:
        """``(exit code, stdout, stderr)`` once the run ends; raises past ``TIMEOUT_S`` (the
        session's end kills it: :meth:`stop`)."""
        left = TIMEOUT_S - (time.monotonic() - self.started)
        code = self.process.wait(timeout=max(left, 1.0))
        self._out.seek(0), self._err.seek(0)
        return code, self._out.read(), self._err.read()

    def stop(self) -> None:
        """Kills the run if it still goes, and removes its folder."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._out.close(), self._err.close()
        shutil.rmtree(self.folder, ignore_errors=True)
