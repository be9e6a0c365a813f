"""Preference pairs from scored rollouts: best vs worst completion of each prompt.

TorchRL's ``LLMCollector`` yields rollouts, not preference labels. :func:`build_preference_pairs`
constructs the pairs TRL's ``RewardTrainer`` and ``DPOTrainer`` train on from rollouts that hold
several scored completions per prompt, and writes them to a replay buffer.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.utils import NestedKey
from torchrl.data import LazyStackStorage, ReplayBuffer

from .._checks import as_names, boundary, check_real, type_error
from .._conversation import row_values, split_completion
from .._keys import HISTORY_KEY, REWARD_KEY, get_entry, key_parts
from ._columns import as_column_key
from ._processes import check_replay_buffer
from ._rows import extend_with_rows

__all__ = ["build_preference_pairs"]


def _hashable(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _read_messages(td: TensorDictBase, key: NestedKey, where: str) -> list:
    """One message list per element of ``td``'s batch, flattened in row-major order."""
    from torchrl.data.llm import History

    hint = "Pass history_key=... (TorchRL's LLM wrappers write ('history', 'full'))."
    history = get_entry(td, key_parts(key), "history_key", hint, where)
    if not isinstance(history, History):
        raise TypeError(
            f"{where}[{key!r}] is a {type(history).__name__}, expected a "
            "torchrl.data.llm.History (one conversation per rollout)."
        )
    return row_values(td, key, "history_key")


def _read_rewards(td: TensorDictBase, key: NestedKey, where: str) -> list[float]:
    hint = (
        "Score the rollouts first (e.g. with HFRewardModelWrapper or TRLRewardFuncWrapper) or "
        "pass reward_key=...."
    )
    reward = get_entry(td, key_parts(key), "reward_key", hint, where)
    if not isinstance(reward, torch.Tensor):
        raise TypeError(
            f"{where}[{key!r}] is a {type(reward).__name__}, expected a float tensor with one "
            "reward per rollout."
        )
    if reward.shape[: td.ndim] != td.batch_size or reward[(0,) * td.ndim].numel() != 1:
        raise ValueError(
            f"{where}[{key!r}] has shape {tuple(reward.shape)}; expected one reward per "
            f"rollout, shape {tuple(td.batch_size)} (trailing 1s allowed)."
        )
    values = reward.reshape(-1).double()
    infinite = values.isinf().nonzero().flatten()
    if infinite.numel():
        raise ValueError(
            f"{where}[{key!r}] holds {infinite.numel()} infinite reward(s) (flattened indices "
            f"{infinite[:8].tolist()}), which would give pairs of infinite margin. Fix the "
            "scorer (HFRewardModelWrapper raises on them by default), or write NaN for "
            "rollouts that should be left out."
        )
    return values.tolist()


def _read_group_ids(td: TensorDictBase, key: NestedKey, where: str) -> list[Hashable]:
    get_entry(td, key_parts(key), "group_key", "Pass group_key=... naming the group ids.", where)
    return [_hashable(v) for v in row_values(td, key, "group_key")]


def _as_list(rollouts: Any) -> list[TensorDictBase]:
    if isinstance(rollouts, ReplayBuffer):
        if len(rollouts) == 0:
            return []
        rollouts = rollouts[:]
    if isinstance(rollouts, TensorDictBase):
        return [rollouts]
    if isinstance(rollouts, Sequence) and all(isinstance(td, TensorDictBase) for td in rollouts):
        return list(rollouts)
    expected = (
        "a TensorDict, a list of TensorDicts (e.g. the batches an LLMCollector yielded) or a "
        "ReplayBuffer of rollouts"
    )
    raise type_error("rollouts", expected, rollouts)


