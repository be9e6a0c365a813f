"""TorchRL chat-environment episodes, one per prompt, each as one token sequence (token-first).

:func:`run_episodes` resets a ``ChatEnv`` with a batch of prompts, lets a torchrl LLM policy
answer, steps the environment and repeats. Each episode becomes a :class:`RolloutRow`: the first
prompt's token ids, then the completion: the policy's tokens exactly as sampled and, between two
turns, the tokens the environment added. From the second turn on the policy is given those very
tokens (``("tokens", "prompt")``, read with ``prefer_tokens=True``), so ``prompt + completion``
is what the model saw and produced; nothing is re-tokenized.

The environment's tokens are the text its next prompt adds to the conversation (rendered with the
policy's chat template), preceded by the template's close of the assistant turn (ChatML:
``<|im_end|>\\n``, less an eos token the policy already generated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, set_list_to_stack
from tensordict.utils import NestedKey

from .._checks import signed
from .._conversation import history_to_messages, is_message_list, messages_to_history
from .._keys import POLICY_VERSION_KEY, placeholder_turn, without_placeholders
from .._padding import pad_rows, position_mask
from .._upstream._env_step import reset, step, step_mdp
from ._policy_output import PolicyKeys, read_policy_rows
from ._render import render, turn_closing
from ._tools import env_transforms

__all__ = ["REWARDED_KEY", "RolloutRow", "find_env_problem", "run_episodes"]

#: torchrl's placeholder turn, which fills a batch of conversations to one length
#: beside a step's reward, whether the environment gave one (``OpenEnvChatEnv`` writes it: an
#: OpenEnv step's reward may be ``None``); a step without one adds nothing to ``env_reward``
REWARDED_KEY = "rewarded"


@dataclass
class RolloutRow:
    """One episode: prompt ids, completion ids with per-token log-probs and env mask, and more.

    ``env_mask`` is 1 on the policy's tokens and 0 on the environment's (whose ``logprobs`` are
    0.0); ``history`` is the conversation as TRL messages up to the last policy turn;
    ``env_reward`` the sum of the environment's rewards, ``None`` if it wrote none;
    ``policy_version`` the oldest ``"policy_version"`` the policy (or a torchrl ``PolicyVersion``
    transform) stamped on the rollout's turns, ``None`` if none was.
    """

    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    env_reward: float | None = None
    policy_version: int | None = None
    active: bool = True

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None, from_env: bool) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else logprobs)
        self.env_mask.extend([0 if from_env else 1] * len(ids))


def find_env_problem(env: Any, *, own_prompts: bool = False) -> tuple[type[Exception], str] | None:
    """Why ``env`` cannot take a prompt at reset, as ``(exception type, reason)``, or ``None``.

    ``own_prompts=True`` accepts an environment that serves its own prompts (a
    ``DataLoadingPrimer``), as TRL's ``environment_factory`` allows.

    Examples:
        >>> from torchrl.envs import PendulumEnv
        >>> from torchrl.envs.llm import ChatEnv
        >>> find_env_problem(ChatEnv(batch_size=(2,), input_mode="history")) is None
        True
        >>> find_env_problem(PendulumEnv())[0]
        <class 'TypeError'>
    """
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    base = getattr(env, "base_env", env)
    if not hasattr(base, "data_key") or not hasattr(base, "input_mode"):
        return TypeError, (
            f"its base environment is a {type(base).__name__}, which reads no prompt at reset; "
            "use a torchrl.envs.llm.ChatEnv (or a TransformedEnv around one)"
        )
    if base.input_mode != "history":
        return ValueError, (
            f"its ChatEnv has input_mode={base.input_mode!r}; the rollout reads the conversation "
            "as History: build it with input_mode='history'"
        )
    if len(env.batch_size) != 1:
        return ValueError, f"its batch_size is {tuple(env.batch_size)}; one dimension is expected"
    for t in [] if own_prompts else env_transforms(env):
        if isinstance(t, DataLoadingPrimer):
            return ValueError, (
                "it holds a DataLoadingPrimer, which replaces the prompt at every reset with one "
                "from its own dataloader; the trainer's dataset serves the prompts here: drop it"
            )
    return None


def _to_messages(history: Any) -> list[list[dict[str, Any]]]:
    """Each conversation of ``history`` (``[B, T]``) as TRL messages, converted in one pass.

    Tool calls are kept, torchrl's ``<none>`` padding dropped.

    Examples:
        >>> from tensordict import lazy_stack, set_list_to_stack
        >>> from torchrl.data.llm import History
        >>> call = {"name": "add", "arguments": {"a": 2, "b": 2}}
        >>> with set_list_to_stack(True):
        ...     history = lazy_stack([History(role="assistant", content="", tool_calls=[call]),
        ...                           History(role="tool", content="4", tool_calls=[])])
        ...     batch = lazy_stack([history, history])
        >>> _to_messages(batch)[1][1]
        {'role': 'tool', 'content': '4', 'name': 'add'}
        >>> _to_messages(batch)[0][0]["tool_calls"]
        [{'type': 'function', 'function': {'name': 'add', 'arguments': {'a': 2, 'b': 2}}}]
    """
    return [without_placeholders(chat) for chat in history_to_messages(history)]


def _same_length(conversations: list[list[dict]]) -> list[list[dict]]:
    """Conversations filled to one length with torchrl's placeholder turn (``"<none>"``).

    torchrl's tool transforms extend a batch of conversations along the turn dimension, which a
    ragged batch cannot do; chat templates and :func:`_to_messages` skip the placeholder.

    Examples:
        >>> _same_length([[{"role": "user", "content": "Hi"}], [{"role": "system", "content": "S"},
        ...               {"role": "user", "content": "Ho"}]])[0]
        [{'role': 'user', 'content': 'Hi'}, {'role': '<none>', 'content': ''}]
    """
    width = max(len(c) for c in conversations)
    return [list(c) + [placeholder_turn() for _ in range(width - len(c))] for c in conversations]


class _Episodes:
    """One batch of episodes in flight (``env.batch_size`` of them)."""

    def __init__(self, env, policy, tokenizer, read_logprobs) -> None:
        self.env = env
        self.policy = policy
        self.tokenizer = tokenizer
        self.read_logprobs = read_logprobs
        self.keys = PolicyKeys.of(policy)

    def reset(self, prompts: list) -> Any:
        base = getattr(self.env, "base_env", self.env)
        if is_message_list(prompts[0]):
            query = messages_to_history(_same_length(prompts))
        else:
            query = NonTensorStack(*prompts)
        return reset(self.env, TensorDict({base.data_key: query}, batch_size=self.env.batch_size))

    def policy_step(self, td: Any, rows: list[RolloutRow], turn: int) -> Any:
        if turn > 0:  # token-first: the policy continues from exactly the rollout's tokens
            sequences = [torch.tensor(r.prompt_ids + r.completion_ids) for r in rows]
            lengths = torch.tensor([len(s) for s in sequences])
            pad = getattr(self.policy, "padding_value", None)
            pad = self.tokenizer.pad_token_id if pad is None else pad
            # left-padded, as torchrl's wrappers read prompts; a policy that reads it also gets
            # the mask that tells the real tokens (the pad id may be an eos id the rows hold)
            td.set(self.keys.prompt_tokens, pad_rows(sequences, pad, padding_side="left"))
            if getattr(self.policy, "reads_prompt_mask", False):
                mask = position_mask(lengths, int(lengths.max()), "left")
                td.set(self.keys.attention_mask, mask)
        td = self.policy(td)
        out = read_policy_rows(td, self.keys, log_probs=self.read_logprobs)
        conversations = _to_messages(td.get(self.keys.full_history))  # before tools extend it
        versions = td.get(POLICY_VERSION_KEY, None)
        if isinstance(versions, torch.Tensor):
            versions = versions.reshape(len(rows), -1)[:, 0].tolist()
        for i, row in enumerate(rows):
            if not row.active:
                continue
            if versions is not None:
                seen = row.policy_version
                row.policy_version = int(versions[i]) if seen is None else min(seen, versions[i])
            ids = out.prompts[i]
            expected = row.prompt_ids + row.completion_ids
            if turn == 0:
                row.prompt_ids = ids
            elif ids != expected:
                at = next((k for k, (a, b) in enumerate(zip(ids, expected)) if a != b), None)
                raise RuntimeError(
                    signed(
                        f"at turn {turn} the policy conditioned on {len(ids)} tokens for rollout "
                        f"{i}, the rollout holds {len(expected)} (first difference at {at}). "
                        "Multi-turn rollouts need a token-first policy (prefer_tokens=True) that "
                        f"continues from the {self.keys.prompt_tokens!r} it is given, as they are. "
                        "torchrl 0.14.1's own wrappers strip every pad id from that prompt: with "
                        "them, the pad token must not be an eos token (the default policy reads "
                        f"the {self.keys.attention_mask!r} given beside the tokens instead)."
                    )
                )
            row.extend(out.responses[i], None if out.log_probs is None else out.log_probs[i], False)
            row.history = conversations[i]
        return td

    def env_tokens(self, td: Any, rows: list[RolloutRow], answered: list[str], turn: int) -> None:
        """Appends, per active row, the tokens the environment added before the next turn.

        ``answered`` is each conversation rendered up to the turn just taken, before the step
        (tool transforms extend that History in place). Parsed answers are not compared with the
        sampled text: torchrl strips whitespace from them.
        """
        texts = render(
            td.get(self.keys.prompt_history),
            self.policy,
            self.tokenizer,
            add_generation_prompt=True,
        )
        closing = turn_closing(self.policy, self.tokenizer)
        added = {}  # per active row, the text the environment added
        for i, row in enumerate(rows):
            if not row.active:
                continue
            if not texts[i].startswith(answered[i]):
                raise ValueError(
                    signed(
                        f"after turn {turn} the chat template renders rollout {i}'s next prompt "
                        f"({texts[i][-200:]!r}) as text that does not extend the conversation so "
                        f"far ({answered[i][-200:]!r}). Multi-turn rollouts need a template that "
                        "renders earlier turns unchanged (templates that drop past reasoning do "
                        "not); use max_turns=1 or such a template."
                    )
                )
            close = closing
            last = row.completion_ids[-1] if row.completion_ids else None
            if last in self.tokenizer.all_special_ids:
                eos_text = self.tokenizer.decode([last], skip_special_tokens=False)
                if close.startswith(eos_text):
                    close = close[len(eos_text) :]
            added[i] = close + texts[i][len(answered[i]) :]
        if added:  # tokenized in one call
            ids = self.tokenizer(list(added.values()), add_special_tokens=False)["input_ids"]
            for i, row_ids in zip(added, ids):
                rows[i].extend(list(row_ids), None, True)


def _add_rewards(rows: list[RolloutRow], td: Any, reward_key: NestedKey) -> None:
    """Adds each active row's step reward to its ``env_reward``: a step whose ``rewarded`` entry
    (beside ``reward_key``) is False gave none and adds nothing, so an episode never rewarded
    keeps ``None``."""
    reward = td.get(reward_key, None)
    if reward is None:
        return
    key = (reward_key,) if isinstance(reward_key, str) else tuple(reward_key)
    given = td.get((*key[:-1], REWARDED_KEY), None)
    given = [True] * len(rows) if given is None else given.reshape(len(rows), -1).any(-1).tolist()
    values = reward.reshape(len(rows), -1).sum(-1).tolist()
    for row, value, rewarded in zip(rows, values, given):
        if row.active and rewarded:
            row.env_reward = (row.env_reward or 0.0) + float(value)


def run_episodes(
    env: Any,
    policy: Any,
    prompts: list,
    tokenizer: Any,
    *,
    max_turns: int,
    read_logprobs: bool,
    reward_key: NestedKey,
    done_key: NestedKey,
    lockstep: Any = None,
) -> list[RolloutRow]:
    """Runs ``len(prompts) == env.batch_size[0]`` episodes of at most ``max_turns`` policy turns.

    An episode stops when ``done_key`` is set after a step or after ``max_turns`` turns. Rewards at
    ``reward_key`` are summed over its turns, except those of steps whose ``"rewarded"`` entry
    beside it is False (no reward given: ``OpenEnvChatEnv``); never rewarded, ``None``. ``read_logprobs=False`` leaves the policy's tokens
    at log-prob 0.0, to be scored afterwards.

    With a ``lockstep`` (a :class:`~torchrl_trl_interop.rollouts._ranks.Lockstep`: several
    ranks whose every forward is a collective), the turns go on while any rank has a live
    episode; a rank whose episodes all ended idles through the others' turns
    (``lockstep.idle()``) without touching its rows or its environment.

    Raises:
        KeyError: if ``read_logprobs`` and the policy writes no ``("log_probs", "response")``.
        RuntimeError: if, from the second turn, the policy did not continue from the given tokens.
        ValueError: if the policy's attention mask does not span a row's prompt and response, or
            the chat template does not render the next prompt as an extension of the
            conversation so far.
    """
    episodes = _Episodes(env, policy, tokenizer, read_logprobs)
    rows = [RolloutRow() for _ in prompts]
    with set_list_to_stack(True), torch.no_grad():
        td = episodes.reset(prompts)
        for turn in range(max_turns):
            last_turn = turn == max_turns - 1
            if not any(r.active for r in rows):  # only with a lockstep: others still run
                lockstep.idle()
                if last_turn or not lockstep.any_active(False):
                    break
                continue
            td = episodes.policy_step(td, rows, turn)
            if not last_turn:
                full = td.get(episodes.keys.full_history)
                answered = render(full, policy, tokenizer, add_generation_prompt=False)
            td = step(env, td)
            _add_rewards(rows, td, reward_key)
            done = td.get(done_key, None)
            if done is not None:
                for row, d in zip(rows, done.reshape(len(rows), -1).any(-1).tolist()):
                    row.active = row.active and not d
            active = any(r.active for r in rows)
            if lockstep is not None and not last_turn:
                active_anywhere = lockstep.any_active(active)
            else:
                active_anywhere = active
            if last_turn or not active_anywhere:
                break
            if active:
                td = step_mdp(env, td)
                episodes.env_tokens(td, rows, answered, turn)
    return rows
