"""The process a :class:`~torchrl_trl_interop.RemotePolicy` runs: it serves calls and weight commits,
and it ends when the process that started it ends.

Requests arrive in order on one queue, replies leave in order on another. The trainer writes
weights into a shared-memory staging buffer this process allocates
(the receiver side of a
:class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme`); they go live at the next
``"commit"``, between two calls: a CPU model switches to the staged buffer (two buffers, the
model's tensors in one of them), a model on another device copies it in. The process exits when its parent is gone, however the parent died (a SIGKILL,
the OOM killer): on Linux the kernel kills it (``prctl(PR_SET_PDEATHSIG)``), and everywhere it
checks its parent's pid while it waits for a request.
"""

from __future__ import annotations

import os
import pickle
import queue
import traceback
from typing import Any

import torch

from .._keys import POLICY_VERSION_KEY
from .._processes import end_with_parent
from ._scheme import StagingWeightSyncScheme
from ._tensors import policy_model, weights_checksum

__all__ = ["POLL_SECONDS", "serve"]

#: how often a waiting side checks that the other process is alive (seconds)
POLL_SECONDS = 0.5


def _next_request(requests: Any, parent_pid: int) -> tuple[str, Any]:
    """The next request; exits the process if the parent died while it waited."""
    while True:
        try:
            return requests.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent_pid:  # reparented: the trainer is gone
                os._exit(1)


def serve(
    policy_factory: Any,
    requests: Any,
    replies: Any,
    num_threads: int | None,
    parent_pid: int,
    kernel_signal: bool,
) -> None:
    """The generator process: builds the policy, allocates the shared staging buffers and sends
    them with its weights' layout, then serves calls, commits and checksums in order, until
    ``"stop"``."""
    end_with_parent(parent_pid, kernel_signal=kernel_signal)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        policy = policy_factory()
        model = policy_model(policy)
        scheme = StagingWeightSyncScheme()  # the receiver: allocates the staging buffers
        scheme.init_on_receiver(model_id="policy", model=model)
        keys = {k: list(getattr(policy, k, [])) for k in ("in_keys", "out_keys")}
        replies.put(("ok", {**keys, "layout": scheme.layout, "stagings": scheme.stagings}))
    except BaseException:  # noqa: BLE001 - reported to the trainer's process
        replies.put(("error", traceback.format_exc()))
        return
    while True:
        kind, payload = _next_request(requests, parent_pid)
        if kind == "stop":
            break
        try:
            if kind == "commit":  # between two calls: the scheme makes the staged weights live
                reply = scheme.commit(*payload)
            elif kind == "delta":  # between two calls: the changed elements, in place
                reply = scheme.commit_delta(*pickle.loads(payload))
            elif kind == "call":
                td = pickle.loads(payload)
                with torch.no_grad():
                    out = policy(td)
                stamp = -1 if scheme.policy_version is None else scheme.policy_version
                out.set(POLICY_VERSION_KEY, torch.full(out.batch_size, stamp, dtype=torch.int64))
                reply = pickle.dumps(out)
            elif kind == "checksum":
                reply = (scheme.policy_version, weights_checksum(model))
            else:
                raise ValueError(f"unknown request {kind!r}")
            replies.put(("ok", reply))
        except BaseException:  # noqa: BLE001
            replies.put(("error", traceback.format_exc()))
