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

from typing import Any

import torch
from tensordict import TensorDictBase

from ._adapters import as_weight_sync_scheme, whole
from ._staleness import set_policy_version
from ._stream import sendable
from ._tensors import check_weights_fit, named_tensors, policy_model

__all__ = ["push", "target_kind"]


def target_kind(target: Any) -> str:
    """``"scheme"`` or ``"module"``: how :func:`push` sends (a check for constructors).

    Raises:
        TypeError: if ``target`` can receive no weights.

    Examples:
        >>> target_kind(torch.nn.Linear(2, 2))
        'module'
    """
    return "module" if as_weight_sync_scheme(target) is None else "scheme"


def push(
    target: Any,
    weights: torch.nn.Module | TensorDictBase,
    version: int,
    *,
    partial: bool = False,
    policy_version: Any = None,
) -> None:
    """Sends ``weights`` to ``target`` as policy version ``version``.

    Args:
        target: a torchrl ``WeightSyncScheme``, an object exposing one (``.weight_sync_scheme``:
            a :class:`~torchrl_trl_interop.RemotePolicy`), a torchrl collector or
            ``VLLMWeightSender`` (adapted), or an ``nn.Module``.
        weights (nn.Module or TensorDictBase): the trainer's model (unwrapped), streamed one
            tensor at a time (:func:`~torchrl_trl_interop.weights._stream.stream_weights`:
            sharded parameters gathered one by one, LoRA merged, or a PEFT adapter alone when the
            receiver is the same PEFT model), or its weights, keyed as its parameters.
        version (int): the policy version rollouts sampled with these weights carry.

    Keyword Args:
        partial (bool, optional): ``weights`` may hold a subset of the receiver's tensors (TRL
            streams trainable parameters only). Defaults to ``False``.
        policy_version (PolicyVersion, optional): one more integer torchrl ``PolicyVersion`` to
            set to ``version``. Defaults to ``None``.

    Raises:
        KeyError: if the names differ from the receiving model's (when known).
        ValueError: if the shapes differ from the receiving model's (when known).

    Examples:
        >>> from tensordict import TensorDict
        >>> policy = torch.nn.Linear(2, 2)
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(2, 2)).data.zero_(), 1)
        >>> policy.weight.abs().sum().item()
        0.0
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(3, 2)).data, 2)
        Traceback (most recent call last):
        ...
        ValueError: the weights do not fit the policy: parameter 'weight': trainer [2, 3], policy [2, 2] (1 of 2 tensors differ). ...
    """
    scheme = as_weight_sync_scheme(target)
    if scheme is None:  # a module here: each tensor copied in place as it comes
        live = named_tensors(policy_model(target))
        receiver = {name: tuple(t.shape) for name, t in live.items()}
        layout, stream, partial = sendable(weights, receiver, partial=partial)
        check_weights_fit(layout, receiver, receiver_name="policy", partial=partial)
        with torch.no_grad():
            for name, tensor in stream:
                live[name].copy_(tensor)
    elif getattr(scheme, "takes_policy_version", False):  # ours: checked, with the version
        scheme.send(weights, policy_version=version, partial=partial)
    else:  # torchrl's own scheme: one TensorDict
        scheme.send(whole(sendable(weights, None)[1]))
    set_policy_version(policy_version, version)
