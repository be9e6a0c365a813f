"""The staging transport as a torchrl weight-sync scheme: :class:`StagingWeightSyncScheme`.

A push fills a staging buffer shaped like the receiver's weights
(:class:`~torchrl_trl_interop.weights._staging.StagingBuffer`), one ``copy_`` per tensor as
each is read (gathered, merged), checked first against the receiver's names and shapes; the
receiver then commits the staged weights with their version between two of its calls, so a
generation never sees half-updated weights. It follows torchrl's ``WeightSyncScheme`` contract:
``init_on_sender`` / ``connect`` / ``send`` on one side, ``init_on_receiver`` / ``connect`` /
``receive`` on the other, registered with torchrl as the ``"staging"`` backend
(``WeightSyncScheme.from_backend("staging")``).

What carries the commit is the scheme's *channel*, of one of two kinds:

* a **staging** channel has ``open_staging(version) -> (stagings, layout)`` (the buffers the
  sender fills in turn, and the receiver's names and shapes; called before every push),
  ``commit_staged(version, names) -> version`` and, for delta pushes,
  ``commit_delta(version, base, changes) -> version or None`` (``None``: the receiver does not
  hold ``base``). :class:`~torchrl_trl_interop.RemotePolicy` passes its generator process
  (requests in order with its calls, buffers in shared memory). Without a channel, the scheme
  builds its own for torchrl's collectors: a buffer in shared memory shaped like the
  collector's policy (``context``) and a queue of commits each worker's ``receive()`` applies,
  acknowledged within ``timeout`` (no deltas);
* a **streaming** channel moves the stream itself: ``open(version) -> (layout, dtypes)``,
  ``send_full(version, stream, partial) -> bytes`` and ``send_delta(version, base, changes) ->
  bytes or None``. :class:`~torchrl_trl_interop.RayRemotePolicy` passes its actors (one
  ``ray.put`` per push, straight from the stream).

Either may have ``refuse_first()`` (the first push did not fit). Delta pushes
(``send(..., delta=True)``, :mod:`~torchrl_trl_interop.weights._delta`) keep the last pushed
weights on the sender's side, in the receiver's dtypes, and send only what changed.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.weight_update.weight_sync_schemes import (
    WeightSyncScheme,
    register_weight_sync_backend,
)

from .._checks import boundary
from ._delta import Changes, DeltaEncoder, apply_delta, changes_nbytes
from ._staging import StagingBuffer
from ._staleness import check_policy_version, set_policy_version
from ._stream import sendable
from ._tensors import check_weights_fit, named_tensors, policy_model

__all__ = ["StagingWeightSyncScheme", "staging_buffers"]


def staging_buffers(live: dict[str, torch.Tensor]) -> list[StagingBuffer]:
    """The staging buffers of a receiver whose tensors are ``live``: for a CPU model two, its
    tensors moved into the second (commits switch between them, no copy), else one (commits
    copy from it).

    Examples:
        >>> live = {"w": torch.zeros(2)}
        >>> [b.nbytes for b in staging_buffers(live)], live["w"].data_ptr() != 0
        ([8, 8], True)
    """
    staging = StagingBuffer.like(live)
    if any(t.device.type != "cpu" for t in live.values()):
        return [staging]
    current = StagingBuffer.like(live)
    current.fill(live.items())
    current.adopt(live)
    return [staging, current]


class _QueueChannel:
    """The channel to torchrl collector workers: one shared buffer, a queue of commits per
    worker, one queue of acknowledgements (made by the sender, carried to the workers with the
    pickled scheme). While it waits for the acknowledgements it watches the collector's worker
    processes (its ``procs``): a worker's death raises at once, naming it."""

    def __init__(
        self, model: torch.nn.Module, ctx: Any, timeout: float, num_workers: int, context: Any
    ):
        if ctx is None:
            from torch import multiprocessing as mp

            ctx = mp.get_context("spawn")
        live = named_tensors(policy_model(model))
        self.stagings = [StagingBuffer.like(live)]
        self.stagings[0].fill(live.items())  # the first weights a worker starts from
        self.layout = {name: tuple(t.shape) for name, t in live.items()}
        self.commits = [ctx.Queue() for _ in range(num_workers)]
        self.acks = ctx.Queue()
        self.timeout = timeout
        try:  # the collector whose worker processes (``procs``) it watches, if any
            self.context = None if context is None else weakref.ref(context)
        except TypeError:  # not weakly referable: nothing to watch
            self.context = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "context": None}  # the sender's collector stays with it

    def open_staging(self, version: int) -> tuple[list[StagingBuffer], dict[str, tuple[int, ...]]]:
        return self.stagings, self.layout

    def _check_workers(self, version: int) -> None:
        context = None if self.context is None else self.context()
        for i, process in enumerate(getattr(context, "procs", None) or []):
            if not process.is_alive():
                raise RuntimeError(
                    f"worker {i} of the {type(context).__name__} died (exit code "
                    f"{process.exitcode}) before committing the weights of version "
                    f"{version} through its StagingWeightSyncScheme. The collector cannot "
                    "go on; build a new one."
                )

    def commit_staged(self, version: int, names: list[str] | None) -> int:
        self._check_workers(version)
        for commits in self.commits:
            commits.put((version, names))
        deadline = time.monotonic() + self.timeout
        for done in range(len(self.commits)):
            while True:
                try:
                    self.acks.get(timeout=max(min(0.5, deadline - time.monotonic()), 0.0))
                    break
                except queue.Empty:
                    self._check_workers(version)
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"{done} of {len(self.commits)} workers committed the weights "
                            f"of version {version} through the StagingWeightSyncScheme "
                            f"within timeout={self.timeout}s (raise timeout= for slow "
                            "workers)."
                        ) from None
        return version


