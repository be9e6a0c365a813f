"""A TorchRL LLM policy served by another process, with weight sync and policy versions.

:class:`RemotePolicy` is a TensorDict module in the trainer's process whose calls run a torchrl
LLM policy (built by ``policy_factory``) in a spawned process (``_generator_process``).
TensorDicts go out and come back pickled by value (no shared-memory file descriptors per call);
every output carries the ``"policy_version"`` of the weights that produced it. A push copies
each weight, as it is read (gathered, merged), into a shared-memory staging buffer the generator
allocated once (``_staging``); the generator commits them to the live model, with their
version, between two calls: a generation never sees half-updated weights, and its version is
exact.

Nothing here waits without a bound: every wait polls the generator's liveness and ends at
``timeout``, pushes are checked against the generator's own names and shapes before they are
sent, and the generator exits when the trainer's process does.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from .._checks import boundary
from .._keys import POLICY_VERSION_KEY
from ._generator_process import POLL_SECONDS, serve
from ._served import ServedPolicy, check_rows

__all__ = ["RemotePolicy"]


def _close(process: Any, requests: Any) -> None:
    if process is not None and process.is_alive():
        requests.put(("stop", None))
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


class _GeneratorChannel:
    """A :class:`RemotePolicy`'s generator process as the channel of its
    :class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme`: the buffers come
    with the process's start, each commit is a request in order with the calls."""

    def __init__(self, policy: RemotePolicy) -> None:
        self.policy = weakref.ref(policy)  # the policy holds the scheme, which holds this

    def open_staging(self, version: int) -> tuple[list, dict[str, tuple[int, ...]]]:
        policy = self.policy()
        if policy._process is None:
            policy._start()
        policy._check_alive(f"the weights of version {version}")
        return policy._stagings, policy._layout

    def refuse_first(self) -> None:
        self.policy().close()  # the generator has no weights yet

    def commit_staged(self, version: int, names: list[str] | None) -> int:
        return self._commit("commit", (version, names), version)

    def commit_delta(self, version: int, base: int, changes: dict) -> int | None:
        return self._commit("delta", pickle.dumps((version, base, changes)), version)

    def _commit(self, kind: str, payload: Any, version: int) -> Any:
        policy = self.policy()
        what = f"the weights of version {version}"
        policy._check_alive(what)
        policy._requests.put((kind, payload))
        try:
            committed = policy._reply(what)
        except TimeoutError:  # a late commit could read the next push's half-written weights
            policy.close()
            raise
        if committed is not None:
            policy.policy_version = committed
        return committed


class RemotePolicy(ServedPolicy):
    """A torchrl LLM policy running in another process, called like the policy itself.

    ``policy_factory`` runs in a spawned process and builds the policy there (e.g. a
    :class:`~torchrl_trl_interop.TrainerModelPolicy`, a torchrl
    ``TransformersWrapper``, a ``vLLMWrapper`` on its own GPU). Calling this module sends the
    TensorDict there and returns the policy's output, plus ``"policy_version"`` (``int64``, one per
    row): the version of the weights that produced it.

    The process starts at the first :meth:`update_policy_weights_` (which
    :class:`~torchrl_trl_interop.WeightSyncCallback` calls when training begins): the generator
    reports the names and shapes of its model's weights and hands over a shared-memory staging
    buffer shaped like them, once; the pushed weights are checked against those names and
    shapes, so the generator starts from the trainer's weights. Every push is checked first,
    then streams the weights into the staging buffer one tensor at a time (a ``copy_`` each:
    nothing pickled, nothing allocated, one gathered or merged tensor of extra memory at a time
    in the trainer's process), and the generator commits them, with their version, between two
    calls. The staging buffer is the size of the generator's weights, in shared memory (the
    generator's process holds its weights twice).

    No wait is unbounded: a call, a push or the start raises ``TimeoutError`` after
    ``timeout`` seconds (a push that timed out also stops the generator: its late commit could
    read the next push's weights half-written), and a ``RuntimeError`` naming the exit code within a second of the
    generator's death. The generator exits when the process that started it dies, even by
    SIGKILL (Linux: the kernel's parent-death signal when started from the main thread; on every
    platform it checks its parent while it waits for requests).

    As a policy for :func:`~torchrl_trl_interop.as_trl_rollout_func`, every rollout row gets a
    ``policy_version``; the rollout function compares it with the trainer's step.

    On several trainer ranks each rank builds its own (a generator process beside each rank),
    and :class:`~torchrl_trl_interop.WeightSyncCallback` on each rank pushes its own. For one
    pool of generators shared by every rank, use a
    :class:`~torchrl_trl_interop.RayRemotePolicy`.

    Args:
        policy_factory (Callable[[], TensorDictModuleBase]): builds the policy in the generator
            process; it must be picklable (a module-level function or a ``functools.partial``).
            Its weights are those of ``policy.model`` (torchrl LLM wrappers) or of the policy.

    Keyword Args:
        timeout (float, optional): seconds to wait for the generator's reply to a call, a push or
            its start. Defaults to ``600``.
        num_threads (int, optional): ``torch.set_num_threads`` in the generator. Defaults to
            ``None`` (torch's default).

    Attributes:
        policy_version (int or None): the version last committed in the generator.
        weight_sync_scheme (StagingWeightSyncScheme): the sender side of the push.

    Examples:
        >>> import torch
        >>> from functools import partial
        >>> policy = RemotePolicy(partial(torch.nn.Linear, 2, 2))
        >>> policy
        RemotePolicy(policy_factory=partial, started=False, policy_version=None)
    """

    builds_in = "the generator process"
    holds = "a process and its queues"

    @boundary("RemotePolicy")
    def __init__(
        self,
        policy_factory: Callable[[], Any],
        *,
        timeout: float = 600.0,
        num_threads: int | None = None,
    ) -> None:
        super().__init__(policy_factory, timeout=timeout, num_threads=num_threads)
        self._process = None
        self._requests = self._replies = None
        self._stagings: list = []  # the generator's staging buffers
        self._layout: dict[str, tuple[int, ...]] = {}

    @property
    def started(self) -> bool:
        return self._process is not None

    # -- waiting on the generator ----------------------------------------------------------------

    def _check_alive(self, what: str) -> None:
        if self._process is None:
            raise RuntimeError(
                "the generator process is not started; it starts with the first weights: "
                "call update_policy_weights_(model_or_weights, policy_version=0) first "
                "(WeightSyncCallback does so when training begins)."
            )
        if not self._process.is_alive():
            raise RuntimeError(
                f"the generator process died (exit code {self._process.exitcode}) before "
                f"{what}. Build a new RemotePolicy; the generator's own output says why it "
                "died (exit code -9: killed, e.g. by the OOM killer)."
            )

    def _get(self, source: Any, what: str) -> Any:
        """The next item of ``source``, polling the generator's liveness, within ``timeout``."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return source.get(timeout=max(min(POLL_SECONDS, deadline - time.monotonic()), 0))
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(
                        f"the generator process died (exit code {self._process.exitcode}) "
                        f"while serving {what}."
                    ) from None
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no reply to {what} within timeout={self.timeout}s; the generator is "
                        "alive but did not answer (raise timeout= for slow calls)."
                    ) from None

    def _reply(self, what: str) -> Any:
        status, reply = self._get(self._replies, what)
        if status == "error":
            raise RuntimeError(f"the generator process failed on {what}:\n{reply}")
        return reply

    def _ask(self, kind: str, payload: Any = None) -> Any:
        self._check_alive(repr(kind))
        self._requests.put((kind, payload))
        return self._reply(repr(kind))

    # -- weights ---------------------------------------------------------------------------------

    def _channel(self) -> _GeneratorChannel:
        return _GeneratorChannel(self)

    def _start(self) -> None:
        from torch import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        kernel_signal = threading.current_thread() is threading.main_thread()
        self._process = ctx.Process(
            target=serve,
            args=(
                self.policy_factory,
                self._requests,
                self._replies,
                self.num_threads,
                os.getpid(),
                kernel_signal,
            ),
            name="torchrl-remote-policy",
            daemon=True,
        )
        self._process.start()
        self._finalizer = weakref.finalize(self, _close, self._process, self._requests)
        try:
            info = self._reply("its start")
        except BaseException:
            self.close()
            raise
        self._layout, self._stagings = info["layout"], info["stagings"]
        self.in_keys = info["in_keys"]
        self.out_keys = info["out_keys"] + [POLICY_VERSION_KEY]

    @boundary("RemotePolicy")
    def weights_checksum(self) -> tuple[int | None, str]:
        """``(policy_version, checksum)`` of the generator's live weights (see
        :func:`~torchrl_trl_interop.weights_checksum`)."""
        return self._ask("checksum")

    @boundary("RemotePolicy")
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        check_rows(tensordict)
        return pickle.loads(self._ask("call", pickle.dumps(tensordict)))

    # the shared push and close, members of this class too (autodoc documents a class's own)
    update_policy_weights_ = ServedPolicy.update_policy_weights_
    close = ServedPolicy.close

    def _stopped(self) -> None:
        self._process = None
