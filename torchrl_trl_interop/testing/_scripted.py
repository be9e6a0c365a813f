"""A scripted chat policy: known answers in TorchRL's LLM layout, for episodes that must agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack, set_list_to_stack
from tensordict.nn import TensorDictModuleBase

from .._chat_format import ChatFormat
from .._conversation import history_to_messages
from .._keys import (
    ATTENTION_MASK_KEY,
    HISTORY_KEY,
    PROMPT_HISTORY_KEY,
    PROMPT_TOKEN_KEY,
    RESPONSE_TOKEN_KEY,
    without_placeholders,
)
from ._tokenizer import toy_tokenizer

_RESPONSE_LOG_PROBS_KEY = ("log_probs", "response")


class ScriptedChatPolicy(TensorDictModuleBase):
    """A TorchRL LLM policy in history mode that answers from a script instead of a model.

    It reads what ``TransformersWrapper(input_mode="history")`` reads and writes what it writes:
    the conversation ``("history", "prompt")``, and optionally the token prompt
    ``("tokens", "prompt")`` (left-padded, as :func:`~torchrl_trl_interop.as_trl_rollout_func`
    gives it from the second turn), and writes ``("history", "prompt" | "response" | "full")``,
    ``("tokens", "prompt" | "response")``, ``("masks", "all_attention_mask")`` and
    ``("log_probs", "response")`` (zeros). The answer
    of a conversation is ``answers[k]``, where ``k`` is the number of assistant turns it already
    holds, or ``answers(messages)`` for a callable. So ``LLMCollector``, ``as_trl_rollout_func``
    and an OpenEnv client all play the same episode.

    It speaks its tokenizer's chat template as a model trained on it would
    (:attr:`chat_format`): the prompt is the template's rendering of the conversation, the
    answer's tokens are the scripted text then the token that ends the template's assistant
    turn (the tokenizer's eos when the template has none), and the answer turn holds what the
    template renders again as the prompt and those tokens spelled it (a reasoning block the
    generation prompt opened included).

    Args:
        answers (sequence of str or callable): the assistant's turns, in order, or a function of
            the conversation so far (TRL messages) returning the next answer.

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop import history_to_messages
        >>> from torchrl_trl_interop.testing import toy_chat_env
        >>> env = toy_chat_env(batch_size=1)
        >>> td = env.reset(TensorDict({"query": ["What is 2 plus 3?"]}, batch_size=[1]))
        >>> td = ScriptedChatPolicy(["5"])(td)
        >>> history_to_messages(td["history", "full"])[0][-1]
        {'role': 'assistant', 'content': '5'}
    """

    def __init__(
        self,
        answers: Sequence[str] | Callable[[list[dict[str, Any]]], str],
        *,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        if not callable(answers) and (
            isinstance(answers, str) or not all(isinstance(a, str) for a in answers)
        ):
            raise TypeError(
                "ScriptedChatPolicy: answers must be a list of str (one per assistant turn) or a "
                f"function of the conversation, got {answers!r:.100}."
            )
        self.answers = answers if callable(answers) else list(answers)
        self.tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
        #: how it renders conversations and reads its answers: the tokenizer's own template
        self.chat_format = ChatFormat.of(self.tokenizer)
        self.in_keys = [PROMPT_HISTORY_KEY]
        self.out_keys = [
            HISTORY_KEY,
            PROMPT_TOKEN_KEY,
            RESPONSE_TOKEN_KEY,
            ATTENTION_MASK_KEY,
            _RESPONSE_LOG_PROBS_KEY,
        ]

    def answer(self, messages: list[dict[str, Any]]) -> str:
        """The scripted answer to ``messages`` (the conversation so far)."""
        if callable(self.answers):
            return self.answers(messages)
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn >= len(self.answers):
            raise IndexError(
                f"ScriptedChatPolicy: the script has {len(self.answers)} answers, the conversation "
                f"asks for answer {turn + 1}. End the episode sooner (max_steps) or add answers."
            )
        return self.answers[turn]

    #: from the second turn of a rollout, ``as_trl_rollout_func`` gives it the prompt's mask too
    reads_prompt_mask = True

    def _prompt_ids(self, td: TensorDictBase, messages: list[list[dict]]) -> list[list[int]]:
        """Each row's prompt ids: the given ``("tokens", "prompt")`` cut by the
        ``("masks", "all_attention_mask")`` given beside them (token-first, as a rollout gives
        them), or, without that mask, less their left padding when they spell the conversation,
        else the rendered conversation tokenized (torchrl's collectors leave the last call's
        tokens in the input)."""
        given = td.get(PROMPT_TOKEN_KEY, None, as_list=True)
        masks = td.get(ATTENTION_MASK_KEY, None, as_list=True)
        if given is not None and masks is not None:
            if [m.shape for m in masks] == [g.shape for g in given]:
                return [g[m.bool()].tolist() for g, m in zip(given, masks)]
        texts = self.chat_format.render(messages, add_generation_prompt=True)
        given = given or [None] * len(texts)
        pad = self.tokenizer.pad_token_id
        out = []
        for text, row in zip(texts, given):
            ids = [] if row is None else row.tolist()
            ids = ids[next((k for k, t in enumerate(ids) if t != pad), len(ids)) :]
            if not ids or self.tokenizer.decode(ids, skip_special_tokens=False) != text:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]  # stale or none
            out.append(ids)
        return out

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        td = tensordict if tensordict.ndim == 1 else tensordict.reshape(-1)
        with set_list_to_stack(True):
            prompt = td.get(PROMPT_HISTORY_KEY)
            messages = [without_placeholders(chat) for chat in history_to_messages(prompt)]
            chat = self.chat_format
            stop = chat.end_of_turn_id
            stop = self.tokenizer.eos_token_id if stop is None else stop
            sampled = [ids + [stop] for ids in chat.encode([self.answer(m) for m in messages])]
            td = td.to_lazystack(0)
            prompt_ids = self._prompt_ids(td, messages)
            response = lazy_stack(chat.answer_turns(sampled, prompt_ids=prompt_ids))
            full = prompt.extend(response, inplace=False, dim=-1)
            for row, ids, response_ids in zip(td.tensordicts, prompt_ids, sampled):
                row.set(PROMPT_TOKEN_KEY, torch.tensor(ids, dtype=torch.long))
                row.set(RESPONSE_TOKEN_KEY, torch.tensor(response_ids, dtype=torch.long))
                mask = torch.ones(len(ids) + len(response_ids), dtype=torch.bool)
                row.set(ATTENTION_MASK_KEY, mask)  # over the prompt then the answer, as torchrl's
                row.set(_RESPONSE_LOG_PROBS_KEY, torch.zeros(len(response_ids)))
            td.set((HISTORY_KEY[0], "response"), response)
            td.set(HISTORY_KEY, full)
        return td if tensordict.ndim == 1 else td.reshape(tensordict.shape)
