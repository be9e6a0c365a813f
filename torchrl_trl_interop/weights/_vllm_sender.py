"""A push into vLLM engines through torchrl's own vLLM weight sync (``VLLMWeightSender``).

A torchrl ``vLLMWrapper`` over ``AsyncVLLM`` holds no weights in this process: its engines get
them from torchrl's ``VLLMWeightSyncScheme`` (NCCL, the trainer as rank 0). The caller builds
the sender and joins the group (``scheme.create_sender()``, ``init_all_workers_group(metadata,
vllm_engine=engine)``, as torchrl documents); :func:`push_to_vllm` then checks the trainer's
weights against the engine's names and shapes (the metadata the group was built with), sends
them with ``update_weights`` (parameters, and the buffers the engine holds) (torchrl's collective broadcast, every tensor in the metadata's
order), and sets the integer ``PolicyVersion`` of every collector registered on the sender to
the trainer's step (torchrl's own hook counts pushes). vLLM is not imported here.

torchrl's broadcast has no bound: an engine that died in the middle of it leaves NCCL waiting
forever. The broadcast runs in a thread of its own, and the push raises ``TimeoutError`` once
``timeout`` seconds have passed (the thread is left waiting; the group is unusable after that,
as NCCL's always is after a peer's death).
"""

from __future__ import annotations

import threading
from typing import Any

from .._upstream._weights import vllm_sender_collectors, vllm_sender_layout
from ._staleness import set_policy_version
from ._stream import RankStream, sendable
from ._tensors import check_weights_fit

__all__ = ["is_vllm_sender", "is_vllm_wrapper", "push_to_vllm"]


def is_vllm_sender(target: Any) -> bool:
    """Whether ``target`` is torchrl's ``VLLMWeightSender`` (or a subclass).

    Examples:
        >>> import torch
        >>> is_vllm_sender(torch.nn.Linear(2, 2))
        False
    """
    from torchrl.weight_update.llm import VLLMWeightSender  # imports no vLLM

    return isinstance(target, VLLMWeightSender)


def is_vllm_wrapper(target: Any) -> bool:
    """Whether ``target`` is torchrl's ``vLLMWrapper`` (its engine's weights are elsewhere)."""
    return any(cls.__name__ == "vLLMWrapper" for cls in type(target).__mro__)


def _bounded(send: Any, timeout: float) -> None:
    """Runs ``send()`` in a thread of its own; raises what it raised, or ``TimeoutError`` when
    it is not done within ``timeout`` seconds (it is left running: a broadcast cannot be
    interrupted)."""
    import torch

    failure: list[BaseException] = []
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None  # a thread starts on device 0

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            send()
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            failure.append(error)

    thread = threading.Thread(target=run, name="torchrl-trl-vllm-push", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(
            f"torchrl's VLLMWeightSender did not finish its broadcast within {timeout}s: an "
            "engine that died (or never joined) leaves NCCL waiting. The group cannot be "
            "used again; restart the engines and the trainer (raise timeout= for very large "
            "models)."
        )
    if failure:
        raise failure[0]


def push_to_vllm(target: Any, weights: Any, version: int, *, timeout: float = 600.0) -> int:
    """Sends ``weights`` (a model, streamed, or a weights TensorDict) to the vLLM engines;
    returns the bytes sent.

    Raises:
        RuntimeError: if the sender has not joined its group (``init_all_workers_group``).
        KeyError: if names differ from the engine's (vLLM's names are the Hugging Face model's).
        ValueError: if shapes differ.
        TimeoutError: if the broadcast is not done within ``timeout`` seconds.

    On a torchrl other than the one measured (:mod:`~torchrl_trl_interop._upstream._weights`)
    the engines' names are not read: nothing is checked before torchrl's broadcast, and torchrl's
    own hook counts the registered collectors' versions.
    """
    receiver = vllm_sender_layout(target)  # None: not known on this torchrl (nothing checked)
    if receiver == {}:
        raise RuntimeError(
            "the VLLMWeightSender has not joined its engines' group: call "
            "sender.init_all_workers_group(get_model_metadata(model), vllm_engine=engine) "
            "(together with the engine's side) before training, as torchrl's "
            "VLLMWeightSyncScheme documents."
        )
    layout, stream, _ = sendable(weights, receiver)
    # vLLM takes parameters: the model's buffers it does not hold (rotary tables) stay here
    model = weights.model if isinstance(weights, RankStream) else weights
    buffers = {n for n, _ in model.named_buffers()} if hasattr(model, "named_buffers") else ()
    kept = {n: s for n, s in layout.items() if n in (receiver or ()) or n not in buffers}
    if receiver is not None:  # torchrl's broadcast sends every tensor: a push is never partial
        check_weights_fit(kept, receiver, receiver_name="vLLM engine")
    # a flat {name: tensor}, read in the metadata's order
    sent = {name: tensor for name, tensor in stream if name in kept}
    _bounded(lambda: target.update_weights(sent), timeout)
    for collector in vllm_sender_collectors(target):
        set_policy_version(getattr(collector, "policy_version_tracker", None), version)
    return sum(t.numel() * t.element_size() for t in sent.values())
