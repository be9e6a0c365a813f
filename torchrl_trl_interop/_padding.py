"""Padding and unpadding with tensor ops: attended spans, zero-copy row splits, pad, pack right.

Plain functions over tensors, the one place each is written: the dataset's column split
(``data/_columns``), the collator (``data/_collate``), the reward model's input packing and
scoring (``rewards/_inputs``, ``_scoring``, ``_to_trl``), the rollout function's token rows
(``rollouts/_episodes``, ``_trainer_policy``) and the fixtures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = [
    "Spans",
    "check_padding_side",
    "length_buckets",
    "mask_spans",
    "pack_right",
    "pad_rows",
    "position_mask",
    "trim_row",
    "unbucket",
]


def _spans_torch(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    mask = mask.bool()
    length = mask.shape[-1]
    if length == 0:  # no position: every span is empty (argmax refuses an empty dim)
        empty = torch.zeros(mask.shape[:-1], dtype=torch.long, device=mask.device)
        return empty, empty.clone(), False
    has_any = mask.any(-1)
    first = mask.int().argmax(-1)
    last = length - mask.flip(-1).int().argmax(-1)
    first = torch.where(has_any, first, torch.zeros_like(first))
    last = torch.where(has_any, last, torch.zeros_like(last))
    return first, last, False


def _spans_numpy(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """:func:`_spans_torch` of a ``[B, L > 0]`` CPU mask, faster (figures: ``benchmarks/RESULTS.rst``).

    NumPy's ``argmax`` of a boolean row stops at its first ``True``. The span's end is then
    its start plus the row's count of ``True`` when every row's attended positions form one
    run (no row rises from ``False`` to ``True`` twice), as tokenizers and TorchRL's wrappers
    write them; otherwise it is read from the reversed rows.
    """
    real = mask.numpy() if mask.dtype == torch.bool else mask.detach().numpy() != 0
    first = real.argmax(1)  # 0 for a row with no attended token, as wanted
    count = np.count_nonzero(real, axis=1)
    rises = np.count_nonzero(real[:, 1:] > real[:, :-1]) + np.count_nonzero(real[:, 0])
    if rises == np.count_nonzero(count):  # one run per row that has one
        last = first + count
        solid = mask.dtype == torch.bool
    else:
        last = np.where(count > 0, real.shape[1] - real[:, ::-1].argmax(1), 0)
        solid = False
    return torch.from_numpy(first), torch.from_numpy(last), solid


def mask_spans(mask: torch.Tensor) -> Spans:
    """Each row's attended span in a ``[B, L]`` mask, found once to cut every column of a batch.

    Rows with no attended token get the span ``(0, 0)``. See :class:`Spans`.

    Examples:
        >>> import torch
        >>> spans = mask_spans(torch.tensor([[False, True, True], [True, True, True]]))
        >>> spans.first, spans.last, spans.solid
        (tensor([1, 0]), tensor([3, 3]), True)
    """
    if mask.ndim == 2 and mask.device.type == "cpu" and mask.shape[0] > 0 and mask.shape[1] > 0:
        first, last, solid = _spans_numpy(mask)
    else:
        first, last, solid = _spans_torch(mask)
    return Spans(first, last, mask, solid)


@dataclass(eq=False)
class Spans:
    """Each row's attended span ``[first, last)`` in a ``[B, L]`` ``mask`` (:func:`mask_spans`).

    ``solid`` is ``True`` when the mask is boolean and attends every position of every span:
    its own rows, cut to their spans, are then all ``True``.
    """

    first: torch.Tensor
    last: torch.Tensor
    mask: torch.Tensor
    solid: bool = False

    @property
    def shape(self) -> torch.Size:
        """The mask's shape."""
        return self.mask.shape

    @cached_property
    def sizes(self) -> list[int]:
        """Chunk sizes of the flattened ``[B * L]`` mask: gap, span, gap, ..., span, gap."""
        first, last = self.first.cpu().numpy(), self.last.cpu().numpy()
        rows, length = self.shape
        sizes = np.empty(2 * rows + 1, dtype=np.int64)
        sizes[0] = first[0]
        sizes[1:-1:2] = last - first
        sizes[2:-1:2] = length - last[:-1] + first[1:]
        sizes[-1] = length - last[-1]
        return sizes.tolist()

    def split(self, value: torch.Tensor) -> list[torch.Tensor]:
        """Splits a ``[B, ...]`` tensor into rows, each cut to its span when the tensor's leading
        shape is the mask's (otherwise the rows as they are).

        Cutting copies nothing: in the flattened ``[B * L, ...]`` tensor each row's span is one
        contiguous run, so one ``split`` into (gap, span) chunks gives every row as a view. The
        mask's own rows, when ``solid``, are one new ``True`` tensor split into the spans alone
        (half the views: views are most of the cost).

        Examples:
            >>> import torch
            >>> ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
            >>> mask_spans(torch.tensor([[0, 1, 1], [1, 1, 1]])).split(ids)
            [tensor([5, 6]), tensor([7, 8, 9])]
        """
        shape = self.shape
        if len(shape) != 2 or value.shape[:2] != shape or shape[0] == 0:
            return list(value.unbind(0))
        sizes = self.sizes
        if self.solid and value is self.mask:
            lengths = sizes[1::2]
            return list(value.new_ones(sum(lengths)).split(lengths))
        rows, length = shape
        flat = value.contiguous().reshape(rows * length, *value.shape[2:])
        return list(flat.split(sizes)[1::2])


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


