"""Hugging Face reward models as TensorDict modules: :class:`HFRewardModelWrapper`.

Read -> score -> write. The input is read into right-packed ids by ``_inputs`` (one reader per
``input_mode``) and scored by ``_scoring``; ``_pooling`` reads the reward out of the model's
output. Where this differs from upstream's wrapper: ``docs/overview.rst``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn

from .._checks import (
    as_mapping,
    boundary,
    check_bool,
    check_positive_int,
    check_tensordict,
    check_tokenizer,
    module_repr,
    type_error,
)
from .._keys import ATTENTION_MASK_KEY, REWARD_KEY, TOKEN_KEY, as_nested_key
from ._input_mode import INPUT_MODES, MODE_KEY_ARGS, mode_key, resolve_input_mode
from ._inputs import PackedInput, read_history, read_texts, read_tokens
from ._pooling import (
    RewardOutputError,
    RewardShapeError,
    check_model_input,
    guard_model_input,
    text_config,
)
from ._scoring import check_nonfinite, report_nonfinite, score_packed, scores_without_mask

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = ["HFRewardModelWrapper", "RewardOutputError", "RewardShapeError"]


class _RewardModelHolder(nn.Module):
    """Holds the model as ``_reward_module.model``: same ``state_dict`` keys as upstream."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class HFRewardModelWrapper(TensorDictModuleBase):
    """A :class:`~tensordict.nn.TensorDictModuleBase` that scores TensorDicts with an HF reward model.

    Reads its input from the tensordict in one of TorchRL's three forms, ``input_mode``
    (``"tokens"``, ``"text"`` or ``"history"``, as ``TransformersWrapper`` names them), calls the
    reward model, and writes one ``float32`` reward per row to ``reward_key`` in the same
    tensordict. Drop-in for upstream ``torchrl.modules.llm.HFRewardModelWrapper`` (same arguments
    and defaults: token input). The mask, not the pad id, decides which tokens are real, so each
    reward equals that of the row scored alone whatever the padding (the rows are then padded on
    the right, and a causal model such as Llama is called without a mask: its real tokens never
    see the padding after them); ragged input (lazy stacks, nested lists, jagged tensors) and
    any batch shape (``[]``, ``[B]``, ``[E, G]``) are read as they are; the reward is never an
    inference tensor; NaN or infinite rewards raise by default.
    ``docs/overview.rst`` says how, and where upstream differs.

    ============== ================ ============================================================
    ``input_mode`` key argument     what is read
    ============== ================ ============================================================
    ``"tokens"``   ``token_key``    token ids, and the mask at ``attention_mask_key``
    ``"text"``     ``text_key``     strings, tokenized with ``tokenizer`` as ``RewardTrainer``
                                    tokenizes standard text (EOS appended, see ``append_eos``)
    ``"history"``  ``history_key``  a :class:`~torchrl.data.llm.History`, rendered with
                                    ``tokenizer``'s chat template as ``RewardTrainer`` renders
                                    conversational data
    ============== ================ ============================================================

    Code written before ``input_mode`` runs unchanged: ``text_key=`` or ``history_key=`` alone
    selects its mode (see ``docs/overview.rst``).

    Args:
        model (nn.Module): the reward model, e.g. an ``AutoModelForSequenceClassification`` with
            ``num_labels=1`` (one trained by ``trl.RewardTrainer``), or any module whose forward
            takes ``input_ids`` (and ``attention_mask``) and returns a ``logits`` or ``rewards``
            tensor, a tuple whose first element is one, or a bare tensor, of shape ``[N]`` or
            ``[N, 1]``.

    Keyword Args:
        input_mode (str, optional): ``"tokens"``, ``"text"`` or ``"history"``. Defaults to
            ``None``: the mode of the key argument given (``text_key`` or ``history_key``),
            else ``"tokens"`` (upstream's behaviour).
        token_key (NestedKey, optional): the token ids (``"tokens"`` mode). Defaults to
            ``("tokens", "full")`` (TorchRL's LLM layout).
        attention_mask_key (NestedKey or None, optional): the attention mask (``"tokens"``
            mode; bool or int, ``1`` marks a real token). ``None``: every token of a row is real
            (ragged rows carry their own length). Defaults to ``("masks", "all_attention_mask")``.
        reward_key (NestedKey, optional): where the reward is written. Defaults to ``"reward"``.
        inference_mode (bool, optional): if ``True``, the model runs under
            :func:`torch.no_grad` (no graph is built); if ``False``, gradients flow to the
            model's parameters (reward-model training, critics). Defaults to ``False``.
        max_batch_size (int, optional): the most rows per model call. Rows are sorted by length
            and split into micro-batches, each padded to its own longest row; rewards come back
            in the original order. ``None`` scores every row in one call, at the input's width
            (ragged input: its longest row), with no value read back from a GPU before the model
            runs. Defaults to ``None``.
        tokenizer (PreTrainedTokenizerBase, optional): the reward model's own tokenizer (often
            not the policy's), needed by the ``"text"`` and ``"history"`` modes. Defaults to
            ``None``.
        text_key (NestedKey, optional): the strings (``"text"`` mode). Defaults to ``None``:
            ``("text", "full")`` in ``"text"`` mode.
        history_key (NestedKey, optional): the History (``"history"`` mode). Defaults to
            ``None``: ``("history", "full")`` in ``"history"`` mode.
        append_eos (bool, optional): in ``"text"`` mode, append ``tokenizer.eos_token`` to texts
            that do not end with it, as ``RewardTrainer`` did to its training data. ``False``
            scores the text as is (what ``GRPOTrainer`` does with a reward model). Defaults to
            ``True``.
        chat_template_kwargs (dict, optional): extra arguments for
            ``tokenizer.apply_chat_template`` in ``"history"`` mode (e.g. ``tools``). Defaults
            to ``None``.
        unsqueeze_reward (bool, optional): write the reward with a trailing singleton dimension,
            shape ``[*batch, 1]``. Defaults to ``False`` (shape ``[*batch]``, as upstream).
        nonfinite (str, optional): what to do when a reward is NaN or infinite: ``"raise"`` a
            :class:`ValueError`, ``"warn"`` (:class:`RuntimeWarning`) or ``"ignore"`` (skips the
            check and its device sync). Defaults to ``"raise"``: a NaN reward silently poisons
            an RL update.

    Raises:
        TypeError: if ``model`` is not callable, a key is not a str or tuple of str,
            ``tokenizer`` is not a tokenizer, ``chat_template_kwargs`` not a dict, or a flag
            (``inference_mode``, ``append_eos``, ``unsqueeze_reward``) not a bool.
        ValueError: if ``input_mode`` is unknown, a key argument of another mode is given (or,
            without ``input_mode``, key arguments of two modes), ``max_batch_size`` is not a
            positive int, ``nonfinite`` is unknown, the ``"text"`` or ``"history"`` mode has no
            ``tokenizer`` (or ``"tokens"`` has one), ``chat_template_kwargs`` is given outside
            ``"history"`` mode, or ``append_eos=True`` with a tokenizer without EOS token.

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

        Score text with the reward model's own tokenizer, formatted as ``RewardTrainer`` did
        (``text_key="text"`` alone, as written before ``input_mode``, selects the same input):

        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> rm = HFRewardModelWrapper(model, input_mode="text", text_key="text",
        ...                           tokenizer=toy_tokenizer(), inference_mode=True)
        >>> rm
        HFRewardModelWrapper(
            model=LlamaForSequenceClassification,
            input_mode='text',
            in_keys=['text'],
            out_keys=['reward'],
            inference_mode=True,
            max_batch_size=None)
        >>> text = TensorDict({"text": ["Hello world!", "Two plus two is four."]}, batch_size=[2])
        >>> rm(text)["reward"].requires_grad
        False

        Conversations are scored as ``History``, rendered with the chat template:

        >>> from torchrl_trl_interop import messages_to_history
        >>> chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]]
        >>> rm = HFRewardModelWrapper(model, input_mode="history", tokenizer=toy_tokenizer())
        >>> rm.in_keys
        [('history', 'full')]
        >>> td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[1])
        >>> rm(td)["reward"].shape
        torch.Size([1])

    .. seealso::
        ``torchrl.modules.llm.trl_interop.HFRewardModelWrapper``, the upstream class this one
        replaces.
    """

    @boundary("HFRewardModelWrapper")
    def __init__(
        self,
        model: nn.Module,
        *,
        input_mode: str | None = None,
        token_key: NestedKey = TOKEN_KEY,
        attention_mask_key: NestedKey | None = ATTENTION_MASK_KEY,
        reward_key: NestedKey = REWARD_KEY,
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
        input_mode = resolve_input_mode(  # first: it reads the arguments as passed
            HFRewardModelWrapper.__init__, locals(), modes=INPUT_MODES, default="tokens"
        )
        if not callable(model):
            raise type_error("model", "a callable nn.Module (a reward model)", model)
        check_positive_int(max_batch_size, "max_batch_size", allow_none=True)
        check_tokenizer(tokenizer, "tokenizer")
        chat_template_kwargs = (
            None
            if chat_template_kwargs is None
            else as_mapping(chat_template_kwargs, "chat_template_kwargs", "{name: value}")
        )
        for flag, value in (
            ("inference_mode", inference_mode),
            ("append_eos", append_eos),
            ("unsqueeze_reward", unsqueeze_reward),
        ):
            check_bool(value, flag)
        check_nonfinite(nonfinite)
        reward_key = as_nested_key(reward_key, "reward_key")
        keys = {"tokens": token_key, "text": text_key, "history": history_key}
        in_keys = [mode_key(input_mode, keys[input_mode])]
        if input_mode != "tokens":
            attention_mask_key = None  # text and History are tokenized here: every token is real
        elif attention_mask_key is not None:
            in_keys.append(as_nested_key(attention_mask_key, "attention_mask_key"))
        if input_mode == "tokens" and tokenizer is not None:
            raise ValueError(
                "tokenizer= is only used with text_key= or history_key= (input_mode='text' "
                "or 'history'); token input is read as it is, so it would be ignored. Pass "
                "input_mode='text' or 'history', or drop tokenizer=."
            )
        if input_mode != "tokens" and tokenizer is None:
            raise ValueError(
                f"input_mode={input_mode!r} ({MODE_KEY_ARGS[input_mode]}={in_keys[0]!r}) "
                "needs the reward model's tokenizer: pass tokenizer=... (the one the reward "
                "model was trained with, which is often not the policy's)."
            )
        if input_mode == "text" and append_eos and tokenizer.eos_token is None:
            raise ValueError(
                f"append_eos=True but tokenizer {type(tokenizer).__name__} has no eos_token. "
                "Set tokenizer.eos_token or pass append_eos=False."
            )
        if chat_template_kwargs is not None and input_mode != "history":
            raise ValueError(
                "chat_template_kwargs= is only used with history_key= "
                f"(input_mode='history'); with input_mode={input_mode!r} it would be ignored."
            )

        super().__init__()
        self.in_keys = in_keys
        self.out_keys = [reward_key]
        self.input_mode = input_mode
        self._input_key = in_keys[0]  # what the model reads, in the mode's key argument
        self._attention_mask_key = in_keys[1] if len(in_keys) > 1 else None
        self._reward_key = reward_key
        self._inference_mode = bool(inference_mode)
        self._tokenizer = tokenizer
        self._append_eos = bool(append_eos)
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_batch_size = max_batch_size
        self.unsqueeze_reward = bool(unsqueeze_reward)
        self.nonfinite = nonfinite
        # upstream passes no mask when attention_mask_key is None (and nothing is padded)
        self._pass_mask = input_mode != "tokens" or attention_mask_key is not None
        self._facts: tuple[Any, ...] | None = None  # (model, config, *facts): no submodule
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
        after = [f"inference_mode={self._inference_mode}", f"max_batch_size={self.max_batch_size}"]
        if self.unsqueeze_reward:
            after.append("unsqueeze_reward=True")
        if self.nonfinite != "raise":
            after.append(f"nonfinite={self.nonfinite!r}")
        model = type(self.model).__name__
        return module_repr(self, [f"model={model}", f"input_mode={self.input_mode!r}"], after)

    # -----------------------------------------------------------------------------------------
    # forward
    # -----------------------------------------------------------------------------------------

    @boundary("HFRewardModelWrapper")  # one context per call, never per row
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Scores every row of ``tensordict`` and writes the rewards to ``reward_key``.

        Args:
            tensordict (TensorDictBase): holds the key of the input mode: ``token_key`` (and
                ``attention_mask_key``), ``text_key`` or ``history_key``; dense, lazily stacked
                (ragged) or nested.

        Returns:
            the same tensordict, with a ``float32`` reward of shape ``[*batch]`` (or
            ``[*batch, 1]`` with ``unsqueeze_reward=True``) at ``reward_key``.

        Raises:
            KeyError: if an input key is missing (the message lists the keys present).
            TypeError: if ``tensordict`` is not a TensorDict, the tokens are not integers, or an
                entry has an unreadable type.
            ValueError: if the mask's shape or row lengths do not match the tokens', a row has
                no real token (a row of length 0, an all-zero mask, a text that tokenizes to
                nothing: the message names the key and the rows), a token id is outside the
                model's vocabulary, a row is longer than its ``max_position_embeddings``, or
                (with ``nonfinite="raise"``) a reward is NaN or infinite. No reward is written.
            RewardShapeError: (a :class:`ValueError` and a :class:`RuntimeError`) if the model
                returns anything but one scalar per row.
            RewardOutputError: (a :class:`TypeError` and a :class:`RuntimeError`) if the model
                output holds no reward tensor.
        """
        model = self._reward_module.model
        config, maskless = self._facts_of(model)
        no_grad = self._inference_mode and torch.is_grad_enabled()
        if no_grad:
            torch.set_grad_enabled(False)  # torch.no_grad(), without its two context objects
        try:
            scored = self._score(tensordict, model, config, maskless)
        finally:
            if no_grad:
                torch.set_grad_enabled(True)
        reward, batch_shape, device, bad = scored
        if reward.dtype is not torch.float32:
            reward = reward.float()
        if reward.shape != batch_shape:
            reward = reward.reshape(batch_shape)
        if self.unsqueeze_reward:
            reward = reward.unsqueeze(-1)
        if device is not None:
            reward = reward.to(device)
        if bad:
            report_nonfinite(reward, self._reward_key, self.nonfinite)
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

    # -----------------------------------------------------------------------------------------
    # what the model reads
    # -----------------------------------------------------------------------------------------

    def _read(self, tensordict: TensorDictBase) -> PackedInput:
        """One reader per input mode (``_inputs``)."""
        if self.input_mode == "text":
            return read_texts(tensordict, self._input_key, self._tokenizer, self._append_eos)
        if self.input_mode == "history":
            return read_history(
                tensordict, self._input_key, self._tokenizer, self._chat_template_kwargs
            )
        return read_tokens(tensordict, self._input_key, self._attention_mask_key)

    def _score(
        self, tensordict: TensorDictBase, model: nn.Module, config: Any, maskless: bool
    ) -> tuple[torch.Tensor, tuple[int, ...], torch.device | None, bool]:
        """Any input: read, packed to the right, clamped, scored (``_scoring``), checked."""
        check_tensordict(tensordict, "tensordict")
        packed = self._read(tensordict)
        arg = self._input_arg()
        ids, invalid = guard_model_input(model, packed.ids, packed.lengths, arg, config)
        check = (invalid, lambda: check_model_input(model, packed.ids, packed.lengths, arg))
        reward, bad = score_packed(
            model,
            config,
            PackedInput(ids, packed.lengths, packed.batch_shape, packed.device, packed.empty_hint),
            max_batch_size=self.max_batch_size,
            pass_mask=self._pass_mask,
            nonfinite=self.nonfinite,
            input_check=check,
            maskless=maskless,
        )
        return reward, packed.batch_shape, packed.device, bad

    def _input_arg(self) -> str:
        """The argument naming what the model reads, for error messages."""
        tokenized = "" if self.input_mode == "tokens" else " (tokenized)"
        return f"{MODE_KEY_ARGS[self.input_mode]}={self._input_key!r}{tokenized}"

    def _facts_of(self, model: nn.Module) -> tuple[Any, bool]:
        """``(text_config, scores_without_mask)``, once per model and config."""
        source = getattr(model, "config", None)
        cached = self._facts
        if cached is None or cached[0] is not model or cached[1] is not source:
            facts = (text_config(model), scores_without_mask(model))
            cached = self._facts = (model, source, *facts)
        return cached[2:]