def _group_rollouts(
    tds: list[TensorDictBase],
    *,
    single: bool,
    history_key: NestedKey,
    reward_key: NestedKey,
    group_key: NestedKey | None,
    completion_roles: tuple[str, ...],
) -> dict[Hashable, list[tuple[list, list, float]]]:
    """Groups ``(prompt, completion, reward)`` records by group id, in rollout order."""
    groups: dict[Hashable, list[tuple[list, list, float]]] = {}
    for t, td in enumerate(tds):
        where = "rollouts" if single else f"rollouts[{t}]"
        if td.ndim == 0:
            raise ValueError(
                f"{where} has batch_size=[] (a single rollout); pairs need several completions "
                "per prompt, e.g. batch size [N] or [prompts, completions]."
            )
        messages = _read_messages(td, history_key, where)
        rewards = _read_rewards(td, reward_key, where)
        if group_key is not None:
            ids: list[Hashable] = _read_group_ids(td, group_key, where)
        elif td.ndim >= 2:
            size = td.batch_size[-1]
            ids = [(t, i // size) for i in range(len(messages))]
        else:
            ids = [None] * len(messages)  # grouped by prompt below
        for i, (conversation, reward, gid) in enumerate(zip(messages, rewards, ids)):
            prompt, completion = split_completion(
                conversation, completion_roles, f"rollout {i} of {where}: "
            )
            if gid is None:
                gid = ("prompt", _hashable(prompt))
            group = groups.setdefault(gid, [])
            if group and group[0][0] != prompt:
                raise ValueError(
                    f"rollout {i} of {where} is in the same group as earlier rollouts but has "
                    f"a different prompt ({prompt!r:.120} vs {group[0][0]!r:.120}). Group by "
                    "prompt (group_key=None on [N] rollouts) or fix group_key."
                )
            group.append((prompt, completion, reward))

    return groups


@boundary("build_preference_pairs")
def build_preference_pairs(
    rollouts: TensorDictBase | Sequence[TensorDictBase] | ReplayBuffer,
    *,
    history_key: NestedKey = HISTORY_KEY,
    reward_key: NestedKey = REWARD_KEY,
    group_key: NestedKey | None = None,
    completion_roles: Sequence[str] = ("assistant",),
    min_margin: float = 0.0,
    prompt_key: NestedKey | None = "prompt",
    chosen_key: NestedKey = "chosen",
    rejected_key: NestedKey = "rejected",
    margin_key: NestedKey | None = "margin",
    replay_buffer: ReplayBuffer | None = None,
) -> ReplayBuffer:
    """Turns scored rollouts into preference pairs (best vs worst completion of each prompt).

    Each rollout is a full conversation (a :class:`~torchrl.data.llm.History` at ``history_key``)
    with a scalar reward at ``reward_key``. It is split into a prompt (every turn before the
    trailing ``completion_roles`` turns) and a completion (those trailing turns). Rollouts are
    grouped by prompt; each group gives at most one pair:

    * ``chosen`` = the completion with the highest reward, ``rejected`` = the one with the lowest
      (on equal rewards, the first in rollout order);
    * ``margin`` = reward gap ``chosen - rejected`` (RewardTrainer adds it to its loss).

    Groups that carry no preference are skipped, never guessed: a group with a single completion,
    a tie (best reward equals worst, i.e. gap ``0``), a gap below ``min_margin``, or the same
    completion as chosen and rejected. ``NaN`` rewards (unscored rollouts) are left out of their
    group first; an infinite reward raises (as :class:`HFRewardModelWrapper` does by default),
    and so do two finite rewards whose gap overflows (``1e308 - -1e308``): a margin is finite.

    Grouping: by default the last batch dimension is the group (``[E, G]`` rollouts: ``E``
    prompts, ``G`` completions each, as GRPO-style collection writes them), and a ``[N]`` batch is
    grouped by identical prompt conversation. ``group_key`` groups by the value stored there
    instead (a prompt id, a string, a History). Within a group every prompt must be the same.

    Rows are written in the order groups first appear, as TRL's conversational preference
    format with an explicit prompt:

    .. code-block:: text

        prompt    History [Tp]   system/user/... turns        (omitted if prompt_key=None)
        chosen    History [Tc]   best completion turns         (prompt + completion if implicit)
        rejected  History [Tr]   worst completion turns
        margin    float64 []     reward gap > 0               (omitted if margin_key=None)

    so ``TorchRLBufferDataset(buffer, ...).to_hf_dataset()`` is accepted as-is by
    ``RewardTrainer`` and ``DPOTrainer``.

    Args:
        rollouts (TensorDict, list of TensorDict or ReplayBuffer): scored rollouts with batch
            size ``[N]`` or ``[..., G]``; a list (e.g. collector batches) is read batch by batch,
            a replay buffer is read in full (``rb[:]``).

    Keyword Args:
        history_key (NestedKey, optional): the full conversation of each rollout. Defaults to
            ``("history", "full")``.
        reward_key (NestedKey, optional): one reward per rollout (trailing singleton dims are
            allowed). Defaults to ``"reward"``.
        group_key (NestedKey, optional): groups rollouts by this value instead of by batch
            dimension/prompt. Defaults to ``None``.
        completion_roles (sequence of str, optional): roles of the completion turns. Defaults to
            ``("assistant",)``.
        min_margin (float, optional): groups whose reward gap is below it are skipped. Exact
            ties are always skipped. Defaults to ``0.0``.
        prompt_key (NestedKey or None, optional): where the prompt History is written; ``None``
            writes TRL's implicit-prompt format (chosen/rejected hold the full conversations).
            Defaults to ``"prompt"``.
        chosen_key (NestedKey, optional): Defaults to ``"chosen"``.
        rejected_key (NestedKey, optional): Defaults to ``"rejected"``.
        margin_key (NestedKey or None, optional): where the reward gap is written; ``None``
            leaves it out. Defaults to ``"margin"``.
        replay_buffer (ReplayBuffer, optional): a buffer to extend (one that keeps per-row
            History, e.g. over ``LazyStackStorage`` or ``ListStorage``). Defaults to a new
            ``ReplayBuffer(storage=LazyStackStorage(number of pairs))``.

    Returns:
        the replay buffer holding the pairs (empty if no group carried a preference).

    Raises:
        TypeError: if ``rollouts`` is not a TensorDict/list/ReplayBuffer, ``replay_buffer`` is
            not a ReplayBuffer, or the history or reward has the wrong type.
        KeyError: if ``history_key``, ``reward_key`` or ``group_key`` is missing.
        ValueError: if rollouts have no batch dimension, the reward shape does not match the
            batch, a reward is infinite, two rewards of a group are so far apart that their gap
            (the margin) overflows to infinity while ``margin_key`` is set, a conversation has
            no completion turn, completions of one group have different prompts, a prompt is
            empty while ``prompt_key`` is set, or ``min_margin < 0``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_trl_interop import messages_to_history
        >>> def chat(q, a):
        ...     return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        >>> rollouts = TensorDict({
        ...     "history": {"full": messages_to_history([[chat("2+2?", "4"), chat("2+2?", "5")],
        ...                                              [chat("Hi", "Hey"), chat("Hi", "Hey")]])},
        ...     "reward": torch.tensor([[1.0, -1.0], [0.5, 0.5]]),
        ... }, batch_size=[2, 2])
        >>> rb = build_preference_pairs(rollouts)  # the second prompt is a tie: skipped
        >>> len(rb)
        1
        >>> from torchrl_trl_interop import TorchRLBufferDataset
        >>> row = TorchRLBufferDataset(rb, batch_size=1).to_hf_dataset()[0]
        >>> row["prompt"], row["margin"]
        ([{'role': 'user', 'content': '2+2?'}], 2.0)
        >>> row["chosen"], row["rejected"]
        ([{'role': 'assistant', 'content': '4'}], [{'role': 'assistant', 'content': '5'}])
    """
    min_margin = check_real(min_margin, "min_margin", finite=False)
    if math.isnan(min_margin) or min_margin < 0:
        raise ValueError(f"min_margin must be a float >= 0, got {min_margin!r}.")
    if replay_buffer is not None:
        check_replay_buffer(replay_buffer)
    completion_roles = as_names(completion_roles, "completion_roles")
    history_key = as_column_key(history_key, "history_key")
    reward_key = as_column_key(reward_key, "reward_key")
    group_key = None if group_key is None else as_column_key(group_key, "group_key")
    rename = {"chosen": as_column_key(chosen_key, "chosen_key")}
    rename["rejected"] = as_column_key(rejected_key, "rejected_key")
    if prompt_key is not None:
        rename["prompt"] = as_column_key(prompt_key, "prompt_key")
    if margin_key is not None:
        rename["margin"] = as_column_key(margin_key, "margin_key")

    # 1. Flat records (group id, prompt, completion, reward), in rollout order.
    with set_list_to_stack(True):  # reading History needs it; scoped, never global
        groups = _group_rollouts(
            _as_list(rollouts),
            single=isinstance(rollouts, (TensorDictBase, ReplayBuffer)),
            history_key=history_key,
            reward_key=reward_key,
            group_key=group_key,
            completion_roles=completion_roles,
        )
    # 2. One pair per group that carries a preference.
    rows = []
    for group in groups.values():
        scored = [entry for entry in group if not math.isnan(entry[2])]
        if len(scored) < 2:
            continue
        best = max(range(len(scored)), key=lambda j: (scored[j][2], -j))
        worst = min(range(len(scored)), key=lambda j: (scored[j][2], j))
        prompt, chosen, best_reward = scored[best]
        _, rejected, worst_reward = scored[worst]
        margin = best_reward - worst_reward
        if margin <= 0 or margin < min_margin or chosen == rejected:
            continue
        if margin_key is not None and not math.isfinite(margin):
            raise ValueError(
                f"the rewards {best_reward!r} and {worst_reward!r} of the completions of "
                f"prompt {prompt!r:.120} are too far apart: their gap overflows float64, so "
                "the pair's margin would be infinite, which RewardTrainer trains on. Rescale "
                "the rewards, or pass margin_key=None to write no margin."
            )
        if prompt_key is not None and not prompt:
            raise ValueError(
                f"a rollout has no prompt turns (the conversation is only {completion_roles} "
                "turns), so the prompt column would be empty. Pass prompt_key=None to write "
                "full conversations (TRL's implicit-prompt format)."
            )
        row: dict[str, Any] = {}
        if prompt_key is not None:
            row["prompt"] = prompt
            row["chosen"], row["rejected"] = chosen, rejected
        else:
            row["chosen"], row["rejected"] = prompt + chosen, prompt + rejected
        if margin_key is not None:
            row["margin"] = margin
        rows.append(row)

    # 3. Write them.
    if replay_buffer is None:
        replay_buffer = ReplayBuffer(storage=LazyStackStorage(max_size=max(len(rows), 1)))
    if rows:
        extend_with_rows(replay_buffer, rows, rename=rename)
    return replay_buffer
