"""A vectorized ``collate_fn``: pads a list of rows to the batch's longest row with tensor ops."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._checks import (
    as_mapping,
    boundary,
    check_bool,
    check_int,
    check_positive_int,
    check_tokenizer,
)
from .._padding import check_padding_side, position_mask

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = ["PaddingCollator"]

# Keys padded the way ``tokenizer.pad`` pads them, with the value it uses.
_TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")
_LABEL_ALIASES = ("label", "label_ids")


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _converts(value: Any) -> bool:
    try:
        _as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def _column_tensors(name: str, values: list) -> list[torch.Tensor]:
    """The rows' values of column ``name`` as tensors; a value that is none names its row."""
    if set(map(type, values)) == {torch.Tensor} or all(
        isinstance(v, torch.Tensor) for v in values
    ):  # the set first: cheaper than the generator
        return values
    try:
        return [_as_tensor(v) for v in values]
    except (TypeError, ValueError, RuntimeError) as err:
        row = next(i for i, v in enumerate(values) if not _converts(v))
        value = values[row]
        raise ValueError(
            f"column {name!r} cannot be made a tensor: row {row} holds {value!r:.80} of type "
            f"{type(value).__name__} ({err}). Columns other than strings and message lists "
            "must hold numbers or (nested) lists of numbers in every row: fill or cast it "
            "first (e.g. dataset.map), or drop it (dataset.remove_columns)."
        ) from err


def _check_whole(name: str, flat: torch.Tensor, lengths: list[int]) -> None:
    """Refuses a token column whose cast to ``int64`` would change a value (e.g. ``1.5`` -> 1)."""
    if not (flat.is_floating_point() or flat.is_complex()):
        return
    changed = ~(torch.isfinite(flat) & (flat == flat.real.trunc()))
    if bool(changed.any()):
        position = int(changed.reshape(len(flat), -1).any(1).nonzero()[0])
        row = int(torch.searchsorted(torch.tensor(lengths).cumsum(0), position, right=True))
        raise ValueError(
            f"column {name!r} holds token ids or mask values, but row {row} holds "
            f"{flat[position].tolist()!r} ({flat.dtype}), which is not a whole number: cast to "
            "int64 it would change. Pass integer token ids (as the tokenizer returns them); "
            "DataCollatorWithPadding refuses float lists too."
        )


