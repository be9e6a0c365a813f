"""How a reward comes out of an HF model: the pooled token, the output's reward tensor, its shape.

``*ForSequenceClassification`` decoders (Llama, Qwen, GPT2, ...) pool the rightmost token whose
id is not ``config.pad_token_id``; the attention mask plays no part (see the project BRIEF).
:func:`choose_fill` picks the padding value that makes that token every row's last real one;
:func:`pooling_model` gives the module to call with it, never changing the user's model.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "RewardOutputError",
    "RewardShapeError",
    "check_model_input",
    "guard_model_input",
    "check_reward_shape",
    "choose_fill",
    "extract_reward",
    "optimistic_pad_id",
    "pooling_model",
    "text_config",
]


class RewardShapeError(ValueError, RuntimeError):
    """The reward model returned a tensor that is not one scalar per row.

    Subclasses both :class:`ValueError` (a bad shape is a bad value) and :class:`RuntimeError`
    (what upstream ``HFRewardModelWrapper`` raises), so either ``except`` clause catches it.
    """


class RewardOutputError(TypeError, RuntimeError):
    """The reward model returned an object the wrapper cannot read a reward tensor from.

    Subclasses both :class:`TypeError` (a wrong type) and :class:`RuntimeError` (what upstream
    ``HFRewardModelWrapper`` raises).
    """


def extract_reward(out: Any) -> torch.Tensor:
    """Reads the reward tensor from ``logits``, ``rewards``, a mapping, a tuple or a tensor.

    Examples:
        >>> import torch
        >>> extract_reward({"logits": torch.ones(2, 1)}).shape
        torch.Size([2, 1])
    """
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "rewards"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, Mapping):
        for name in ("logits", "rewards"):
            if isinstance(out.get(name), torch.Tensor):
                return out[name]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise RewardOutputError(
        f"could not extract reward from model output: it is of type {type(out).__name__}. "
        "Expected a tensor, an output with a 'logits' or 'rewards' tensor attribute (or "
        "mapping entry), or a tuple whose first element is the reward tensor."
    )


def check_reward_shape(model: Any, reward: torch.Tensor, n: int) -> torch.Tensor:
    """``reward`` as ``[n]``; raises :class:`RewardShapeError` unless it is ``[n]`` or ``[n, 1]``."""
    if reward.shape == (n, 1):
        return reward.squeeze(-1)
    if reward.shape == (n,):
        return reward
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    hint = (
        f" The model config has num_labels={num_labels}; reward models need num_labels=1."
        if num_labels not in (None, 1)
        else ""
    )
    raise RewardShapeError(
        f"expected one scalar reward per input (one scalar reward per row, shape [{n}] or "
        f"[{n}, 1]), but the model returned shape {list(reward.shape)}.{hint}"
    )


_FROM_MODEL: Any = object()  # the config argument's default: looked up with text_config(model)


def _limits(model: Any, config: Any = _FROM_MODEL) -> tuple[int | None, int | None]:
    """``(vocabulary size, longest sequence)`` of ``model``, ``None`` where unknown.

    ``config`` is ``text_config(model)`` when the caller holds it already (it takes longer to
    look up than the rest of this function).
    """
    vocab = None
    embeddings = getattr(model, "get_input_embeddings", None)
    if callable(embeddings):
        with contextlib.suppress(Exception):
            vocab = int(embeddings().num_embeddings)
    if config is _FROM_MODEL:
        config = text_config(model)
    if vocab is None:
        vocab = getattr(config, "vocab_size", None)
    positions = getattr(config, "max_position_embeddings", None)
    return (
        vocab if isinstance(vocab, int) else None,
        positions if isinstance(positions, int) else None,
    )


def check_model_input(model: Any, ids: torch.Tensor, lengths: torch.Tensor, arg: str) -> None:
    """Raises a :class:`ValueError` naming ``arg`` on input the model would fail on, or score
    silently wrong: token ids outside ``[0, vocabulary size)``, rows longer than the model's
    ``max_position_embeddings``. ``ids [N, T]`` are right-packed rows of ``lengths``.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> check_model_input(toy_reward_model(), torch.tensor([[-1]]), torch.tensor([1]), "ids")
        Traceback (most recent call last):
        ...
        ValueError: ids holds token id -1 (row 0); the reward model's vocabulary has ids 0 to 383. Tokenize with the reward model's own tokenizer.
    """
    if ids.numel() == 0:
        return
    vocab, positions = _limits(model)
    if positions is not None and int(lengths.max()) > positions:
        row = int(lengths.argmax())
        raise ValueError(
            f"{arg} holds a row of {int(lengths.max())} tokens (row {row}, flattened); the "
            f"reward model takes at most {positions} (max_position_embeddings). Truncate or "
            "drop longer rows first."
        )
    if vocab is not None:
        low, high = int(ids.min()), int(ids.max())  # padding is 0: inside the vocabulary
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            row = int(((ids == bad).any(-1)).nonzero()[0])
            raise ValueError(
                f"{arg} holds token id {bad} (row {row}); the reward model's vocabulary has "
                f"ids 0 to {vocab - 1}. Tokenize with the reward model's own tokenizer."
            )


def guard_model_input(
    model: Any, ids: torch.Tensor, lengths: torch.Tensor, arg: str, config: Any = _FROM_MODEL
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`check_model_input` without reading the device: ``ids`` clamped into the model's
    vocabulary (what the model is given, so a bad id cannot crash its embedding) and a 0-d bool
    tensor telling whether an id was outside it (``None`` if the vocabulary is unknown). Read
    the flag with the call's other checks; when it is set, :func:`check_model_input` raises.

    Rows longer than ``max_position_embeddings`` raise here; the lengths are read only when the
    batch is wider than that limit. ``config`` is :func:`text_config` of the model when the
    caller holds it.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> ids, bad = guard_model_input(
        ...     toy_reward_model(), torch.tensor([[5, 400]]), torch.tensor([2]), "ids")
        >>> ids, bool(bad)
        (tensor([[  5, 383]]), True)
    """
    if ids.numel() == 0:
        return ids, None
    vocab, positions = _limits(model, config)
    if positions is not None and ids.shape[-1] > positions:
        check_model_input(model, ids, lengths, arg)
    if vocab is None:
        return ids, None
    clamped = ids.clamp(0, vocab - 1)
    return clamped, (clamped != ids).any()  # an id moved by the clamp was outside


