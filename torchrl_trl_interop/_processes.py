"""The processes the package starts end with the process that started them.

A generator process (``weights/``), a served environment's worker (``openenv/``): each asks, as
it starts, to be signalled when its parent dies, however the parent died (a SIGKILL, the OOM
killer), so that nothing the package starts outlives the process that started it. On Linux the
kernel sends the signal (``prctl(PR_SET_PDEATHSIG)``); everywhere, the parent's pid is checked
then, which closes the race with a parent that died before the request.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["end_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: resolved on import: a forked child (a ``preexec_fn``) only calls it, no dlopen after the fork
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def end_with_parent(
    parent_pid: int, *, sig: int = signal.SIGKILL, kernel_signal: bool = True
) -> None:
    """Has this process get ``sig`` when its parent ``parent_pid`` dies; exits now (status 1)
    if that parent is already gone.

    With ``kernel_signal`` (Linux only) the kernel sends ``sig`` when the *thread* that started
    this process ends: ask for it only when that thread outlives the child (the parent's main
    thread, or a thread that lives as long). Safe in a ``preexec_fn`` (between fork and exec).

    Examples:
        >>> import os
        >>> end_with_parent(os.getppid(), kernel_signal=False)  # the parent lives: nothing happens
    """
    if kernel_signal and _PRCTL is not None:
        if _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)
