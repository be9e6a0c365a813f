"""Whether a user-given torchrl LLM policy fits the rollout: tokenizer, pad token, batches.

:func:`~torchrl_trl_interop.as_trl_rollout_func` checks a policy given as ``policy=`` when it is
built (:func:`check_policy`), its tokenizer at the first call, and each env batch before it runs: torchrl 0.14.1's own ``TransformersWrapper`` has limits the
trainer's model (:class:`~torchrl_trl_interop.TrainerModelPolicy`) does not.
"""

from __future__ import annotations

from typing import Any

from torchrl.modules.llm import TransformersWrapper

from .._conversation import is_message_list
from ._trainer_policy import TrainerModelPolicy

__all__ = [
    "check_pad_is_not_eos",
    "check_policy",
    "check_same_tokenizer",
    "check_same_turn_counts",
    "is_torchrl_transformers_wrapper",
]


def check_same_tokenizer(policy_tokenizer: Any, trainer_tokenizer: Any) -> None:
    """Raises ``ValueError`` unless both tokenizers map the same tokens to the same ids."""
    fields = ("pad_token_id", "eos_token_id")
    mismatch = [
        f"{field}: policy {getattr(policy_tokenizer, field)!r}, trainer "
        f"{getattr(trainer_tokenizer, field)!r}"
        for field in fields
        if getattr(policy_tokenizer, field) != getattr(trainer_tokenizer, field)
    ]
    if len(policy_tokenizer) != len(trainer_tokenizer):
        mismatch.append(
            f"vocabulary size: policy {len(policy_tokenizer)}, trainer {len(trainer_tokenizer)}"
        )
    elif policy_tokenizer.get_vocab() != trainer_tokenizer.get_vocab():
        mismatch.append("vocabulary: same size, different token ids")
    if mismatch:
        raise ValueError(
            "the policy's tokenizer is not the trainer's processing_class ("
            + "; ".join(mismatch)
            + "). The trainer scores the policy's token ids with its own model, so both must "
            "use one tokenizer: build the policy with tokenizer=trainer.processing_class."
        )


def is_torchrl_transformers_wrapper(policy: Any) -> bool:
    """torchrl 0.14.1's own ``TransformersWrapper`` (not ours, whose generate path differs)."""
    return isinstance(policy, TransformersWrapper) and not isinstance(policy, TrainerModelPolicy)


def check_pad_is_not_eos(policy: Any) -> None:
    """torchrl's ``TransformersWrapper`` drops every pad-id token: with pad == eos, the eos."""
    tokenizer = getattr(policy, "tokenizer", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    config_eos = getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)
    eos = config_eos if isinstance(config_eos, (list, tuple)) else [config_eos]
    eos = sorted({getattr(tokenizer, "eos_token_id", None), *eos} - {None})
    if pad is not None and pad in eos:
        raise ValueError(
            "the policy is torchrl's TransformersWrapper and its tokenizer's pad token is an "
            f"eos token (pad_token_id={pad}, eos ids {eos}). torchrl 0.14.1's wrapper tells "
            "padding from tokens by comparing ids with the pad id, so it drops the eos token "
            "an answer ends with: TRL would see every completion as truncated and the policy "
            "would never learn to stop. Leave policy=None (the trainer's model, cut by "
            "lengths and masks), or give the tokenizer a pad token that is not an eos token "
            "(a vLLMWrapper keeps the eos too, for single-turn rollouts)."
        )


def check_same_turn_counts(policy: Any, prompts: list, start: int) -> None:
    """torchrl's ``TransformersWrapper`` cannot extend conversations of different lengths."""
    if not is_torchrl_transformers_wrapper(policy) or not is_message_list(prompts[0]):
        return
    sizes = [len(p) for p in prompts]
    other = next((i for i, n in enumerate(sizes) if n != sizes[0]), None)
    if other is not None:
        raise ValueError(
            f"prompts {start} and {start + other} share an env batch but have {sizes[0]} and "
            f"{sizes[other]} messages. torchrl 0.14.1's TransformersWrapper cannot answer "
            "conversations of different lengths in one batch (it fails with 'zip() argument "
            "... is shorter'). Leave policy=None (the trainer's model answers each row on its "
            "own), use a vLLMWrapper, or make the env's batch_size a divisor of "
            "num_generations (each env batch then holds one prompt's copies)."
        )


