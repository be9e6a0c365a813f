"""A model's weights one tensor at a time: sharded parameters gathered one by one, LoRA merged.

:func:`stream_weights` yields ``(name, tensor)`` pairs, each a whole tensor: a ``DTensor``
(FSDP2) parameter is gathered with ``full_tensor()`` when its turn comes, a DeepSpeed ZeRO-3
parameter inside ``deepspeed.zero.GatheredParameters`` for that one parameter, and a PEFT LoRA
layer's weight is merged (base weight plus every active adapter's delta) without touching the
model. A consumer that copies each tensor before asking for the next (every weight push does)
needs one tensor of extra memory at a time, not one model. :func:`stream_layout` gives the names
and shapes the stream will have without gathering anything, so a push can be checked first.

On several ranks every rank must run the whole stream (each gather is a collective), whether or
not it sends: :class:`RankStream` is a model's stream that can be finished (:meth:`RankStream.drain`)
after a push that stopped part-way, so that a rank whose push failed still takes part in the
gathers the other ranks run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from .._checks import type_error
from ._tensors import Layout, weights_layout

__all__ = [
    "RankStream",
    "is_peft_model",
    "sendable",
    "several_ranks",
    "stream_layout",
    "stream_weights",
]

_BASE = ".base_layer"  # where PEFT moves a wrapped layer's own weights
_SAVED = (".original_module", ".modules_to_save.")  # PEFT's modules_to_save copies


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (``peft.PeftModel`` or a model with adapters injected).

    Examples:
        >>> is_peft_model(torch.nn.Linear(2, 2))
        False
    """
    return hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None))


def _is_adapter(name: str) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(f".{part}." in f".{name}" for part in LoraLayer.adapter_layer_names)


def _merged_entries(model: Any) -> Iterator[tuple[str, Any, str, torch.Tensor]]:
    """``(merged name, owner module, attribute, tensor)`` of a PEFT model's base model, its
    adapters left out, its ``modules_to_save`` copies under the original name."""
    base = model.get_base_model()
    modules = dict(base.named_modules())
    active = getattr(model, "active_adapter", "default")
    saved = f".modules_to_save.{active}."
    for kind in ("parameters", "buffers"):
        for name, tensor in getattr(base, f"named_{kind}")(remove_duplicate=False):
            if _is_adapter(name) or ".original_module." in f".{name}":
                continue
            if _SAVED[1] in name:
                if saved not in name:
                    continue
                merged = name.replace(saved, ".")
            else:
                merged = name.replace(f"{_BASE}.", ".")
            owner, _, attribute = name.rpartition(".")
            yield merged, modules.get(owner.removesuffix(_BASE)), attribute, tensor


def _merge_delta(layer: Any, attribute: str) -> torch.Tensor | None:
    """The weight delta of a LoRA layer's active, unmerged adapters (``None`` when there is none)."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(layer, LoraLayer) or attribute != "weight" or layer.disable_adapters:
        return None
    delta = None
    for adapter in layer.active_adapters:
        known = adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {})
        if known and adapter not in layer.merged_adapters:
            with torch.no_grad():
                step = layer.get_delta_weight(adapter)
            step = step.full_tensor() if hasattr(step, "full_tensor") else step  # sharded LoRA
            delta = step if delta is None else delta + step
    return delta


def _entries(model: torch.nn.Module, adapter_only: bool) -> Iterator[tuple[str, Any, str, Any]]:
    if is_peft_model(model):
        if adapter_only:
            for name, tensor in model.named_parameters():
                if _is_adapter(name):
                    yield name, None, "", tensor
            return
        yield from _merged_entries(model)
        return
    if adapter_only:
        raise ValueError(
            f"stream_weights: adapter_only=True needs a PEFT model, got {type(model).__name__}."
        )
    yield from ((name, None, "", t) for name, t in model.named_parameters(remove_duplicate=False))
    yield from ((name, None, "", t) for name, t in model.named_buffers(remove_duplicate=False))


def several_ranks() -> bool:
    """Whether this process is one of several ``torch.distributed`` ranks.

    Examples:
        >>> several_ranks()
        False
    """
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _shape(tensor: Any) -> tuple[int, ...]:
    return tuple(getattr(tensor, "ds_shape", None) or tensor.shape)  # ZeRO-3: the full shape


@contextlib.contextmanager
def _gathered(tensor: Any, stable: bool = False) -> Iterator[torch.Tensor]:
    """``tensor`` whole, for as long as the block runs: one parameter's gather at a time
    (``stable``: a copy of a gathered ZeRO-3 parameter, valid after the block)."""
    if hasattr(tensor, "ds_id"):  # a DeepSpeed ZeRO-3 partitioned parameter
        import deepspeed

        with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
            yield tensor.detach().clone() if stable else tensor.detach()
    elif hasattr(tensor, "full_tensor"):  # a DTensor (FSDP2, tensor parallel)
        yield tensor.full_tensor().detach()
    else:
        yield tensor.detach()


def stream_layout(model: torch.nn.Module, *, adapter_only: bool = False) -> Layout:
    """The names and shapes :func:`stream_weights` yields, read without gathering anything.

    Examples:
        >>> stream_layout(torch.nn.Linear(2, 3))
        {'weight': (3, 2), 'bias': (3,)}
    """
    return {name: _shape(t) for name, _, _, t in _entries(model, adapter_only)}


def stream_weights(
    model: torch.nn.Module, *, adapter_only: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields ``(name, tensor)`` for every parameter and buffer of ``model``, one whole tensor at a
    time, gathered (sharded parameters) or merged (LoRA) only when its turn comes.

    Use each tensor before asking for the next: a gathered or merged tensor is freed (or, for
    ZeRO-3, partitioned again) when the iteration moves on. On several ranks every rank must run
    the whole iteration (each gather is a collective).

    Args:
        model (nn.Module): the trainer's model, unwrapped (no DDP/accelerate wrapper).

    Keyword Args:
        adapter_only (bool, optional): a PEFT model yields its adapter tensors only, under its own
            names (for a receiver that is the same PEFT model). Defaults to ``False``: a PEFT
            model yields its base model's names, each LoRA weight merged with its active adapters
            (for a receiver without adapters).

    Raises:
        ValueError: if ``adapter_only`` is set for a model that is not a PEFT model.

    Examples:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        >>> [(name, tuple(t.shape)) for name, t in stream_weights(model)]
        [('0.weight', (3, 2)), ('0.bias', (3,)), ('2.weight', (1, 3)), ('2.bias', (1,))]
    """
    yield from _stream(list(_entries(model, adapter_only)))


