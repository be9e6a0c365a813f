"""Delta pushes: only the elements that changed since the last push, in the receiver's dtype.

Between two RL steps most weights do not change once cast to the generator's dtype (a bf16
generator rounds away small updates of fp32 master weights). :class:`DeltaEncoder`, on the
sender's side, keeps the last pushed weights as the receivers hold them (in their dtypes, one
copy of the model) and turns each new push into ``{name: (indices, values)}``: the flat
positions whose *bits* differ (NaN and ``-0.0`` included) and their new values. A push is sent
whole instead when it is the first, every ``full_every`` pushes, when a tensor is new, or when
the delta would weigh more than :data:`MAX_DELTA_FRACTION` of the whole push (indices cost
bytes too). :func:`apply_delta` writes a delta into a receiver's tensors. A receiver that holds
the previous push exactly ends bit-exact: the trainer's weights cast to its dtypes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["MAX_DELTA_FRACTION", "Changes", "DeltaEncoder", "apply_delta", "changes_nbytes"]

#: a delta is sent only when its bytes (indices and values) are at most this fraction of a
#: whole push's: past it, a plain copy of every element costs less to send and to apply
MAX_DELTA_FRACTION = 0.5

#: ``{name: (flat indices, new values)}``: what changed in each tensor since the last push
Changes = dict[str, tuple[torch.Tensor, torch.Tensor]]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements as integers of the same width: equal only for equal bits."""
    return tensor.reshape(-1).view(_BITS[tensor.element_size()])


def changes_nbytes(changes: Changes) -> int:
    """The bytes a delta sends (indices and values).

    Examples:
        >>> changes_nbytes({"w": (torch.tensor([1, 5], dtype=torch.int32), torch.ones(2))})
        16
    """
    return sum(
        i.numel() * i.element_size() + v.numel() * v.element_size() for i, v in changes.values()
    )


class DeltaEncoder:
    """The sender's side of delta pushes: the last pushed weights, in the receivers' dtypes.

    Args:
        dtypes (dict): ``{name: dtype}`` of the receivers' tensors.

    Keyword Args:
        full_every (int): a whole push every ``full_every`` pushes (``1``: always whole).

    Attributes:
        version (int or None): the version the receivers hold as :attr:`last` (set by the
            sender once a push is committed; ``None``: the next push is whole).
        last (dict): ``{name: tensor}``, the weights as the receivers hold them (CPU).

    Examples:
        >>> weights = torch.arange(100.0)
        >>> encoder = DeltaEncoder({"w": torch.bfloat16}, full_every=4)
        >>> kind, payload = encoder.encode({"w": (100,)}, [("w", weights)])
        >>> kind, encoder.last["w"].dtype
        ('full', torch.bfloat16)
        >>> encoder.version = 0  # the receivers committed it
        >>> stepped = weights.clone()
        >>> stepped[3] += 1e-4  # rounds away in bf16
        >>> stepped[7] += 1.0
        >>> kind, changes = encoder.encode({"w": (100,)}, [("w", stepped)])
        >>> kind, changes["w"][0].tolist(), changes["w"][1].tolist()
        ('delta', [7], [8.0])
    """

    def __init__(self, dtypes: Mapping[str, torch.dtype], *, full_every: int) -> None:
        self.dtypes = dict(dtypes)
        self.full_every = int(full_every)
        self.last: dict[str, torch.Tensor] = {}
        self.version: int | None = None
        self._since_full = 0

    def encode(
        self, layout: Mapping[str, tuple[int, ...]], stream: Iterable[tuple[str, torch.Tensor]]
    ) -> tuple[str, Any]:
        """Reads ``stream`` (the push's ``(name, tensor)`` pairs, whose names and shapes are
        ``layout``), updates :attr:`last`, and returns ``("delta", changes)`` or ``("full",
        [(name, tensor), ...])`` (the tensors of :attr:`last`, to send whole)."""
        total = sum(_numel(shape) * self.dtypes[n].itemsize for n, shape in layout.items())
        budget = MAX_DELTA_FRACTION * total
        whole = (
            self.version is None
            or self._since_full >= self.full_every - 1
            or any(name not in self.last for name in layout)
        )
        changes: Changes = {}
        size = 0
        with torch.no_grad():
            for name, tensor in stream:
                new = tensor.detach().to(device="cpu", dtype=self.dtypes[name])
                if new.data_ptr() == tensor.data_ptr() or not new.is_contiguous():
                    new = new.clone(memory_format=torch.contiguous_format)  # never the live one
                old = self.last.get(name)
                self.last[name] = new  # what the receivers hold once this push lands
                if old is None:
                    continue
                if not whole:
                    where = (_bits(new) != _bits(old)).nonzero().squeeze(1)
                    if where.numel():
                        values = new.reshape(-1)[where]
                        index = where.to(torch.int32) if old.numel() < 2**31 else where
                        changes[name] = (index, values)
                        size += index.numel() * index.element_size()
                        size += values.numel() * values.element_size()
                        if size > budget:  # too much changed to gain: send it whole
                            whole, changes = True, {}
        if whole:
            self._since_full = 0
            return "full", [(name, self.last[name]) for name in layout]
        self._since_full += 1
        return "delta", changes


def apply_delta(live: Mapping[str, torch.Tensor], changes: Changes) -> None:
    """Writes each tensor's changed elements into ``live`` (a receiver's own tensors), in place.

    Examples:
        >>> live = {"w": torch.zeros(4)}
        >>> apply_delta(live, {"w": (torch.tensor([1, 3], dtype=torch.int32), torch.ones(2))})
        >>> live["w"].tolist()
        [0.0, 1.0, 0.0, 1.0]
    """
    with torch.no_grad():
        for name, (index, values) in changes.items():
            target = live[name]
            index = index.to(device=target.device, dtype=torch.long)
            values = values.to(device=target.device, dtype=target.dtype)
            if target.is_contiguous():
                target.view(-1).index_copy_(0, index, values)
            else:
                flat = target.reshape(-1).clone()
                flat.index_copy_(0, index, values)
                target.copy_(flat.view(target.shape))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
