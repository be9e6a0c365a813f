"""Generating through TRL's own vLLM: ``GRPOConfig(use_vllm=True)`` with ``as_trl_rollout_func``.

With ``use_vllm=True`` ``GRPOTrainer`` starts its vLLM backend (``trainer.vllm_generation``: a
client of a ``trl vllm-serve`` server, or a colocated engine), pushes the trainer's weights into
it before the first rollout-function call of each step, and corrects the returned ``logprobs``
by importance sampling (TIS/MIS). :func:`vllm_policy` gives the rollout function a policy that
generates every turn through that backend (:class:`TRLVLLMPolicy`: TRL's
``VLLMGeneration.generate`` on the turn's prompt tokens, one completion each, vLLM's own
log-probs), so the rows get TRL's weight sync and correction; where that cannot hold, it raises
instead of letting another model generate.

**Several processes on one server (or one tensor-parallel group).** TRL's ``generate`` then
gathers every process's prompts into one call (``vllm_mode="server"``: to the main process,
which asks the server; a tensor-parallel group: to every rank of the group) and hands each
process back the slice at ``process_index * len(prompts)``: every process must call it as often,
and (TRL 1.16 slices by this process's own count) with as many prompts. Multi-turn episodes end
at different turns on different processes, so the turns run in lockstep
(:class:`~torchrl_trl_interop.rollouts._ranks.Lockstep`): after each turn the processes agree
whether any episode is still running anywhere; a process whose episodes have all ended joins
each generate call without prompts of its own until every process is done, as TRL's own tool
loop needs. Before each call the processes share their prompt counts (one collective), and one
holding fewer fills up with one-token prompts whose answers it drops.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._ranks import Lockstep, Ranks
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

    Attributes:
        ranks (Ranks or None): the processes whose prompts TRL's ``generate`` gathers into one
            call (several processes on a server or a tensor-parallel group); ``None``: this
            process's calls are its own.
        idle_calls (int): the generate calls this process joined with no prompt of its own.
    """

    ranks: Ranks | None = None
    idle_calls = 0

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
        ids = [p.tolist() for p in prompts]
        if self.ranks is not None:  # TRL slices every process's answers by its own count
            width = max(self.ranks.gather([len(ids)]))
            token = self.tokenizer.eos_token_id
            ids += [[0 if token is None else token]] * (width - len(ids))
        _, completions, logprobs, _ = self.vllm_generation.generate(
            prompts=ids, images=None, num_generations=1
        )
        mine = len(prompts)  # the fillers' answers are dropped
        responses = [torch.tensor(row, dtype=torch.long) for row in completions[:mine]]
        # vLLM gives per token the top-k log-probs, the sampled token's first
        scores = [
            torch.tensor([lp[0] for lp in row], dtype=torch.float32) for row in logprobs[:mine]
        ]
        return responses, scores

    def idle_turn(self) -> None:
        """Joins one generate call of the other processes with no prompt of its own (one-token
        fillers, as many as the others hold), when this process's episodes have all ended."""
        self._sample([], None)
        self.idle_calls += 1

    def lockstep(self) -> Lockstep | None:
        """The lockstep this policy's turns need: one when TRL's ``generate`` gathers several
        processes' prompts into each call, else ``None``."""
        return None if self.ranks is None else Lockstep(self.ranks, self)


def vllm_policy(
    trainer: Any, policy: Any, recompute_logprobs: bool, ranks: Ranks
) -> TRLVLLMPolicy | None:
    """The policy that generates through the trainer's vLLM; ``None`` when it uses none.

    On several processes sharing a server (or a tensor-parallel group) its :attr:`ranks` are
    set: its turns then go in lockstep (:meth:`TRLVLLMPolicy.lockstep`).

    Raises:
        ValueError: if ``use_vllm=True`` meets a ``policy`` of the user's (TRL would sync and
            correct for an engine that does not generate the rows) or ``recompute_logprobs=True``
            (the trainer's log-probs would replace the sampler's that the correction needs).
        RuntimeError: if the trainer says ``use_vllm`` but holds no vLLM backend.

    Examples:
        >>> from types import SimpleNamespace
        >>> vllm_policy(SimpleNamespace(use_vllm=False), None, False, Ranks()) is None
        True
    """
    backend = vllm_backend(trainer)
    if backend is None:
        return None
    generation, mode = backend
    if policy is not None:
        raise ValueError(
            "GRPOConfig(use_vllm=True) makes GRPOTrainer sync its vLLM engine every step and "
            f"correct the rows' log-probs as vLLM's, but policy={type(policy).__name__} "
            "generates them. Leave policy=None to generate through TRL's vLLM, or set "
            "use_vllm=False to generate with your policy (a torchrl vLLMWrapper keeps its own "
            "weight sync: WeightSyncCallback(VLLMWeightSender))."
        )
    if recompute_logprobs:
        raise ValueError(
            "recompute_logprobs=True with use_vllm=True replaces vLLM's sampling log-probs "
            "with the trainer's, which voids TRL's importance-sampling correction; leave it "
            "None."
        )
    if not callable(getattr(generation, "generate", None)):
        raise RuntimeError(
            "the trainer has use_vllm=True but no vLLM backend (trainer.vllm_generation is "
            f"{type(generation).__name__}); build the trainer with GRPOConfig(use_vllm=True) "
            "and vLLM installed."
        )
    model = unwrapped_model(trainer)
    tokenizer = trainer_tokenizer(trainer)
    policy = _POLICIES.get(generation)
    if policy is None or policy.model is not model:
        config = trainer_generation_config(trainer, tokenizer)
        policy = TRLVLLMPolicy(generation, model, tokenizer, config, sampling_temperature(trainer))
        _POLICIES[generation] = policy
    gathers = mode == "server" or getattr(generation, "tensor_parallel_size", 1) > 1
    policy.ranks = ranks if gathers and ranks.count > 1 else None
    return policy
