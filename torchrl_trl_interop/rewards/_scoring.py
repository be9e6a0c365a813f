"""Scoring right-packed token ids with an HF reward model: fill choice, length buckets, one read.

``_inputs`` packs each row's real tokens to the right;
:func:`score_packed` fills the padding so the model pools the last real token, scores the rows
in length-bucketed micro-batches (a causal model without a mask: :func:`scores_without_mask`)
and reads every check of the call back from the device at once, after the model ran.
:class:`~torchrl_trl_interop.HFRewardModelWrapper` calls it.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict.utils import NestedKey
from torch import nn

from .._checks import signed
from .._padding import length_buckets, position_mask, unbucket
from ._inputs import PackedInput, empty_rows_error
from ._pooling import (
    check_reward_shape,
    choose_fill,
    extract_reward,
    optimistic_pad_id,
    pooling_model,
)

__all__ = [
    "NONFINITE_MODES",
    "check_nonfinite",
    "report_nonfinite",
    "score_packed",
    "scores_without_mask",
]

NONFINITE_MODES = ("raise", "warn", "ignore")


def check_nonfinite(nonfinite: str) -> None:
    """Raises a ``ValueError`` unless ``nonfinite`` is one of :data:`NONFINITE_MODES`: what a
    reward call does with a NaN or infinite reward.

    Examples:
        >>> check_nonfinite("warn")
        >>> check_nonfinite("drop")
        Traceback (most recent call last):
        ...
        ValueError: nonfinite='drop'; expected one of ('raise', 'warn', 'ignore').
    """
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"nonfinite={nonfinite!r}; expected one of {NONFINITE_MODES}.")


def score_packed(
    model: nn.Module,
    config: Any,
    packed: PackedInput,
    *,
    max_batch_size: int | None,
    pass_mask: bool,
    nonfinite: str,
    input_check: tuple[torch.Tensor | None, Callable[[], None]] | None = None,
    maskless: bool | None = None,
) -> tuple[torch.Tensor, bool]:
    """Scores the rows of ``packed``: their rewards ``[N]`` and whether one is not finite.

    ``input_check`` is ``(flag, raise_error)``: a 0-d bool tensor read with the other checks
    (e.g. :func:`._pooling.guard_model_input`'s) and what raises when it is set. ``maskless``
    is :func:`scores_without_mask` of the model when the caller holds it (it walks every module).

    ``config`` is the one the model's pooling reads
    (``_pooling.text_config``). The device is read once, after the model
    ran; a row that ends with the fill picked without looking at the rows (the model's pad id)
    makes it score every row again with a spare id.

    Raises:
        ValueError: if a row has no real token (found with that one read).

    Examples:
        >>> import torch
        >>> from torchrl_trl_interop.rewards._pooling import text_config
        >>> from torchrl_trl_interop.rewards._inputs import PackedInput
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> model = toy_reward_model("llama")
        >>> packed = PackedInput(torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([3, 2]),
        ...                      torch.Size([2]), None, None)
        >>> with torch.no_grad():
        ...     reward, bad = score_packed(model, text_config(model), packed,
        ...                                max_batch_size=1, pass_mask=True, nonfinite="raise")
        >>> reward.shape, bad
        (torch.Size([2]), False)
    """
    if packed.empty_hint is not None and packed.ids.shape[0] and not packed.ids.shape[-1]:
        raise empty_rows_error(packed.lengths, packed.empty_hint)  # width 0: every row is empty
    if maskless is None:
        maskless = scores_without_mask(model)
    reward, clash = _score(
        model, config, packed.ids, packed.lengths, max_batch_size, pass_mask, maskless
    )
    invalid = input_check[0] if input_check is not None else None
    empty, bad, clashed, invalid = _read_flags(reward, clash, packed, nonfinite, invalid)
    if invalid:
        input_check[1]()
    if clashed and not empty:  # a row ends with the pad id: score again with a spare
        reward, _ = _score(
            model, config, packed.ids, packed.lengths, max_batch_size, pass_mask, maskless, True
        )
        finite = _all_finite(reward, nonfinite)
        bad = finite is not None and not bool(finite)
    if empty:
        raise empty_rows_error(packed.lengths, packed.empty_hint)
    return reward, bad


def report_nonfinite(reward: torch.Tensor, reward_key: NestedKey, nonfinite: str) -> None:
    """Raises (``nonfinite="raise"``) or warns about the NaN or infinite entries of ``reward``.

    Called from the wrapper's ``forward`` (the warning's ``stacklevel`` counts on it).
    """
    bad = ~torch.isfinite(reward.detach())
    where = bad.nonzero().tolist()[:8]
    message = (
        f"{int(bad.sum())} of {bad.numel()} reward(s) at {reward_key!r} are NaN or infinite "
        f"(first indices: {where}). Check the model's dtype and inputs, or pass nonfinite='warn' "
        "or 'ignore'."
    )
    if nonfinite == "raise":
        raise ValueError(message)
    warnings.warn(signed(message), RuntimeWarning, stacklevel=3)


def _model_device(model: nn.Module, default: torch.device) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return default


def _score(
    model: nn.Module,
    config: Any,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    max_batch_size: int | None,
    pass_mask: bool,
    maskless: bool,
    look: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores right-packed rows ``ids [N, T]`` of ``lengths [N]`` (``0`` past each row's
    length, as :class:`PackedInput` holds them): a reward per row.

    Returns the rewards and, when the model's own pad id was used as the fill without
    looking at the rows, a 0-d bool tensor telling whether some row ends with it after all
    (the caller then scores again with ``look=True``, which picks a spare id).
    """
    n = ids.shape[0]
    device = _model_device(model, ids.device)
    ids = ids.to(device)
    lengths = lengths.to(device)
    if n == 0:
        return torch.zeros(0, device=device), None
    clash = None
    pad = optimistic_pad_id(config) if not look else None
    if pad is not None:
        fill, pooling_pad = pad, None
        clash = (ids[torch.arange(n, device=device), lengths - 1] == pad).any()
    else:
        fill, pooling_pad = choose_fill(config, ids, lengths)
    # the padding holds 0 already: the mask is built only to write another fill, or for a
    # model that reads it (a causal model's real tokens never see the padding)
    mask = position_mask(lengths, ids.shape[-1]) if fill != 0 or not maskless else None
    if fill != 0:
        ids = ids.masked_fill(~mask, fill)

    # micro-batches: rows sorted by length, so each call pads only to its own longest row
    buckets = length_buckets(lengths, max_batch_size)
    if buckets is None:
        chunks = [(ids, mask, lengths)]
    else:
        # a sorted bucket's longest row is its last: every width read back at once
        widths = lengths[torch.stack([b[-1] for b in buckets])].tolist()
        chunks = [
            (ids[b, :w], None if mask is None else mask[b, :w], lengths[b])
            for b, w in zip(buckets, widths)
        ]

    if pooling_pad is None:  # the model pools with its own pad id: called as it is
        rewards = _call_chunks(model, model, chunks, maskless, pass_mask)
    else:
        with pooling_model(model, config, pooling_pad) as pooled:  # never mutates the model
            rewards = _call_chunks(pooled, model, chunks, maskless, pass_mask)
    if buckets is None:
        return rewards[0], clash
    return unbucket(rewards, buckets), clash  # back to the original row order


def _call_chunks(
    pooled: Any,
    model: nn.Module,
    chunks: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],
    maskless: bool,
    pass_mask: bool,
) -> list[torch.Tensor]:
    """One model call per chunk ``(ids, mask, lengths)``: each chunk's rewards ``[n]``."""
    rewards = []
    for chunk_ids, chunk_mask, chunk_len in chunks:
        if not maskless and (pass_mask or bool((chunk_len != chunk_ids.shape[-1]).any())):
            out = pooled(input_ids=chunk_ids, attention_mask=chunk_mask.long())
        else:
            out = pooled(input_ids=chunk_ids)
        rewards.append(check_reward_shape(model, extract_reward(out), chunk_ids.shape[0]))
    return rewards


