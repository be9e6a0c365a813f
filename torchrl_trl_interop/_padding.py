"""Padding and unpadding with tensor ops: trim bounds, zero-copy row splits, pad, pack right.

Plain functions over tensors, shared by the dataset's column split
(``_columns``), the collator (``_collate``) and
the reward model's input packing (``_inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = [
    "length_buckets",
    "pack_right",
    "pad_rows",
    "position_mask",
    "split_rows",
    "trim_bounds",
    "trim_row",
    "unbucket",
]


def trim_bounds(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First attended index and one-past-last attended index per row of a ``[B, L]`` mask.

    Rows with no attended token get ``(0, 0)``.

    Examples:
        >>> import torch
        >>> trim_bounds(torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]))
        (tensor([1, 0, 0]), tensor([3, 4, 0]))
    """
    mask = mask.bool()
    length = mask.shape[-1]
    has_any = mask.any(-1)
    first = mask.int().argmax(-1)
    last = length - mask.flip(-1).int().argmax(-1)
    first = torch.where(has_any, first, torch.zeros_like(first))
    last = torch.where(has_any, last, torch.zeros_like(last))
    return first, last


def split_rows(
    value: torch.Tensor,
    bounds: tuple[torch.Tensor, torch.Tensor, torch.Size] | None = None,
) -> list[torch.Tensor]:
    """Splits a ``[B, ...]`` tensor into rows, cut to ``bounds`` when the leading shapes match.

    ``bounds`` is ``(first, last, mask_shape)`` from :func:`trim_bounds` of a ``[B, L]`` mask; a
    tensor whose leading shape is not ``mask_shape`` is split as it is. Trimming copies nothing:
    in the flattened ``[B * L, ...]`` tensor each row's attended span is one contiguous run, so
    one ``split`` into (gap, span) chunks gives every row as a view.

    Examples:
        >>> import torch
        >>> ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
        >>> first, last = trim_bounds(torch.tensor([[0, 1, 1], [1, 1, 1]]))
        >>> split_rows(ids, (first, last, ids.shape))
        [tensor([5, 6]), tensor([7, 8, 9])]
    """
    if bounds is not None:
        first, last, mask_shape = bounds
        if len(mask_shape) == 2 and value.shape[:2] == mask_shape and mask_shape[0] > 0:
            rows, length = mask_shape
            flat = value.contiguous().reshape(rows * length, *value.shape[2:])
            gaps = torch.empty(rows + 1, dtype=torch.long)
            gaps[0] = first[0]
            gaps[1:-1] = (length - last[:-1]) + first[1:]
            gaps[-1] = length - last[-1]
            sizes = torch.stack([gaps[:-1], last - first], 1).reshape(-1).tolist()
            sizes.append(int(gaps[-1]))
            return list(flat.split(sizes)[1::2])
    return list(value.unbind(0))


def trim_row(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cuts one row to the attended span of its 1-d ``mask`` (``value`` as is if shapes differ).

    Examples:
        >>> import torch
        >>> trim_row(torch.tensor([0, 0, 4, 5]), torch.tensor([False, False, True, True]))
        tensor([4, 5])
    """
    if value.shape[: mask.ndim] != mask.shape or mask.ndim != 1:
        return value
    idx = mask.bool().nonzero()
    if idx.numel() == 0:
        return value[:0]
    return value[int(idx[0]) : int(idx[-1]) + 1]


def pad_rows(
    rows: Sequence[torch.Tensor],
    padding_value: float | int | bool,
    *,
    padding_side: str = "right",
    pad_to_multiple_of: int | None = None,
) -> torch.Tensor:
    """Pads 1-d (or ``[L, ...]``) tensors along their first dim into one ``[B, L_max, ...]`` tensor.

    Args:
        rows (sequence of Tensor): the rows, all with the same trailing shape and dtype.
        padding_value (number): the fill value.

    Keyword Args:
        padding_side (str, optional): ``"right"`` or ``"left"``. Defaults to ``"right"``.
        pad_to_multiple_of (int, optional): round ``L_max`` up to a multiple of this.

    Examples:
        >>> import torch
        >>> pad_rows([torch.tensor([1, 2, 3]), torch.tensor([4])], 0, padding_side="left")
        tensor([[1, 2, 3],
                [0, 0, 4]])
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    out = pad_sequence(
        list(rows), batch_first=True, padding_value=padding_value, padding_side=padding_side
    )
    if pad_to_multiple_of:
        length = out.shape[1]
        target = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        if target != length:
            extra = out.new_full((out.shape[0], target - length, *out.shape[2:]), padding_value)
            out = torch.cat([extra, out] if padding_side == "left" else [out, extra], dim=1)
    return out


def position_mask(lengths: torch.Tensor, width: int, padding_side: str = "right") -> torch.Tensor:
    """``[B, width]`` bool mask of the real positions of rows of ``lengths`` once padded.

    Examples:
        >>> import torch
        >>> position_mask(torch.tensor([2, 1]), 3, "left")
        tensor([[False,  True,  True],
                [False, False,  True]])
    """
    positions = torch.arange(width, device=lengths.device)
    if padding_side == "right":
        return positions < lengths[:, None]
    return positions >= (width - lengths)[:, None]


def pack_right(ids: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packs the real tokens of every row at its start, in order: ``(ids [N, T], lengths [N])``.

    This is right padding whatever the input layout: positions are those of the row alone. ``T``
    is the input's width; positions past a row's length hold ``0``. No value is read back to
    the host (a stable sort moves the real tokens first), so nothing waits for the device.

    Examples:
        >>> import torch
        >>> ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0]])
        >>> pack_right(ids, ids != 0)
        (tensor([[5, 6, 0, 0],
                [7, 8, 9, 0]]), tensor([2, 3]))
    """
    lengths = real.sum(-1)
    order = torch.argsort((~real).to(torch.uint8), dim=-1, stable=True)
    packed = ids.gather(-1, order).masked_fill_(~position_mask(lengths, ids.shape[-1]), 0)
    return packed, lengths


def length_buckets(lengths: torch.Tensor, max_batch_size: int | None) -> list[torch.Tensor] | None:
    """Row indices sorted by length (stable) and cut into buckets of at most ``max_batch_size``.

    Each bucket then pads only to its own longest row. ``None`` when one bucket holds every row
    (``max_batch_size`` is ``None`` or at least the number of rows). :func:`unbucket` puts
    per-bucket results back in row order.

    Examples:
        >>> import torch
        >>> length_buckets(torch.tensor([5, 1, 4, 2]), 2)
        [tensor([1, 3]), tensor([2, 0])]
        >>> length_buckets(torch.tensor([5, 1]), None) is None
        True
    """
    if max_batch_size is None or lengths.shape[0] <= max_batch_size:
        return None
    return list(torch.sort(lengths, stable=True).indices.split(max_batch_size))


def unbucket(values: Sequence[torch.Tensor], buckets: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenates per-bucket ``values`` and returns them in the original row order.

    Examples:
        >>> import torch
        >>> buckets = length_buckets(torch.tensor([5, 1, 4, 2]), 2)
        >>> unbucket([torch.tensor([10.0, 30.0]), torch.tensor([20.0, 0.0])], buckets)
        tensor([ 0., 10., 20., 30.])
    """
    index = torch.cat(list(buckets)).to(values[0].device)
    return torch.cat(list(values))[torch.argsort(index)]
