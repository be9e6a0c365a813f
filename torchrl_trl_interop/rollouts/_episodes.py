"""TorchRL chat-environment episodes, one per prompt, each as one token sequence (token-first).

:func:`run_episodes` resets a ``ChatEnv`` with a batch of prompts, lets a torchrl LLM policy
answer, steps the environment and repeats. Each episode becomes a :class:`RolloutRow`: the first
prompt's token ids, then the completion: the policy's tokens exactly as sampled and, between two
turns, the tokens the environment added. From the second turn on the policy is given those very
tokens (``("tokens", "prompt")``, read with ``prefer_tokens=True``), so ``prompt + completion``
is what the model saw and produced; nothing is re-tokenized.

Every token comes from one chat format (:class:`~torchrl_trl_interop._chat_format.ChatFormat`:
the tokenizer's own template, or the one the caller names): the first prompt is the template's
rendering of the conversation (``apply_chat_template(..., add_generation_prompt=True)``, given to
the policy as tokens; the package's own policy renders it itself, with the same format), each
answer is read back with the template's own markers (its turn ends at a stop token), and the
environment's tokens are what the template writes after the answer: the rest of the answer's
closing, the environment's turns and the next generation prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, set_list_to_stack
from tensordict.utils import NestedKey

from .._chat_format import ChatFormat
from .._conversation import history_to_messages, is_message_list, messages_to_history
from .._keys import POLICY_VERSION_KEY, key_parts, placeholder_turn, without_placeholders
from .._padding import pad_rows, position_mask
from .._upstream._env_step import reset, step, step_mdp
from ._policy_output import PolicyKeys, extend_history, read_policy_rows, stack_rows
from ._tools import env_transforms, tool_transforms

__all__ = ["REWARDED_KEY", "RolloutRow", "env_reply_roles", "find_env_problem", "run_episodes"]

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
    last_answer: list[int] = field(default_factory=list)  # the policy's last turn, as sampled

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


def env_reply_roles(env: Any) -> list[str]:
    """The roles of the turns ``env`` may add between two answers: its tool transforms'
    ``tool_role`` (torchrl's default ``"tool"``); an environment without one may reply as
    anything, as the user most often (``OpenEnvChatEnv``), or add nothing (a bare ``ChatEnv``).
    An environment may say it itself (``env.reply_roles``).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_chat_env
        >>> env_reply_roles(toy_chat_env(reply=True)), env_reply_roles(toy_chat_env())
        (['tool'], ['user'])
    """
    own = getattr(getattr(env, "base_env", env), "reply_roles", None)
    if own is not None:
        return list(own)
    roles = [getattr(t, "tool_role", "tool") or "tool" for t in tool_transforms(env)]
    return list(dict.fromkeys(roles)) or ["user"]


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

    def __init__(self, env, policy, tokenizer, read_logprobs, chat, stop_ids) -> None:
        self.env = env
        self.policy = policy
        self.tokenizer = tokenizer
        self.read_logprobs = read_logprobs
        self.chat = chat
        self.stop_ids = stop_ids
        self.keys = PolicyKeys.of(policy)
        #: the policy reads the prompt tokens it is given (torchrl's ``prefer_tokens=True``)
        self.takes_tokens = bool(getattr(policy, "prefer_tokens", False))
        #: the policy renders conversations and reads answers with this very chat format (the
        #: package's own policy): its first prompt is this format's rendering, its answers are
        #: this format's reading
        self.parses_answers = getattr(policy, "chat_format", None) is chat

    def reset(self, prompts: list) -> Any:
        base = getattr(self.env, "base_env", self.env)
        if is_message_list(prompts[0]):
            query = messages_to_history(_same_length(prompts))
        else:
            query = NonTensorStack(*prompts)
        return reset(self.env, TensorDict({base.data_key: query}, batch_size=self.env.batch_size))

    def _renders_first_prompt(self, td: Any) -> bool:
        """Whether the policy renders the first prompt itself, as this chat format renders it
        (the package's own policy, given no tokens: a reset that wrote some gets them
        replaced), so that it need not be rendered here and handed over as tokens."""
        return self.parses_answers and self.keys.prompt_tokens not in td.keys(True)

    def _give_tokens(self, td: Any, sequences: list[list[int]]) -> None:
        """The prompt tokens the policy continues from, left-padded as torchrl's wrappers read
        them; a policy that reads it also gets the mask that tells the real tokens (the pad id
        may be an eos id the rows hold)."""
        tensors = [torch.tensor(s, dtype=torch.long) for s in sequences]
        lengths = torch.tensor([len(s) for s in sequences])
        pad = getattr(self.policy, "padding_value", None)
        pad = self.tokenizer.pad_token_id if pad is None else pad
        td.set(self.keys.prompt_tokens, pad_rows(tensors, pad, padding_side="left"))
        if getattr(self.policy, "reads_prompt_mask", False):
            td.set(self.keys.attention_mask, position_mask(lengths, int(lengths.max()), "left"))
        elif self.keys.attention_mask in td.keys(True):  # the last turn's, over its answer too
            del td[self.keys.attention_mask]

    def policy_step(self, td: Any, rows: list[RolloutRow], turn: int) -> Any:
        rendered = None
        if turn == 0 and not self._renders_first_prompt(td):  # the chat format's rendering
            rendered = self.chat.prompt_ids(_to_messages(td.get(self.keys.prompt_history)))
            if self.takes_tokens:
                self._give_tokens(td, rendered)
        elif turn > 0:  # token-first: the policy continues from exactly the rollout's tokens
            self._give_tokens(td, [r.prompt_ids + r.completion_ids for r in rows])
        td = self.policy(td)
        out = read_policy_rows(td, self.keys, log_probs=self.read_logprobs)
        if rendered is not None and not self.takes_tokens:
            self._check_own_render(out.prompts, rendered)
        if not self.parses_answers:
            td = self._answered(td, out.prompts, out.responses)
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
                    f"at turn {turn} the policy conditioned on {len(ids)} tokens for rollout "
                    f"{i}, the rollout holds {len(expected)} (first difference at {at}). "
                    "Multi-turn rollouts need a token-first policy (prefer_tokens=True) that "
                    f"continues from the {self.keys.prompt_tokens!r} it is given, as they are. "
                    "torchrl 0.14.1's own wrappers strip every pad id from that prompt: with "
                    "them, the pad token must not be an eos token (the default policy reads "
                    f"the {self.keys.attention_mask!r} given beside the tokens instead)."
                )
            row.extend(out.responses[i], None if out.log_probs is None else out.log_probs[i], False)
            row.last_answer = list(out.responses[i])
            row.history = conversations[i]
        return td

    def _check_own_render(self, prompts: list[list[int]], rendered: list[list[int]]) -> None:
        """A policy that renders the conversation itself must render what the chat format does."""
        for i, (ids, expected) in enumerate(zip(prompts, rendered)):
            if ids != expected:
                own = self.tokenizer.decode(ids, skip_special_tokens=False)
                raise ValueError(
                    f"the policy {type(self.policy).__name__} prompted rollout {i} with "
                    f"{own[-200:]!r}, not with {self.chat.name}'s rendering of the "
                    f"conversation ({self.tokenizer.decode(expected)[-200:]!r}): it renders "
                    "with another chat template (torchrl's LLM wrappers pick one from "
                    "tokenizer.name_or_path unless one is named). Build it with "
                    "prefer_tokens=True (it then reads the rollout's tokens) or with "
                    "chat_template=tokenizer.chat_template."
                )

    def _answered(self, td: Any, prompts: list[list[int]], responses: list[list[int]]) -> Any:
        """``td`` with each row's answer read from its tokens with the chat format (its content
        up to the stop token), as the conversation's next assistant turn: what the environment
        steps with, whatever template the policy's own parser assumed."""
        from torchrl.modules.llm import ChatHistory

        rows = list(td.get(self.keys.prompt_history).unbind(0))
        answers = self.chat.answer_turns(responses, self.stop_ids, prompt_ids=prompts)
        full = [extend_history(p, a) for p, a in zip(rows, answers)]
        chat = stack_rows(ChatHistory, prompt=rows, response=answers, full=full)
        td.set(key_parts(self.keys.full_history)[:-1], chat)
        return td

    def env_tokens(self, td: Any, rows: list[RolloutRow]) -> None:
        """Appends, per active row, the tokens the environment added before the next turn: what
        the chat template writes after the row's last answer (the rest of its closing, the
        environment's turns, the next generation prompt), tokenized as the template's text."""
        active = [i for i, r in enumerate(rows) if r.active]
        if not active:
            return
        conversations = _to_messages(td.get(self.keys.prompt_history))
        added = self.chat.added_after(
            [conversations[i] for i in active],
            [len(rows[i].history) - 1 for i in active],  # the answer: the last turn it holds
            [rows[i].last_answer for i in active],
            self.stop_ids,
        )
        for i, row_ids in zip(active, self.chat.encode(added)):
            rows[i].extend(row_ids, None, True)


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
    chat: ChatFormat | None = None,
    stop_ids: Sequence[int] = (),
) -> list[RolloutRow]:
    """Runs ``len(prompts) == env.batch_size[0]`` episodes of at most ``max_turns`` policy turns.

    An episode stops when ``done_key`` is set after a step or after ``max_turns`` turns. Rewards at
    ``reward_key`` are summed over its turns, except those of steps whose ``"rewarded"`` entry
    beside it is False (no reward given: ``OpenEnvChatEnv``); never rewarded, ``None``.
    ``read_logprobs=False`` leaves the policy's tokens at log-prob 0.0, to be scored afterwards.

    ``chat`` renders every token (defaults to the tokenizer's own template); ``stop_ids`` are
    the ids that end an answer besides the tokenizer's eos and the template's end of turn (the
    generation config's eos list).

    With a ``lockstep`` (a :class:`~torchrl_trl_interop.rollouts._ranks.Lockstep`: several
    ranks whose every forward is a collective), the turns go on while any rank has a live
    episode; a rank whose episodes all ended idles through the others' turns
    (``lockstep.idle()``) without touching its rows or its environment.

    Raises:
        KeyError: if ``read_logprobs`` and the policy writes no ``("log_probs", "response")``.
        RuntimeError: if, from the second turn, the policy did not continue from the given tokens.
        ValueError: if the policy's attention mask does not span a row's prompt and response, a
            policy rendering its prompt itself renders another one, or the chat template cannot
            render a conversation.
    """
    chat = ChatFormat.of(tokenizer) if chat is None else chat
    episodes = _Episodes(env, policy, tokenizer, read_logprobs, chat, list(stop_ids))
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
                episodes.env_tokens(td, rows)
    return rows
