"""What the reward calls read from a TensorDict: one reader per input mode (see ``_input_mode``).

A reward model (:class:`~torchrl_trl_interop.HFRewardModelWrapper`) reads tokens, text or History
as right-packed token ids: :func:`read_tokens`, :func:`read_texts`, :func:`read_history`. Each
returns :class:`PackedInput`: ``ids [N, T]`` with the real tokens of each row at its start (right
padding whatever the input layout), ``lengths [N]``, the batch shape the rewards take, and the
device they go back to. The mask, not the pad id, decides which tokens are real.

TRL reward functions (:class:`~torchrl_trl_interop.TRLRewardFuncWrapper`) read TRL's prompts and
completions instead: :func:`read_chats` (History) and :func:`read_chat_texts` (text).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, is_non_tensor, set_list_to_stack
from tensordict.utils import NestedKey

from .._conversation import history_to_messages, row_values, split_prompt_completion
from .._keys import flatten_nested, get_entry
from .._padding import pack_right, position_mask

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "PackedInput",
    "empty_rows_error",
    "read_chat_texts",
    "read_chats",
    "read_history",
    "read_texts",
    "read_tokens",
]


@dataclass
class PackedInput:
    """Right-packed rows to score: ``ids [N, T]``, ``lengths [N]``, the batch shape, the device.

    Positions past a row's length hold ``0`` (every reader pads with it), so scoring with the
    fill ``0`` needs no further write.
    """

    ids: torch.Tensor
    lengths: torch.Tensor
    batch_shape: tuple[int, ...]
    device: torch.device | None
    #: set when a row may hold no real token (token input): the argument read and why a row
    #: can be empty. Such rows are looked for with the rewards (:func:`empty_rows_error`), not
    #: before: one host sync per call.
    empty_hint: str | None = None


def empty_rows_error(lengths: torch.Tensor, hint: str) -> ValueError:
    """The error for rows of ``lengths`` 0: a reward model cannot score an empty sequence.

    ``hint`` names the argument read and why a row can be empty; the message opens with the
    public call being made (:func:`~torchrl_trl_interop._checks.boundary`).

    Examples:
        >>> print(empty_rows_error(torch.tensor([2, 0]), "token_key='ids' (a row holds no token)"))
        token_key='ids' (a row holds no token): row(s) [1] (flattened index) have no real token. A reward model cannot score an empty sequence; drop these rows first.
    """
    empty = (lengths == 0).nonzero().flatten()[:8].tolist()
    return ValueError(
        f"{hint}: row(s) {empty} (flattened index) have no real token. A reward model cannot "
        "score an empty sequence; drop these rows first."
    )


def _non_tensor_value(value: Any) -> Any:
    """The Python value of a non-tensor entry.

    A ``NonTensorData`` holding a list (``td.set_non_tensor(key, [row, row, ...])``) is that list,
    one item per row; ``tolist()`` would repeat the whole list for every row of the batch.
    """
    data = getattr(value, "data", None)
    if not isinstance(value, TensorDictBase) and isinstance(data, (list, tuple)):
        return data
    return value.tolist()


def _nested_rows(
    value: Any, what: str, leaf: Callable[[Any, str], tuple[list, tuple[int, ...]]], ragged: str
) -> tuple[list, tuple[int, ...]]:
    """``(rows, batch shape)`` of ``value``: what ``leaf`` reads of it, or of each item of nested
    lists (a non-tensor entry read as its list), every item of a list of one batch shape, else
    a ``ValueError`` saying ``ragged`` (``{inner}``: the first item's shape; ``{shape}``, ``{i}``:
    the other one's and its index)."""
    while is_non_tensor(value):
        value = _non_tensor_value(value)
    if not isinstance(value, (list, tuple)):
        return leaf(value, what)
    if not value:
        return [], (0,)
    parts = [_nested_rows(v, what, leaf, ragged) for v in value]
    inner = parts[0][1]
    for i, (_, shape) in enumerate(parts):
        if shape != inner:
            raise ValueError(f"{what} " + ragged.format(inner=inner, shape=shape, i=i))
    return [row for rows, _ in parts for row in rows], (len(value), *inner)


def _tensor_rows(value: Any, what: str) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """A tensor's 1-D rows and its leading (batch) shape (a nested tensor's rows as a list)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return _flatten_rows(list(value.unbind(0)), what)
        if value.ndim == 0:
            raise ValueError(
                f"{what} is a 0-d tensor; expected a sequence dimension last, e.g. shape [L], "
                "[B, L] or [E, G, L]."
            )
        if value.ndim == 1:
            return [value], ()
        shape = tuple(value.shape[:-1])
        return list(value.reshape(-1, value.shape[-1]).unbind(0)), shape
    raise TypeError(
        f"{what} is a {type(value).__name__}; expected a tensor, a nested tensor, a lazy "
        "stack of tensors or a list of 1-D tensors."
    )


def _flatten_rows(value: Any, what: str) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """Flattens a (nested) list of tensors into 1-D rows and the leading (batch) shape."""
    ragged = (
        "has rows with different batch shapes ({inner} at index 0, {shape} at index {i}); only "
        "the last (sequence) dimension may be ragged."
    )
    return _nested_rows(value, what, _tensor_rows, ragged)


def _read_padded(
    value: Any, what: str
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """Returns ``(values [N, L], lengths [N] or None if every row has length L, batch shape)``."""
    if isinstance(value, torch.Tensor) and not value.is_nested:
        if value.ndim == 0:
            _flatten_rows(value, what)  # raises with the message
        shape = tuple(value.shape[:-1])
        # the row count spelled out: rows of width 0 (every row empty) reshape too
        return value.reshape(math.prod(shape), value.shape[-1]), None, shape
    rows, shape = _flatten_rows(value, what)
    if not rows:
        return torch.zeros(0, 0, dtype=torch.long), None, shape
    lengths = torch.tensor([row.shape[0] for row in rows], device=rows[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    return padded, lengths, shape


def _text(value: Any, what: str) -> tuple[list[str], tuple[int, ...]]:
    if isinstance(value, str):
        return [value], ()
    raise TypeError(
        f"{what} holds a {type(value).__name__}; expected strings (a str, a NonTensorStack of "
        "str or nested lists of str)."
    )


def _read_texts(value: Any, what: str) -> tuple[list[str], tuple[int, ...]]:
    return _nested_rows(value, what, _text, "is ragged above the string level.")


def _value_device(value: Any) -> torch.device | None:
    """The device of a token entry (tensor, or first tensor of a nested list), if any."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value.device if isinstance(value, torch.Tensor) else None


def _check_mask(
    token_key: NestedKey,
    mask_key: NestedKey,
    ids: torch.Tensor,
    tok_lengths: torch.Tensor | None,
    batch_shape: tuple[int, ...],
    mask: torch.Tensor,
    mask_lengths: torch.Tensor | None,
    mask_shape: tuple[int, ...],
) -> None:
    if mask_shape == batch_shape and (tok_lengths is not None or mask_lengths is not None):
        # ragged rows: compare row by row (padded widths may differ)
        full = torch.full((ids.shape[0],), ids.shape[-1], device=ids.device)
        t_len = tok_lengths if tok_lengths is not None else full
        m_len = mask_lengths.to(ids.device) if mask_lengths is not None else full
        bad = (t_len != m_len).nonzero().flatten()
        if bad.numel():
            row = int(bad[0])
            raise ValueError(
                f"the mask at {mask_key!r} does not match the tokens at {token_key!r}: row "
                f"{row} (flattened) has {int(t_len[row])} tokens but a mask of length "
                f"{int(m_len[row])}."
            )
    elif mask_shape != batch_shape or mask.shape != ids.shape:
        raise ValueError(
            f"the mask at {mask_key!r} (shape {[*mask_shape, mask.shape[-1]]}) does not match "
            f"the tokens at {token_key!r} (shape {[*batch_shape, ids.shape[-1]]}). The mask "
            "needs one entry per token."
        )


def read_tokens(
    td: TensorDictBase, token_key: NestedKey, mask_key: NestedKey | None
) -> PackedInput:
    """``input_mode="tokens"``: token ids (and the mask deciding which are real) ->
    :class:`PackedInput`.

    Dense, lazily stacked (ragged), nested-list and jagged input are read; every row must keep
    at least one real token (checked with the rewards: see :func:`empty_rows_error`; rows of
    length 0 are rows without a real token). Nothing is read back from the device here.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...                  "mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}, batch_size=[2])
        >>> packed = read_tokens(td, "ids", "mask")
        >>> packed.ids, packed.lengths
        (tensor([[5, 6, 0],
                [7, 8, 9]]), tensor([2, 3]))
    """
    # _keys imports nothing of the package: it is handed the public call's name
    value = get_entry(td, token_key, "token_key")
    ids, tok_lengths, batch_shape = _read_padded(value, f"token_key={token_key!r}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(
            f"token_key={token_key!r} holds {ids.dtype} values; expected integer token ids."
        )
    real = None if tok_lengths is None else position_mask(tok_lengths, ids.shape[-1])
    if mask_key is not None:
        mask_value = get_entry(td, mask_key, "attention_mask_key")
        mask, mask_lengths, mask_shape = _read_padded(
            mask_value, f"attention_mask_key={mask_key!r}"
        )
        _check_mask(
            token_key, mask_key, ids, tok_lengths, batch_shape, mask, mask_lengths, mask_shape
        )
        attended = (mask if mask.dtype == torch.bool else mask != 0).to(ids.device)
        real = attended if real is None else real & attended
    if real is None:
        real = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    ids, lengths = pack_right(ids.long(), real)
    reason = "a row of length 0"
    if mask_key is not None:
        reason += f", or whose mask at attention_mask_key={mask_key!r} is all zero"
    hint = f"token_key={token_key!r} ({reason})"
    return PackedInput(ids, lengths, batch_shape, td.device or _value_device(value), hint)


def _pack(token_lists: Sequence[Sequence[int]], what: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.as_tensor(list(ids), dtype=torch.long) for ids in token_lists]
    if not rows:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    sizes = [row.numel() for row in rows]
    lengths = torch.tensor(sizes)
    if 0 in sizes:
        empty = [i for i, size in enumerate(sizes) if size == 0][:8]
        raise ValueError(
            f"{what}: row(s) {empty} (flattened index) tokenize to no token at all; a reward "
            "model cannot score an empty sequence. Drop these rows first."
        )
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    return ids, lengths


def read_texts(
    td: TensorDictBase, text_key: NestedKey, tokenizer: PreTrainedTokenizerBase, append_eos: bool
) -> PackedInput:
    """``input_mode="text"``: strings, formatted as ``trl.RewardTrainer`` formats standard text
    -> :class:`PackedInput`.

    With ``append_eos``, the tokenizer's EOS is appended to texts that do not end with it.
    """
    value = get_entry(td, text_key, "text_key")
    texts, batch_shape = _read_texts(value, f"text_key={text_key!r}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(
                f"text_key={text_key!r} row {i} is a {type(text).__name__}; expected a str."
            )
    eos = tokenizer.eos_token
    if append_eos:
        texts = [text if text.endswith(eos) else text + eos for text in texts]
    token_lists = tokenizer(texts)["input_ids"] if texts else []
    return PackedInput(*_pack(token_lists, f"text_key={text_key!r}"), batch_shape, td.device)


def read_history(
    td: TensorDictBase,
    history_key: NestedKey,
    tokenizer: PreTrainedTokenizerBase,
    chat_template_kwargs: dict[str, Any],
) -> PackedInput:
    """``input_mode="history"``: a History rendered with the chat template, as
    ``trl.RewardTrainer`` renders conversations -> :class:`PackedInput`."""
    from torchrl.data.llm import History

    with set_list_to_stack(True):  # scoped: reading a ragged History needs the mode
        history = get_entry(td, history_key, "history_key")
        messages = history_to_messages(history) if isinstance(history, History) else None
    if not isinstance(history, History):
        raise TypeError(
            f"history_key={history_key!r} holds a {type(history).__name__}; expected a "
            "torchrl.data.llm.History."
        )
    batch_shape = tuple(history.batch_size[:-1])
    conversations = flatten_nested(messages, len(batch_shape))
    # as trl.data_utils._tokenize renders conversational RewardTrainer data, every conversation
    # in one call (one template render pass, one batched tokenizer call)
    token_lists = (
        tokenizer.apply_chat_template(
            conversations, tokenize=True, return_dict=True, **chat_template_kwargs
        )["input_ids"]
        if conversations
        else []
    )
    packed = _pack(token_lists, f"history_key={history_key!r}")
    return PackedInput(*packed, batch_shape, td.device)


# -- TRL reward functions: prompts and completions ----------------------------------------------


def read_chats(
    td: TensorDictBase, history_key: NestedKey, completion_roles: tuple[str, ...]
) -> tuple[list, list]:
    """``input_mode="history"``: each conversation split into TRL's prompt and completion
    (message lists; the completion is the trailing ``completion_roles`` turns), row-major."""
    prompts, completions = [], []
    for i, conversation in enumerate(row_values(td, history_key, "history_key")):
        try:
            prompt, completion = split_prompt_completion(
                conversation, completion_roles=completion_roles
            )
        except ValueError as err:
            raise ValueError(f"rollout {i} (flattened): {err}") from err
        prompts.append(prompt)
        completions.append(completion)
    return prompts, completions


def read_chat_texts(
    td: TensorDictBase, prompt_key: NestedKey, completion_key: NestedKey
) -> tuple[list, list]:
    """``input_mode="text"``: prompt and completion strings, TRL's standard format, row-major.

    Examples:
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"text": {"prompt": ["2+2="], "response": ["4"]}}, batch_size=[1])
        >>> read_chat_texts(td, ("text", "prompt"), ("text", "response"))
        (['2+2='], ['4'])
    """
    prompts = row_values(td, prompt_key, "prompt_key")
    return prompts, row_values(td, completion_key, "completion_key")