def text_config(model: Any) -> Any:
    """The config whose ``pad_token_id`` the model's pooling reads, or ``None``."""
    config = getattr(model, "config", None)
    if config is None:
        config = getattr(getattr(model, "module", None), "config", None)  # DDP and the like
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # where Generic*ForSequenceClassification reads it
    return config if hasattr(config, "pad_token_id") else None


def choose_fill(config: Any, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int | None]:
    """Returns ``(fill value, pad id to set on the config for the call or None)``.

    ``ids [N, T]`` are right-packed rows of ``lengths``. The model's own pad id is the fill when
    no row ends with it; otherwise (``pad_token_id == eos_token_id``, or no pad id) a spare id
    that no row ends with, so the pooled "rightmost non-pad token" is every row's last real one.
    """
    if config is None:
        return 0, None
    pad = config.pad_token_id
    last = ids[torch.arange(ids.shape[0], device=ids.device), lengths - 1]
    if pad is not None and not bool((last == pad).any()):
        return int(pad), None  # the model's own pad id: nothing to change
    taken = set(last.tolist())
    spare = next(i for i in range(len(taken) + 1) if i not in taken)
    return spare, spare


def optimistic_pad_id(config: Any) -> int | None:
    """The model's own pad id when it can be the fill without reading the rows first, else ``None``.

    It can when it is set and is not an EOS id (rows often end with EOS: the RewardTrainer
    appends it). Whether a row ends with it after all is then checked with the rewards, and
    such a batch is scored again with :func:`choose_fill`'s spare id.

    Examples:
        >>> from types import SimpleNamespace
        >>> optimistic_pad_id(SimpleNamespace(pad_token_id=0, eos_token_id=2))
        0
        >>> optimistic_pad_id(SimpleNamespace(pad_token_id=2, eos_token_id=[1, 2])) is None
        True
    """
    pad = None if config is None else config.pad_token_id  # a config attribute read is slow
    if pad is None:
        return None
    eos = getattr(config, "eos_token_id", None)
    eos_ids = eos if isinstance(eos, (list, tuple)) else [eos]
    return None if pad in eos_ids else int(pad)


_WRAPPED = ("module", "_orig_mod")  # DistributedDataParallel / DataParallel, torch.compile


def _config_owner(model: Any) -> Any:
    """The module holding the config the model pools with (under DDP or ``torch.compile``)."""
    owner = model
    while "config" not in vars(owner):
        inner = next(
            (vars(owner)["_modules"].get(n) for n in _WRAPPED if n in owner._modules), None
        )
        if inner is None:
            return None
        owner = inner
    return owner


@contextlib.contextmanager
def pooling_model(model: Any, config: Any, pad_id: int | None) -> Iterator[Any]:
    """Yields the module to call so that the model pools with ``pad_id`` as its pad token id.

    That is ``model`` itself when ``pad_id`` is ``None`` or already the config's; otherwise a
    shallow copy of the module that owns the config (parameters, buffers and submodules shared),
    holding a copy of the config with ``pad_token_id=pad_id``. Nothing of the user's model or
    config is changed, so one model can be scored from several threads at once. Under DDP or
    ``torch.compile`` the copy is of the inner model, which is then called directly.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> model = toy_reward_model("llama", pad_token_id=None)
        >>> with pooling_model(model, text_config(model), 7) as scorer:
        ...     scorer.config.pad_token_id, model.config.pad_token_id
        (7, None)
    """
    owner = None if config is None or pad_id is None else _config_owner(model)
    if owner is None or config.pad_token_id == pad_id:
        yield model
        return
    top = copy.copy(owner.config)
    if top.get_text_config() is config and config is not owner.config:
        # the pad id lives in a sub-config (text_config of a multimodal model): copy it too
        name = next(k for k, v in vars(owner.config).items() if v is config)
        setattr(top, name, copy.copy(config))
    target = top.get_text_config() if hasattr(top, "get_text_config") else top
    target.pad_token_id = pad_id
    view = copy.copy(owner)
    view.config = top
    yield view
