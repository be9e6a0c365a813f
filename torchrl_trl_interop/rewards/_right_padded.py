"""The common reward batch on CPU, scored as it is: dense rows, right-padded with the pad id.

An HF tokenizer padding on the right, and a TorchRL batch padded with the model's pad id, hand
the reward model rows that are already what it must see: each row's real tokens first, the
model's pad id after them, a mask of ones then zeros. :func:`score_right_padded` checks that
before the model runs, in three small tensor ops and two reads (on CPU a read costs what an
op does): ``ids != pad`` equals the mask (the padding holds the pad id, no real token is one, the
mask holds 0 and 1), and one float matmul of the mask gives each row's length and tells ones
then zeros. An id outside the vocabulary is left to the embedding, which raises on CPU; the
general path then names it. The model is called on the tokens as they are: no copy, packing,
fill or clamp.

Anything else returns ``None``, and the general path (``_inputs``, then ``_scoring``) scores the
batch and raises its errors: left padding, padding that holds another id, a row holding the pad
id, an id outside the vocabulary, an empty row, a mask value other than 0 and 1, ragged, nested
or lazily stacked input, micro-batches, a model off the CPU (a read before the model would wait
for the device). Both paths give the same rewards and errors
(``test/rewards/test_right_padded.py``).

Why a second path: on the smallest toy Llama (16 rows of 64-128 tokens, a 3.5 ms forward) the
general path's ~26 small tensor ops cost about 10% of the model's time, each op 10-40 us right
after the model's forward (2-5 us warm); this path costs about 4-5% (``benchmarks/RESULTS.rst``).
Its ops are those the model's own pooling has just run (``!=``, a float matmul): the cheapest.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey
from torch import nn

from ._pooling import check_reward_shape, extract_reward

__all__ = ["input_embedding", "score_right_padded"]

_WIDEST = 4096  # positions summed in float32 stay exact integers (below 2 ** 24)


def input_embedding(model: nn.Module) -> nn.Embedding | None:
    """``model``'s input embedding if it is an :class:`~torch.nn.Embedding`, which raises an
    ``IndexError`` on CPU for an id outside ``[0, num_embeddings)`` (the vocabulary
    ``_pooling.check_model_input`` checks against), else ``None``: then only the general path
    scores the model's input.

    ``transformers``' ``resize_token_embeddings`` keeps the module (it swaps its weight), so a
    caller may hold on to it; its weight says where the model runs.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> input_embedding(toy_reward_model("llama"))
        Embedding(384, 32, padding_idx=0)
    """
    try:
        embedding = model.get_input_embeddings()
    except Exception:  # no such method, or a model that does not say
        return None
    return embedding if isinstance(embedding, nn.Embedding) else None


@functools.lru_cache(maxsize=64)
def _moments(width: int) -> torch.Tensor:
    """``[width, 2]`` float32: a row of 0/1 times it is ``(sum m_j, sum j * m_j)``."""
    with torch.inference_mode(False):  # cached: a normal tensor, whatever mode built it
        return torch.stack([torch.ones(width), torch.arange(width, dtype=torch.float32)], 1)


def score_right_padded(
    model: nn.Module,
    embedding: nn.Embedding,
    config: Any,
    tensordict: Any,
    token_key: NestedKey,
    mask_key: NestedKey,
    *,
    max_batch_size: int | None,
    maskless: bool,
    nonfinite: str,
) -> tuple[torch.Tensor, tuple[int, ...], None, bool] | None:
    """Scores ``tensordict``'s dense right-padded CPU rows: ``(rewards [N], batch shape, None,
    some reward not finite)``, or ``None`` for any other input (the general path's).

    ``embedding`` is :func:`input_embedding` of the model (not ``None``), ``config`` the one the
    model pools with (``_pooling.text_config``), ``maskless``
    :func:`._scoring.scores_without_mask` of the model (a causal model is called without the
    mask, as the general path calls it).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> model = toy_reward_model("llama")
        >>> td = TensorDict({"ids": torch.tensor([[5, 6, 7], [8, 9, 0]]),
        ...                  "mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}, batch_size=[2])
        >>> with torch.no_grad():
        ...     reward, shape, _, bad = score_right_padded(
        ...         model, input_embedding(model), model.config, td, "ids", "mask",
        ...         max_batch_size=None, maskless=True, nonfinite="raise")
        >>> reward.shape, shape, bad
        (torch.Size([2]), (2,), False)
        >>> td["mask"] = torch.tensor([[1, 1, 1], [0, 1, 1]])  # left padding: the general path's
        >>> score_right_padded(model, input_embedding(model), model.config, td, "ids", "mask",
        ...                    max_batch_size=None, maskless=True, nonfinite="raise") is None
        True
    """
    if type(tensordict) is not TensorDict or not embedding.weight.is_cpu:
        return None  # a model off the CPU: reading the rows first would wait for the device
    ids, mask = tensordict.get(token_key, None), tensordict.get(mask_key, None)
    if type(ids) is not torch.Tensor or type(mask) is not torch.Tensor:
        return None
    shape = ids.shape
    if (
        ids.dtype is not torch.int64
        or shape != mask.shape
        or ids.is_nested
        or not (ids.is_cpu and mask.is_cpu)
    ):
        return None
    width = shape[-1] if shape else 0
    rows = ids.numel() // width if 0 < width <= _WIDEST else 0
    pad = getattr(config, "pad_token_id", None)
    positions = getattr(config, "max_position_embeddings", None)
    if (
        not rows
        or type(pad) is not int
        or (max_batch_size is not None and rows > max_batch_size)
        or (isinstance(positions, int) and width > positions)
    ):
        return None

    # the ops the model's own pooling just ran (!=, float matmul): cheap right after it
    if not torch.equal(ids != pad, mask):  # the padding holds the pad id, no real token is one,
        return None  # and the mask is 0 and 1 (any other value: the general path reads it)
    if len(shape) != 2:
        ids, mask = ids.reshape(rows, width), mask.reshape(rows, width)
    for length, position_sum in mask.float().mm(_moments(width)).tolist():
        # ones then zeros: the one 0/1 row of this length whose positions sum the least
        if length < 1 or 2 * position_sum != length * (length - 1):
            return None

    try:
        out = model(input_ids=ids) if maskless else model(input_ids=ids, attention_mask=mask.long())
    except IndexError:  # an id outside the vocabulary: the general path clamps it and names it
        return None
    reward = check_reward_shape(model, extract_reward(out), rows)
    bad = False
    if nonfinite != "ignore":
        if reward.is_floating_point():
            bad = not all(map(math.isfinite, reward.tolist()))
        else:
            bad = not bool(reward.isfinite().all())
    return reward, tuple(shape[:-1]), None, bad