def check_padding_side(padding_side: str) -> None:
    """Raises a ``ValueError`` unless ``padding_side`` is ``"left"`` or ``"right"`` (unsigned: a
    ground helper imports nothing of the package).

    Examples:
        >>> check_padding_side("left")
        >>> check_padding_side("up")
        Traceback (most recent call last):
        ...
        ValueError: padding_side must be 'left' or 'right', got 'up'.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")


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
    check_padding_side(padding_side)
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


def position_mask(
    lengths: torch.Tensor | Sequence[int], width: int, padding_side: str = "right"
) -> torch.Tensor:
    """``[B, width]`` bool mask of the real positions of rows of ``lengths`` once padded.

    ``lengths`` is a tensor (the mask is built on its device) or a list of ints (built in NumPy,
    on CPU: cheaper than ``torch.tensor(lengths)`` alone).

    Examples:
        >>> import torch
        >>> position_mask(torch.tensor([2, 1]), 3, "left")
        tensor([[False,  True,  True],
                [False, False,  True]])
        >>> position_mask([2, 1], 3, "right")
        tensor([[ True,  True, False],
                [ True, False, False]])
    """
    if not isinstance(lengths, torch.Tensor):
        column = np.asarray(lengths, dtype=np.int64)[:, None]
        positions_np = np.arange(width)
        real = positions_np < column if padding_side == "right" else positions_np >= width - column
        return torch.from_numpy(real)
    positions = torch.arange(width, device=lengths.device)
    if padding_side == "right":
        return positions < lengths[:, None]
    return positions >= (width - lengths)[:, None]


def pack_right(ids: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packs the real tokens of every row at its start, in order: ``(ids [N, T], lengths [N])``.

    This is right padding whatever the input layout: positions are those of the row alone. ``T``
    is the input's width; positions past a row's length hold ``0``. No value is read back to
    the host, so nothing waits for the device: each real token is scattered to its rank among
    the row's real tokens (a running count), every other position to the row's last column,
    which, unless the row is full, is padding and receives only zeros (no sort: faster than a
    stable argsort).

    Examples:
        >>> import torch
        >>> ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0]])
        >>> pack_right(ids, ids != 0)
        (tensor([[5, 6, 0, 0],
                [7, 8, 9, 0]]), tensor([2, 3]))
    """
    width = ids.shape[-1]
    if width == 0:
        return ids.clone(), real.sum(-1)
    rank = real.cumsum(-1)  # real tokens up to and including each position
    lengths = rank[..., -1]
    target = torch.where(real, rank, width).sub_(1)  # one temporary fewer than rank - 1
    packed = torch.zeros_like(ids).scatter_(-1, target, ids * real)
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
