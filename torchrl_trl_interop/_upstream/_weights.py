"""torchrl's internals that the weight push reads: a ``RayLLMCollector``'s actor handle, and a
``VLLMWeightSender``'s model metadata and registered collectors.

torchrl 0.14 keeps all three private (``RayLLMCollector._collector``,
``VLLMWeightSender._model_metadata``, ``VLLMWeightSender._collectors``). Each reader here is
gated on :data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`; on another torchrl (or inside
:func:`~torchrl_trl_interop._upstream.plain_upstream`) it returns what the public API allows,
and the push takes torchrl's public route:

=================================  ====================================  ==========================
reader                             measured branch                       other branch
=================================  ====================================  ==========================
:func:`ray_collector_handle`       the collector's actor handle: the     ``None``: the push calls
                                   push runs in the actor, checked,      the collector's public
                                   with its version                      ``update_policy_weights_``
:func:`vllm_sender_layout`         the engines' names and shapes: the    ``None``: nothing checked
                                   push is checked before NCCL           before torchrl's broadcast
:func:`vllm_sender_collectors`     the collectors registered on the      ``[]``: torchrl's own hook
                                   sender: their version set to the      counts pushes instead
                                   trainer's step
=================================  ====================================  ==========================
"""

from __future__ import annotations

from typing import Any

from ._gate import TORCHRL_MEASURED, use_fast

__all__ = ["ray_collector_handle", "vllm_sender_collectors", "vllm_sender_layout"]

#: The torchrl internals this module reads (``test/test_layout.py`` checks the list).
READS = (
    "torchrl.collectors.llm.RayLLMCollector._collector",
    "torchrl.weight_update.llm.VLLMWeightSender._model_metadata",
    "torchrl.weight_update.llm.VLLMWeightSender._collectors",
)


def ray_collector_handle(collector: Any) -> Any:
    """The Ray actor handle of a torchrl ``RayLLMCollector`` (``None`` for anything else, or on
    the plain branch).

    Retired when torchrl's ``RayLLMCollector`` offers a public way to run a function in its
    actor (or a versioned, bounded ``update_policy_weights_(weights, policy_version=...,
    timeout=...)``).

    Examples:
        >>> import torch
        >>> ray_collector_handle(torch.nn.Linear(2, 2)) is None
        True
    """
    if not use_fast(TORCHRL_MEASURED):
        return None
    handle = getattr(collector, "_collector", None)
    if handle is None or type(handle).__name__ != "ActorHandle":
        return None
    return handle


def vllm_sender_layout(sender: Any) -> dict[str, tuple[int, ...]] | None:
    """``{name: shape}`` of the engines a torchrl ``VLLMWeightSender`` broadcasts to, ``{}`` when
    it has not joined their group yet, ``None`` on the plain branch (unknown).

    Retired when torchrl's ``VLLMWeightSender`` exposes the metadata it was joined with (a
    public ``model_metadata`` property).

    Examples:
        >>> from types import SimpleNamespace
        >>> import torch
        >>> sender = SimpleNamespace(_model_metadata={"w": (torch.float32, torch.Size([2, 3]))})
        >>> vllm_sender_layout(sender)
        {'w': (2, 3)}
    """
    if not use_fast(TORCHRL_MEASURED):
        return None
    metadata = getattr(sender, "_model_metadata", None)
    if metadata is None:
        return {}
    return {name: tuple(shape) for name, (_dtype, shape) in metadata.items()}


def vllm_sender_collectors(sender: Any) -> list:
    """The collectors registered on a torchrl ``VLLMWeightSender`` (``register_collector``);
    ``[]`` on the plain branch.

    Retired when torchrl's ``VLLMWeightSender`` lists its collectors publicly, or its
    ``update_weights`` takes the policy version to set.

    Examples:
        >>> from types import SimpleNamespace
        >>> vllm_sender_collectors(SimpleNamespace(_collectors=["c"]))
        ['c']
    """
    if not use_fast(TORCHRL_MEASURED):
        return []
    return list(getattr(sender, "_collectors", []))
