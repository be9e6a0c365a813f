"""torchrl objects that take weights through their own API, seen as weight-sync schemes.

A torchrl collector (``LLMCollector`` here, ``RayLLMCollector`` in a Ray actor) and torchrl's
``VLLMWeightSender`` receive weights, but hold no scheme the push could send through with a
version. :func:`as_weight_sync_scheme` wraps each in a :class:`TargetScheme`: a torchrl
``WeightSyncScheme`` on the sender side whose ``send(weights, policy_version=...,
partial=...)`` runs that object's own route (``_remote_collector``, ``_vllm_sender``, or the
local collector's ``update_policy_weights_`` below). This is the one place that tells those
objects apart; :func:`~torchrl_trl_interop.weights._push.push` only sees schemes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.weight_update import WeightSyncScheme

from .._checks import boundary
from .._upstream._weights import ray_collector_handle
from ._remote_collector import PUSH_TIMEOUT_S, push_to_remote_collector
from ._staleness import set_policy_version
from ._stream import sendable
from ._tensors import check_weights_fit, policy_model, weights_layout
from ._vllm_sender import is_vllm_sender, is_vllm_wrapper, push_to_vllm

__all__ = ["TargetScheme", "as_weight_sync_scheme", "tensors_nbytes", "whole"]


def tensors_nbytes(weights: TensorDictBase) -> int:
    """The bytes of every tensor of a weights TensorDict (what a push of it sends).

    Examples:
        >>> tensors_nbytes(whole([("a", torch.zeros(3)), ("b.c", torch.zeros(2, dtype=torch.int8))]))
        14
    """
    return sum(t.numel() * t.element_size() for t in weights.values(True, True))


def whole(stream: Any) -> TensorDictBase:
    """A ``(name, tensor)`` stream gathered into one TensorDict (receivers that take nothing
    else).

    Examples:
        >>> whole([("a.b", torch.zeros(1))])["a", "b"]
        tensor([0.])
    """
    return TensorDict(dict(stream), batch_size=[]).unflatten_keys(".")


class TargetScheme(WeightSyncScheme):
    """The sender side of a push into ``target`` through its own API, as a torchrl scheme.

    Args:
        target: the torchrl object that receives.
        route (Callable): ``route(target, weights, version, *, partial, timeout) -> bytes``:
            the push, bounded by ``timeout`` seconds when it waits on another process.

    Keyword Args:
        shared_by_ranks (bool, optional): the target is one receiver for every trainer rank
            (pushed from rank 0 only: torchrl's vLLM sender, which rank 0 joined to the engines'
            group). Defaults to ``False`` (each rank pushes its own).

    Examples:
        >>> scheme = as_weight_sync_scheme(torch.nn.Linear(2, 2))
        >>> scheme is None  # a module is copied into, not sent to
        True
    """

    #: ``send`` takes ``policy_version=`` and ``partial=`` (torchrl's schemes take neither)
    takes_policy_version = True

    def __init__(
        self, target: Any, route: Callable[..., int], *, shared_by_ranks: bool = False
    ) -> None:
        super().__init__(strategy="tensordict")
        self.target, self.route = target, route
        self.shared_by_ranks = shared_by_ranks
        self.last_push_bytes = 0
        self.last_push_delta = False
        self.init_on_sender()  # nothing to set up: the target's own API connects
        self.connect()

    def __repr__(self) -> str:
        return f"TargetScheme(target={type(self.target).__name__}, route={self.route.__name__})"

    def _init_on_sender_impl(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to set up: the target's own API connects."""

    def _setup_connection_and_weights_on_sender_impl(self, **kwargs: Any) -> None:
        """Nothing to exchange."""

    @boundary("TargetScheme")  # torchrl's init_on_receiver calls it
    def _init_on_receiver_impl(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"{type(self.target).__name__} receives through torchrl's own machinery; there is "
            "no receiver side to initialise."
        )

    def create_transport(self, **kwargs: Any) -> Any:
        """The target itself (its own API carries the weights)."""
        return self.target

    @boundary("TargetScheme")
    def send(
        self,
        weights: Any = None,
        worker_ids: int | list[int] | None = None,
        *,
        policy_version: int,
        partial: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Pushes ``weights`` into the target as ``policy_version`` (``worker_ids``: the target
        decides), waiting at most ``timeout`` seconds (``None``:
        :data:`~torchrl_trl_interop.weights._remote_collector.PUSH_TIMEOUT_S`) on another
        process; :attr:`last_push_bytes` is what it sent."""
        seconds = PUSH_TIMEOUT_S if timeout is None else timeout
        self.last_push_bytes = self.route(
            self.target, weights, policy_version, partial=partial, timeout=seconds
        )


def _to_ray_collector(target: Any, weights: Any, version: int, *, partial: bool, timeout: float):
    """``RayLLMCollector``: in its actor, checked against its policy, with its version."""
    layout, stream, partial = sendable(weights, None, partial=partial)
    handle = ray_collector_handle(target)
    return push_to_remote_collector(
        handle, layout, stream, version, partial=partial, timeout=timeout
    )


def _to_collector(target: Any, weights: Any, version: int, *, partial: bool, timeout: float):
    """A torchrl collector: its ``update_policy_weights_`` (one TensorDict, in the wrapper's
    layout when its policy is here), its integer ``PolicyVersion`` set to ``version``."""
    policy = getattr(target, "policy", None)
    model = policy_model(policy)
    local = isinstance(model, torch.nn.Module)  # a local collector: its policy is here
    receiver = weights_layout(model) if local else None
    layout, stream, partial = sendable(weights, receiver, partial=partial)
    if local:
        check_weights_fit(layout, receiver, receiver_name="policy", partial=partial)
    weights = whole(stream)
    nbytes = tensors_nbytes(weights)
    if local and model is not policy:  # a torchrl LLM wrapper keeps its model under "model"
        weights = TensorDict({"model": weights}, batch_size=[])
    target.update_policy_weights_(weights)
    set_policy_version(getattr(target, "policy_version_tracker", None), version)
    return nbytes


def _to_vllm(target: Any, weights: Any, version: int, *, partial: bool, timeout: float):
    """torchrl's ``VLLMWeightSender``: NCCL into the engines (never partial)."""
    return push_to_vllm(target, weights, version, timeout=timeout)


def as_weight_sync_scheme(target: Any) -> WeightSyncScheme | None:
    """The scheme a push into ``target`` sends through, or ``None`` for a module (copied in
    place). See :class:`~torchrl_trl_interop.WeightSyncCallback` for the targets.

    Raises:
        TypeError: if ``target`` cannot receive weights (a ``vLLMWrapper``: pass its sender);
            the message opens with the public call being made.

    Examples:
        >>> from torchrl_trl_interop import RemotePolicy
        >>> from functools import partial
        >>> type(as_weight_sync_scheme(RemotePolicy(partial(torch.nn.Linear, 2, 2)))).__name__
        'StagingWeightSyncScheme'
        >>> as_weight_sync_scheme(object())
        Traceback (most recent call last):
        ...
        TypeError: target=object cannot receive weights: ...
    """
    if isinstance(target, WeightSyncScheme):  # ours or torchrl's
        return target
    scheme = getattr(target, "weight_sync_scheme", None)  # RemotePolicy, RayRemotePolicy
    if isinstance(scheme, WeightSyncScheme):
        return scheme
    if is_vllm_sender(target):
        return TargetScheme(target, _to_vllm, shared_by_ranks=True)
    if is_vllm_wrapper(target):
        raise TypeError(
            "a torchrl vLLMWrapper holds no weights here: its engines get them through "
            "torchrl's vLLM weight sync. Pass its sender instead: sender = "
            "VLLMWeightSyncScheme(...).create_sender(), joined with "
            "sender.init_all_workers_group(get_model_metadata(model), vllm_engine=engine)."
        )
    if ray_collector_handle(target) is not None:
        return TargetScheme(target, _to_ray_collector)
    if callable(getattr(target, "update_policy_weights_", None)):
        return TargetScheme(target, _to_collector)
    if isinstance(target, torch.nn.Module):
        return None
    raise TypeError(
        f"target={type(target).__name__} cannot receive weights: it holds no module and is no "
        "torchrl collector or weight-sync scheme. Pass a RemotePolicy, a torchrl collector "
        "(with update_policy_weights_), a torchrl WeightSyncScheme initialised on the sender "
        "side, or an nn.Module (a policy in this process: a torchrl LLM wrapper, a model)."
    )
