"""Hugging Face reward models as TensorDict modules: :class:`HFRewardModelWrapper`.

The wrapper is a drop-in replacement for ``torchrl.modules.llm.trl_interop.HFRewardModelWrapper``
(same name, constructor arguments, defaults, ``.model`` property and exception types) that fixes
what upstream gets wrong:

* **Padding-independent scores.** ``*ForSequenceClassification`` decoders (Llama, Qwen, GPT2, ...)
  pool the rightmost token whose id is not ``config.pad_token_id``; the attention mask plays no
  part. Upstream trusts that choice, so rows padded with another value are scored on a pad
  position, a trailing EOS equal to the pad id is skipped, and GPT2 (absolute positions) scores
  left-padded rows at shifted positions. Here the *mask* decides which tokens are real: every row
  is re-packed to the right, so positions are those of the row alone, and the pooled token is the
  last real one.
* **Ragged input.** TorchRL's LLM wrappers write ragged lazy stacks by default; upstream's plain
  ``td.get`` crashes on them. Lazy stacks, nested lists and jagged nested tensors are read here.
* **Batch shapes** ``[]`` and ``[E, G]`` (environments x group) work; upstream fails on both.
* **Never an inference tensor.** Upstream returns an inference tensor when its caller is inside
  :func:`torch.inference_mode`, which breaks any later backward pass that uses the reward.
* **Micro-batches bucketed by length** (``max_batch_size=``) bound peak memory and skip most of the
  padding; **text and History input** are tokenized with the reward model's own tokenizer.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, is_non_tensor, set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn

from ._utils import format_keys, normalize_key
from .conversation import history_to_messages

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = ["HFRewardModelWrapper", "RewardOutputError", "RewardShapeError"]

_DEFAULT_TOKEN_KEY = ("tokens", "full")
_DEFAULT_MASK_KEY = ("masks", "all_attention_mask")
_NONFINITE_MODES = ("raise", "warn", "ignore")


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


class _RewardModelHolder(nn.Module):
    """Holds the model as ``_reward_module.model``: same ``state_dict`` keys as upstream."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


# ---------------------------------------------------------------------------------------------
# Reading rows out of a TensorDict
# ---------------------------------------------------------------------------------------------


def _present_keys(tensordict: TensorDictBase) -> list:
    return list(tensordict.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf))


def _is_leaf(cls: type) -> bool:
    # tensors, non-tensor data (text) and tensorclasses (History) are leaves; sub-tensordicts not
    return not issubclass(cls, TensorDictBase) or bool(getattr(cls, "_is_non_tensor", False))


def _get_entry(tensordict: TensorDictBase, key: NestedKey, arg_name: str) -> Any:
    """Returns the entry at ``key``, as a list of rows when it is a ragged lazy stack."""
    if key not in tensordict.keys(include_nested=True):
        raise KeyError(
            f"HFRewardModelWrapper: {arg_name}={key!r} not found in the input tensordict "
            f"(found {format_keys(_present_keys(tensordict))}). Pass {arg_name}=... naming the "
            "entry that holds it."
        )
    try:
        return tensordict.get(key)
    except RuntimeError:
        # a ragged lazy stack cannot be stacked into one tensor: read it row by row
        return tensordict.get(key, as_list=True)


def _non_tensor_value(value: Any) -> Any:
    """The Python value of a non-tensor entry.

    A ``NonTensorData`` holding a list (``td.set_non_tensor(key, [row, row, ...])``) is that list,
    one item per row; ``tolist()`` would repeat the whole list for every row of the batch.
    """
    data = getattr(value, "data", None)
    if not isinstance(value, TensorDictBase) and isinstance(data, (list, tuple)):
        return data
    return value.tolist()


