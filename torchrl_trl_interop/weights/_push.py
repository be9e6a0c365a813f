"""The one weight push: trainer weights into a TorchRL generator, whatever holds it, with a version.

:class:`~torchrl_trl_interop.WeightSyncCallback` and
:class:`~torchrl_trl_interop.TorchRLWeightTransfer` both push through :func:`push`. It knows two
kinds of target: a torchrl ``WeightSyncScheme`` (sender side), or a module in this process
(copied in place). Everything else reaches it as a scheme
(:func:`~torchrl_trl_interop.weights._adapters.as_weight_sync_scheme`): a
:class:`~torchrl_trl_interop.RemotePolicy` or :class:`~torchrl_trl_interop.RayRemotePolicy`
through its own :class:`~torchrl_trl_interop.weights._scheme.StagingWeightSyncScheme`, a torchrl
collector or ``VLLMWeightSender`` through a
:class:`~torchrl_trl_interop.weights._adapters.TargetScheme` over its own API. The table of
targets, and what each push does, is in :class:`~torchrl_trl_interop.WeightSyncCallback`'s
docstring (the one copy).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase

from ._adapters import TargetScheme, as_weight_sync_scheme, tensors_nbytes, whole
from ._scheme import StagingWeightSyncScheme
from ._staleness import check_policy_version, set_policy_version
from ._stream import sendable
from ._tensors import check_weights_fit, named_tensors, policy_model

__all__ = ["Pushed", "push", "pushed_by_every_rank", "takes_delta", "target_kind"]


class Pushed(NamedTuple):
    """What one push sent: its bytes (indices and values for a delta), and whether it was one."""

    bytes: int
    delta: bool


def target_kind(target: Any) -> str:
    """``"scheme"`` or ``"module"``: how :func:`push` sends (a check for constructors).

    Raises:
        TypeError: if ``target`` can receive no weights.

    Examples:
        >>> target_kind(torch.nn.Linear(2, 2))
        'module'
    """
    return "module" if as_weight_sync_scheme(target) is None else "scheme"


def takes_delta(target: Any) -> bool:
    """Whether a push into ``target`` can be a delta (its receivers apply them).

    Examples:
        >>> takes_delta(torch.nn.Linear(2, 2))
        False
    """
    scheme = as_weight_sync_scheme(target)
    return isinstance(scheme, StagingWeightSyncScheme) and scheme.takes_delta


def pushed_by_every_rank(target: Any) -> bool:
    """Whether, on several trainer ranks, every rank pushes into its own ``target`` (a
    ``RemotePolicy``, a module, a collector each rank built), or rank 0 alone into one receiver
    every rank shares (a ``RayRemotePolicy``'s named actors, torchrl's vLLM sender, a torchrl
    scheme the caller connected).

    Examples:
        >>> pushed_by_every_rank(torch.nn.Linear(2, 2))
        True
    """
    shared = getattr(target, "shared_by_ranks", None)
    if shared is not None:
        return not shared
    scheme = as_weight_sync_scheme(target)
    if scheme is None or isinstance(scheme, StagingWeightSyncScheme):
        return True
    if isinstance(scheme, TargetScheme):
        return not scheme.shared_by_ranks
    return False  # torchrl's own scheme, connected by the caller (from rank 0)


def push(
    target: Any,
    weights: torch.nn.Module | TensorDictBase | dict[str, torch.Tensor],
    version: int,
    *,
    partial: bool = False,
    policy_version: Any = None,
    delta: bool = False,
    full_every: int = 10,
    timeout: float | None = None,
) -> Pushed:
    """Sends ``weights`` to ``target`` as policy version ``version``; returns what it sent.

    Args:
        target: a torchrl ``WeightSyncScheme``, an object exposing one (``.weight_sync_scheme``:
            a :class:`~torchrl_trl_interop.RemotePolicy`), a torchrl collector or
            ``VLLMWeightSender`` (adapted), or an ``nn.Module``.
        weights (nn.Module, TensorDictBase or dict): the trainer's model (unwrapped), streamed
            one tensor at a time
            (:func:`~torchrl_trl_interop.weights._stream.stream_weights`: sharded parameters
            gathered one by one, LoRA merged, or a PEFT adapter alone when the receiver is the
            same PEFT model), its weights keyed as its parameters, or its ``state_dict()``.
        version (int): the policy version rollouts sampled with these weights carry.

    Keyword Args:
        partial (bool, optional): ``weights`` may hold a subset of the receiver's tensors (TRL
            streams trainable parameters only). Defaults to ``False``.
        policy_version (PolicyVersion, optional): one more integer torchrl ``PolicyVersion`` to
            set to ``version``. Defaults to ``None``.
        delta (bool, optional): only the changed elements, when the receiver applies deltas
            (:func:`takes_delta`). Defaults to ``False``.
        full_every (int, optional): with ``delta``, a whole push every ``full_every`` pushes.
            Defaults to ``10``.
        timeout (float, optional): seconds a push into a target without a timeout of its own
            (a ``RayLLMCollector``, torchrl's vLLM sender) may wait. Defaults to ``None``
            (:data:`~torchrl_trl_interop.weights._remote_collector.PUSH_TIMEOUT_S`).

    Raises:
        TypeError: if ``weights`` is no model, TensorDict or state_dict, or ``version`` no int.
        KeyError: if the names differ from the receiving model's (when known).
        ValueError: if the shapes differ from the receiving model's (when known), ``version``
            is negative, or ``delta`` is asked of a target that takes none.

    Examples:
        >>> from tensordict import TensorDict
        >>> policy = torch.nn.Linear(2, 2)
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(2, 2)).data.zero_(), 1)
        Pushed(bytes=24, delta=False)
        >>> policy.weight.abs().sum().item()
        0.0
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(3, 2)).data, 2)
        Traceback (most recent call last):
        ...
        ValueError: the weights do not fit the policy: parameter 'weight': trainer [2, 3], policy [2, 2] (1 of 2 tensors differ). ...
    """
    version = check_policy_version(version)
    scheme = as_weight_sync_scheme(target)
    if delta and not (isinstance(scheme, StagingWeightSyncScheme) and scheme.takes_delta):
        name = type(target).__name__
        raise ValueError(
            "delta=True needs a target whose receivers apply delta pushes (a RemotePolicy or "
            f"a RayRemotePolicy), got {name}. Leave delta=False."
        )
    if scheme is None:  # a module here: each tensor copied in place as it comes
        live = named_tensors(policy_model(target))
        receiver = {name: tuple(t.shape) for name, t in live.items()}
        layout, stream, partial = sendable(weights, receiver, partial=partial)
        check_weights_fit(layout, receiver, receiver_name="policy", partial=partial)
        nbytes = 0
        with torch.no_grad():
            for name, tensor in stream:
                live[name].copy_(tensor)
                nbytes += live[name].numel() * live[name].element_size()
        pushed = Pushed(nbytes, False)
    elif isinstance(scheme, StagingWeightSyncScheme):  # ours: checked, with the version
        scheme.send(
            weights, policy_version=version, partial=partial, delta=delta, full_every=full_every
        )
        pushed = Pushed(scheme.last_push_bytes, scheme.last_push_delta)
    elif isinstance(scheme, TargetScheme):  # a target's own API, with the version
        scheme.send(weights, policy_version=version, partial=partial, timeout=timeout)
        pushed = Pushed(scheme.last_push_bytes, False)
    else:  # torchrl's own scheme: one TensorDict
        sent = whole(sendable(weights, None)[1])
        scheme.send(sent)
        pushed = Pushed(tensors_nbytes(sent), False)
    set_policy_version(policy_version, version)
    return pushed
