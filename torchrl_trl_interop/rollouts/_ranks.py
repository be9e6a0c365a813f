"""The online loop on several ranks: each rank's slice, the generation guard, lockstep.

``GRPOTrainer`` on ``N`` processes (``accelerate launch`` / ``torchrun``: DDP, DeepSpeed ZeRO,
FSDP) draws ``generation_batch_size`` prompts, each repeated ``num_generations`` times, and hands
every rank a contiguous slice of them, in rank order (rank ``r`` holds positions
``r * n .. (r + 1) * n - 1``, TRL's ``process_slice``). A group may be split over ranks: TRL
gathers the rewards of all ranks before it normalises them, so a rank needs no whole group.

Under ZeRO-3 and FSDP every forward of the trainer's model is a collective (the shards are
gathered layer by layer; under ZeRO-3 ``generate`` also all-reduces "finished?" after each
token). Every rank must then call ``generate`` as many times as every other, each call with
``synced_gpus=True``: :class:`Lockstep` keeps a rank whose episodes ended early generating on a
one-token stand-in until the last rank's episodes end, and leaves its rows as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._trainer import distributed_backend, trainer_accelerator, trainer_model, training_args

__all__ = ["Lockstep", "Ranks", "check_prompt_slice", "check_same_calls", "generation_guard"]


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among a trainer's processes.

    ``collective`` is ``True`` when every forward of the trainer's model is a collective: more
    than one process under DeepSpeed ZeRO-3 or FSDP (either version), as ``accelerate``
    configured it or as the model shows it (``fully_shard`` applied by hand: ``accelerate``
    1.16 runs no FSDP on CPU).

    Examples:
        >>> Ranks.of(object())
        Ranks(index=0, count=1, collective=False)
    """

    index: int = 0
    count: int = 1
    collective: bool = False
    accelerator: Any = None  # ``trainer.accelerator``: its ``gather`` works on every backend

    def __repr__(self) -> str:
        return f"Ranks(index={self.index}, count={self.count}, collective={self.collective})"

    @classmethod
    def of(cls, trainer: Any) -> Ranks:
        """The ranks of ``trainer`` (one process when it has no ``accelerator``)."""
        accelerator = trainer_accelerator(trainer)
        count = int(getattr(accelerator, "num_processes", 1) or 1)
        if count == 1:
            return cls(accelerator=accelerator)
        backend = distributed_backend(trainer)
        collective = backend.is_zero3 or backend.is_fsdp or _is_sharded(trainer_model(trainer))
        return cls(int(accelerator.process_index), count, bool(collective), accelerator)

    def gather(self, values: Sequence[int]) -> list[int]:
        """Every rank's ``values`` (the same count on each), in rank order; one collective."""
        if self.count == 1:
            return list(values)
        local = torch.tensor(list(values), dtype=torch.long, device=self.accelerator.device)
        return self.accelerator.gather(local).cpu().tolist()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank; one collective."""
        return bool(max(self.gather([int(flag)])))

    def gather_versions(self, versions: Sequence[int | None]) -> list[int | None]:
        """Every rank's policy versions, in rank order (``None``: a row without one)."""
        if self.count == 1:
            return list(versions)
        every = self.gather([-1 if v is None else v for v in versions])
        return [None if v == -1 else v for v in every]