def _flatten_rows(value: Any, what: str) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """Flattens a (nested) list of tensors into 1-D rows and the leading (batch) shape."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return _flatten_rows(list(value.unbind(0)), what)
        if value.ndim == 0:
            raise ValueError(
                f"HFRewardModelWrapper: {what} is a 0-d tensor; expected a sequence dimension "
                "last, e.g. shape [L], [B, L] or [E, G, L]."
            )
        if value.ndim == 1:
            return [value], ()
        shape = tuple(value.shape[:-1])
        return list(value.reshape(-1, value.shape[-1]).unbind(0)), shape
    if is_non_tensor(value):
        return _flatten_rows(_non_tensor_value(value), what)
    if isinstance(value, (list, tuple)):
        if not value:
            return [], (0,)
        parts = [_flatten_rows(v, what) for v in value]
        inner = parts[0][1]
        for i, (_, shape) in enumerate(parts):
            if shape != inner:
                raise ValueError(
                    f"HFRewardModelWrapper: {what} has rows with different batch shapes "
                    f"({inner} at index 0, {shape} at index {i}); only the last (sequence) "
                    "dimension may be ragged."
                )
        return [row for rows, _ in parts for row in rows], (len(value), *inner)
    raise TypeError(
        f"HFRewardModelWrapper: {what} is a {type(value).__name__}; expected a tensor, a nested "
        "tensor, a lazy stack of tensors or a list of 1-D tensors."
    )


def _read_padded(
    value: Any, what: str
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """Returns ``(values [N, L], lengths [N] or None if every row has length L, batch shape)``."""
    if isinstance(value, torch.Tensor) and not value.is_nested:
        if value.ndim == 0:
            _flatten_rows(value, what)  # raises with the message
        return value.reshape(-1, value.shape[-1]), None, tuple(value.shape[:-1])
    rows, shape = _flatten_rows(value, what)
    if not rows:
        return torch.zeros(0, 0, dtype=torch.long), None, shape
    lengths = torch.tensor([row.shape[0] for row in rows], device=rows[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    return padded, lengths, shape


def _read_texts(value: Any, what: str) -> tuple[list[str], tuple[int, ...]]:
    if isinstance(value, str):
        return [value], ()
    if is_non_tensor(value):
        return _read_texts(_non_tensor_value(value), what)
    if isinstance(value, (list, tuple)):
        if not value:
            return [], (0,)
        parts = [_read_texts(v, what) for v in value]
        inner = parts[0][1]
        if any(shape != inner for _, shape in parts):
            raise ValueError(f"HFRewardModelWrapper: {what} is ragged above the string level.")
        return [t for texts, _ in parts for t in texts], (len(value), *inner)
    raise TypeError(
        f"HFRewardModelWrapper: {what} holds a {type(value).__name__}; expected strings (a str, "
        "a NonTensorStack of str or nested lists of str)."
    )


def _flatten_conversations(messages: Any, depth: int) -> list[list[dict[str, str]]]:
    if depth == 0:
        return [messages]
    return [conv for sub in messages for conv in _flatten_conversations(sub, depth - 1)]


def _compact_right(ids: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packs the real tokens of every row at its start, in order: ``(ids [N, T], lengths [N])``.

    This is right padding whatever the input layout: positions are those of the row alone. ``T``
    is the longest row; positions past a row's length hold ``0`` (replaced by the pad value at
    scoring time). Input that is already right-padded is only sliced.
    """
    lengths = real.sum(-1)
    width = int(lengths.max()) if lengths.numel() else 0
    arange = torch.arange(ids.shape[-1], device=ids.device)
    prefix = arange < lengths[:, None]
    if torch.equal(real, prefix):
        return ids[:, :width], lengths
    out = ids.new_zeros(ids.shape[0], width)
    rows, cols = real.nonzero(as_tuple=True)
    out[rows, real.cumsum(-1)[rows, cols] - 1] = ids[rows, cols]
    return out, lengths


# ---------------------------------------------------------------------------------------------
# Model output and pad-token pooling
# ---------------------------------------------------------------------------------------------


def _extract_reward(out: Any) -> torch.Tensor:
    """Reads the reward tensor from ``logits``, ``rewards``, a mapping, a tuple or a tensor."""
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
        "HFRewardModelWrapper: could not read a reward from the model output of type "
        f"{type(out).__name__}. Expected a tensor, an output with a 'logits' or 'rewards' tensor "
        "attribute (or mapping entry), or a tuple whose first element is the reward tensor."
    )