def scores_without_mask(model: nn.Module) -> bool:
    """Whether rows padded on the right can be scored without an attention mask.

    True for a causal model: every attention module says ``is_causal=True`` (the flag
    transformers' own kernels read when no mask is given; ``False`` in encoders such as BERT or
    ModernBERT and in bidirectional variants). A real token then attends only to the real tokens
    before it, at the same positions: its hidden state, and the reward pooled at the last one,
    are those of the masked call, while attention runs on the causal kernel instead of a
    materialised mask (figures: ``benchmarks/RESULTS.rst``). Models whose forward logs a
    padding warning when called without a mask (GPT-2) keep the mask, and so does a model
    without the flag (a custom module).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> [scores_without_mask(toy_reward_model(arch)) for arch in ("llama", "gpt2", "bert")]
        [True, False, False]
    """
    causal = None
    for module in model.modules():
        flag = module.__dict__.get("is_causal")
        if flag is not None:
            if flag is not True:
                return False
            causal = True
        if _warns_without_mask(type(module)):
            return False
    return bool(causal)


_WARNS: dict[type, bool] = {}  # module class -> its forward warns when no mask is given


def _warns_without_mask(cls: type) -> bool:
    warns = _WARNS.get(cls)
    if warns is None:
        forward = getattr(cls, "forward", None)
        code = getattr(inspect.unwrap(forward) if forward is not None else None, "__code__", None)
        warns = _WARNS[cls] = (
            code is not None and "warn_if_padding_and_no_attention_mask" in code.co_names
        )
    return warns


def _all_finite(reward: torch.Tensor, nonfinite: str) -> torch.Tensor | None:
    """A 0-d bool tensor: every reward is finite (``None`` with ``nonfinite="ignore"``)."""
    if nonfinite == "ignore":
        return None
    reward = reward.detach()
    if reward.is_floating_point() or reward.is_complex():
        # x - x is 0 for a finite x and NaN for NaN or an infinity: two ops where isfinite,
        # composite on floats, takes four
        return (reward - reward == 0).all()
    return reward.isfinite().all()


def _read_flags(
    reward: torch.Tensor,
    clash: torch.Tensor | None,
    packed: PackedInput,
    nonfinite: str,
    invalid: torch.Tensor | None,
) -> tuple[bool, bool, bool, bool]:
    """``(some row is empty, some reward is not finite, some row ends with the fill, the input
    check failed)``.

    Every flag is computed on the device and read back in one transfer. Two are read as their
    opposite, which takes one tensor op fewer: no row is empty, every reward is finite.
    """
    names: list[str] = []
    flags: list[torch.Tensor] = []
    if invalid is not None:
        names.append("invalid")
        flags.append(invalid.to(reward.device))
    if packed.empty_hint is not None and packed.lengths.numel():
        names.append("no empty row")
        flags.append(packed.lengths.all().to(reward.device))  # a length 0 is an empty row
    if clash is not None:
        names.append("clash")
        flags.append(clash)
    finite = _all_finite(reward, nonfinite)
    if finite is not None:
        names.append("finite")
        flags.append(finite)
    if not flags:
        return False, False, False, False
    values = dict(zip(names, torch.stack(flags).tolist()))
    return (
        not values.get("no empty row", True),
        not values.get("finite", True),
        values.get("clash", False),
        values.get("invalid", False),
    )
