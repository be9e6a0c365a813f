"""A model's weights as a TensorDict: reading them, their checksum, and whether they fit a receiver.

Every weight push (:func:`~torchrl_trl_interop.weights._push.push`) sends what
:func:`model_weights` reads, into the module :func:`policy_model` finds, after
:func:`check_weights_fit` compared the names and shapes of both sides: a push that does not fit
raises here, naming the parameters, before anything is sent.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "check_weights_fit",
    "model_weights",
    "named_tensors",
    "policy_model",
    "weights_checksum",
    "weights_layout",
]

#: ``{"model.layers.0.mlp.up_proj.weight": (64, 32), ...}``: the names and shapes of a model's weights
Layout = dict[str, tuple[int, ...]]

_SHOWN = 8  # names listed in an error before "and N more"


def policy_model(policy: Any) -> Any:
    """The module whose weights a policy samples with: a torchrl LLM wrapper's ``.model``.

    A TensorDict module with a ``model`` (``TransformersWrapper``, ``vLLMWrapper``...) gives its
    model; anything else (a Hugging Face model, an ``nn.Module``) is returned as is.

    Examples:
        >>> linear = torch.nn.Linear(2, 2)
        >>> policy_model(linear) is linear
        True
    """
    from tensordict.nn import TensorDictModuleBase

    inner = getattr(policy, "model", None)
    if isinstance(policy, TensorDictModuleBase) and isinstance(inner, torch.nn.Module):
        return inner
    return policy


def model_weights(model: torch.nn.Module) -> TensorDictBase:
    """The parameters and buffers of ``model`` as a TensorDict (full tensors, detached).

    Sharded parameters (``DTensor``, FSDP2) are gathered with ``full_tensor()``: every rank must
    call this, as with TRL's own weight streaming.

    Examples:
        >>> model_weights(torch.nn.Linear(2, 3))["weight"].shape
        torch.Size([3, 2])
    """
    weights = TensorDict.from_module(model).data

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    return weights.apply(full)


def named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters and buffers of ``model`` by dotted name, tied ones under each name: the
    module's own tensors (copying into them, or setting their ``.data``, updates the model).

    Examples:
        >>> list(named_tensors(torch.nn.Linear(2, 3)))
        ['weight', 'bias']
    """
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return tensors


def weights_checksum(weights: torch.nn.Module | TensorDictBase) -> str:
    """A SHA-256 of every tensor's bytes, in sorted key order: equal only for equal weights.

    Examples:
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> weights_checksum(a) == weights_checksum(a), weights_checksum(a) == weights_checksum(b)
        (True, False)
    """
    if isinstance(weights, torch.nn.Module):
        weights = model_weights(weights)
    digest = hashlib.sha256()
    flat = weights.flatten_keys(".")
    for key in sorted(flat.keys()):
        tensor = flat.get(key).detach().cpu().contiguous()
        digest.update(key.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def weights_layout(weights: torch.nn.Module | TensorDictBase) -> Layout:
    """The dotted name and shape of every tensor of a model or a weights TensorDict.

    Examples:
        >>> weights_layout(torch.nn.Linear(2, 3))
        {'weight': (3, 2), 'bias': (3,)}
    """
    if isinstance(weights, torch.nn.Module):
        weights = TensorDict.from_module(weights)
    return {
        key if isinstance(key, str) else ".".join(key): tuple(tensor.shape)
        for key, tensor in weights.items(include_nested=True, leaves_only=True)
    }


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return f"[{shown}{f', ... and {len(names) - _SHOWN} more' if len(names) > _SHOWN else ''}]"


def _prefix(names: list[str], others: Layout) -> str | None:
    """The prefix that turns every one of ``names`` into a name of ``others``, if there is one."""
    for other in others:
        if names[0].endswith(other) and names[0] != other:
            prefix = names[0][: -len(other)]
            if all(n.startswith(prefix) and n[len(prefix) :] in others for n in names):
                return prefix
    return None


def check_weights_fit(
    weights: TensorDictBase | Layout,
    receiver: Layout,
    *,
    receiver_name: str = "generator",
    partial: bool = False,
) -> None:
    """Raises unless every tensor of ``weights`` has a tensor of the same name and shape in
    ``receiver`` (and, unless ``partial``, every tensor of ``receiver`` is sent).

    Args:
        weights (TensorDictBase or dict): what is sent (or its :func:`weights_layout`).
        receiver (dict): the receiving model's :func:`weights_layout`.

    Errors open with the public call being made (:func:`~torchrl_trl_interop._checks.boundary`).

    Keyword Args:
        receiver_name (str, optional): what receives, in the message. Defaults to
            ``"generator"``.
        partial (bool, optional): the weights may be a subset of the receiver's (TRL streams its
            trainable parameters only). Defaults to ``False``.

    Raises:
        KeyError: if names differ: the names the receiver lacks and those not sent, and the
            prefix that tells them apart when there is one (``torch.compile``, PEFT).
        ValueError: if shapes differ: each parameter with both shapes.

    Examples:
        >>> small, big = torch.nn.Linear(2, 3), torch.nn.Linear(2, 4)
        >>> check_weights_fit(model_weights(big), weights_layout(small))
        Traceback (most recent call last):
        ...
        ValueError: the weights do not fit the generator: parameter 'weight': trainer [4, 2], generator [3, 2]; parameter 'bias': trainer [4], generator [3] (2 of 2 tensors differ). ...
    """
    sent = weights if isinstance(weights, dict) else weights_layout(weights)
    unknown = [name for name in sent if name not in receiver]
    missing = [] if partial else [name for name in receiver if name not in sent]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} sent names the {receiver_name} lacks: {_listed(unknown)}")
        if missing:
            parts.append(f"{len(missing)} {receiver_name} names not sent: {_listed(missing)}")
        prefix = _prefix(unknown, receiver) if unknown else None
        if prefix is not None:
            hint = (
                f"Every sent name carries the prefix {prefix!r}: push the unwrapped model "
                "(torch.compile: model._orig_mod; PEFT: model.merge_and_unload())."
            )
        elif missing and (other := _prefix(missing, sent)) is not None:
            hint = f"The {receiver_name}'s names carry the prefix {other!r}: push its inner model."
        else:
            hint = f"The trainer and the {receiver_name} must be the same architecture."
        raise KeyError(
            f"the weights do not fit the {receiver_name}: " + "; ".join(parts) + f". {hint}"
        )
    wrong = [name for name, shape in sent.items() if receiver[name] != shape]
    if wrong:
        shown = "; ".join(
            f"parameter {name!r}: trainer {list(sent[name])}, {receiver_name} "
            f"{list(receiver[name])}"
            for name in wrong[:_SHOWN]
        )
        raise ValueError(
            f"the weights do not fit the {receiver_name}: {shown} ({len(wrong)} of "
            f"{len(sent)} tensors differ). The trainer and the {receiver_name} must be the "
            "same model size (hidden size, layers, vocabulary)."
        )