@register_weight_sync_backend("staging")
class StagingWeightSyncScheme(WeightSyncScheme):
    """torchrl's weight-sync contract over a staging buffer committed between two calls.

    The sender checks every push against the receiver's names and shapes, streams it into the
    staging buffer one tensor at a time (sharded parameters gathered one by one, LoRA merged:
    one tensor of extra memory), then asks the receiver to commit it as a policy version. The
    receiver commits between two of its calls: a CPU model switches to the staged buffer (two
    buffers, no copy), a model elsewhere copies it in. In a torchrl collector's workers
    (``MultiSyncCollector(..., weight_sync_schemes={"policy": StagingWeightSyncScheme()})``) a
    background thread commits each push as it arrives, as torchrl's own schemes apply theirs:
    there a commit is not ordered with the rollout in flight.

    Keyword Args:
        timeout (float, optional): seconds the sender waits for a commit on its own channel
            (torchrl collectors). Defaults to ``600``.

    Errors open with the public call being made: this class's method, or the call that sent
    through it (``RemotePolicy``, ``WeightSyncCallback``).

    Examples:
        >>> import threading
        >>> sender, receiver = StagingWeightSyncScheme(), StagingWeightSyncScheme()
        >>> trainer_model, generator_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> sender.init_on_sender(model_id="policy", model=generator_model)
        >>> receiver.__setstate__(sender.__getstate__())  # what a worker gets, pickled
        >>> receiver.init_on_receiver(model_id="policy", model=generator_model)
        >>> sender.connect(); receiver.connect()
        >>> worker = threading.Thread(target=receiver.receive, kwargs={"timeout": 10}); worker.start()
        >>> sender.send(trainer_model, policy_version=3); worker.join()
        3
        >>> bool((generator_model.weight == trainer_model.weight).all()), receiver.policy_version
        (True, 3)
    """

    #: ``send`` takes ``policy_version=`` and ``partial=`` (torchrl's schemes take neither)
    takes_policy_version = True

    def __init__(self, *, timeout: float = 600.0) -> None:
        super().__init__(strategy="tensordict")
        self.timeout = float(timeout)
        self.policy_version: int | None = None
        self._channel: Any = None
        self._stagings: list[StagingBuffer] | None = None
        self._layout: dict[str, tuple[int, ...]] = {}
        self._turn = 0
        self._live: dict[str, torch.Tensor] | None = None
        self._encoder: DeltaEncoder | None = None
        #: the bytes the last push sent (indices and values for a delta), and whether it was one
        self.last_push_bytes = 0
        self.last_push_delta = False

    def __repr__(self) -> str:
        side = "sender" if self.initialized_on_sender else "receiver"
        side = side if self.initialized_on_sender or self.initialized_on_receiver else "new"
        return f"StagingWeightSyncScheme({side}, policy_version={self.policy_version})"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # a worker gets the queues and the shared buffer; an owner's channel stays with it
        if not isinstance(self._channel, _QueueChannel):
            state["_channel"] = None
        state["_live"] = None
        state["_encoder"] = None
        state.pop("_stopping", None)
        return state

    @property
    def stagings(self) -> list[StagingBuffer] | None:
        """The staging buffers (the sender fills them in turn), once known."""
        return self._stagings

    @property
    def staging(self) -> StagingBuffer | None:
        """The staging buffer the next push fills, once known."""
        return None if self._stagings is None else self._stagings[self._turn]

    @property
    def layout(self) -> dict[str, tuple[int, ...]]:
        """The receiver's names and shapes (``{}`` on the sender before the first push)."""
        return self._layout

    # -- sender ----------------------------------------------------------------------------------

    @boundary("StagingWeightSyncScheme")  # torchrl's init_on_sender calls it
    def _init_on_sender_impl(
        self,
        model_id: str = "policy",
        context: Any = None,
        *,
        channel: Any = None,
        model: Any = None,
        ctx: Any = None,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``channel``: the owner's commit path (see the module); without one, a shared buffer
        shaped like ``model`` (or the ``context`` collector's policy) and a commit queue per
        worker (``num_workers``, or the ``context``'s)."""
        self.model_id = model_id
        if context is not None:
            self.context = context
        if channel is None:
            model = model if model is not None else getattr(context, "policy", None)
            if not isinstance(policy_model(model), torch.nn.Module):
                raise TypeError(
                    "the sender needs the receiver's model to shape the staging buffer: pass "
                    "model=... or a context with a .policy module, got "
                    f"model={type(model).__name__}, context={type(context).__name__}."
                )
            if num_workers is None:
                num_workers = getattr(context, "num_workers", 1)
            channel = _QueueChannel(model, ctx, self.timeout, int(num_workers), context)
        self._channel = channel

    def create_transport(self, **kwargs: Any) -> Any:
        """The channel (the scheme's transport: what carries each commit)."""
        return self._channel

    def _setup_connection_and_weights_on_sender_impl(self, **kwargs: Any) -> None:
        """Nothing to exchange: the buffers come with the first push (``open_staging``)."""

    @property
    def takes_delta(self) -> bool:
        """Whether the receiver applies delta pushes (a ``RemotePolicy``, a ``RayRemotePolicy``;
        not torchrl's collectors)."""
        channel = self._channel
        return callable(getattr(channel, "send_delta", getattr(channel, "commit_delta", None)))

    @boundary("StagingWeightSyncScheme")
    def send(
        self,
        weights: Any = None,
        worker_ids: int | list[int] | None = None,
        *,
        policy_version: int | None = None,
        partial: bool = False,
        delta: bool = False,
        full_every: int = 10,
    ) -> int:
        """Checks ``weights``, streams them to the receiver and has it commit them as
        ``policy_version``; returns the committed version (:attr:`last_push_bytes`: what it sent).

        Args:
            weights (nn.Module, TensorDictBase or state_dict): a model (streamed one tensor at a
                time) or its weights keyed as its parameters; ``None``: the ``context``'s policy.
            worker_ids: torchrl's argument; every receiver gets the push.

        Keyword Args:
            policy_version (int, optional): the version to commit. Defaults to the last one + 1.
            partial (bool, optional): ``weights`` may hold a subset of the receiver's tensors.
                Defaults to ``False``.
            delta (bool, optional): send only the elements that changed since the last push, in
                the receiver's dtypes (see :mod:`~torchrl_trl_interop.weights._delta`); a whole
                push every ``full_every`` pushes, when too much changed, or when the receiver
                does not hold the last push. Defaults to ``False``.
            full_every (int, optional): with ``delta``. Defaults to ``10``.

        Raises:
            RuntimeError: if the scheme is not initialised on the sender side.
            KeyError: if names differ from the receiver's; nothing is sent.
            ValueError: if shapes differ from the receiver's (nothing is sent), or ``delta`` is
                asked of a receiver that applies none (torchrl's collectors).
        """
        if not self.initialized_on_sender:
            raise RuntimeError(
                "the StagingWeightSyncScheme is not initialised on the sender side: call "
                "scheme.init_on_sender(model_id=..., model=... or channel=...) first."
            )
        if delta and not self.takes_delta:
            raise ValueError(
                "delta=True needs a receiver that applies delta pushes (a RemotePolicy or a "
                "RayRemotePolicy); this scheme's receivers are torchrl collector workers, "
                "which take whole pushes only. Leave delta=False."
            )
        if weights is None:
            weights = getattr(self.context, "policy", None)
        if policy_version is None:
            policy_version = 0 if self.policy_version is None else self.policy_version + 1
        version = check_policy_version(policy_version)
        streams = hasattr(self._channel, "send_full")  # the channel moves the stream itself
        if streams:
            self._layout, dtypes = self._channel.open(version)  # receiver alive
        else:
            self._stagings, self._layout = self._channel.open_staging(version)
            dtypes = {name: slot[0] for name, slot in self._stagings[0].slots.items()}
        layout, stream, partial = sendable(weights, self._layout, partial=partial, stable=streams)
        try:
            check_weights_fit(layout, self._layout, partial=partial)
        except (KeyError, ValueError):
            if self.policy_version is None and hasattr(self._channel, "refuse_first"):
                self._channel.refuse_first()  # a receiver that never had weights is stopped
            raise
        try:
            if delta:
                version = self._send_delta(version, layout, stream, dtypes, full_every, partial)
            else:
                self._encoder = None  # a later delta push starts again from a whole one
                version = self._send_full(version, stream, partial)
                self.last_push_delta = False
        except BaseException:
            self._encoder = None  # the receivers may not hold what the encoder holds
            raise
        self.policy_version = version
        return version

    def _send_full(self, version: int, stream: Any, partial: bool) -> int:
        """The whole stream, committed as ``version``; sets :attr:`last_push_bytes`."""
        if hasattr(self._channel, "send_full"):
            self.last_push_bytes = self._channel.send_full(version, stream, partial)
            return version
        staging = self._stagings[self._turn]
        names = staging.fill(stream)  # a copy_ per tensor, as each is read
        version = self._channel.commit_staged(version, names if partial else None)
        self._turn = (self._turn + 1) % len(self._stagings)  # as the receiver switched
        self.last_push_bytes = sum(staging.views[n].nbytes for n in names)
        return version

    def _send_delta(
        self, version: int, layout: Any, stream: Any, dtypes: dict, full_every: int, partial: bool
    ) -> int:
        encoder = self._encoder
        if encoder is None or encoder.full_every != full_every or encoder.dtypes != dtypes:
            encoder = self._encoder = DeltaEncoder(dtypes, full_every=full_every)
        kind, payload = encoder.encode(layout, stream)
        committed = None
        if kind == "delta":
            committed = self._commit_delta(version, encoder.version, payload)
        if committed is None:  # whole: by choice, or the receiver did not hold the last push
            partial = partial or set(encoder.last) != set(self._layout)
            committed = self._send_full(version, iter(encoder.last.items()), partial)
            self.last_push_delta = False
        else:
            self.last_push_delta = True
        encoder.version = committed
        return committed

    def _commit_delta(self, version: int, base: int, changes: Changes) -> int | None:
        channel = self._channel
        if hasattr(channel, "send_delta"):
            sent = channel.send_delta(version, base, changes)
            if sent is None:
                return None
            self.last_push_bytes = sent
            return version
        committed = channel.commit_delta(version, base, changes)
        self.last_push_bytes = changes_nbytes(changes)
        return committed

    # -- receiver --------------------------------------------------------------------------------

    def _init_on_receiver_impl(
        self,
        model_id: str = "policy",
        context: Any = None,
        *,
        model: Any = None,
        worker_idx: int | None = None,
        **kwargs: Any,
    ) -> None:
        """The receiver's model: ``model``, or the ``context`` collector's policy. Without the
        sender's buffers (a receiver that allocates them), they are made here (see
        :func:`staging_buffers`)."""
        self.model_id = model_id
        self.worker_idx = worker_idx
        if context is not None:
            self.context = context
        model = policy_model(model if model is not None else getattr(context, "policy", None))
        if any(t.is_meta for t in model.parameters()):  # a collector worker's policy skeleton
            model.to_empty(device="cpu")
            if isinstance(self._channel, _QueueChannel):  # the sender's first weights
                self._channel.stagings[0].commit(named_tensors(model), named_tensors(model))
        self._live = named_tensors(model)
        self._layout = {name: tuple(t.shape) for name, t in self._live.items()}
        if self._stagings is None and isinstance(self._channel, _QueueChannel):
            self._stagings = self._channel.stagings
        if self._stagings is None:
            self._stagings = staging_buffers(self._live)
        self._turn = 0

    def _setup_connection_and_weights_on_receiver_impl(self, **kwargs: Any) -> None:
        """Nothing to exchange: the first weights came with the buffer. In a torchrl collector's
        worker (a ``worker_idx``), a background thread commits each push as it comes, as
        torchrl's own schemes do; elsewhere the owner calls :meth:`receive`."""
        if kwargs.get("worker_idx") is not None:
            self.worker_idx = kwargs["worker_idx"]
        if self.worker_idx is not None and isinstance(self._channel, _QueueChannel):
            self._stopping = threading.Event()
            thread = threading.Thread(target=self._receive_until_stopped, daemon=True)
            thread.start()

    def _receive_until_stopped(self) -> None:
        while not self._stopping.is_set():
            self.receive(timeout=0.1)

    def shutdown(self) -> None:
        """Stops a worker's background receiver (torchrl calls it when the worker ends)."""
        stopping = getattr(self, "_stopping", None)
        if stopping is not None:
            stopping.set()
        super().shutdown()

    def commit(self, version: int, names: list[str] | None = None) -> int:
        """Makes the staged weights (``names``, or all) live as ``version``; returns it. Call it
        between two of the receiver's calls."""
        if len(self._stagings) == 2:  # the model switches to the staged buffer
            self._stagings[self._turn].adopt(
                self._live, names, current=self._stagings[1 - self._turn]
            )
            self._turn = 1 - self._turn
        else:
            self._stagings[0].commit(self._live, self._live if names is None else names)
        self.policy_version = int(version)
        return self.policy_version

    def commit_delta(self, version: int, base: int, changes: Changes) -> int | None:
        """Writes a delta push into the live weights as ``version`` if they are ``base`` (the
        push it was taken against); returns the version, or ``None`` (nothing written) if not.
        Call it between two of the receiver's calls."""
        if self.policy_version != base:
            return None
        apply_delta(self._live, changes)
        self.policy_version = int(version)
        return self.policy_version

    @boundary("StagingWeightSyncScheme")
    def receive(self, timeout: float | None = None) -> TensorDictBase | None:
        """Commits the pending push, if any (waiting up to ``timeout`` seconds for one; ``None``:
        the scheme's ``timeout``), acknowledges it, and returns the live weights (``None`` when
        none came)."""
        if not self.initialized_on_receiver:
            raise RuntimeError(
                "receive() needs init_on_receiver(model_id=..., model=... or context=...) first."
            )
        commits = self._channel.commits[self.worker_idx or 0]
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                version, names = commits.get(timeout=0.05)
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None
        self._channel.acks.put(self.commit(version, names))
        set_policy_version(
            getattr(self.context, "policy_version_tracker", None), self.policy_version
        )
        return TensorDict(dict(self._live), batch_size=[]).unflatten_keys(".")
