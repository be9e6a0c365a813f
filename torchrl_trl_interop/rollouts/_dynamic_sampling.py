"""Dynamic sampling: more candidate rollouts per group than the trainer gets, chosen for spread.

A GRPO group whose rewards are all equal has zero advantage on every row: its generation and its
backward pass are wasted (TRL logs the share of such groups as ``frac_reward_zero_std`` and acts
on nothing). Dynamic sampling (DAPO, verl ``filter_groups``, NeMo-RL, torchrl's
``MCAdvantage(candidate_group_size=...)``) samples more candidates per group than it trains on and
keeps those whose rewards differ. Here:

* :func:`select_candidates` is the rule: of a group's candidates, keep the best and the worst
  (by reward) and fill the rest at random; a group with no spread at all keeps its first ones;
* :func:`sample_candidates` runs it inside :func:`~torchrl_trl_interop.as_trl_rollout_func`
  (``candidate_group_size=``): each group's prompt goes ``K`` times through the environment, its
  own reward (``env_reward``) scores the candidates, and the group gets back its rows, in TRL's
  order, each one a candidate as sampled (tokens, log-probs, env mask, everything);
* :class:`~torchrl_trl_interop.TorchRLRolloutWorker` uses the same rule before its queue.

The selection is not uniform: it changes the distribution the policy gradient is estimated on
(as DAPO does, knowingly). What was done is logged: ``rollout/candidates`` (candidates sampled per
group), ``rollout/zero_std_groups_before`` (share of groups whose first candidates, what plain
sampling would have returned, have no reward spread), ``rollout/zero_std_groups_after`` (share
of groups returned without spread) and ``rollout/candidate_reward_mean`` (the mean reward of every
candidate: the policy's own, while TRL's ``reward`` is the mean over the rows kept, biased by the
selection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._checks import check_optional_int, check_present
from ._trainer import group_size, log_metrics, process_slice

__all__ = [
    "CANDIDATES",
    "CANDIDATE_REWARD",
    "DROPPED_ZERO_STD",
    "ENV_REWARD",
    "ZERO_STD_AFTER",
    "ZERO_STD_BEFORE",
    "check_candidate_group_size",
    "group_runs",
    "has_spread",
    "sample_candidates",
    "select_candidates",
    "select_group",
]

#: the rollout function's column the candidates are scored by: the environment's own reward
ENV_REWARD = "env_reward"
#: candidate rollouts sampled per group
CANDIDATES = "rollout/candidates"
#: mean reward of every candidate sampled (the kept rows' mean is biased by the selection)
CANDIDATE_REWARD = "rollout/candidate_reward_mean"
#: share of groups whose first candidates (plain sampling's rows) have no reward spread
ZERO_STD_BEFORE = "rollout/zero_std_groups_before"
#: share of groups returned with no reward spread
ZERO_STD_AFTER = "rollout/zero_std_groups_after"
#: samples the rollout worker dropped for having no reward spread
DROPPED_ZERO_STD = "rollout/dropped_zero_std_total"

_SPREAD_ATOL = 1e-8  # TRL's frac_reward_zero_std: torch.isclose(std, 0) (atol=1e-8)


def check_candidate_group_size(value: Any, *, group_size: int | None = None) -> None:
    """Raises ``ValueError`` unless ``value`` is ``None`` or an int ``>= group_size`` (and ``>= 2``).

    Examples:
        >>> check_candidate_group_size(8, group_size=4)
        >>> check_candidate_group_size(2, group_size=4)
        Traceback (most recent call last):
        ...
        ValueError: candidate_group_size=2 is smaller than num_generations=4; it counts the candidates sampled per group, of which num_generations are kept: pass candidate_group_size >= 4, or None to sample without candidates.
    """
    counts = "candidate rollouts sampled per group"
    check_optional_int(value, "candidate_group_size", minimum=2, counts=counts)
    if value is not None and group_size is not None and value < group_size:
        raise ValueError(
            f"candidate_group_size={value} is smaller than num_generations={group_size}; it "
            "counts the candidates sampled per group, of which num_generations are kept: pass "
            f"candidate_group_size >= {group_size}, or None to sample without candidates."
        )


def has_spread(rewards: Sequence[float | None]) -> bool:
    """Whether the finite rewards differ (TRL's ``frac_reward_zero_std`` counts groups that don't).

    Examples:
        >>> has_spread([1.0, 0.0]), has_spread([1.0, 1.0]), has_spread([1.0, float("nan")])
        (True, False, False)
    """
    scored = finite(rewards)
    return len(scored) >= 2 and max(scored) - min(scored) > _SPREAD_ATOL


def group_runs(n_rows: int, group_size: int, offset: int = 0) -> list[tuple[int, int, int]]:
    """The runs of rows that belong to one group: ``(start, stop, position of start in it)``.

    ``GRPOTrainer`` lays a generation batch out as groups of ``group_size`` identical prompts
    and hands process ``i`` the rows ``[i * n_rows, (i + 1) * n_rows)``, so a process may hold
    the end of one group and the start of another: ``offset`` is its first row's global index.

    Examples:
        >>> group_runs(4, 2)
        [(0, 2, 0), (2, 4, 0)]
        >>> group_runs(3, 4, offset=3)  # process 1 of a batch of 6 rows in groups of 4
        [(0, 1, 3), (1, 3, 0)]
    """
    runs, start = [], 0
    while start < n_rows:
        position = (offset + start) % group_size
        stop = min(n_rows, start + group_size - position)
        runs.append((start, stop, position))
        start = stop
    return runs


def finite(rewards: Sequence[float | None]) -> list[float]:
    """The rewards that score a row: not ``None``, not NaN.

    Examples:
        >>> finite([1.0, None, float("nan"), 0.0])
        [1.0, 0.0]
    """
    return [r for r in rewards if _scores(r)]


def _scores(reward: float | None) -> bool:
    return reward is not None and math.isfinite(reward)


def candidates_for(keep: int, group_size: int, candidate_group_size: int) -> int:
    """Candidates sampled for ``keep`` rows of a group: ``candidate_group_size`` per whole group.

    Examples:
        >>> candidates_for(4, 4, 8), candidates_for(2, 4, 8), candidates_for(1, 2, 3)
        (8, 4, 2)
    """
    return -(-keep * candidate_group_size // group_size)


def select_candidates(
    rewards: Sequence[float | None],
    keep: int,
    *,
    position: int = 0,
    group_size: int | None = None,
) -> list[int]:
    """Which ``keep`` of a group's candidates to return, in ascending order, keeping the spread.

    With a spread (two finite rewards that differ), the rows keep the first candidate with the
    highest reward and the first with the lowest, and the others are drawn uniformly at random
    (torch's generator) from the remaining candidates. Without a spread, the first ``keep``
    candidates (they are samples alike). A single row (a process holding one row of a group
    split across processes, at ``position`` in a group of ``group_size``) keeps the best candidate
    in the first half of the group and the worst in the second, so the group's rows on different
    processes still differ when their candidates do. NaN or ``None`` rewards are never the best
    or the worst.

    Args:
        rewards (sequence of float): one reward per candidate.
        keep (int): how many to return, at most ``len(rewards)``.

    Keyword Args:
        position (int, optional): the first kept row's position in its group. Defaults to ``0``.
        group_size (int, optional): the group's size. Defaults to ``keep``.

    Returns:
        ``keep`` candidate indices, ascending.

    Examples:
        >>> select_candidates([0.0, 0.0, 1.0, 0.0], 2)
        [0, 2]
        >>> select_candidates([1.0, 1.0, 1.0], 2)  # no spread: the first ones
        [0, 1]
        >>> select_candidates([0.0, 1.0], 1, position=1, group_size=2)  # second half: the worst
        [0]
    """
    if not 0 < keep <= len(rewards):
        raise ValueError(f"select_candidates cannot keep {keep} of {len(rewards)} candidates.")
    if not has_spread(rewards):
        return list(range(keep))
    scored = [i for i, r in enumerate(rewards) if _scores(r)]
    best = max(scored, key=lambda i: rewards[i])
    worst = min(scored, key=lambda i: rewards[i])
    if keep == 1:
        group_size = keep if group_size is None else group_size
        return [best if 2 * position < group_size else worst]
    rest = [i for i in range(len(rewards)) if i not in (best, worst)]
    fill = [rest[int(i)] for i in torch.randperm(len(rest))[: keep - 2]]
    return sorted([best, worst, *fill])


def select_group(
    rewards: Sequence[float], keep: int, drop_zero_std: bool = False
) -> tuple[list[int], dict[str, Any]]:
    """The worker's filter: the kept candidates (none: dropped) and the group's metrics.

    Shares and the candidates' mean reward are ``(numerator, denominator)`` rates, as
    ``AsyncGRPOTrainer`` reduces them.

    Examples:
        >>> kept, metrics = select_group([1.0, 1.0, 1.0], 2, drop_zero_std=True)
        >>> kept, metrics["rollout/zero_std_groups_after"], metrics["rollout/dropped_zero_std_total"]
        ([], (1.0, 1.0), 2.0)
    """
    kept = select_candidates(rewards, keep)
    flat = not has_spread([rewards[i] for i in kept])
    scored = finite(rewards)
    metrics: dict[str, Any] = {
        CANDIDATES: float(len(rewards)),
        ZERO_STD_BEFORE: (float(not has_spread(rewards[:keep])), 1.0),
        ZERO_STD_AFTER: (float(flat), 1.0),
        CANDIDATE_REWARD: (float(sum(scored)), float(len(scored))),
    }
    if flat and drop_zero_std:
        metrics[DROPPED_ZERO_STD] = float(len(kept))
        kept = []
    return kept, metrics


def sample_candidates(
    rollout: Callable[[list, Any], dict[str, list]],
    prompts: list,
    trainer: Any,
    *,
    candidate_group_size: int,
    env_batch_size: int,
) -> dict[str, list]:
    """``rollout`` over each group's prompt ``candidate_group_size`` times; the kept rows.

    The groups are the runs of this process's rows that share a group of ``GRPOTrainer``'s
    generation batch (:func:`group_runs`): a run of ``n`` rows of a group of ``G`` samples
    ``ceil(n * K / G)`` candidates (``K`` for a whole group) and keeps ``n``
    (:func:`select_candidates`), scored by the environment's reward (``env_reward``). Every
    column of ``rollout``'s output is kept row for row: a kept row is its candidate as sampled.

    Raises:
        ValueError: if ``candidate_group_size`` is smaller than the group size, the candidates
            are not a multiple of ``env_batch_size``, or the environment wrote no reward.
    """
    group = group_size(trainer)
    check_candidate_group_size(candidate_group_size, group_size=group)
    offset = process_slice(trainer, len(prompts)).start
    runs = group_runs(len(prompts), group, offset)
    counts = [candidates_for(stop - start, group, candidate_group_size) for start, stop, _ in runs]
    if sum(counts) % env_batch_size:
        raise ValueError(
            f"candidate_group_size={candidate_group_size} makes {sum(counts)} candidate "
            f"rollouts for the {len(prompts)} prompts of this call ({len(runs)} groups of "
            f"num_generations={group}), which the environment, of batch_size "
            f"({env_batch_size},), cannot run in whole batches. Make the candidates a multiple "
            "of the env's batch size: candidate_group_size x groups per call (for a whole "
            "group, candidate_group_size itself) divisible by it, or an env batch size that "
            "divides it."
        )
    candidate_prompts = [prompts[start] for (start, _, _), n in zip(runs, counts) for _ in range(n)]
    out = rollout(candidate_prompts, trainer)
    rewards = out[ENV_REWARD]
    check_present(
        rewards,
        ValueError,
        lambda rows: (
            f"candidate_group_size={candidate_group_size} scores candidates by the environment's "
            f"reward, but the environment wrote none for candidates {rows} (env_reward is None). "
            "Append a reward transform to the environment (e.g. RewardTransform(reward_func)), "
            "check reward_key=, or drop candidate_group_size."
        ),
    )
    kept: list[int] = []
    metrics: dict[str, list[float]] = {
        CANDIDATES: [],
        ZERO_STD_BEFORE: [],
        ZERO_STD_AFTER: [],
        CANDIDATE_REWARD: [],
    }
    first = 0
    for (start, stop, position), count in zip(runs, counts):
        scores = rewards[first : first + count]
        chosen = select_candidates(scores, stop - start, position=position, group_size=group)
        kept.extend(first + i for i in chosen)
        metrics[CANDIDATES].append(float(count))
        metrics[ZERO_STD_BEFORE].append(float(not has_spread(scores[: stop - start])))
        metrics[ZERO_STD_AFTER].append(float(not has_spread([scores[i] for i in chosen])))
        scored = finite(scores)
        if scored:
            metrics[CANDIDATE_REWARD].append(sum(scored) / len(scored))
        first += count
    log_metrics(trainer, metrics)
    return {key: [values[i] for i in kept] for key, values in out.items()}
