"""A TorchRL LLM policy served by N Ray actors, on any node of a cluster, with weight sync.

:class:`RayRemotePolicy` is a TensorDict module in the trainer's process whose calls run a
torchrl LLM policy (built by ``policy_factory``) in ``num_replicas`` Ray actors
(:class:`PolicyActor`): a call splits its rows into contiguous chunks, one per replica, and
joins the answers in order; every row carries the ``"policy_version"`` of the weights that
produced it. A push streams the weights one tensor at a time into one flat buffer per dtype
(:class:`~torchrl_trl_interop.weights._staging.StagingBuffer`, in the trainer's process,
allocated once), puts it in Ray's object store once (``ray.put`` of numpy views: zero-copy for
the actors on the same node, one transfer per other node), and each actor commits it, with its
version, between two calls (a Ray actor runs one method at a time).

Every wait is bounded by ``timeout`` and notices an actor's death at once (Ray reports it);
actors are Ray's own and end with the driver that created them. This module imports ``ray``
only when a policy starts.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack

from .._checks import as_mapping, boundary, check_positive_int, require, signed
from .._keys import POLICY_VERSION_KEY
from ._served import ServedPolicy
from ._staging import Slots, StagingBuffer
from ._tensors import named_tensors, policy_model, weights_checksum

__all__ = ["PolicyActor", "RayRemotePolicy"]


class PolicyActor:
    """What each Ray actor of a :class:`RayRemotePolicy` runs: the policy, its version, commits.

    A plain class (``ray.remote(PolicyActor)`` makes the actor), usable in-process too.

    Examples:
        >>> from functools import partial
        >>> actor = PolicyActor(partial(torch.nn.Linear, 2, 2))
        >>> sorted(actor.info()["tensors"]), actor.checksum()[0]
        (['bias', 'weight'], None)
    """

    def __init__(self, policy_factory: Callable[[], Any], num_threads: int | None = None) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.policy = policy_factory()
        self.model = policy_model(self.policy)
        self.live = named_tensors(self.model)
        self.version: int | None = None

    def info(self) -> dict[str, Any]:
        """The policy's keys and its weights (as ``meta`` tensors: names, shapes, dtypes)."""
        keys = {k: list(getattr(self.policy, k, [])) for k in ("in_keys", "out_keys")}
        tensors = {name: t.detach().to("meta") for name, t in self.live.items()}
        return {**keys, "tensors": tensors}

    def commit(
        self, buffers: dict[torch.dtype, Any], slots: Slots, names: list[str] | None, version: int
    ) -> int:
        """Copies the pushed weights (flat numpy buffers by dtype) into the model, as
        ``version``."""
        with warnings.catch_warnings():  # the object store's arrays are read-only: only read
            warnings.simplefilter("ignore", UserWarning)
            flat = {d: torch.from_numpy(a).view(d) for d, a in buffers.items()}
        StagingBuffer(flat, slots).commit(self.live, self.live if names is None else names)
        self.version = int(version)
        return self.version

    def call(self, td: TensorDictBase) -> TensorDictBase:
        """The policy's answer to ``td``, each row stamped with the live version (-1: none)."""
        with torch.no_grad():
            out = self.policy(td)
        stamp = -1 if self.version is None else self.version
        out.set(POLICY_VERSION_KEY, torch.full(out.batch_size, stamp, dtype=torch.int64))
        return out

    def checksum(self) -> tuple[int | None, str]:
        return self.version, weights_checksum(self.model)


def _kill(actors: list) -> None:
    import ray

    if ray.is_initialized():
        for actor in actors:
            ray.kill(actor)