class PaddingCollator:
    """Collates rows (dicts) into a padded batch, the way ``DataCollatorWithPadding`` does, vectorized.

    For rows holding ``input_ids`` (and optionally ``attention_mask``, ``token_type_ids``,
    ``special_tokens_mask``, ``label``), the output is exactly what
    ``transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=...)`` returns: ids padded
    with the tokenizer's pad id on its padding side, an ``int64`` attention mask (made from the row
    lengths when absent), ``label``/``label_ids`` renamed ``labels``. It pads with one
    :func:`~torch.nn.utils.rnn.pad_sequence` per column instead of per-row Python work.

    Beyond the HF collator: other ragged tensor columns (e.g. an assistant mask, log-probs) are
    padded too (with ``pad_values[name]``, else ``0``/``False``) instead of raising; strings and
    message lists pass through as Python lists; equal-shape tensors and numbers are stacked.

    Args:
        tokenizer (PreTrainedTokenizerBase, optional): gives the pad id and the padding side (read
            at call time, like the HF collator). Without it, pass ``pad_token_id``.

    Keyword Args:
        pad_token_id (int, optional): overrides the tokenizer's pad id.
        padding_side (str, optional): ``"left"`` or ``"right"``; overrides the tokenizer's.
        pad_to_multiple_of (int, optional): round the padded length up to a multiple of this.
        pad_values (dict, optional): padding value per extra column name.
        return_attention_mask (bool, optional): build ``attention_mask`` from lengths when the rows
            lack it. Defaults to ``True``.

    Token columns (``input_ids``, ``attention_mask``, ``token_type_ids``,
    ``special_tokens_mask``) come out as ``int64``; a float value that is not a whole number
    (``1.5``) raises instead of being truncated.

    Raises:
        ValueError: if no pad id is known, a column is missing from some rows, a column holds a
            value that is not a number (``None``, say; the message names the column and row),
            or a token column holds a value that is not a whole number.

    Examples:
        >>> import torch
        >>> collate = PaddingCollator(pad_token_id=0)
        >>> batch = collate([{"input_ids": torch.tensor([5, 6, 7]), "prompt": "a"},
        ...                  {"input_ids": torch.tensor([8]), "prompt": "b"}])
        >>> batch["input_ids"]
        tensor([[5, 6, 7],
                [8, 0, 0]])
        >>> batch["attention_mask"]
        tensor([[1, 1, 1],
                [1, 0, 0]])
        >>> batch["prompt"]
        ['a', 'b']
    """

    @boundary("PaddingCollator")
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        pad_token_id: int | None = None,
        padding_side: str | None = None,
        pad_to_multiple_of: int | None = None,
        pad_values: Mapping[str, float | int | bool] | None = None,
        return_attention_mask: bool = True,
    ) -> None:
        check_tokenizer(tokenizer, "tokenizer")
        check_int(pad_token_id, "pad_token_id", allow_none=True)
        if tokenizer is None and pad_token_id is None:
            raise ValueError(
                "PaddingCollator needs a pad id: pass tokenizer=... (its pad_token_id is used) or "
                "pad_token_id=..."
            )
        if padding_side is not None:
            check_padding_side(padding_side)
        check_positive_int(pad_to_multiple_of, "pad_to_multiple_of", allow_none=True)
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_values = as_mapping(pad_values, "pad_values", "{column: value}")
        self.return_attention_mask = check_bool(return_attention_mask, "return_attention_mask")

    def _pad_id(self) -> int:
        pad = self.pad_token_id if self.pad_token_id is not None else self.tokenizer.pad_token_id
        if pad is None:
            raise ValueError(
                "the tokenizer has no pad token (pad_token_id is None). Set "
                "tokenizer.pad_token = tokenizer.eos_token, or pass pad_token_id=..."
            )
        return pad

    def _side(self) -> str:
        if self.padding_side is not None:
            return self.padding_side
        return getattr(self.tokenizer, "padding_side", "right") if self.tokenizer else "right"

    def _pad_value(self, name: str) -> float | int | bool:
        if name in self.pad_values:
            return self.pad_values[name]
        if name == "input_ids":
            return self._pad_id()
        if name == "token_type_ids":
            return getattr(self.tokenizer, "pad_token_type_id", 0) if self.tokenizer else 0
        if name == "special_tokens_mask":
            return 1
        return 0

    def _position_mask(self, lengths: list[int], side: str) -> torch.Tensor:
        """``[B, W]`` bool mask of the real positions of rows of these lengths once padded."""
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        return position_mask(lengths, width, side)

    def _check_columns(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """The columns of the rows; raises unless every row has the same."""
        if not rows:
            raise ValueError("PaddingCollator got an empty list of rows.")
        first_keys = rows[0].keys()
        names = list(first_keys)
        for i, row in enumerate(rows):
            if row.keys() != first_keys:
                differing = sorted(set(names) ^ set(row.keys()))
                raise ValueError(
                    f"row {i} has columns {sorted(row.keys())} but row 0 has {sorted(names)} "
                    f"(differing: {differing}). Every row needs the same columns."
                )
        return names

    @boundary("PaddingCollator")
    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        names = self._check_columns(rows)
        side = self._side()
        masks: dict[tuple, torch.Tensor] = {}  # one position mask per (lengths, device)
        out: dict[str, Any] = {}
        input_lengths = None
        for name in names:
            values = [row[name] for row in rows]
            first = values[0]
            out_name = "labels" if name in _LABEL_ALIASES else name
            if isinstance(first, str) or (
                isinstance(first, list) and first and isinstance(first[0], dict)
            ):
                out[out_name] = values  # strings and message lists pass through
                continue
            tensors = _column_tensors(name, values)
            if tensors[0].ndim == 0:
                out[out_name] = torch.stack(tensors)
                continue
            lengths = [t.shape[0] for t in tensors]
            token_like = name in _TOKEN_KEYS
            if not token_like and all(t.shape == tensors[0].shape for t in tensors):
                out[out_name] = torch.stack(tensors)
                continue
            flat = torch.cat(tensors)
            key = (tuple(lengths), flat.device)  # the rows' device: a CUDA buffer's rows stay there
            real = masks.get(key)
            if real is None:
                real = masks[key] = self._position_mask(lengths, side).to(flat.device)
            if token_like:
                _check_whole(name, flat, lengths)
            if name == "attention_mask" and bool(flat.all()):
                padded = real  # every real token attended: the mask is the positions
            else:
                padded = flat.new_full(
                    (len(tensors), real.shape[1], *flat.shape[1:]), self._pad_value(name)
                )
                if flat.ndim > 1:
                    shape = (*real.shape, *([1] * (flat.ndim - 1)))
                    padded.masked_scatter_(real.reshape(shape).expand_as(padded), flat)
                else:
                    padded.masked_scatter_(real, flat)
            if token_like and padded.dtype != torch.long:
                padded = padded.long()
            if name == "input_ids":
                input_lengths = key
            out[out_name] = padded
        if self.return_attention_mask and input_lengths is not None and "attention_mask" not in out:
            out["attention_mask"] = masks[input_lengths].long()
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_token_id={self.pad_token_id}, "
            f"padding_side={self.padding_side}, pad_to_multiple_of={self.pad_to_multiple_of}, "
            f"pad_values={self.pad_values})"
        )