def check_policy(policy: Any, max_turns: int, recompute_logprobs: bool | None) -> None:
    """Whether ``policy`` (given as ``policy=``) can run the rollout as asked.

    Raises:
        TypeError: if ``policy`` is not a TensorDict module.
        ValueError: if it returns no log-probs and ``recompute_logprobs=False``, re-tokenizes
            the conversation (``prefer_tokens=False``) with ``max_turns > 1``, samples several
            answers per prompt (``num_samples``), or is torchrl's ``TransformersWrapper`` with a
            tokenizer whose pad token is an eos token.

    Examples:
        >>> check_policy("a policy", 1, None)
        Traceback (most recent call last):
        ...
        TypeError: policy must be a torchrl LLM wrapper (a TensorDictModuleBase, e.g. TransformersWrapper or vLLMWrapper) or None (the trainer's model), got 'a policy' of type str.
    """
    from tensordict.nn import TensorDictModuleBase

    if not isinstance(policy, TensorDictModuleBase):
        raise TypeError(
            "policy must be a torchrl LLM wrapper (a TensorDictModuleBase, e.g. "
            "TransformersWrapper or vLLMWrapper) or None (the trainer's model), got "
            f"{policy!r:.100} of type {type(policy).__name__}."
        )
    if getattr(policy, "return_log_probs", True) is False and recompute_logprobs is False:
        raise ValueError(
            f"the policy {type(policy).__name__} returns no log-probs (return_log_probs=False) "
            "and recompute_logprobs=False; build it with return_log_probs=True or let the "
            "trainer's model score the tokens (recompute_logprobs=True)."
        )
    if max_turns > 1 and getattr(policy, "prefer_tokens", True) is False:
        raise ValueError(
            f"max_turns={max_turns} needs a policy that continues from the rollout's tokens, "
            f"but {type(policy).__name__} has prefer_tokens=False (it would re-tokenize the "
            "conversation, so the trainer would score other tokens than those sampled). Build "
            "it with prefer_tokens=True."
        )
    if getattr(policy, "num_samples", None) not in (None, 1):
        raise ValueError(
            f"the policy samples num_samples={policy.num_samples} answers per prompt; "
            "GRPOTrainer already repeats each prompt num_generations times, so build it with "
            "num_samples=None."
        )
    if is_torchrl_transformers_wrapper(policy):
        check_pad_is_not_eos(policy)


def check_policy_format(policy: Any) -> None:
    """A torchrl LLM policy in history mode prompts in its tokenizer's own chat format.

    torchrl's ``TransformersWrapper`` and ``vLLMWrapper`` render a conversation with a template
    they pick from ``tokenizer.name_or_path`` (ChatML when nothing matches) unless one is named,
    and read the answer back with that family's parser: with most real templates, another format
    than the tokenizer's. A policy whose template is named (``chat_template=``,
    ``chat_template_name=``), or the package's own (which render with the tokenizer's template),
    pass; one whose pick renders a probe conversation otherwise than the tokenizer's template is
    refused.

    Raises:
        ValueError: naming both renders and the fix.

    Examples:
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> from trl.chat_template_utils import llama3_1_chat_template
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_template_tokenizer
        >>> tok = toy_template_tokenizer(llama3_1_chat_template)
        >>> policy = TransformersWrapper(toy_causal_lm(tokenizer=tok), tokenizer=tok,
        ...                              input_mode="history", generate=True)
        >>> check_policy_format(policy)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the policy TransformersWrapper renders conversations with torchrl's ...
    """
    from tensordict import set_list_to_stack
    from torchrl.data.llm import History

    from .._chat_format import ChatFormat

    tokenizer = getattr(policy, "tokenizer", None)
    named = getattr(policy, "chat_template", None) or getattr(policy, "chat_template_name", None)
    if (
        tokenizer is None
        or named
        or getattr(policy, "chat_format", None) is not None  # the package's own policies
        or getattr(policy, "input_mode", None) != "history"
        or not getattr(tokenizer, "chat_template", None)
    ):
        return
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with set_list_to_stack(True):
        probe = History.from_chats([chat])
    own = ChatFormat.of(tokenizer)
    # what the policy renders: torchrl's pick from name_or_path, as its wrapper calls it
    theirs = probe.apply_chat_template(
        tokenizer=tokenizer,
        add_generation_prompt=True,
        chat_template=getattr(policy, "chat_template", None),
        chat_template_name=getattr(policy, "chat_template_name", None),
    )[0]
    ours = own.render([chat], add_generation_prompt=True)[0]
    if theirs != ours:
        raise ValueError(
            f"the policy {type(policy).__name__} renders conversations with torchrl's "
            f"template pick ({theirs[-120:]!r}), not with its tokenizer's own, "
            f"{own.name} ({ours[-120:]!r}): the rollouts would train the model on a format "
            "its template never produces, and torchrl would parse its answers with another "
            "family's parser. Build it with chat_template=tokenizer.chat_template, or use "
            "TrainerModelPolicy(model, tokenizer, generation_config, temperature), which "
            "renders and reads answers with the tokenizer's template."
        )