class _ActorsChannel:
    """A :class:`RayRemotePolicy`'s actors as the channel of its
    :class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme`: one buffer in this
    process, put in Ray's object store once per push, committed by every actor."""

    def __init__(self, policy: RayRemotePolicy) -> None:
        self.policy = weakref.ref(policy)  # the policy holds the scheme, which holds this

    def open_staging(self, version: int) -> tuple[list[StagingBuffer], dict[str, tuple[int, ...]]]:
        policy = self.policy()
        if not policy._actors:
            policy._start()
        return [policy._staging], policy._layout

    def commit_staged(self, version: int, names: list[str] | None) -> int:
        import ray

        policy = self.policy()
        buffers = policy._staging.buffers
        ref = ray.put({d: b.view(torch.uint8).numpy() for d, b in buffers.items()})  # once
        what = f"the weights of version {version}"
        slots = policy._staging.slots
        policy._wait([a.commit.remote(ref, slots, names, version) for a in policy._actors], what)
        policy.policy_version = version
        return version


class RayRemotePolicy(ServedPolicy):
    """A torchrl LLM policy served by ``num_replicas`` Ray actors, called like the policy.

    Each actor builds the policy with ``policy_factory`` (a torchrl ``TransformersWrapper``, a
    :class:`~torchrl_trl_interop.TrainerModelPolicy`, a ``vLLMWrapper`` on its GPU) wherever Ray
    places it (``remote_config``: ``num_gpus``, a ``scheduling_strategy``...). Calling this
    module splits the TensorDict's rows into one contiguous chunk per replica, runs them at once
    and returns the answers in the rows' order, each row with ``"policy_version"`` (``int64``):
    the version of the weights that produced it.

    The actors start at the first :meth:`update_policy_weights_` (which
    :class:`~torchrl_trl_interop.WeightSyncCallback` calls when training begins); they report
    their weights' names, shapes and dtypes, and every push is checked against them before it
    is sent. A push streams the weights one tensor at a time (sharded parameters gathered one by
    one, LoRA merged) into a flat buffer per dtype in this process (allocated once, the size of
    the weights), puts it in Ray's object store once, and every actor copies it in and takes the
    version between two calls: a generation never sees half-updated weights, and a row's version
    is exact. Ray moves the object to each node once; actors on a node read it without a copy.

    No wait is unbounded: a call, a push or the start raises ``TimeoutError`` after ``timeout``
    seconds, and a ``RuntimeError`` naming the replica as soon as Ray reports its actor dead.
    The actors are Ray's (not detached): they end with :meth:`close`, with this object, or with
    the driver.

    Ray must be installed (the ``ray`` extra). If no Ray instance is connected when the actors
    start, ``ray.init()`` is called (Ray's own default: ``RAY_ADDRESS`` or a local instance).

    Args and attributes are those of :class:`~torchrl_trl_interop.RemotePolicy`, where each Ray
    actor stands for its generator process (``policy_version`` is the version last committed in
    every replica), plus:

    Keyword Args:
        num_replicas (int, optional): actors, each with its own policy. Defaults to ``1``.
        remote_config (dict, optional): Ray actor options (``ray.remote(**remote_config)``).
            Defaults to ``{"num_cpus": 1}``.

    Examples:
        >>> from functools import partial
        >>> policy = RayRemotePolicy(partial(torch.nn.Linear, 2, 2), num_replicas=2)
        >>> policy
        RayRemotePolicy(policy_factory=partial, num_replicas=2, started=False, policy_version=None)
    """

    builds_in = "each Ray actor"
    holds = "Ray actors and a staging buffer"
    repr_fields = ("num_replicas",)

    @boundary("RayRemotePolicy")
    def __init__(
        self,
        policy_factory: Callable[[], Any],
        *,
        num_replicas: int = 1,
        remote_config: dict[str, Any] | None = None,
        timeout: float = 600.0,
        num_threads: int | None = None,
    ) -> None:
        super().__init__(policy_factory, timeout=timeout, num_threads=num_threads)
        check_positive_int(num_replicas, "num_replicas")
        options = as_mapping(
            remote_config, "remote_config", "of Ray actor options (e.g. {'num_gpus': 1})"
        )
        self.num_replicas = num_replicas
        self.remote_config = {"num_cpus": 1, **options}
        self._actors: list = []
        self._layout: dict[str, tuple[int, ...]] = {}
        self._staging: StagingBuffer | None = None

    @property
    def started(self) -> bool:
        return bool(self._actors)

    # -- waiting on the actors -------------------------------------------------------------------

    def _wait(self, refs: list, what: str) -> list:
        """Every result of ``refs`` (one per replica, in order), within ``timeout``; an actor's
        death or failure raises at once, naming its replica."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        deadline = time.monotonic() + self.timeout
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            left = max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise TimeoutError(
                    signed(
                        f"no reply to {what} from replicas "
                        f"{sorted(index[r] for r in pending)} within timeout={self.timeout}s; "
                        "their actors are alive but did not answer (raise timeout= for slow calls)"
                        + (
                            f", or Ray could not place them: each needs {self.remote_config} and "
                            f"the cluster has {ray.available_resources()} free."
                            if what == "its start"
                            else "."
                        )
                    )
                )
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except RayActorError as error:
                    raise RuntimeError(
                        signed(
                            f"the Ray actor of replica {i} died during {what}: {error}. Build a "
                            "new RayRemotePolicy; the actor's log says why it died."
                        )
                    ) from None
                except RayTaskError as error:
                    raise RuntimeError(signed(f"replica {i} failed on {what}:\n{error}")) from None
        return results

    def _check_started(self) -> None:
        if not self._actors:
            raise RuntimeError(
                signed(
                    "the actors are not started; they start with the first weights: call "
                    "update_policy_weights_(model_or_weights, policy_version=0) first "
                    "(WeightSyncCallback does so when training begins)."
                )
            )

    # -- weights ---------------------------------------------------------------------------------

    def _channel(self) -> _ActorsChannel:
        return _ActorsChannel(self)

    def _start(self) -> None:
        require("ray", "RayRemotePolicy")
        import ray

        if not ray.is_initialized():
            ray.init()
        actor = ray.remote(**self.remote_config)(PolicyActor)
        self._actors = [
            actor.remote(self.policy_factory, self.num_threads) for _ in range(self.num_replicas)
        ]
        self._finalizer = weakref.finalize(self, _kill, list(self._actors))
        try:
            infos = self._wait([a.info.remote() for a in self._actors], "its start")
        except BaseException:
            self.close()
            raise
        tensors = infos[0]["tensors"]
        self._layout = {name: tuple(t.shape) for name, t in tensors.items()}
        self._staging = StagingBuffer.like(tensors, shared=False)
        self.in_keys = infos[0]["in_keys"]
        self.out_keys = infos[0]["out_keys"] + [POLICY_VERSION_KEY]

    @boundary("RayRemotePolicy")
    def weights_checksums(self) -> list[tuple[int | None, str]]:
        """``(policy_version, checksum)`` of every replica's live weights, in replica order (see
        :func:`~torchrl_trl_interop.weights_checksum`)."""
        self._check_started()
        return self._wait([a.checksum.remote() for a in self._actors], "checksum")

    @boundary("RayRemotePolicy")
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._check_started()
        rows = tensordict.shape[0] if tensordict.batch_dims else 1
        if tensordict.batch_dims != 1 or rows == 1 or len(self._actors) == 1:
            return self._wait([self._actors[0].call.remote(tensordict)], "a call")[0]
        bounds = torch.linspace(0, rows, min(rows, len(self._actors)) + 1).round().long().tolist()
        chunks = [tensordict[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        outs = self._wait([a.call.remote(c) for a, c in zip(self._actors, chunks)], "a call")
        return lazy_stack([row for out in outs for row in out.unbind(0)])

    # the shared push and close, members of this class too (autodoc documents a class's own)
    update_policy_weights_ = ServedPolicy.update_policy_weights_
    close = ServedPolicy.close

    def _stopped(self) -> None:
        self._actors = []
