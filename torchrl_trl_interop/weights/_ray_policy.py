"""A TorchRL LLM policy served by N Ray actors, on any node of a cluster, with weight sync.

:class:`RayRemotePolicy` is a TensorDict module in the trainer's process whose calls run a
torchrl LLM policy (built by ``policy_factory``) in ``num_replicas`` Ray actors
(:class:`PolicyActor`): a call splits its rows into contiguous chunks, one per replica, and
joins the answers in order; every row carries the ``"policy_version"`` of the weights that
produced it. A push puts the streamed weights (cast to the actors' dtypes) in Ray's object
store once, straight from the stream (``ray.put`` of numpy views: one copy in; Ray moves it
once to each other node), and each actor makes it its model's, with its version, between two
calls (a Ray actor runs one method at a time): a model on the CPU adopts the object store's
memory (no copy; the replicas of a node share it), one on a GPU copies it in.
A delta push (``WeightSyncCallback(delta=True)``) puts only the changed elements.

The actors are *named* (in Ray's namespace :data:`NAMESPACE`): the same ``RayRemotePolicy``
built on every trainer rank joins one set of actors, created by the first rank that pushes (its
owner) and looked up by the others at their first call.

Every wait is bounded by ``timeout`` and notices an actor's death at once (Ray reports it);
actors are Ray's own and end with the driver that created them. This module imports ``ray``
only when a policy starts.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack

from .._checks import as_mapping, boundary, check_positive_int, require, type_error
from .._keys import POLICY_VERSION_KEY
from ._delta import Changes, apply_delta
from ._served import ServedPolicy, check_rows
from ._stream import several_ranks
from ._tensors import named_tensors, policy_model, weights_checksum

__all__ = ["NAMESPACE", "PolicyActor", "RayRemotePolicy"]

#: the Ray namespace of every :class:`RayRemotePolicy`'s named actors
NAMESPACE = "torchrl_trl_interop"

_BUILT = itertools.count()  # RayRemotePolicy objects built in this process, in order


def _to_wire(tensor: torch.Tensor, dtype: torch.dtype) -> Any:
    """``tensor`` cast to ``dtype`` on the CPU as a flat ``uint8`` numpy array (a view when it
    already is: ``ray.put`` copies it once into the object store)."""
    if tensor.dtype != dtype or tensor.device.type != "cpu":
        tensor = tensor.to(device="cpu", dtype=dtype)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.detach().view(-1).view(torch.uint8).numpy()


def _from_wire(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of ``dtype`` over a ``uint8`` numpy array (read-only object-store memory:
    read, never written)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).view(dtype)


class PolicyActor:
    """What each Ray actor of a :class:`RayRemotePolicy` runs: the policy, its version, commits.

    A plain class (``ray.remote(PolicyActor)`` makes the actor), usable in-process too.

    Examples:
        >>> from functools import partial
        >>> actor = PolicyActor(partial(torch.nn.Linear, 2, 2))
        >>> sorted(actor.info()["tensors"]), actor.checksum()[0]
        (['bias', 'weight'], None)
        >>> weights = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
        >>> actor.commit({k: _to_wire(v, torch.float32) for k, v in weights.items()}, 3)
        3
        >>> actor.commit_delta(3, 4, {"bias": (torch.tensor([1]).numpy(), _to_wire(torch.ones(1), torch.float32))})
        4
        >>> actor.live["bias"].tolist()
        [0.0, 1.0]
    """

    def __init__(
        self,
        policy_factory: Callable[[], Any],
        num_threads: int | None = None,
        *,
        owner: str | None = None,
        num_replicas: int = 1,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.policy = policy_factory()
        self.model = policy_model(self.policy)
        self.live = named_tensors(self.model)
        self.version: int | None = None
        self.owner, self.num_replicas = owner, num_replicas
        self.held: dict[str, Any] = {}  # object-store arrays the model's CPU tensors use

    def info(self) -> dict[str, Any]:
        """The policy's keys, its weights (as ``meta`` tensors: names, shapes, dtypes), who
        started the actor and with how many replicas."""
        keys = {k: list(getattr(self.policy, k, [])) for k in ("in_keys", "out_keys")}
        tensors = {name: t.detach().to("meta") for name, t in self.live.items()}
        return {**keys, "tensors": tensors, "owner": self.owner, "num_replicas": self.num_replicas}

    def commit(self, weights: dict[str, Any], version: int) -> int:
        """Makes the pushed weights (``{name: flat uint8 array}`` in the model's dtypes; the
        tensors not among them keep their values) the model's, as ``version``.

        A tensor on the CPU adopts the object store's memory (no copy: the replicas of a node
        share one copy of the weights, read-only, kept while the model uses it); one elsewhere (a
        GPU) is copied into."""
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays: read, never written
            for name, array in weights.items():
                live = self.live[name]
                pushed = torch.from_numpy(array).view(live.dtype).view(live.shape)
                if live.device.type == "cpu":
                    live.data = pushed
                    self.held[name] = array  # the store keeps it while the model reads it
                else:
                    live.copy_(pushed)
        self.version = int(version)
        return self.version

    def commit_delta(self, base: int, version: int, changes: dict[str, tuple[Any, Any]]) -> Any:
        """Writes a delta push (``{name: (flat indices, values as uint8)}``) as ``version`` if
        the model holds ``base``; ``None`` (nothing written) otherwise. A tensor that uses the
        object store's (read-only, shared) memory is first copied into memory of its own."""
        if self.version != base:
            return None
        tensors: Changes = {
            name: (torch.from_numpy(index), _from_wire(values, self.live[name].dtype))
            for name, (index, values) in changes.items()
        }
        with torch.no_grad():
            for name in tensors:
                if self.held.pop(name, None) is not None:
                    live = self.live[name]
                    live.data = live.data.clone()
        apply_delta(self.live, tensors)
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


