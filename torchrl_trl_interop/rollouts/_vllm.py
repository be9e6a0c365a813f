"""Generating through TRL's own vLLM: ``GRPOConfig(use_vllm=True)`` with ``as_trl_rollout_func``.

With ``use_vllm=True`` ``GRPOTrainer`` starts its vLLM backend (``trainer.vllm_generation``: a
client of a ``trl vllm-serve`` server, or a colocated engine), pushes the trainer's weights into
it before the first rollout-function call of each step, and corrects the returned ``logprobs``
by importance sampling (TIS/MIS). :func:`vllm_policy` gives the rollout function a policy that
generates every turn through that backend (:class:`TRLVLLMPolicy`: TRL's
``VLLMGeneration.generate`` on the turn's prompt tokens, one completion each, vLLM's own
log-probs), so the rows get TRL's weight sync and correction; where that cannot hold, it raises
instead of letting another model generate.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._checks import signed
from ._trainer import (
    sampling_temperature,
    trainer_generation_config,
    trainer_tokenizer,
    unwrapped_model,
    vllm_backend,
)
from ._trainer_policy import TrainerModelPolicy

__all__ = ["TRLVLLMPolicy", "vllm_policy"]

_POLICIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> its policy


class TRLVLLMPolicy(TrainerModelPolicy):
    """A :class:`~torchrl_trl_interop.TrainerModelPolicy` that samples through TRL's vLLM.

    Prompts are read and answers parsed as the parent does (torchrl's history layout); each
    turn's prompt tokens go to ``vllm_generation.generate(prompts, images=None,
    num_generations=1)`` (TRL 1.16's ``VLLMGeneration``: the server or the colocated engine,
    with the trainer's sampling arguments), and each answer keeps the log-probs vLLM returned
    for its sampled tokens, which ``GRPOTrainer`` uses as the sampling log-probs of its
    importance-sampling correction. ``model`` only places the prompts (it never generates).

    Args:
        vllm_generation: the trainer's ``vllm_generation``.
        model (PreTrainedModel): the trainer's model, unwrapped.
        tokenizer (PreTrainedTokenizerBase): the trainer's tokenizer.
        generation_config (GenerationConfig): the trainer's (its eos ids end an answer).
        temperature (float): the trainer's.
    """

    def __init__(
        self,
        vllm_generation: Any,
        model: Any,
        tokenizer: Any,
        generation_config: Any,
        temperature: float,
    ) -> None:
        super().__init__(model, tokenizer, generation_config, temperature)
        self.vllm_generation = vllm_generation

    def _sample(
        self, prompts: list[torch.Tensor], config: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        _, completions, logprobs, _ = self.vllm_generation.generate(
            prompts=[p.tolist() for p in prompts], images=None, num_generations=1
        )
        responses = [torch.tensor(ids, dtype=torch.long) for ids in completions]
        # vLLM gives per token the top-k log-probs, the sampled token's first
        scores = [torch.tensor([lp[0] for lp in row], dtype=torch.float32) for row in logprobs]
        return responses, scores


def vllm_policy(
    trainer: Any,
    policy: Any,
    recompute_logprobs: bool,
    max_turns: int,
    processes: int,
) -> TRLVLLMPolicy | None:
    """The policy that generates through the trainer's vLLM; ``None`` when it uses none.

    Raises:
        ValueError: if ``use_vllm=True`` meets a ``policy`` of the user's (TRL would sync and
            correct for an engine that does not generate the rows) or ``recompute_logprobs=True``
            (the trainer's log-probs would replace the sampler's that the correction needs), or
            several processes share a server (or a tensor-parallel group) with ``max_turns > 1``
            (TRL's generate gathers every process's prompts: turn counts would differ).
        RuntimeError: if the trainer says ``use_vllm`` but holds no vLLM backend.

    Examples:
        >>> from types import SimpleNamespace
        >>> vllm_policy(SimpleNamespace(use_vllm=False), None, False, 1, 1) is None
        True
    """
    backend = vllm_backend(trainer)
    if backend is None:
        return None
    generation, mode = backend
    if policy is not None:
        raise ValueError(
            signed(
                "GRPOConfig(use_vllm=True) makes GRPOTrainer sync its vLLM engine every step and "
                f"correct the rows' log-probs as vLLM's, but policy={type(policy).__name__} "
                "generates them. Leave policy=None to generate through TRL's vLLM, or set "
                "use_vllm=False to generate with your policy (a torchrl vLLMWrapper keeps its own "
                "weight sync: WeightSyncCallback(VLLMWeightSender))."
            )
        )
    if recompute_logprobs:
        raise ValueError(
            signed(
                "recompute_logprobs=True with use_vllm=True replaces vLLM's sampling log-probs "
                "with the trainer's, which voids TRL's importance-sampling correction; leave it "
                "None."
            )
        )
    if not callable(getattr(generation, "generate", None)):
        raise RuntimeError(
            signed(
                "the trainer has use_vllm=True but no vLLM backend (trainer.vllm_generation is "
                f"{type(generation).__name__}); build the trainer with GRPOConfig(use_vllm=True) "
                "and vLLM installed."
            )
        )
    gathers = mode == "server" or getattr(generation, "tensor_parallel_size", 1) > 1
    if processes > 1 and gathers and max_turns > 1:
        raise ValueError(
            signed(
                f"with {processes} processes and vllm_mode={mode!r}, TRL's vLLM generate gathers "
                "every process's prompts in each call, so every process must call it as often and "
                f"with as many prompts; max_turns={max_turns} episodes end at different turns. Use "
                "max_turns=1, vllm_mode='colocate' with tensor_parallel_size=1, or a generator of "
                "your own (RayRemotePolicy, a vLLMWrapper) with use_vllm=False."
            )
        )
    model = unwrapped_model(trainer)
    tokenizer = trainer_tokenizer(trainer)
    policy = _POLICIES.get(generation)
    if policy is None or policy.model is not model:
        config = trainer_generation_config(trainer, tokenizer)
        policy = TRLVLLMPolicy(generation, model, tokenizer, config, sampling_temperature(trainer))
        _POLICIES[generation] = policy
    return policy
