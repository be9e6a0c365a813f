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
from torchrl.modules.llm import TransformersWrapper

__all__ = [
    "TrainerModelPolicy",
    "check_same_tokenizer",
    "score_tokens",
    "trainer_generation_config",
    "trainer_tokenizer",
]


class TrainerModelPolicy(TransformersWrapper):
    """A history-mode ``TransformersWrapper`` that samples as a TRL trainer does and scores right.

    Two changes to torchrl 0.14.1's wrapper, both in its generate path:

    * log-probs: the wrapper writes 0.0 for the first response token (``_log_probs_generate``
      sets ``[:, 0] = 0``) and scores the raw logits; here every token is scored, on
      ``logits / temperature``, as ``GRPOTrainer`` scores it.
    * generation: the wrapper keeps only the generation arguments it knows (``min_p``,
      ``suppress_tokens``, ``cache_implementation``... are dropped silently); here the whole
      ``generation_config`` reaches ``model.generate``.

    The model object is wrapped, not copied: the policy always samples with its current weights.
    It reads ``("tokens", "prompt")`` when present (``prefer_tokens=True``) to continue a
    multi-turn rollout from exactly its tokens.

    Args:
        model (PreTrainedModel): the causal LM (for a trainer:
            ``trainer.accelerator.unwrap_model(trainer.model)``).
        tokenizer (PreTrainedTokenizerBase): its tokenizer.
        generation_config (GenerationConfig): how to sample (for a trainer:
            :func:`trainer_generation_config`). Written with ``output_logits=True`` and
            ``return_dict_in_generate=True``, which the wrapper needs.
        temperature (float): the logits are divided by it before scoring.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from transformers import GenerationConfig
        >>> from torchrl.envs.llm import ChatEnv
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> tok = toy_tokenizer()
        >>> config = GenerationConfig(max_new_tokens=4, do_sample=True, pad_token_id=0, eos_token_id=2)
        >>> policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, temperature=1.0)
        >>> env = ChatEnv(batch_size=(1,), tokenizer=tok, input_mode="history")
        >>> td = policy(env.reset(TensorDict({"query": ["Hi"]}, batch_size=[1])))
        >>> log_probs = td.get(("log_probs", "response"), as_list=True)[0]
        >>> bool(log_probs[0] < 0)  # torchrl 0.14.1's own wrapper writes 0.0 here
        True
    """

    def __init__(
        self, model: Any, tokenizer: Any, generation_config: Any, temperature: float
    ) -> None:
        super().__init__(
            model,
            tokenizer=tokenizer,
            input_mode="history",
            generate=True,
            return_log_probs=True,
            pad_output=False,
            prefer_tokens=True,
            device=next(model.parameters()).device,  # prompts go where the model is
        )
        self.temperature = float(temperature)
        generation_config.output_logits = True
        generation_config.return_dict_in_generate = True
        self.generate_kwargs = {"generation_config": generation_config}

    def _log_probs_generate(self, tokens, logits, pad_val=-100, pad: bool = True):
        if pad:
            tokens = torch.nn.utils.rnn.pad_sequence(
                tokens, padding_value=pad_val, batch_first=True, padding_side="left"
            )
            logits = torch.nn.utils.rnn.pad_sequence(
                logits, padding_value=0.0, batch_first=True, padding_side="left"
            )
        scaled = logits.float() / self.temperature
        index = tokens.clamp_min(0).unsqueeze(-1)
        log_probs = scaled.log_softmax(-1).gather(-1, index).squeeze(-1)
        return log_probs.masked_fill(tokens == -100, 0.0), logits


def trainer_tokenizer(trainer: Any) -> Any:
    """The trainer's tokenizer (a processor's ``.tokenizer`` for multimodal processing classes)."""
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    return getattr(tokenizer, "tokenizer", tokenizer)


def trainer_generation_config(trainer: Any, tokenizer: Any, *, model: Any = None) -> Any:
    """A copy of the ``GenerationConfig`` a TRL trainer generates with, pad suppressed.

    ``GRPOTrainer`` builds it from ``max_completion_length``, ``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``repetition_penalty``, ``cache_implementation`` and
    ``generation_kwargs`` (vLLM trainers build none: it is made from the same arguments). The pad
    token is added to ``suppress_tokens`` when it is not an eos token: torchrl's wrapper strips
    every pad id from responses and token prompts, so a sampled pad token would vanish.

    ``trainer`` may also be the trainer's ``GRPOConfig``, before the trainer exists (a generator
    in another process is built before the trainer whose rollout function uses it): the config is
    then made as ``GRPOTrainer`` makes it for a text model, the eos ids being the tokenizer's and
    those ``model.generation_config`` declares.

    Examples:
        >>> from trl import GRPOConfig
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> args = GRPOConfig("out", max_completion_length=8, temperature=0.7, bf16=False)
        >>> config = trainer_generation_config(args, toy_tokenizer())
        >>> config.max_new_tokens, config.temperature, config.suppress_tokens
        (8, 0.7, [0])
    """
    from transformers import TrainingArguments

    if isinstance(trainer, TrainingArguments):
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if tokenizer.eos_token_id not in eos:
            eos = [tokenizer.eos_token_id, *eos]
        config = _generation_config(trainer, tokenizer, eos)
    elif getattr(trainer, "generation_config", None) is not None:
        config = copy.deepcopy(trainer.generation_config)
    else:
        config = _generation_config(trainer.args, tokenizer, list(trainer.eos_token_ids))
    eos = config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = tokenizer.pad_token_id
    if pad is not None and pad not in eos:
        config.suppress_tokens = sorted(set(config.suppress_tokens or []) | {pad})
    return config


def _generation_config(args: Any, tokenizer: Any, eos_token_ids: list[int]) -> Any:
    """``GRPOTrainer``'s ``GenerationConfig`` for a text model (TRL 1.16, ``__init__``)."""
    from transformers import GenerationConfig

    kwargs = {
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_token_ids,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
        **(args.generation_kwargs or {}),
    }
    return GenerationConfig(**kwargs, disable_compile=True)


def check_same_tokenizer(policy_tokenizer: Any, trainer_tokenizer: Any, owner: str) -> None:
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
            f"{owner}: the policy's tokenizer is not the trainer's processing_class ("
            + "; ".join(mismatch)
            + "). The trainer scores the policy's token ids with its own model, so both must "
            "use one tokenizer: build the policy with tokenizer=trainer.processing_class."
        )


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
