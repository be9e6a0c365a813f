"""A TorchRL LLM policy served by another process, with weight sync and policy versions.

:class:`RemotePolicy` is a TensorDict module in the trainer's process whose calls run a torchrl
LLM policy (built by ``policy_factory``) in a spawned process. TensorDicts go out and come back
pickled by value (no shared-memory file descriptors per call); every output carries the
``"policy_version"`` of the weights that produced it. Weights arrive through torchrl's own
``MultiProcessWeightSyncScheme`` (``torchrl.weight_update``) into a staging copy, and are
committed to the live model, with their version, between two calls: a generation never sees
half-updated weights, and its version is exact.
"""

from __future__ import annotations

import pickle
import queue
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

__all__ = ["RemotePolicy"]

_OWNER = "RemotePolicy"
#: written by :class:`RemotePolicy` on every output row: the version of the weights that produced it
VERSION_KEY = "policy_version"


def _serve(policy_factory, scheme, requests, replies, num_threads) -> None:
    """The generator process: builds the policy, then serves calls and weight commits in order."""
    from ._sync import policy_model, weights_checksum

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        policy = policy_factory()
        model = policy_model(policy)
        live = TensorDict.from_module(model).data
        staging = live.data.clone()  # torchrl's scheme writes here; commits copy it into `live`
        scheme.init_on_receiver(model_id="policy", model=staging, worker_idx=0)
        scheme.connect(worker_idx=0)  # the initial weights, received by value
        staging.update(staging.data.clone())  # own memory, not the sender's shared tensors
        keys = {k: list(getattr(policy, k, [])) for k in ("in_keys", "out_keys")}
        replies.put(("ok", keys))
    except BaseException:  # noqa: BLE001 - reported to the trainer's process
        replies.put(("error", traceback.format_exc()))
        return
    version = None
    while True:
        kind, payload = requests.get()
        if kind == "stop":
            break
        try:
            if kind == "commit":
                live.data.update_(staging)
                version = int(payload)
                reply = version
            elif kind == "call":
                td = pickle.loads(payload)
                with torch.no_grad():
                    out = policy(td)
                stamp = -1 if version is None else version
                out.set(VERSION_KEY, torch.full(out.batch_size, stamp, dtype=torch.int64))
                reply = pickle.dumps(out)
            elif kind == "checksum":
                reply = (version, weights_checksum(live))
            else:
                raise ValueError(f"unknown request {kind!r}")
            replies.put(("ok", reply))
        except BaseException:  # noqa: BLE001
            replies.put(("error", traceback.format_exc()))
    scheme.shutdown()


def _close(process: Any, requests: Any, scheme: Any) -> None:
    if process is not None and process.is_alive():
        requests.put(("stop", None))
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    if scheme is not None:
        scheme.shutdown()


class RemotePolicy(TensorDictModuleBase):
    """A torchrl LLM policy running in another process, called like the policy itself.

    ``policy_factory`` runs in a spawned process and builds the policy there (e.g. a
    :class:`~torchrl_trl_interop.TrainerModelPolicy`, a torchrl
    ``TransformersWrapper``, a ``vLLMWrapper`` on its own GPU). Calling this module sends the
    TensorDict there and returns the policy's output, plus ``"policy_version"`` (``int64``, one per
    row): the version of the weights that produced it.

    The process starts at the first :meth:`update_policy_weights_` (which
    :class:`~torchrl_trl_interop.WeightSyncCallback` calls when training begins): torchrl's
    ``MultiProcessWeightSyncScheme`` is set up with those weights as the initial ones, so the
    generator starts from the trainer's weights. Each later push goes through the scheme's
    ``send`` (blocking until the generator acknowledged) and is then committed, with its version,
    between two calls. The generator keeps a staging copy of the weights for that (twice the
    weights' memory in its process).

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

    def _ask(self, kind: str, payload: Any = None) -> Any:
        if self._process is None:
            raise RuntimeError(
                f"{_OWNER}: the generator process is not started; it starts with the first "
                "weights: call update_policy_weights_(model_or_weights, policy_version=0) first "
                "(WeightSyncCallback does so when training begins)."
            )
        self._requests.put((kind, payload))
        return self._reply(kind)

    def _reply(self, kind: str) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                status, reply = self._replies.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(
                        f"{_OWNER}: the generator process died (exit code "
                        f"{self._process.exitcode}) while serving {kind!r}."
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{_OWNER}: no reply to {kind!r} within timeout={self.timeout}s."
                    ) from None
        if status == "error":
            raise RuntimeError(f"{_OWNER}: the generator process failed on {kind!r}:\n{reply}")
        return reply

    def _start(self, weights: TensorDictBase) -> None:
        from torch import multiprocessing as mp
        from torchrl.weight_update import MultiProcessWeightSyncScheme

        ctx = mp.get_context("spawn")
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._scheme = MultiProcessWeightSyncScheme()
        self._scheme.init_on_sender(weights=weights, devices=[torch.device("cpu")], ctx=ctx)
        self._process = ctx.Process(
            target=_serve,
            args=(
                self.policy_factory,
                self._scheme,
                self._requests,
                self._replies,
                self.num_threads,
            ),
            name="torchrl-remote-policy",
            daemon=True,
        )
        self._process.start()
        self._finalizer = weakref.finalize(
            self, _close, self._process, self._requests, self._scheme
        )
        self._scheme.connect()  # sends the initial weights
        keys = self._reply("start")
        self.in_keys, self.out_keys = keys["in_keys"], keys["out_keys"] + [VERSION_KEY]

    def update_policy_weights_(
        self, weights: torch.nn.Module | TensorDictBase, *, policy_version: int
    ) -> None:
        """Sends ``weights`` to the generator and makes them live as ``policy_version``.

        The first call starts the generator process with these weights.

        Args:
            weights (nn.Module or TensorDictBase): the trainer's model or its
                ``TensorDict.from_module`` weights (keys as the generator's model).

        Keyword Args:
            policy_version (int): the version rollouts sampled from now on are stamped with.
        """
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights).data
        # a copy: sending moves a tensor's storage to shared memory, which must not happen to the
        # trainer's live parameters (copy.deepcopy of the model would then share them)
        weights = weights.apply(lambda t: t.detach().to("cpu", copy=True))
        if self._process is None:
            self._start(weights)
        else:
            self._scheme.send(weights)  # torchrl: queue + instruction + ack, into staging
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
