"""A TorchRL LLM policy served by another process, with weight sync and policy versions.

:class:`RemotePolicy` is a TensorDict module in the trainer's process whose calls run a torchrl
LLM policy (built by ``policy_factory``) in a spawned process (``_generator_process``).
TensorDicts go out and come back pickled by value (no shared-memory file descriptors per call);
every output carries the ``"policy_version"`` of the weights that produced it. Weights arrive
through torchrl's own ``MultiProcessWeightSyncScheme`` (``torchrl.weight_update``) into a staging
copy, and are committed to the live model, with their version, between two calls: a generation
never sees half-updated weights, and its version is exact.

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

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .._keys import POLICY_VERSION_KEY
from ._generator_process import POLL_SECONDS, serve
from ._tensors import check_weights_fit

__all__ = ["RemotePolicy"]

_OWNER = "RemotePolicy"


def _close(process: Any, requests: Any, scheme: Any) -> None:
    if process is not None and process.is_alive():
        requests.put(("stop", None))
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    if scheme is not None:
        scheme.shutdown()


def _ack_queue(scheme: Any) -> Any:
    """The queue torchrl's ``MultiProcessWeightSyncScheme`` acknowledges received weights on.

    The one reach into torchrl's private attributes here: ``send`` (``sync=True``) waits for the
    acknowledgement without a timeout and without noticing the receiver's death (torchrl 0.14.1
    ``_wait_for_ack``), so the scheme runs with ``sync=False`` and :class:`RemotePolicy` waits
    on this queue itself.
    """
    queues = getattr(scheme, "_ack_queues", None)
    if not queues or 0 not in queues:
        raise RuntimeError(
            f"{_OWNER}: torchrl's MultiProcessWeightSyncScheme has no acknowledgement queue "
            "(_ack_queues[0]); this torchrl version is not supported."
        )
    return queues[0]


class RemotePolicy(TensorDictModuleBase):
    """A torchrl LLM policy running in another process, called like the policy itself.

    ``policy_factory`` runs in a spawned process and builds the policy there (e.g. a
    :class:`~torchrl_trl_interop.TrainerModelPolicy`, a torchrl
    ``TransformersWrapper``, a ``vLLMWrapper`` on its own GPU). Calling this module sends the
    TensorDict there and returns the policy's output, plus ``"policy_version"`` (``int64``, one per
    row): the version of the weights that produced it.

    The process starts at the first :meth:`update_policy_weights_` (which
    :class:`~torchrl_trl_interop.WeightSyncCallback` calls when training begins): the generator
    reports the names and shapes of its model's weights, the pushed weights are checked against
    them, and torchrl's ``MultiProcessWeightSyncScheme`` is set up with those weights as the
    initial ones, so the generator starts from the trainer's weights. Each later push is checked
    against the same names and shapes, goes through the scheme's ``send``, and is committed,
    with its version, between two calls. The generator keeps a staging copy of the weights for
    that (twice the weights' memory in its process).

    No wait is unbounded: a call, a push or the start raises ``TimeoutError`` after
    ``timeout`` seconds, and a ``RuntimeError`` naming the exit code within a second of the
    generator's death. The generator exits when the process that started it dies, even by
    SIGKILL (Linux: the kernel's parent-death signal when started from the main thread; on every
    platform it checks its parent while it waits for requests).

    As a policy for :func:`~torchrl_trl_interop.as_trl_rollout_func`, every rollout row gets a
    ``policy_version``; the rollout function compares it with the trainer's step.

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

    Examples:
        >>> from functools import partial
        >>> policy = RemotePolicy(partial(torch.nn.Linear, 2, 2))
        >>> policy
        RemotePolicy(policy_factory=partial, started=False, policy_version=None)
    """

    def __init__(
        self,
        policy_factory: Callable[[], Any],
        *,
        timeout: float = 600.0,
        num_threads: int | None = None,
    ) -> None:
        super().__init__()
        if not callable(policy_factory):
            raise TypeError(
                f"{_OWNER}: policy_factory must be a callable that builds the policy in the "
                f"generator process, got {type(policy_factory).__name__}."
            )
        self.policy_factory = policy_factory
        self.timeout = float(timeout)
        self.num_threads = num_threads
        self.in_keys: list = []
        self.out_keys: list = []
        self.policy_version: int | None = None
        self._process = None
        self._requests = self._replies = self._scheme = None
        self._layout: dict[str, tuple[int, ...]] = {}
        self._finalizer = None

    def __repr__(self) -> str:
        factory = type(self.policy_factory).__name__
        factory = getattr(self.policy_factory, "__name__", factory)
        return (
            f"{_OWNER}(policy_factory={factory}, started={self.started}, "
            f"policy_version={self.policy_version})"
        )

    @property
    def started(self) -> bool:
        return self._process is not None

    # -- waiting on the generator ----------------------------------------------------------------

    def _check_alive(self, what: str) -> None:
        if self._process is None:
            raise RuntimeError(
                f"{_OWNER}: the generator process is not started; it starts with the first "
                "weights: call update_policy_weights_(model_or_weights, policy_version=0) first "
                "(WeightSyncCallback does so when training begins)."
            )
        if not self._process.is_alive():
            raise RuntimeError(
                f"{_OWNER}: the generator process died (exit code {self._process.exitcode}) "
                f"before {what}. Build a new RemotePolicy; the generator's own output says why "
                "it died (exit code -9: killed, e.g. by the OOM killer)."
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
                        f"{_OWNER}: the generator process died (exit code "
                        f"{self._process.exitcode}) while serving {what}."
                    ) from None
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{_OWNER}: no reply to {what} within timeout={self.timeout}s; the "
                        "generator is alive but did not answer (raise timeout= for slow calls)."
                    ) from None

    def _reply(self, what: str) -> Any:
        status, reply = self._get(self._replies, what)
        if status == "error":
            raise RuntimeError(f"{_OWNER}: the generator process failed on {what}:\n{reply}")
        return reply

    def _ask(self, kind: str, payload: Any = None) -> Any:
        self._check_alive(repr(kind))
        self._requests.put((kind, payload))
        return self._reply(repr(kind))

    # -- weights ---------------------------------------------------------------------------------

    def _start(self, weights: TensorDictBase, partial: bool) -> None:
        from torch import multiprocessing as mp
        from torchrl.weight_update import MultiProcessWeightSyncScheme

        ctx = mp.get_context("spawn")
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        # sync=False: the acknowledgement is awaited here, with a timeout (see _ack_queue)
        self._scheme = MultiProcessWeightSyncScheme(sync=False)
        self._scheme.init_on_sender(weights=weights, devices=[torch.device("cpu")], ctx=ctx)
        kernel_signal = threading.current_thread() is threading.main_thread()
        self._process = ctx.Process(
            target=serve,
            args=(
                self.policy_factory,
                self._scheme,
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
        self._finalizer = weakref.finalize(
            self, _close, self._process, self._requests, self._scheme
        )
        try:
            info = self._reply("its start")
            self._layout = info["layout"]
            check_weights_fit(weights, self._layout, owner=_OWNER, partial=partial)
            self._scheme.connect()  # sends the initial weights
            self._ask("connect")
        except BaseException:
            self.close()
            raise
        self.in_keys = info["in_keys"]
        self.out_keys = info["out_keys"] + [POLICY_VERSION_KEY]

    def update_policy_weights_(
        self,
        weights: torch.nn.Module | TensorDictBase,
        *,
        policy_version: int,
        partial: bool = False,
    ) -> None:
        """Sends ``weights`` to the generator and makes them live as ``policy_version``.

        The first call starts the generator process with these weights.

        Args:
            weights (nn.Module or TensorDictBase): the trainer's model or its
                ``TensorDict.from_module`` weights (keys as the generator's model).

        Keyword Args:
            policy_version (int): the version rollouts sampled from now on are stamped with.
            partial (bool, optional): ``weights`` may hold a subset of the generator's tensors
                (TRL streams trainable parameters only); the others keep their values.
                Defaults to ``False``.

        Raises:
            KeyError: if names differ from the generator model's (e.g. a ``torch.compile`` or
                PEFT prefix); nothing is sent.
            ValueError: if shapes differ from the generator model's; nothing is sent.
            RuntimeError: if the generator process died (its exit code is named).
            TimeoutError: if the generator does not acknowledge within ``timeout``.
        """
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights).data
        if self._process is not None:  # checked before the copy below, which can be large
            self._check_alive(f"the weights of version {policy_version}")
            check_weights_fit(weights, self._layout, owner=_OWNER, partial=partial)
        # a copy: sending moves a tensor's storage to shared memory, which must not happen to the
        # trainer's live parameters (copy.deepcopy of the model would then share them)
        weights = weights.apply(lambda t: t.detach().to("cpu", copy=True))
        if self._process is None:
            self._start(weights, partial)
        else:
            self._scheme.send(weights)  # torchrl: weights + instruction, into staging
            self._get(_ack_queue(self._scheme), f"the weights of version {policy_version}")
        self.policy_version = self._ask("commit", int(policy_version))

    def weights_checksum(self) -> tuple[int | None, str]:
        """``(policy_version, checksum)`` of the generator's live weights (see
        :func:`~torchrl_trl_interop.weights_checksum`)."""
        return self._ask("checksum")

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = pickle.loads(self._ask("call", pickle.dumps(tensordict)))
        return out

    def close(self) -> None:
        """Stops the generator process (also done when this object is garbage-collected)."""
        if self._finalizer is not None:
            self._finalizer()
        self._process = None

    def __getstate__(self):
        raise TypeError(
            f"{_OWNER} holds a process and its queues and cannot be pickled; build one in each "
            "process that calls it."
        )