def _launch() -> str:
    """What tells this launch apart in a shared Ray cluster: torchrun's rendezvous (the same on
    every rank of one job), or this host and process alone."""
    env = os.environ
    if int(env.get("WORLD_SIZE", "1") or 1) > 1 and env.get("MASTER_PORT"):
        run = env.get("TORCHELASTIC_RUN_ID", "")
        run = "" if run in ("", "none") else f"/{run}"
        return f"{env.get('MASTER_ADDR', 'localhost')}:{env['MASTER_PORT']}{run}"
    return f"{socket.gethostname()}:{os.getpid()}"


class _ActorsChannel:
    """A :class:`RayRemotePolicy`'s actors as the streaming channel of its
    :class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme`: each push put in
    Ray's object store once, straight from the stream, committed by every actor."""

    def __init__(self, policy: RayRemotePolicy) -> None:
        self.policy = weakref.ref(policy)  # the policy holds the scheme, which holds this

    def open(self, version: int) -> tuple[dict[str, tuple[int, ...]], dict[str, torch.dtype]]:
        policy = self.policy()
        if not policy._layout:
            policy._start()
        return policy._layout, policy._dtypes

    def send_full(self, version: int, stream: Any, partial: bool) -> int:
        import ray

        policy = self.policy()
        dtypes = policy._dtypes
        weights = {name: _to_wire(tensor, dtypes[name]) for name, tensor in stream}
        ref = ray.put(weights)  # once, whatever the number of replicas
        what = f"the weights of version {version}"
        policy._wait([a.commit.remote(ref, version) for a in policy._actors], what)
        policy.policy_version = version
        return sum(a.nbytes for a in weights.values())

    def send_delta(self, version: int, base: int, changes: Changes) -> int | None:
        import ray

        policy = self.policy()
        wire = {
            name: (index.numpy(), _to_wire(values, values.dtype))
            for name, (index, values) in changes.items()
        }
        ref = ray.put(wire)
        what = f"the weights of version {version} (a delta from version {base})"
        done = policy._wait(
            [a.commit_delta.remote(base, version, ref) for a in policy._actors], what
        )
        if any(v is None for v in done):  # a replica does not hold the base: push it whole
            return None
        policy.policy_version = version
        return sum(i.nbytes + v.nbytes for i, v in wire.values())


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
    one, LoRA merged), cast to the actors' dtypes, into Ray's object store (one ``ray.put``,
    one copy in), and every actor copies it into its model and takes the version between two
    calls: a generation never sees half-updated weights, and a row's version is exact. Ray
    moves the object to each node once; actors on a node read it without a copy.

    **Several trainer ranks.** The actors are named (``name``, in Ray's namespace
    ``"torchrl_trl_interop"``): the same ``RayRemotePolicy(...)`` built on every rank of a
    ``torchrun``/``accelerate`` launch shares one set of actors. The first rank to push starts
    them and owns them (they end with it); the other ranks find them at their first call.
    :class:`~torchrl_trl_interop.WeightSyncCallback` pushes them once per sync, from rank 0,
    after every rank gathered its part of the weights, and no rank goes on before the push is
    committed: every row of every rank carries the exact version. Every rank must join the same
    Ray cluster (``ray start --head`` first, then ``RAY_ADDRESS`` or ``ray.init(address=...)``);
    on several ranks an unconnected process joins with ``ray.init(address="auto")``, never a
    cluster of its own.

    No wait is unbounded: a call, a push or the start raises ``TimeoutError`` after ``timeout``
    seconds, and a ``RuntimeError`` naming the replica as soon as Ray reports its actor dead
    (its process killed, its node gone). The actors are Ray's (not detached): they end with
    :meth:`close` of their owner, with that object, or with the driver that started them.

    Ray must be installed (the ``ray`` extra). If no Ray instance is connected when the actors
    start, one process alone calls ``ray.init()`` (Ray's own default: ``RAY_ADDRESS`` or a local
    instance).

    Args and attributes are those of :class:`~torchrl_trl_interop.RemotePolicy`, where each Ray
    actor stands for its generator process (``policy_version`` is the version last committed in
    every replica by this process), plus:

    Keyword Args:
        num_replicas (int, optional): actors, each with its own policy. Defaults to ``1``.
        remote_config (dict, optional): Ray actor options (``ray.remote(**remote_config)``).
            Defaults to ``{"num_cpus": 1}``.
        name (str, optional): the actors' name (replica ``i`` is ``f"{name}/replica-{i}"``):
            every process that builds a ``RayRemotePolicy`` of this name shares its actors.
            Defaults to one made of the launch (``torchrun``'s ``MASTER_ADDR:MASTER_PORT`` on
            several ranks, this host and process otherwise) and the order in which this process
            built its ``RayRemotePolicy`` objects: the same on every rank of one launch when every
            rank builds them in the same order.

    Examples:
        >>> from functools import partial
        >>> policy = RayRemotePolicy(partial(torch.nn.Linear, 2, 2), num_replicas=2, name="gen")
        >>> policy
        RayRemotePolicy(policy_factory=partial, num_replicas=2, name='gen', started=False, policy_version=None)
    """

    builds_in = "each Ray actor"
    holds = "Ray actors"
    repr_fields = ("num_replicas", "name")
    #: the same object built on every rank shares one set of actors: pushed from rank 0 only
    shared_by_ranks = True

    @boundary("RayRemotePolicy")
    def __init__(
        self,
        policy_factory: Callable[[], Any],
        *,
        num_replicas: int = 1,
        remote_config: dict[str, Any] | None = None,
        timeout: float = 600.0,
        num_threads: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(policy_factory, timeout=timeout, num_threads=num_threads)
        check_positive_int(num_replicas, "num_replicas")
        options = as_mapping(
            remote_config, "remote_config", "of Ray actor options (e.g. {'num_gpus': 1})"
        )
        if name is not None and (not isinstance(name, str) or not name):
            raise type_error("name", "a non-empty str or None", name)
        self.num_replicas = num_replicas
        self.remote_config = {"num_cpus": 1, **options}
        self.name = name if name is not None else f"{_launch()}/{next(_BUILT)}"
        self._actors: list = []
        self._owned: list[bool] = []
        self._layout: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, torch.dtype] = {}

    @property
    def started(self) -> bool:
        return bool(self._actors)

    @property
    def owner(self) -> bool:
        """Whether this process started the actors (they end with it)."""
        return any(self._owned)

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
                    f"no reply to {what} from the RayRemotePolicy's replicas "
                    f"{sorted(index[r] for r in pending)} within timeout={self.timeout}s; "
                    "their actors are alive but did not answer (raise timeout= for slow calls)"
                    + (
                        f", or Ray could not place them: each needs {self.remote_config} and "
                        f"the cluster has {ray.available_resources()} free."
                        if what == "its start"
                        else "."
                    )
                )
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except RayActorError as error:
                    raise RuntimeError(
                        f"the RayRemotePolicy's actor of replica {i} ({self.name}/replica-{i}) "
                        f"died during {what}: {error}. Build a new RayRemotePolicy; the "
                        "actor's log says why it died (a node that left the cluster takes "
                        "its actors with it)."
                    ) from None
                except RayTaskError as error:
                    raise RuntimeError(
                        f"the RayRemotePolicy's replica {i} failed on {what}:\n{error}"
                    ) from None
        return results

    def _check_started(self) -> None:
        if not self._actors and not self._join(create=False):
            raise RuntimeError(
                "the actors are not started; they start with the first weights: call "
                "update_policy_weights_(model_or_weights, policy_version=0) first "
                "(WeightSyncCallback does so when training begins; on several ranks, rank "
                f"0's does, and the other ranks find the actors named {self.name!r})."
            )

    # -- the actors ------------------------------------------------------------------------------

    def _channel(self) -> _ActorsChannel:
        return _ActorsChannel(self)

    def _connect(self, create: bool) -> Any:
        """Ray, connected: ``ray.init()`` for one process; on several ranks the cluster every
        rank joins (``address="auto"``), never one of its own. ``None``: not connected and
        ``create`` is ``False``."""
        require("ray", "RayRemotePolicy")
        import ray

        if ray.is_initialized():
            return ray
        if not create and not several_ranks():
            return None
        if not several_ranks() and int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
            ray.init()
            return ray
        try:
            ray.init(address="auto")
        except ConnectionError as error:
            raise RuntimeError(
                "several trainer ranks share one RayRemotePolicy, so every rank must join "
                f"one Ray cluster, but none was found ({error}). Start it first (`ray start "
                "--head`, then RAY_ADDRESS=HEAD:6379 for the ranks) or call "
                "ray.init(address=...) on every rank before training."
            ) from None
        return ray

    def _join(self, create: bool) -> bool:
        """Starts the named actors (``create``: those missing) or finds them; ``False`` if they
        are not found and ``create`` is ``False``."""
        ray = self._connect(create)
        if ray is None:
            return False
        names = [f"{self.name}/replica-{i}" for i in range(self.num_replicas)]
        token = uuid.uuid4().hex
        if create:
            actor = ray.remote(**self.remote_config)(PolicyActor)
            handles = [
                actor.options(name=n, namespace=NAMESPACE, get_if_exists=True).remote(
                    self.policy_factory, self.num_threads, owner=token, num_replicas=len(names)
                )
                for n in names
            ]
        else:
            try:
                handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
            except ValueError:  # not there (yet)
                return False
        self._actors = handles
        try:
            infos = self._wait([a.info.remote() for a in handles], "its start")
        except BaseException:
            if create:  # a start that failed here ends the actors (none can serve)
                _kill(handles)
            self._stopped()
            raise
        self._owned = [info["owner"] == token for info in infos]
        owned = [a for a, mine in zip(handles, self._owned) if mine]
        if owned:
            self._finalizer = weakref.finalize(self, _kill, owned)
        if infos[0]["num_replicas"] != self.num_replicas:
            replicas = infos[0]["num_replicas"]
            self._actors = []
            raise ValueError(
                f"the actors named {self.name!r} were started with num_replicas={replicas}, "
                f"this RayRemotePolicy has num_replicas={self.num_replicas}; build it alike "
                "on every rank."
            )
        tensors = infos[0]["tensors"]
        self._layout = {name: tuple(t.shape) for name, t in tensors.items()}
        self._dtypes = {name: t.dtype for name, t in tensors.items()}
        self.in_keys = infos[0]["in_keys"]
        self.out_keys = infos[0]["out_keys"] + [POLICY_VERSION_KEY]
        return True

    def _start(self) -> None:
        self._join(create=True)

    @boundary("RayRemotePolicy")
    def weights_checksums(self) -> list[tuple[int | None, str]]:
        """``(policy_version, checksum)`` of every replica's live weights, in replica order (see
        :func:`~torchrl_trl_interop.weights_checksum`)."""
        self._check_started()
        return self._wait([a.checksum.remote() for a in self._actors], "checksum")

    @boundary("RayRemotePolicy")
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        check_rows(tensordict)
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
        self._actors, self._owned = [], []
        self._layout, self._dtypes = {}, {}