def _text_config(model: Any) -> Any:
    """The config whose ``pad_token_id`` the model's pooling reads, or ``None``."""
    config = getattr(model, "config", None)
    if config is None:
        config = getattr(getattr(model, "module", None), "config", None)  # DDP and the like
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # where Generic*ForSequenceClassification reads it
    return config if hasattr(config, "pad_token_id") else None


@contextlib.contextmanager
def _pooling_pad_id(config: Any, pad_id: int | None) -> Iterator[None]:
    """Sets ``config.pad_token_id`` to ``pad_id`` for the duration of the block."""
    if config is None or pad_id is None or config.pad_token_id == pad_id:
        yield
        return
    old = config.pad_token_id
    config.pad_token_id = pad_id
    try:
        yield
    finally:
        config.pad_token_id = old


# ---------------------------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------------------------


class HFRewardModelWrapper(TensorDictModuleBase):
    """A :class:`~tensordict.nn.TensorDictModuleBase` that scores TensorDicts with an HF reward model.

    Reads tokens and attention mask (or text, or a :class:`~torchrl.data.llm.History`) from the
    input tensordict, calls the reward model, and writes one ``float32`` reward per row to
    ``reward_key`` in the same tensordict. Drop-in for upstream
    ``torchrl.modules.llm.trl_interop.HFRewardModelWrapper`` (same arguments and defaults), with
    these differences, all deliberate:

    * **The mask decides which tokens are real, not the pad id.** Upstream passes the batch as
      given, and ``*ForSequenceClassification`` decoders pool the rightmost token that is not
      ``config.pad_token_id``: rows padded with another value are scored on a pad position, a
      trailing EOS equal to the pad id is skipped, and GPT2 (absolute positions) scores
      left-padded rows at shifted positions. This wrapper packs the real tokens of each row to
      the right (so positions are those of the row alone) and makes the pooled token the last
      real one, by filling padding with ``config.pad_token_id`` or, when a row *ends* with that
      id (``pad_token_id == eos_token_id``) or it is ``None``, with a spare id that it sets as
      ``config.pad_token_id`` during the call and restores after. Each reward equals the reward
      of the row scored alone without padding (to float rounding) for left or right padding,
      any pad value, bool or int masks, decoders and encoders (BERT pools the first token).
      Changing the config for the call is not thread-safe: don't score with one model object
      from several threads at once.
    * **Ragged input** is read as it is: lazy stacks (TorchRL's LLM wrappers with
      ``pad_output=False``), nested lists of 1-D tensors and jagged nested tensors.
    * **Any batch shape**: ``[]``, ``[B]``, ``[E, G]``...; the reward has the leading shape of
      the token entry (the tensordict's batch shape), plus a trailing ``1`` with
      ``unsqueeze_reward=True`` (TorchRL's ``("next", "reward")`` convention).
    * **Never an inference tensor**: even inside a caller's :func:`torch.inference_mode`, the
      reward is a normal tensor that a later backward pass can use.
    * **Non-finite rewards raise** by default (see ``nonfinite``).

    Args:
        model (nn.Module): the reward model, e.g. an ``AutoModelForSequenceClassification`` with
            ``num_labels=1`` (one trained by ``trl.RewardTrainer``), or any module whose forward
            takes ``input_ids`` (and ``attention_mask``) and returns a ``logits`` or ``rewards``
            tensor, a tuple whose first element is one, or a bare tensor, of shape ``[N]`` or
            ``[N, 1]``.

    Keyword Args:
        token_key (NestedKey, optional): the token ids. Defaults to ``("tokens", "full")``
            (TorchRL's LLM layout).
        attention_mask_key (NestedKey or None, optional): the attention mask (bool or int, ``1``
            marks a real token). ``None``: every token of a row is real (ragged rows carry their
            own length). Defaults to ``("masks", "all_attention_mask")``.
        reward_key (NestedKey, optional): where the reward is written. Defaults to ``"reward"``.
        inference_mode (bool, optional): if ``True``, the model runs under
            :func:`torch.no_grad` (no graph is built); if ``False``, gradients flow to the
            model's parameters (reward-model training, critics). Defaults to ``False``.
        max_batch_size (int, optional): the most rows per model call. Rows are sorted by length
            and split into micro-batches, each padded to its own longest row; rewards come back
            in the original order. ``None`` scores every row in one call (padded to the longest
            real row). Defaults to ``None``.
        tokenizer (PreTrainedTokenizerBase, optional): the reward model's own tokenizer (often
            not the policy's), needed by ``text_key`` and ``history_key``. Defaults to ``None``.
        text_key (NestedKey, optional): read strings here instead of tokens, e.g.
            ``("text", "full")``. They are formatted as ``trl.RewardTrainer`` formats standard
            training text (EOS appended unless already there, see ``append_eos``) and tokenized
            with ``tokenizer``. Defaults to ``None``.
        history_key (NestedKey, optional): read a :class:`~torchrl.data.llm.History` here
            instead of tokens, e.g. ``("history", "full")``, rendered with ``tokenizer``'s chat
            template as ``trl.RewardTrainer`` renders conversational data (no generation prompt,
            no extra EOS). Defaults to ``None``.
        append_eos (bool, optional): with ``text_key``, append ``tokenizer.eos_token`` to texts
            that do not end with it, as ``RewardTrainer`` did to its training data. ``False``
            scores the text as is (what ``GRPOTrainer`` does with a reward model). Defaults to
            ``True``.
        chat_template_kwargs (dict, optional): extra arguments for
            ``tokenizer.apply_chat_template`` with ``history_key`` (e.g. ``tools``). Defaults to
            ``None``.
        unsqueeze_reward (bool, optional): write the reward with a trailing singleton dimension,
            shape ``[*batch, 1]``. Defaults to ``False`` (shape ``[*batch]``, as upstream).
        nonfinite (str, optional): what to do when a reward is NaN or infinite: ``"raise"`` a
            :class:`ValueError`, ``"warn"`` (:class:`RuntimeWarning`) or ``"ignore"`` (skips the
            check and its device sync). Defaults to ``"raise"``: a NaN reward silently poisons
            an RL update.

    Raises:
        TypeError: if ``model`` is not callable or a key is not a str or tuple of str.
        ValueError: if ``max_batch_size`` is not a positive int, ``nonfinite`` is unknown, both
            ``text_key`` and ``history_key`` are given, a non-default ``token_key`` or
            ``attention_mask_key`` is given with one of them, one of them is given without
            ``tokenizer`` (or ``tokenizer`` without them), or ``append_eos=True`` with a
            tokenizer that has no EOS token.

    Examples:
        Score a ragged batch, as TorchRL's LLM wrappers write it (a lazy stack), with a tiny
        Llama reward model:

        >>> import torch
        >>> from tensordict import TensorDict, lazy_stack
        >>> from torchrl_trl_interop.testing import toy_reward_model
        >>> model = toy_reward_model("llama")
        >>> rm = HFRewardModelWrapper(model)
        >>> td = lazy_stack([
        ...     TensorDict({"tokens": {"full": torch.tensor([5, 6, 7])},
        ...                 "masks": {"all_attention_mask": torch.ones(3, dtype=torch.bool)}}),
        ...     TensorDict({"tokens": {"full": torch.tensor([8, 9])},
        ...                 "masks": {"all_attention_mask": torch.ones(2, dtype=torch.bool)}}),
        ... ])
        >>> rm(td)["reward"].shape
        torch.Size([2])

        The score does not depend on padding: the same rows left-padded give the same rewards.

        >>> padded = TensorDict({
        ...     "tokens": {"full": torch.tensor([[5, 6, 7], [0, 8, 9]])},
        ...     "masks": {"all_attention_mask": torch.tensor([[1, 1, 1], [0, 1, 1]])},
        ... }, batch_size=[2])
        >>> torch.allclose(rm(padded)["reward"], td["reward"], atol=1e-5)
        True

        Group-shaped batches keep their shape; ``unsqueeze_reward`` adds TorchRL's trailing dim:

        >>> rm = HFRewardModelWrapper(model, reward_key=("next", "reward"), unsqueeze_reward=True)
        >>> eg = TensorDict({
        ...     "tokens": {"full": torch.randint(3, 300, (2, 3, 5))},
        ...     "masks": {"all_attention_mask": torch.ones(2, 3, 5, dtype=torch.bool)},
        ... }, batch_size=[2, 3])
        >>> rm(eg)["next", "reward"].shape
        torch.Size([2, 3, 1])

        Score text with the reward model's own tokenizer, formatted as ``RewardTrainer`` did:

        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> rm = HFRewardModelWrapper(model, tokenizer=toy_tokenizer(), text_key="text",
        ...                           inference_mode=True)
        >>> rm
        HFRewardModelWrapper(
            model=LlamaForSequenceClassification,
            in_keys=['text'],
            out_keys=['reward'],
            inference_mode=True,
            max_batch_size=None)
        >>> text = TensorDict({"text": ["Hello world!", "Two plus two is four."]}, batch_size=[2])
        >>> rm(text)["reward"].requires_grad
        False

    .. seealso::
        ``torchrl.modules.llm.trl_interop.HFRewardModelWrapper``, the upstream class this one
        replaces.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        token_key: NestedKey = _DEFAULT_TOKEN_KEY,
        attention_mask_key: NestedKey | None = _DEFAULT_MASK_KEY,
        reward_key: NestedKey = "reward",
        inference_mode: bool = False,
        max_batch_size: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        text_key: NestedKey | None = None,
        history_key: NestedKey | None = None,
        append_eos: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        unsqueeze_reward: bool = False,
        nonfinite: str = "raise",
    ) -> None:
        if not callable(model):
            raise TypeError(
                f"HFRewardModelWrapper: model should be a callable nn.Module (a reward model), "
                f"got {type(model).__name__}."
            )
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool)
            or not isinstance(max_batch_size, int)
            or max_batch_size < 1
        ):
            raise ValueError(
                f"HFRewardModelWrapper: max_batch_size={max_batch_size!r}; expected None or a "
                "positive int (the most rows per model call)."
            )
        if nonfinite not in _NONFINITE_MODES:
            raise ValueError(
                f"HFRewardModelWrapper: nonfinite={nonfinite!r}; expected one of "
                f"{_NONFINITE_MODES}."
            )
        token_key = normalize_key(token_key)
        reward_key = normalize_key(reward_key)
        if attention_mask_key is not None:
            attention_mask_key = normalize_key(attention_mask_key)
        if text_key is not None:
            text_key = normalize_key(text_key)
        if history_key is not None:
            history_key = normalize_key(history_key)

        source_key = text_key if text_key is not None else history_key
        if text_key is not None and history_key is not None:
            raise ValueError(
                f"HFRewardModelWrapper: got both text_key={text_key!r} and "
                f"history_key={history_key!r}; pass only the one the reward model should score."
            )
        if source_key is not None:
            source_arg = "text_key" if text_key is not None else "history_key"
            if token_key != _DEFAULT_TOKEN_KEY or attention_mask_key not in (
                None,
                _DEFAULT_MASK_KEY,
            ):
                raise ValueError(
                    f"HFRewardModelWrapper: {source_arg}={source_key!r} makes the wrapper "
                    f"tokenize its own input, so token_key={token_key!r} and "
                    f"attention_mask_key={attention_mask_key!r} would be ignored. Pass either "
                    f"{source_arg} or token_key/attention_mask_key."
                )
            if tokenizer is None:
                raise ValueError(
                    f"HFRewardModelWrapper: {source_arg}={source_key!r} needs the reward "
                    "model's tokenizer: pass tokenizer=... (the one the reward model was trained "
                    "with, which is often not the policy's)."
                )
            if text_key is not None and append_eos and tokenizer.eos_token is None:
                raise ValueError(
                    f"HFRewardModelWrapper: append_eos=True but tokenizer "
                    f"{type(tokenizer).__name__} has no eos_token. Set tokenizer.eos_token or "
                    "pass append_eos=False."
                )
        elif tokenizer is not None:
            raise ValueError(
                "HFRewardModelWrapper: tokenizer= is only used with text_key= or history_key=; "
                "with token input it would be ignored. Pass text_key=... or history_key=..., or "
                "drop tokenizer=."
            )
        elif chat_template_kwargs is not None:
            raise ValueError(
                "HFRewardModelWrapper: chat_template_kwargs= is only used with history_key=."
            )

        super().__init__()
        if source_key is not None:
            in_keys: list[NestedKey] = [source_key]
        else:
            in_keys = [token_key]
            if attention_mask_key is not None:
                in_keys.append(attention_mask_key)
        self.in_keys = in_keys
        self.out_keys = [reward_key]

        self._token_key = token_key
        self._attention_mask_key = attention_mask_key
        self._reward_key = reward_key
        self._text_key = text_key
        self._history_key = history_key
        self._inference_mode = bool(inference_mode)
        self._tokenizer = tokenizer
        self._append_eos = bool(append_eos)
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_batch_size = max_batch_size
        self.unsqueeze_reward = bool(unsqueeze_reward)
        self.nonfinite = nonfinite
        # upstream passes no mask when attention_mask_key is None (and nothing is padded)
        self._pass_mask = source_key is not None or attention_mask_key is not None
        self._reward_module = _RewardModelHolder(model)

    @property
    def model(self) -> nn.Module:
        """The wrapped reward model."""
        return self._reward_module.model

    @property
    def inference_mode(self) -> bool:
        """Whether the model runs without building a graph."""
        return self._inference_mode

    def __repr__(self) -> str:
        fields = [
            f"model={type(self.model).__name__}",
            f"in_keys={self.in_keys}",
            f"out_keys={self.out_keys}",
            f"inference_mode={self._inference_mode}",
            f"max_batch_size={self.max_batch_size}",
        ]
        if self.unsqueeze_reward:
            fields.append("unsqueeze_reward=True")
        if self.nonfinite != "raise":
            fields.append(f"nonfinite={self.nonfinite!r}")
        body = ",\n    ".join(fields)
        return f"{type(self).__name__}(\n    {body})"

    # -----------------------------------------------------------------------------------------
    # forward
    # -----------------------------------------------------------------------------------------

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Scores every row of ``tensordict`` and writes the rewards to ``reward_key``.

        Args:
            tensordict (TensorDictBase): holds ``token_key`` (and ``attention_mask_key``), or
                ``text_key``, or ``history_key``; dense, lazily stacked (ragged) or nested.

        Returns:
            the same tensordict, with a ``float32`` reward of shape ``[*batch]`` (or
            ``[*batch, 1]`` with ``unsqueeze_reward=True``) at ``reward_key``.

        Raises:
            KeyError: if an input key is missing (the message lists the keys present).
            TypeError: if the tokens are not integers, or an entry has an unreadable type.
            ValueError: if the mask's shape or row lengths do not match the tokens', a row has
                no real token, or (with ``nonfinite="raise"``) a reward is NaN or infinite.
            RewardShapeError: (a :class:`ValueError` and a :class:`RuntimeError`) if the model
                returns anything but one scalar per row.
            RewardOutputError: (a :class:`TypeError` and a :class:`RuntimeError`) if the model
                output holds no reward tensor.
        """
        ids, lengths, batch_shape, out_device = self._read_input(tensordict)

        grad_context = torch.no_grad() if self._inference_mode else contextlib.nullcontext()
        with grad_context:
            reward = self._score(ids, lengths)

        reward = reward.float().reshape(batch_shape)
        if self.unsqueeze_reward:
            reward = reward.unsqueeze(-1)
        if out_device is not None:
            reward = reward.to(out_device)
        self._check_finite(reward)

        if torch.is_inference_mode_enabled() or reward.is_inference():
            # inside the caller's inference_mode every new tensor is an inference tensor, which
            # no later backward pass may use: hand back a normal copy (a [*batch] tensor)
            with torch.inference_mode(False):
                if reward.is_inference():
                    reward = reward.clone()
                tensordict.set(self._reward_key, reward)
        else:
            tensordict.set(self._reward_key, reward)
        return tensordict

    def _read_input(
        self, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.device | None]:
        """Returns right-packed ``ids [N, T]``, ``lengths [N]``, the batch shape, the device."""
        if self._text_key is not None:
            return self._read_text(tensordict)
        if self._history_key is not None:
            return self._read_history(tensordict)

        value = _get_entry(tensordict, self._token_key, "token_key")
        ids, tok_lengths, batch_shape = _read_padded(value, f"token_key={self._token_key!r}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(
                f"HFRewardModelWrapper: token_key={self._token_key!r} holds {ids.dtype} values; "
                "expected integer token ids."
            )
        width = ids.shape[-1]
        arange = torch.arange(width, device=ids.device)
        real = (
            arange < tok_lengths[:, None]
            if tok_lengths is not None
            else torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        )
        if self._attention_mask_key is not None:
            mask_value = _get_entry(tensordict, self._attention_mask_key, "attention_mask_key")
            mask, mask_lengths, mask_shape = _read_padded(
                mask_value, f"attention_mask_key={self._attention_mask_key!r}"
            )
            self._check_mask(ids, tok_lengths, batch_shape, mask, mask_lengths, mask_shape)
            real = real & (mask != 0).to(real.device)
        ids, lengths = _compact_right(ids.long(), real)
        if (lengths == 0).any():
            empty = (lengths == 0).nonzero().flatten()[:8].tolist()
            raise ValueError(
                f"HFRewardModelWrapper: row(s) {empty} (flattened index) have no real token: "
                f"their {self._attention_mask_key!r} mask is all zero (or the row is empty). A "
                "reward model cannot score an empty sequence; drop these rows first."
            )
        return ids, lengths, batch_shape, tensordict.device or _value_device(value)

    def _check_mask(
        self,
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
                    f"HFRewardModelWrapper: the mask at {self._attention_mask_key!r} does not "
                    f"match the tokens at {self._token_key!r}: row {row} (flattened) has "
                    f"{int(t_len[row])} tokens but a mask of length {int(m_len[row])}."
                )
        elif mask_shape != batch_shape or mask.shape != ids.shape:
            raise ValueError(
                f"HFRewardModelWrapper: the mask at {self._attention_mask_key!r} (shape "
                f"{[*mask_shape, mask.shape[-1]]}) does not match the tokens at "
                f"{self._token_key!r} (shape {[*batch_shape, ids.shape[-1]]}). The mask needs "
                "one entry per token."
            )

    def _read_text(
        self, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.device | None]:
        value = _get_entry(tensordict, self._text_key, "text_key")
        texts, batch_shape = _read_texts(value, f"text_key={self._text_key!r}")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(
                    f"HFRewardModelWrapper: text_key={self._text_key!r} row {i} is a "
                    f"{type(text).__name__}; expected a str."
                )
        texts = [self._format_text(text) for text in texts]
        token_lists = self._tokenizer(texts)["input_ids"] if texts else []
        return (*self._pack(token_lists), batch_shape, tensordict.device)

    def _format_text(self, text: str) -> str:
        # as trl.RewardTrainer._prepare_dataset formats standard (non-conversational) text
        eos = self._tokenizer.eos_token
        if self._append_eos and not text.endswith(eos):
            return text + eos
        return text

    def _read_history(
        self, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.device | None]:
        from torchrl.data.llm import History

        with set_list_to_stack(True):  # scoped: reading a ragged History needs the mode
            history = _get_entry(tensordict, self._history_key, "history_key")
            messages = history_to_messages(history) if isinstance(history, History) else None
        if not isinstance(history, History):
            raise TypeError(
                f"HFRewardModelWrapper: history_key={self._history_key!r} holds a "
                f"{type(history).__name__}; expected a torchrl.data.llm.History."
            )
        batch_shape = tuple(history.batch_size[:-1])
        conversations = _flatten_conversations(messages, len(batch_shape))
        token_lists = [
            # as trl.data_utils._tokenize renders conversational RewardTrainer data
            self._tokenizer.apply_chat_template(
                conversation, tokenize=True, return_dict=True, **self._chat_template_kwargs
            )["input_ids"]
            for conversation in conversations
        ]
        return (*self._pack(token_lists), batch_shape, tensordict.device)

    def _pack(self, token_lists: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [torch.as_tensor(list(ids), dtype=torch.long) for ids in token_lists]
        if not rows:
            return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        lengths = torch.tensor([row.numel() for row in rows])
        if (lengths == 0).any():
            empty = (lengths == 0).nonzero().flatten()[:8].tolist()
            raise ValueError(
                f"HFRewardModelWrapper: row(s) {empty} tokenize to no token at all; a reward "
                "model cannot score an empty sequence."
            )
        ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
        return ids, lengths

    # -----------------------------------------------------------------------------------------
    # scoring
    # -----------------------------------------------------------------------------------------

    def _model_device(self, default: torch.device) -> torch.device:
        for tensor in self.model.parameters():
            return tensor.device
        for tensor in self.model.buffers():
            return tensor.device
        return default

    def _pad_id(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int | None]:
        """Returns ``(fill value, pad id to set on the config for the call or None)``."""
        config = _text_config(self.model)
        if config is None:
            return 0, None
        pad = config.pad_token_id
        last = ids[torch.arange(ids.shape[0], device=ids.device), lengths - 1]
        if pad is not None and not bool((last == pad).any()):
            return int(pad), None  # the model's own pad id: nothing to change
        # a row ends with the pad id (pad == eos) or there is none: pad with an id that no row
        # ends with, so the pooled "rightmost non-pad token" is every row's last real token
        taken = set(last.tolist())
        spare = next(i for i in range(len(taken) + 1) if i not in taken)
        return spare, spare

    def _score(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Scores right-packed rows ``ids [N, T]`` of ``lengths [N]``: a reward per row."""
        n = ids.shape[0]
        device = self._model_device(ids.device)
        ids = ids.to(device)
        lengths = lengths.to(device)
        if n == 0:
            return torch.zeros(0, device=device)
        fill, pooling_pad = self._pad_id(ids, lengths)
        arange = torch.arange(ids.shape[-1], device=device)
        mask = arange < lengths[:, None]
        ids = ids.masked_fill(~mask, fill)

        # micro-batches: rows sorted by length, so each call pads only to its own longest row
        one_call = self.max_batch_size is None or n <= self.max_batch_size
        if one_call:
            chunks: list[torch.Tensor | None] = [None]
        else:
            order = torch.sort(lengths, stable=True).indices
            chunks = list(order.split(self.max_batch_size))

        rewards = []
        with _pooling_pad_id(_text_config(self.model), pooling_pad):
            for index in chunks:
                if index is None:
                    chunk_ids, chunk_mask, chunk_len = ids, mask, lengths
                else:
                    chunk_len = lengths[index]
                    width = int(chunk_len.max())
                    chunk_ids, chunk_mask = ids[index, :width], mask[index, :width]
                if self._pass_mask or bool((chunk_len != chunk_ids.shape[-1]).any()):
                    out = self.model(input_ids=chunk_ids, attention_mask=chunk_mask.long())
                else:
                    out = self.model(input_ids=chunk_ids)
                rewards.append(self._check_shape(_extract_reward(out), chunk_ids.shape[0]))
        if one_call:
            return rewards[0]
        # back to the original row order
        return torch.cat(rewards)[torch.argsort(torch.cat(chunks))]

    def _check_shape(self, reward: torch.Tensor, n: int) -> torch.Tensor:
        if reward.shape == (n, 1):
            return reward.squeeze(-1)
        if reward.shape == (n,):
            return reward
        num_labels = getattr(getattr(self.model, "config", None), "num_labels", None)
        hint = (
            f" The model config has num_labels={num_labels}; reward models need num_labels=1."
            if num_labels not in (None, 1)
            else ""
        )
        raise RewardShapeError(
            f"HFRewardModelWrapper: expected one scalar reward per row, shape [{n}] or [{n}, 1], "
            f"but the model returned shape {list(reward.shape)}.{hint}"
        )

    def _check_finite(self, reward: torch.Tensor) -> None:
        if self.nonfinite == "ignore":
            return
        bad = ~torch.isfinite(reward.detach())
        if not bool(bad.any()):
            return
        where = bad.nonzero().tolist()[:8]
        message = (
            f"HFRewardModelWrapper: {int(bad.sum())} of {bad.numel()} reward(s) at "
            f"{self._reward_key!r} are NaN or infinite (first indices: {where}). "
            "Check the model's dtype and inputs, or pass nonfinite='warn' or 'ignore'."
        )
        if self.nonfinite == "raise":
            raise ValueError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _value_device(value: Any) -> torch.device | None:
    """The device of a token entry (tensor, or first tensor of a nested list), if any."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value.device if isinstance(value, torch.Tensor) else None