def _is_sharded(model: Any) -> bool:
    """Whether FSDP (``fully_shard`` or ``FullyShardedDataParallel``) manages part of ``model``."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    kinds = (FSDPModule, FullyShardedDataParallel)
    return isinstance(model, torch.nn.Module) and any(isinstance(m, kinds) for m in model.modules())


def check_prompt_slice(prompts: Any, group: int, ranks: Ranks) -> None:
    """Checks one rank's slice of the prompts: the global count and the groups it holds part of.

    Rank ``r`` of ``N``, given ``n`` prompts, holds positions ``r * n .. (r + 1) * n - 1`` of
    the ``N * n`` prompts of one generation batch. Those must be a multiple of ``group`` (TRL's
    ``num_generations``), and the positions of one group that this rank holds must be one prompt:
    a slice may start or end inside a group.

    Raises:
        TypeError: if ``prompts`` is not a non-empty list.
        ValueError: if the count or the grouping is wrong.

    Examples:
        >>> two = Ranks(index=1, count=2)
        >>> check_prompt_slice(["a", "a"], 4, two)  # rank 1 holds half of group 0
        >>> check_prompt_slice(["a", "b"], 4, two)
        Traceback (most recent call last):
        ...
        ValueError: prompts 0..1 of this rank (positions 2..3 of the 4 prompts of all 2 ranks) are not one prompt repeated num_generations=4 times; GRPOTrainer groups them so.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"expected a non-empty list of prompts, got {type(prompts).__name__}.")
    n, total, offset = len(prompts), len(prompts) * ranks.count, len(prompts) * ranks.index
    if total % group:
        where = "" if ranks.count == 1 else f" on each of {ranks.count} ranks ({total} in all)"
        raise ValueError(
            f"got {n} prompts{where}, not a multiple of num_generations={group}. GRPOTrainer "
            "passes every prompt repeated num_generations times in a row; call the rollout "
            "function the same way."
        )
    start = 0
    while start < n:
        stop = min(n, (offset + start) // group * group + group - offset)
        if any(p != prompts[start] for p in prompts[start:stop]):
            where = (
                ""
                if ranks.count == 1
                else f" of this rank (positions {offset + start}..{offset + stop - 1} of the "
                f"{total} prompts of all {ranks.count} ranks)"
            )
            raise ValueError(
                f"prompts {start}..{stop - 1}{where} are not one prompt repeated "
                f"num_generations={group} times; GRPOTrainer groups them so."
            )
        start = stop


def check_same_calls(ranks: Ranks, counts: dict[str, int]) -> None:
    """Raises on every rank, together, unless all ranks give the same ``counts``.

    Under ZeRO-3 or FSDP a rank that runs more env batches or turns than another waits forever
    for it in a collective; comparing first turns that hang into an error on every rank.
    """
    if not ranks.collective:
        return
    values = ranks.gather(list(counts.values()))
    per_rank = [values[r * len(counts) : (r + 1) * len(counts)] for r in range(ranks.count)]
    if any(row != per_rank[0] for row in per_rank):
        table = "; ".join(
            f"rank {r}: " + ", ".join(f"{k}={v}" for k, v in zip(counts, row))
            for r, row in enumerate(per_rank)
        )
        raise ValueError(
            "under ZeRO-3/FSDP every rank must run the same number of generate calls, but the "
            f"ranks differ ({table}). Build every rank's environment with the same batch_size "
            "and give every rank the same per_device_train_batch_size."
        )


@contextlib.contextmanager
def generation_guard(trainer: Any) -> Iterator[Any]:
    """The trainer's model, ready to generate, as ``GRPOTrainer`` prepares its own generation.

    TRL's ``unwrap_model_for_generation`` (gradient checkpointing off for the call; under
    ZeRO-3 the partitioned parameters gathered when ``ds3_gather_for_generation``) and, under
    FSDP1, ``summon_full_params(recurse=False)``; no gradients. FSDP2 needs nothing: its
    parameters are gathered in every forward, a collective.
    """
    from trl.models import unwrap_model_for_generation

    args = training_args(trainer)
    wrapped = trainer_model(trainer, wrapped=True)
    with (
        unwrap_model_for_generation(
            wrapped,
            trainer_accelerator(trainer),
            gather_deepspeed3_params=getattr(args, "ds3_gather_for_generation", True),
            gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
        ) as model,
        torch.no_grad(),
        distributed_backend(trainer).summon_full_params(wrapped, recurse=False),
    ):
        yield model


class Lockstep:
    """Keeps the ranks' ``generate`` calls in step when each one is a collective.

    Two layouts need it: ZeRO-3/FSDP, where every forward of the trainer's model is a
    collective, and TRL's vLLM shared by several processes (a server, a tensor-parallel group),
    where each ``generate`` gathers every process's prompts
    (:class:`~torchrl_trl_interop.rollouts._vllm.TRLVLLMPolicy`).
    :func:`~torchrl_trl_interop.rollouts._episodes.run_episodes` asks :meth:`any_active` after
    every turn (one all-reduce) and goes on while any rank has a live episode; a rank with none
    calls :meth:`idle` in place of its policy, which changes no row: the policy's own
    ``idle_turn()`` when it has one (vLLM: a generate call with no prompt of its own), else one
    ``generate`` of the model on a one-token stand-in with ``synced_gpus=True``, which takes part
    in every forward of the other ranks' generation.

    Examples:
        >>> class Policy:
        ...     def idle_turn(self):
        ...         print("joined a generate call")
        >>> Lockstep(Ranks(), Policy()).idle()
        joined a generate call
    """

    def __init__(self, ranks: Ranks, policy: Any) -> None:
        self.ranks = ranks
        self.policy = policy
        self.idle_calls = 0

    def any_active(self, active: bool) -> bool:
        return self.ranks.any(active)

    def idle(self) -> None:
        policy = self.policy
        self.idle_calls += 1
        idle_turn = getattr(policy, "idle_turn", None)
        if callable(idle_turn):
            idle_turn()
            return
        token = policy.tokenizer.eos_token_id
        ids = torch.tensor(
            [[0 if token is None else token]], device=next(policy.model.parameters()).device
        )
        policy.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=policy.generate_kwargs["generation_config"],
            synced_gpus=True,
        )