def _stream(entries: list, stable: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    for name, owner, attribute, tensor in entries:
        with _gathered(tensor, stable) as whole:
            if owner is not None and (delta := _merge_delta(owner, attribute)) is not None:
                with torch.no_grad():
                    whole = whole + delta.to(whole.dtype)
            yield name, whole
            del whole  # freed before the next gather, not after it


class RankStream:
    """A model's whole stream (merged weights, every tensor) that can be finished after a push
    that stopped part-way: what every rank streams when several ranks push.

    Iterating it yields :func:`stream_weights`'s pairs (once); :meth:`drain` runs the gathers
    left, so a rank whose push failed before or during the stream still takes part in every
    gather the other ranks run. :func:`sendable` accepts it as the weights of a push.

    Examples:
        >>> stream = RankStream(torch.nn.Linear(2, 3))
        >>> stream.layout, next(iter(stream))[0], stream.drain()
        ({'weight': (3, 2), 'bias': (3,)}, 'weight', 1)
    """

    def __init__(self, model: torch.nn.Module) -> None:
        entries = list(_entries(model, False))
        self.model = model
        self.layout: Layout = {name: _shape(t) for name, _, _, t in entries}
        self.stable = False  # set by the consumer before iterating (see sendable)
        self._pairs: Iterator[tuple[str, torch.Tensor]] | None = None
        self._entries = entries

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._pairs is None:
            self._pairs = _stream(self._entries, self.stable)
        return self._pairs

    def drain(self) -> int:
        """Runs the rest of the stream (its gathers) and returns how many tensors that was."""
        return sum(1 for _ in iter(self))


def _checked_mapping(weights: Mapping) -> dict[str, torch.Tensor]:
    """A ``state_dict``-like mapping's ``{dotted name: tensor}``, each value checked."""
    for name, value in weights.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise type_error(
                "weights",
                "a model, a TensorDict of its weights or a state_dict ({name: tensor})",
                weights,
                f" Entry {name!r} holds a {type(value).__name__}.",
            )
    return dict(weights)


def sendable(
    weights: torch.nn.Module | TensorDictBase | Mapping | RankStream,
    receiver: Layout | None,
    *,
    partial: bool = False,
    stable: bool = False,
) -> tuple[Layout, Iterator[tuple[str, torch.Tensor]], bool]:
    """What a push sends: ``(layout, stream, partial)``, for a model, a weights TensorDict, a
    ``state_dict`` (``{dotted name: tensor}``) or a :class:`RankStream`.

    A model is streamed (:func:`stream_weights`); a PEFT model sends its adapter only (and
    ``partial`` becomes ``True``) when the ``receiver``'s layout holds the adapter's names (the
    same PEFT model) and this is one process, its merged weights otherwise (always on several
    ranks, where every rank must gather the same tensors). ``stable=True``: every tensor stays
    valid after the stream moves on (a gathered ZeRO-3 parameter is copied), for a consumer that
    keeps them all until it sends. A ``state_dict`` is sent as a partial push: the receiver's
    tensors it does not hold (the non-persistent buffers no ``state_dict`` holds, such as rotary
    tables) keep their values; a name the receiver lacks still raises.

    Raises:
        TypeError: if ``weights`` is none of these.

    Examples:
        >>> layout, stream, partial = sendable(torch.nn.Linear(2, 3), None)
        >>> layout, [name for name, _ in stream], partial
        ({'weight': (3, 2), 'bias': (3,)}, ['weight', 'bias'], False)
        >>> sendable(torch.nn.Linear(2, 3).state_dict(), None)[0]
        {'weight': (3, 2), 'bias': (3,)}
    """
    if isinstance(weights, RankStream):
        weights.stable = stable
        return dict(weights.layout), iter(weights), partial
    if isinstance(weights, TensorDictBase):
        items = weights.items(include_nested=True, leaves_only=True)
        stream = ((k if isinstance(k, str) else ".".join(k), t) for k, t in items)
        return weights_layout(weights), stream, partial
    if isinstance(weights, Mapping):  # partial: a state_dict holds no non-persistent buffer
        tensors = _checked_mapping(weights)
        layout = {name: tuple(t.shape) for name, t in tensors.items()}
        return layout, ((name, t.detach()) for name, t in tensors.items()), True
    if not isinstance(weights, torch.nn.Module):
        raise type_error(
            "weights",
            "a model, a TensorDict of its weights or a state_dict ({name: tensor})",
            weights,
        )
    adapter_only = False  # on several ranks every rank streams the same (merged) tensors
    if receiver is not None and is_peft_model(weights) and not several_ranks():
        adapters = stream_layout(weights, adapter_only=True)
        adapter_only = bool(adapters) and all(name in receiver for name in adapters)
    entries = list(_entries(weights, adapter_only))  # read once: for the layout and the stream
    layout = {name: _shape(t) for name, _, _, t in entries}
    return layout, _stream(entries, stable), partial or adapter_only
