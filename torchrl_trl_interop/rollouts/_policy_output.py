"""A torchrl LLM policy's output read as real tokens: each row's prompt, response and log-probs.

TorchRL's LLM wrappers write ``("tokens", "prompt" | "response")`` and
``("log_probs", "response")`` either ragged (``pad_output=False``: every row is its own tokens) or
padded (``pad_output=True``: prompts left-padded to one width, responses right-padded to another,
and ``("masks", "all_attention_mask")`` over both, prompt first). :func:`read_policy_rows` reads
either layout as real rows, cut by that mask (never by comparing ids with the pad id, which may
also be the eos id), so no pad token reaches a trainer as a prompt or policy token.

The keys hang under the policy's own roots (``policy.tokens_key``, ``masks_key``,
``log_probs_key``, ``history_key``), torchrl's by default. :func:`stack_rows` (which writes the ragged
layout in one pass) and :func:`extend_history` (a row's answer appended to its prompt) live in
:mod:`~torchrl_trl_interop._upstream._lazy_rows`, behind its version gate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.utils import NestedKey

from .._keys import (
    ATTENTION_MASK_KEY,
    HISTORY_KEY,
    PROMPT_HISTORY_KEY,
    PROMPT_TOKEN_KEY,
    RESPONSE_LOG_PROBS_KEY,
    RESPONSE_TOKEN_KEY,
    as_nested_key,
)
from .._upstream._lazy_rows import extend_history, stack_rows

__all__ = ["PolicyKeys", "PolicyRows", "extend_history", "read_policy_rows", "stack_rows"]


def _under(root: Any, layout_key: tuple[str, str]) -> NestedKey:
    """``layout_key``'s leaf under a policy's ``root`` (its ``tokens_key``...), or
    ``layout_key`` itself where it names none."""
    return as_nested_key(layout_key if root is None else (root, layout_key[1]))


@dataclass(frozen=True)
class PolicyKeys:
    """Where a torchrl LLM policy writes its output (torchrl's layout under the policy's roots).

    Examples:
        >>> PolicyKeys.of(None).prompt_tokens
        ('tokens', 'prompt')
    """

    prompt_tokens: NestedKey = PROMPT_TOKEN_KEY
    response_tokens: NestedKey = RESPONSE_TOKEN_KEY
    attention_mask: NestedKey = ATTENTION_MASK_KEY
    response_log_probs: NestedKey = RESPONSE_LOG_PROBS_KEY
    prompt_history: NestedKey = PROMPT_HISTORY_KEY
    full_history: NestedKey = HISTORY_KEY

    @classmethod
    def of(cls, policy: Any) -> PolicyKeys:
        """The keys ``policy`` writes (torchrl's defaults for what it does not name)."""
        roots = tuple(getattr(policy, root, None) for root in _ROOTS)
        try:
            return _keys_under(cls, roots)
        except TypeError:  # a root that is no hashable key: built again, and refused there
            return _keys_under.__wrapped__(cls, roots)


#: the policy attributes that name the roots of its output keys
_ROOTS = ("tokens_key", "masks_key", "log_probs_key", "history_key")


@functools.lru_cache(maxsize=64)
def _keys_under(cls: type[PolicyKeys], roots: tuple) -> PolicyKeys:
    """:meth:`PolicyKeys.of` a policy whose roots (``_ROOTS``) are ``roots``, built once."""
    tokens, masks, log_probs, history = roots
    return cls(
        prompt_tokens=_under(tokens, PROMPT_TOKEN_KEY),
        response_tokens=_under(tokens, RESPONSE_TOKEN_KEY),
        attention_mask=_under(masks, ATTENTION_MASK_KEY),
        response_log_probs=_under(log_probs, RESPONSE_LOG_PROBS_KEY),
        prompt_history=_under(history, PROMPT_HISTORY_KEY),
        full_history=_under(history, HISTORY_KEY),
    )


@dataclass
class PolicyRows:
    """Per row: the prompt's token ids, the response's, the response's log-probs (or ``None``)."""

    prompts: list[list[int]]
    responses: list[list[int]]
    log_probs: list[list[float]] | None


def _rows(value: Any) -> list[torch.Tensor]:
    return [torch.as_tensor(row) for row in value]


def read_policy_rows(
    td: Any, keys: PolicyKeys, *, log_probs: bool, required: bool = True
) -> PolicyRows:
    """Reads every row's real prompt, response and (with ``log_probs``) response log-probs.

    Rows are cut by ``keys.attention_mask`` when the policy wrote one spanning the row's prompt
    and response (padded output); ragged rows (``pad_output=False``) are their own tokens.

    Raises:
        KeyError: if ``log_probs`` and ``required`` and there are no response log-probs.
        ValueError: if a row's attention mask does not span its prompt and response.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({  # pad_output=True: left-padded prompts, right-padded responses
        ...     ("tokens", "prompt"): torch.tensor([[0, 5, 6], [7, 8, 9]]),
        ...     ("tokens", "response"): torch.tensor([[2, 0], [4, 2]]),
        ...     ("masks", "all_attention_mask"): torch.tensor(
        ...         [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
        ... }, batch_size=[2])
        >>> rows = read_policy_rows(td, PolicyKeys(), log_probs=False)
        >>> rows.prompts, rows.responses
        ([[5, 6], [7, 8, 9]], [[2], [4, 2]])
    """
    prompts = _rows(td.get(keys.prompt_tokens, as_list=True))
    responses = _rows(td.get(keys.response_tokens, as_list=True))
    scores = td.get(keys.response_log_probs, None, as_list=True) if log_probs else None
    if log_probs and scores is None and required:
        raise KeyError(
            f"the policy wrote no log-probs at {keys.response_log_probs!r} (keys: "
            f"{sorted(map(str, td.keys(True, True)))}). Build it with return_log_probs=True, "
            "or let the rollouts be scored by a model (recompute_logprobs=True / "
            "score_model=)."
        )
    scores = None if scores is None else _rows(scores)
    masks = td.get(keys.attention_mask, None, as_list=True)
    if masks is not None:
        masks = _rows(masks)
        whole = not masks or bool(torch.cat(masks).all())  # no padding: every row stays whole
        for i, mask in enumerate(masks):
            n_prompt, n_response = len(prompts[i]), len(responses[i])
            if mask.numel() != n_prompt + n_response:
                raise ValueError(
                    f"row {i}'s {keys.attention_mask!r} has {mask.numel()} entries, its prompt "
                    f"and response {n_prompt} + {n_response} tokens; expected a mask over the "
                    "prompt then the response, as torchrl's LLM wrappers write it."
                )
            if whole:
                continue
            mask = mask.bool()
            prompts[i] = prompts[i][mask[:n_prompt]]
            responses[i] = responses[i][mask[n_prompt:]]
            if scores is not None:
                scores[i] = scores[i][mask[n_prompt:]]
    return PolicyRows(
        prompts=[p.tolist() for p in prompts],
        responses=[r.tolist() for r in responses],
        log_probs=None if scores is None else [s.tolist() for s in scores],
    )
