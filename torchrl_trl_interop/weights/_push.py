"""The one weight push: trainer weights into a TorchRL generator, whatever holds it, with a version.

:class:`~torchrl_trl_interop.WeightSyncCallback` and
:class:`~torchrl_trl_interop.TorchRLWeightTransfer` both push through :func:`push`; it sends the
weights through the target's own machinery, checks first that they fit when the receiving
model's names and shapes are known, and stamps the version once:

==============================================  ================================================
target                                          push
==============================================  ================================================
:class:`~torchrl_trl_interop.RemotePolicy`      ``update_policy_weights_(weights,
                                                policy_version=version)``: checked against the
                                                generator's names and shapes, streamed into its
                                                shared staging buffer, then committed there
                                                with its version
:class:`~torchrl_trl_interop.RayRemotePolicy`   the same call: checked, streamed into one
                                                buffer, put in Ray's object store once,
                                                committed by every actor with its version
a torchrl collector in a Ray actor              in the actor (``_remote_collector``): checked
(``RayLLMCollector``)                           against its policy, put under ``"model"`` for a
                                                wrapper, its ``update_policy_weights_``, its
                                                integer ``PolicyVersion`` set to the version
a torchrl collector here (``LLMCollector``,     ``update_policy_weights_(weights)`` (its own
any ``Collector``)                              weight-sync scheme); its ``PolicyVersion``
                                                tracker, when local and integer, is set
torchrl's ``VLLMWeightSender`` (the engines     ``update_weights(weights)`` (``_vllm_sender``):
of a ``vLLMWrapper`` over ``AsyncVLLM``)        checked against the engines' names and shapes,
                                                broadcast over NCCL; registered collectors'
                                                ``PolicyVersion`` set to the version
a ``torchrl.weight_update.WeightSyncScheme``    ``send(weights)`` (initialised on the sender
                                                side and connected by the caller)
an ``nn.Module`` in this process (a torchrl     copied in place, one tensor at a time, into a
LLM wrapper, a model)                           wrapper's ``.model``
==============================================  ================================================
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.weight_update import WeightSyncScheme

from ._ray_policy import RayRemotePolicy
from ._remote_collector import is_remote_collector, push_to_remote_collector
from ._remote_policy import RemotePolicy
from ._staleness import set_policy_version
from ._stream import sendable
from ._tensors import check_weights_fit, named_tensors, policy_model, weights_layout
from ._vllm_sender import is_vllm_sender, is_vllm_wrapper, push_to_vllm

__all__ = ["push", "target_kind"]


def target_kind(target: Any, owner: str) -> str:
    """``"remote"``, ``"collector"``, ``"vllm"``, ``"scheme"`` or ``"module"``: how :func:`push`
    sends.

    Raises:
        TypeError: if ``target`` is none of them; the message names ``owner``.

    Examples:
        >>> target_kind(torch.nn.Linear(2, 2), "f")
        'module'
    """
    if isinstance(target, (RemotePolicy, RayRemotePolicy)):
        return "remote"
    if is_vllm_sender(target):
        return "vllm"
    if isinstance(target, WeightSyncScheme):
        return "scheme"
    if is_vllm_wrapper(target):
        raise TypeError(
            f"{owner}: a torchrl vLLMWrapper holds no weights here: its engines get them through "
            "torchrl's vLLM weight sync. Pass its sender instead: sender = "
            "VLLMWeightSyncScheme(...).create_sender(), joined with "
            "sender.init_all_workers_group(get_model_metadata(model), vllm_engine=engine)."
        )
    if callable(getattr(target, "update_policy_weights_", None)):
        return "collector"
    if isinstance(target, torch.nn.Module):
        return "module"
    raise TypeError(
        f"{owner}: target={type(target).__name__} cannot receive weights: it holds no module and "
        "is no torchrl collector or weight-sync scheme. Pass a RemotePolicy, a torchrl collector "
        "(with update_policy_weights_), a torchrl WeightSyncScheme initialised on the sender "
        "side, or an nn.Module (a policy in this process: a torchrl LLM wrapper, a model)."
    )


def _whole(stream: Any) -> TensorDictBase:
    """A stream gathered into one TensorDict (for receivers that take nothing else)."""
    return TensorDict(dict(stream), batch_size=[]).unflatten_keys(".")


def push(
    target: Any,
    weights: torch.nn.Module | TensorDictBase,
    version: int,
    *,
    owner: str,
    partial: bool = False,
    policy_version: Any = None,
) -> None:
    """Sends ``weights`` to ``target`` (see the module's table) as policy version ``version``.

    Args:
        target: a :class:`~torchrl_trl_interop.RemotePolicy`, a torchrl collector, a torchrl
            ``WeightSyncScheme`` or an ``nn.Module``.
        weights (nn.Module or TensorDictBase): the trainer's model (unwrapped), streamed one
            tensor at a time (:func:`~torchrl_trl_interop.weights._stream.stream_weights`:
            sharded parameters gathered one by one, LoRA merged, or a PEFT adapter alone when the
            receiver is the same PEFT model), or its weights, keyed as its parameters.
        version (int): the policy version rollouts sampled with these weights carry.

    Keyword Args:
        owner (str): the public call, named in errors.
        partial (bool, optional): ``weights`` may hold a subset of the receiver's tensors (TRL
            streams trainable parameters only). Defaults to ``False``.
        policy_version (PolicyVersion, optional): one more integer torchrl ``PolicyVersion`` to
            set to ``version``. Defaults to ``None``.

    Raises:
        KeyError: if the names differ from the receiving model's (when known).
        ValueError: if the shapes differ from the receiving model's (when known).

    Examples:
        >>> policy = torch.nn.Linear(2, 2)
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(2, 2)).data.zero_(), 1, owner="f")
        >>> policy.weight.abs().sum().item()
        0.0
        >>> push(policy, TensorDict.from_module(torch.nn.Linear(3, 2)).data, 2, owner="f")
        Traceback (most recent call last):
        ...
        ValueError: f: the weights do not fit the policy: parameter 'weight': trainer [2, 3], policy [2, 2] (1 of 2 tensors differ). ...
    """
    kind = target_kind(target, owner)
    if kind == "remote":  # streams into its shared staging buffer
        target.update_policy_weights_(weights, policy_version=version, partial=partial)
    elif kind == "collector" and is_remote_collector(target):  # RayLLMCollector: in its actor
        layout, stream, partial = sendable(weights, None, partial=partial)
        push_to_remote_collector(target, layout, stream, version, owner=owner, partial=partial)
    elif kind == "collector":
        policy = getattr(target, "policy", None)
        model = policy_model(policy)
        local = isinstance(model, torch.nn.Module)  # a local collector: its policy is here
        layout, stream, partial = sendable(
            weights, weights_layout(model) if local else None, partial=partial
        )
        if local:
            check_weights_fit(
                layout, weights_layout(model), owner=owner, receiver_name="policy", partial=partial
            )
        weights = _whole(stream)  # torchrl's collectors take one TensorDict
        if local and model is not policy:  # a torchrl LLM wrapper keeps its model under "model"
            weights = TensorDict({"model": weights}, batch_size=[])
        target.update_policy_weights_(weights)
        set_policy_version(getattr(target, "policy_version_tracker", None), version)
    elif kind == "vllm":  # torchrl's VLLMWeightSender: NCCL into the engines
        push_to_vllm(target, weights, version, owner=owner)
    elif kind == "scheme":
        target.send(_whole(sendable(weights, None)[1]))
    else:  # a module here: each tensor copied in place as it comes
        live = named_tensors(policy_model(target))
        receiver = {name: tuple(t.shape) for name, t in live.items()}
        layout, stream, partial = sendable(weights, receiver, partial=partial)
        check_weights_fit(layout, receiver, owner=owner, receiver_name="policy", partial=partial)
        with torch.no_grad():
            for name, tensor in stream:
                live[name].copy_(tensor)
    set_policy_version(policy_version, version)
