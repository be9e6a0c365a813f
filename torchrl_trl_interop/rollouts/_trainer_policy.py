"""A TRL trainer's own model as a torchrl LLM policy, and the trainer's way of scoring tokens.

Used by :func:`~torchrl_trl_interop.as_trl_rollout_func`: :class:`TrainerModelPolicy` samples
with the trainer's model and ``GenerationConfig`` and returns the log-probs ``GRPOTrainer``
itself computes; :func:`score_tokens` recomputes them for tokens another policy sampled.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack, set_list_to_stack
from torchrl.modules.llm import TransformersWrapper

from .._chat_format import ChatFormat
from .._checks import boundary
from .._conversation import history_to_messages
from .._keys import key_parts, without_placeholders
from .._padding import pad_rows, position_mask
from .._upstream._policy_hooks import (
    check_generate_step,
    generates_in_place,
    rows_under,
    with_generate_step,
)
from ._policy_output import PolicyKeys, extend_history, stack_rows

__all__ = [
    "TrainerModelPolicy",
    "completion_lengths",
    "score_tokens",
]


@with_generate_step
class TrainerModelPolicy(TransformersWrapper):
    """A history-mode ``TransformersWrapper`` that samples as a TRL trainer does and scores right.

    Its generate path is its own; torchrl 0.14.1's differs in four ways, all fixed here:

    * real tokens: torchrl's wrapper tells real tokens from padding by comparing ids with the pad
      id, so with ``pad_token == eos_token`` (GPT-2, Llama-3, Mistral...) it drops the eos token
      the model generated, and from the second turn of a conversation every earlier eos too.
      Here a prompt is its rows' own tokens (padded and masked by their lengths) and a response
      ends at its first eos token, included, as ``GRPOTrainer`` cuts its own completions;
    * log-probs: the wrapper writes 0.0 for the first response token and scores the raw logits;
      here every token is scored, on ``logits / temperature``, as ``GRPOTrainer`` scores it;
    * generation: the wrapper keeps only the generation arguments it knows (``min_p``,
      ``suppress_tokens``, ``cache_implementation``... are dropped silently); here the whole
      ``generation_config`` reaches ``model.generate``;
    * conversations of different lengths in one batch (e.g. some with a system message): the
      wrapper fails to extend them (``zip() argument ... is shorter``); here each row is extended
      on its own;
    * the chat format: the wrapper renders with a template it picks from
      ``tokenizer.name_or_path`` (ChatML when nothing matches) and parses the answer with that
      family's parser; here the conversation is rendered with the tokenizer's own template (or
      ``chat_template``), as TRL renders it, and the answer is read from its tokens with that
      template's markers: its content up to the stop token (:attr:`chat_format`).

    The model object is wrapped, not copied: the policy always samples with its current weights.
    It reads ``("tokens", "prompt")`` when given (``prefer_tokens=True``:
    :func:`~torchrl_trl_interop.as_trl_rollout_func` gives them, to continue a multi-turn
    rollout from exactly its tokens), each row cut by the ``("masks", "all_attention_mask")``
    beside them, or without one stripped of its leading pad ids. Beside a mask of another shape
    (the last step's, which a torchrl collector carries over) they no longer spell the
    conversation: it then renders the History with the chat format, as it does without tokens.
    Its output has torchrl's layout, unpadded (``pad_output=False``).

    Args:
        model (PreTrainedModel): the causal LM (for a trainer:
            ``trainer.accelerator.unwrap_model(trainer.model)``).
        tokenizer (PreTrainedTokenizerBase): its tokenizer.
        generation_config (GenerationConfig): how to sample (for a trainer:
            :func:`~torchrl_trl_interop.trainer_generation_config`). Written with
            ``output_logits=True`` and ``return_dict_in_generate=True``, which the scoring needs.
        temperature (float): the logits are divided by it before scoring.

    Keyword Args:
        chat_template (str, optional): the template to render with, instead of the tokenizer's
            own (for a trainer: the one it renders with, e.g. TRL's training variant).
        chat_template_kwargs (dict, optional): more arguments for every render (TRL's
            ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from transformers import GenerationConfig
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl_trl_interop.testing import IM_END, toy_causal_lm, toy_tokenizer
        >>> tok = toy_tokenizer(pad_token=IM_END)  # pad == eos
        >>> config = GenerationConfig(max_new_tokens=3, do_sample=True, pad_token_id=2,
        ...                           eos_token_id=2, forced_eos_token_id=2)  # the last is eos
        >>> policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, temperature=1.0)
        >>> env = ChatEnv(batch_size=(1,), tokenizer=tok, input_mode="history")
        >>> td = policy(env.reset(TensorDict({"query": ["Hi"]}, batch_size=[1])))
        >>> td.get(("tokens", "response"), as_list=True)[0][-1].item()  # torchrl's wrapper drops it
        2
        >>> log_probs = td.get(("log_probs", "response"), as_list=True)[0]
        >>> bool(log_probs[0] < 0)  # torchrl 0.14.1's own wrapper writes 0.0 here
        True
    """

    #: from the second turn of a rollout, ``run_episodes`` gives it the prompt's mask too
    reads_prompt_mask = True
    #: passed to ``generate``: ``True`` where every forward is a collective (ZeRO-3, FSDP on
    #: several ranks), so a rank whose rows ended keeps taking part; ``None`` lets transformers
    #: decide
    synced_gpus: bool | None = None

    @boundary("TrainerModelPolicy")
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        generation_config: Any,
        temperature: float,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        check_generate_step()
        device = next(model.parameters()).device  # prompts go where the model is
        super().__init__(
            model,
            tokenizer=tokenizer,
            input_mode="history",
            generate=True,
            return_log_probs=True,
            pad_output=False,
            prefer_tokens=True,
            device=device,
            chat_template=chat_template,
        )
        #: how it renders conversations and reads answers: the tokenizer's own template
        self.chat_format = ChatFormat.of(
            tokenizer, chat_template=chat_template, template_kwargs=chat_template_kwargs
        )
        self._model_device = device
        self.temperature = float(temperature)
        generation_config.output_logits = True
        generation_config.return_dict_in_generate = True
        self.generate_kwargs = {"generation_config": generation_config}

    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        tensordict_out: TensorDictBase | None = None,
        logits_only: bool = False,
        **kwargs: Any,
    ) -> TensorDictBase:
        """torchrl's ``TransformersWrapper.forward``. A call that only generates into its input
        (:func:`~torchrl_trl_interop._upstream._policy_hooks.generates_in_place`: a batch of
        rows, no call-time argument, ``inplace=True``, as the rollout calls it) runs the
        generate step on the input as it is, without converting it to a lazy stack of rows
        first, and writes the step's output into it as torchrl does."""
        if not generates_in_place(self, tensordict, tensordict_out, kwargs):
            return super().forward(
                tensordict, tensordict_out=tensordict_out, logits_only=logits_only, **kwargs
            )
        with set_list_to_stack(True):
            out = self._generate_step(
                tensordict, None, TensorDict(batch_size=tensordict.batch_size)
            )
            result = tensordict.exclude(*self.out_keys, inplace=True)
            result.update(out, keys_to_update=self.out_keys)
        return result

    def _prompt_rows(self, td: TensorDictBase, history: Any) -> list[torch.Tensor]:
        """The prompt of every row: the tokens given (a rollout continuing from its tokens: cut
        by the mask beside them, or without one stripped of their left padding), else its
        History rendered with the chat format and tokenized.

        Tokens beside a mask of another shape are not read: torchrl's collectors carry the last
        call's ``("tokens", "prompt")`` and its mask over prompt and answer into the next step's
        input, where they no longer spell the conversation."""
        keys = PolicyKeys.of(self)
        given = td.get(keys.prompt_tokens, None, as_list=True) if self.prefer_tokens else None
        if given is not None:
            rows = [torch.as_tensor(r) for r in _unbind(given)]
            masks = td.get(keys.attention_mask, None, as_list=True)
            masks = None if masks is None else [torch.as_tensor(m) for m in _unbind(masks)]
            if (
                masks is None
            ):  # left padding: the leading pad ids (a prompt does not start with one)
                return [r[(r != self.padding_value).int().cummax(0).values.bool()] for r in rows]
            if [m.shape for m in masks] == [r.shape for r in rows]:
                return [r[m.bool()] for r, m in zip(rows, masks)]  # cut by the mask beside them
        conversations = [without_placeholders(c) for c in history_to_messages(history)]
        ids = self.chat_format.prompt_ids(conversations)
        return [torch.tensor(row, dtype=torch.long) for row in ids]

    def _answers(self, prompts: list, responses: list[torch.Tensor], stop_ids: Any) -> list:
        """Each row's answer as a one-turn History: its content read from its tokens with the
        chat format (up to the stop token), complete when it ended at one."""
        return self.chat_format.answer_turns(
            [ids.tolist() for ids in responses],
            stop_ids,
            prompt_ids=[prompt.tolist() for prompt in prompts],
        )

    def _sample(
        self, prompts: list[torch.Tensor], config: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each prompt's answer (up to its first eos, included) and its tokens' log-probs, on
        the CPU: the model's ``generate`` (a subclass may sample elsewhere: TRL's vLLM)."""
        lengths = torch.tensor([len(p) for p in prompts])
        width = int(lengths.max())
        ids = pad_rows(prompts, self.padding_value, padding_side="left").to(self._model_device)
        mask = position_mask(lengths, width, "left").long().to(self._model_device)
        generated = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            synced_gpus=self.synced_gpus,
        )
        response = generated.sequences[:, width:]
        logits = torch.stack(list(generated.logits), 1).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        log_probs = logits.log_softmax(-1).gather(-1, response[..., None]).squeeze(-1)
        ends = completion_lengths(response, config.eos_token_id).tolist()
        response, log_probs = response.cpu(), log_probs.cpu()  # once, then cut row by row
        return [r[:n] for r, n in zip(response, ends)], [lp[:n] for lp, n in zip(log_probs, ends)]

    def _generate_step(self, td, cfg, out):
        """torchrl's history-mode generate step, done as the trainer does (see the class)."""
        from torchrl.modules.llm import ChatHistory, LogProbs, Masks, Text, Tokens

        history, prompt_rows = _history_rows(td, self.input_key)
        prompts = self._prompt_rows(td, history)
        config = self.generate_kwargs["generation_config"]
        if cfg is not None:  # call-time generation arguments (``policy(td, max_new_tokens=...)``)
            config = copy.deepcopy(config)
            config.update(**cfg.to_diff_dict())
        responses, scores = self._sample(prompts, config)
        full = [torch.cat([p, r]) for p, r in zip(prompts, responses)]

        text_full = self.chat_format.decode(full)
        text_prompt = self.chat_format.decode(prompts)
        text_response = [f[len(p) :] for f, p in zip(text_full, text_prompt)]
        # the answer read from its tokens, each row extended on its own (rows may differ in length)
        stop_ids = config.eos_token_id
        stop_ids = [stop_ids] if isinstance(stop_ids, int) else stop_ids
        answers = self._answers(prompts, responses, stop_ids)
        full_history = [extend_history(p, a) for p, a in zip(prompt_rows, answers)]

        # torchrl's ragged layout (what ``out``'s attribute assignment builds), row by row once
        result = TensorDict(batch_size=out.batch_size, device=out.device)
        result.set(
            self.tokens_key, stack_rows(Tokens, prompt=prompts, response=responses, full=full)
        )
        masks = [torch.ones(len(f), dtype=torch.bool) for f in full]
        result.set(self.masks_key, stack_rows(Masks, all_attention_mask=masks))
        result.set(self.log_probs_key, stack_rows(LogProbs, response=scores))
        texts = {"prompt": text_prompt, "full": text_full, "response": text_response}
        result.set(self.text_key, stack_rows(Text, **texts))
        chat = {"prompt": prompt_rows, "response": answers, "full": full_history}
        result.set(self.history_key, stack_rows(ChatHistory, **chat))
        return result


def _history_rows(td: TensorDictBase, key: Any) -> tuple[Any, list]:
    """``td.get(key)`` (a ``[B, T]`` History) and its rows: where ``td`` holds its rows as
    ``TensorDict`` objects (torchrl's lazy stack of rows, as the wrapper's ``forward`` hands it
    over, or the ``ChatHistory`` of a reset, :func:`rows_under`), read row by row and stacked
    once, the same History over the same rows, where ``td.get`` stacks every ``ChatHistory``
    field on the way (~4x the time); any other input through ``td.get`` and ``unbind``."""
    rows = rows_under(td, key_parts(key))
    if rows is not None:
        return lazy_stack(rows), rows
    history = td.get(key)
    return history, list(history.unbind(0))


def _unbind(value: Any) -> Any:
    """The rows of a tensor (padded or nested), or ``value`` itself (a list of rows)."""
    return value.unbind(0) if isinstance(value, torch.Tensor) else value


def completion_lengths(
    response: torch.Tensor, eos_token_id: int | Sequence[int] | None
) -> torch.Tensor:
    """Per row of ``model.generate``'s new tokens, how many it generated: up to its first eos, included.

    What ``GRPOTrainer`` keeps of its own generations; the rest is padding, whatever its id (with
    ``pad_token == eos_token`` the padding is eos ids too). A row without eos keeps every token.

    Examples:
        >>> import torch
        >>> completion_lengths(torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]]), 2)
        tensor([2, 4, 1])
    """
    eos = [] if eos_token_id is None else eos_token_id
    eos = torch.tensor([eos] if isinstance(eos, int) else list(eos), device=response.device)
    is_eos = torch.isin(response, eos)
    first = is_eos.int().argmax(-1)
    return torch.where(is_eos.any(-1), first + 1, response.shape[-1]).cpu()


def score_tokens(
    model: Any,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    *,
    temperature: float = 1.0,
    pad_token_id: int = 0,
    batch_size: int = 8,
) -> list[torch.Tensor]:
    """Log-probs of each sequence's tokens after its prompt, as ``GRPOTrainer`` computes them.

    One no-grad forward per ``batch_size`` sequences, right-padded (positions stay those of the
    real tokens), log-softmax of ``logits / temperature``.

    Args:
        model (PreTrainedModel): a causal LM.
        sequences (list of list of int): ``prompt + completion`` token ids.
        prompt_lengths (list of int): the prompt part of each sequence.

    Keyword Args:
        temperature (float): Defaults to ``1.0``.
        pad_token_id (int): fills the padding (masked out). Defaults to ``0``.
        batch_size (int): sequences per forward pass. Defaults to ``8``.

    Returns:
        one float32 tensor per sequence, of length ``len(sequence) - prompt_length``.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_causal_lm
        >>> [t.shape for t in score_tokens(toy_causal_lm(), [[5, 6, 7], [5, 6, 7, 8]], [1, 2])]
        [torch.Size([2]), torch.Size([2])]
    """
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            chunk = [torch.tensor(list(s)) for s in sequences[start : start + batch_size]]
            ids = torch.nn.utils.rnn.pad_sequence(
                chunk, batch_first=True, padding_value=pad_token_id
            )
            lengths = torch.tensor([len(s) for s in chunk])
            mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            scores = (logits.float() / temperature).log_softmax(-1)
            for seq, score, p in zip(chunk, scores, prompt_lengths[start : start + batch_size]):
                targets = seq[p:].to(device)[:, None]
                out.append(score[p - 1 : len(seq) - 1].gather(-1, targets).squeeze(-1).cpu())
    return out
