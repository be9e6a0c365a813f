"""Sessions and the recording rule: an episode's calls as token trajectories, every call in a
torchrl ``ReplayBuffer``.

A session is one episode: every call made through one session URL
(``http://HOST:PORT/sessions/<id>/v1``). The rule that turns its calls into training rows:

* **A call that continues an earlier one extends its trajectory.** A chat call continues an
  earlier answer when its messages start with that call's messages and then the answer as the
  endpoint returned it (tool-call ids aside), with the same tools; a completion call, when its
  prompt's token ids start with the earlier call's prompt and answer. The policy is then
  prompted with the trajectory's own tokens (the earlier prompt, the answer exactly as
  sampled) followed by what the chat template writes after that answer (its closing, the new
  messages, the next generation prompt:
  :meth:`~torchrl_trl_interop._chat_format.ChatFormat.added_after`), so the row is what the
  model saw and wrote. Those in-between tokens are not the model's: ``env_mask`` 0, log-prob 0.
* **Anything else starts a new segment.** A harness that rewrites its history (drops, edits or
  summarizes earlier turns, changes the tools, or writes an answer otherwise than returned) is
  prompted with the template's rendering of its messages, and that call starts a new
  trajectory. An episode's row is its last trajectory (the one holding its last answer); the
  earlier segments stay in the buffer and are counted (``agent_segments``).

Each call (each choice) is added to the buffer as one TensorDict in torchrl's LLM layout: the
conversation (``("history", "full")``: the call's messages and its answer), the call's prompt,
answer and whole trajectory (``("tokens", "prompt" | "response" | "full")``), the answer's
log-probs and the trajectory's (``("log_probs", "response" | "full")``, 0.0 where not the
model's), which trajectory tokens the model wrote (``("masks", "all_assistant_mask")``), the
``policy_version`` (-1 when not known), and ``session``, ``segment``, ``call``, ``choice``,
``finish_reason``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict

from .._chat_format import ChatFormat
from .._conversation import messages_to_history
from .._keys import (
    ASSISTANT_MASK_KEY,
    FULL_LOG_PROBS_KEY,
    HISTORY_KEY,
    POLICY_VERSION_KEY,
    PROMPT_TOKEN_KEY,
    RESPONSE_LOG_PROBS_KEY,
    RESPONSE_TOKEN_KEY,
    TOKEN_KEY,
)
from ._answers import Answer

__all__ = ["Plan", "Sessions", "Trajectory"]

#: the answers of a session a later call may continue (the most recent ones)
MAX_HEADS = 64


@dataclass(frozen=True)
class Trajectory:
    """One segment of an episode as one token sequence, the way TRL's rollout rows hold it.

    ``prompt_ids`` prompted its first call; ``completion_ids`` is everything after: each answer
    as sampled (``env_mask`` 1, its log-probs) and, between two answers, what the chat template
    added (``env_mask`` 0, log-prob 0.0). ``messages`` is the conversation up to its last
    answer; ``versions`` the policy version of each call (``None`` where not known).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    env_mask: tuple[int, ...] = ()
    messages: tuple[dict[str, Any], ...] = ()
    versions: tuple[int | None, ...] = ()
    segment: int = 0

    @property
    def full_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.completion_ids

    @property
    def calls(self) -> int:
        return len(self.versions)

    @property
    def policy_version(self) -> int | None:
        """The oldest version of its calls (``None`` if one is not known)."""
        if not self.versions or any(v is None for v in self.versions):
            return None
        return min(self.versions)

    def answered(
        self, added: Sequence[int], answer: Answer, messages: list, version: int | None
    ) -> Trajectory:
        """This trajectory, then ``added`` (not the model's), then ``answer`` (the model's)."""
        added, ids = tuple(added), tuple(answer.ids)
        return replace(
            self,
            completion_ids=self.completion_ids + added + ids,
            logprobs=self.logprobs + (0.0,) * len(added) + tuple(answer.logprobs),
            env_mask=self.env_mask + (0,) * len(added) + (1,) * len(ids),
            messages=tuple(messages),
            versions=(*self.versions, version),
        )


@dataclass
class _Head:
    """An answer a later call may continue: the call's message keys and the returned answer's
    (``None`` for a completion call), its tools, its conversation in template form, the ids of
    the answer and the trajectory it ended."""

    keys: list[str] | None
    tools_key: str | None
    messages: list[dict[str, Any]]
    tools: list | None
    answer_ids: list[int]
    trajectory: Trajectory


@dataclass
class _Session:
    heads: deque = field(default_factory=lambda: deque(maxlen=MAX_HEADS))
    calls: int = 0
    segments: int = 0
    last: Trajectory | None = None


@dataclass
class Plan:
    """How one call is prompted: the ids, and the trajectory it extends (``None``: a new
    segment) with the ids the template added after that trajectory's answer."""

    session: str
    prompt_ids: list[int]
    base: Trajectory | None = None
    added: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    keys: list[str] | None = None
    tools: list | None = None
    tools_key: str | None = None
    call: int = 0
    segment: int = 0


class Sessions:
    """Every session's trajectories, and the buffer each call is recorded in.

    Args:
        buffer (ReplayBuffer): where each call is added (see the module's docstring).
    """

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def _get(self, session: str) -> _Session:
        return self._sessions.setdefault(session, _Session())

    # -- prompting: the recording rule ------------------------------------------------------------

    def plan_chat(
        self,
        session: str,
        messages: list[dict[str, Any]],
        keys: list[str],
        tools: list | None,
        tools_key: str,
        chat: ChatFormat,
        stop_ids: Sequence[int],
    ) -> Plan:
        """The prompt of a chat call: the continued trajectory's tokens and what the template
        adds after its answer, or the template's rendering of ``messages`` (a new segment)."""
        with self._lock:
            state = self._get(session)
            head = next(
                (
                    h
                    for h in reversed(state.heads)
                    if h.keys is not None
                    and h.tools_key == tools_key
                    and len(keys) >= len(h.keys)
                    and keys[: len(h.keys)] == h.keys
                ),
                None,
            )
        plan = Plan(session, [], messages=messages, keys=keys, tools=tools, tools_key=tools_key)
        if head is None:
            plan.prompt_ids = chat.prompt_ids([messages], tools=tools)[0]
            return plan
        at = len(head.messages) - 1  # the answer
        conversation = head.messages + messages[len(head.keys) :]
        [text] = chat.added_after([conversation], [at], [head.answer_ids], stop_ids, tools=tools)
        plan.added = chat.encode([text])[0]
        plan.base = head.trajectory
        plan.prompt_ids = list(head.trajectory.full_ids) + plan.added
        return plan

    def plan_tokens(self, session: str, prompt_ids: list[int]) -> Plan:
        """The prompt of a completion call: its own ids; it continues the trajectory whose
        tokens its ids start with (the rest is not the model's)."""
        with self._lock:
            state = self._get(session)
            head = next(
                (
                    h
                    for h in reversed(state.heads)
                    if len(prompt_ids) >= len(h.trajectory.full_ids)
                    and tuple(prompt_ids[: len(h.trajectory.full_ids)]) == h.trajectory.full_ids
                ),
                None,
            )
        plan = Plan(session, list(prompt_ids))
        if head is not None:
            plan.base = head.trajectory
            plan.added = list(prompt_ids[len(head.trajectory.full_ids) :])
        return plan

    # -- recording ------------------------------------------------------------------------------

    def record(
        self,
        plan: Plan,
        answers: Sequence[Answer],
        returned_keys: Sequence[str | None],
        versions: Sequence[int | None],
        prompt_text: str | None = None,
    ) -> None:
        """Records one call's choices: each extends the plan's trajectory (or starts one), may
        be continued by a later call, and is added to the buffer. The first choice is the
        session's last trajectory."""
        with self._lock:
            state = self._get(plan.session)
            plan.call = state.calls
            state.calls += 1
            if plan.base is None:
                plan.segment = state.segments
                state.segments += 1
            else:
                plan.segment = plan.base.segment
            records = []
            for choice, (answer, key, version) in enumerate(zip(answers, returned_keys, versions)):
                if plan.messages is not None:
                    conversation = [*plan.messages, answer.message()]
                else:
                    conversation = [
                        {"role": "user", "content": prompt_text or ""},
                        answer.message(),
                    ]
                base = plan.base or Trajectory(tuple(plan.prompt_ids), segment=plan.segment)
                trajectory = base.answered(plan.added, answer, conversation, version)
                keys = None if plan.keys is None else [*plan.keys, key]
                # the answer stands as the model wrote it: the template's text around it is
                # what a later call adds (its tool calls are in its sampled tokens)
                written = [*(plan.messages or []), {"role": "assistant", "content": ""}]
                state.heads.append(
                    _Head(keys, plan.tools_key, written, plan.tools, answer.ids, trajectory)
                )
                if choice == 0:
                    state.last = trajectory
                records.append(_record(plan, choice, answer, trajectory, conversation, version))
        for td in records:
            self.buffer.add(td)

    # -- reading --------------------------------------------------------------------------------

    def last(self, session: str) -> tuple[Trajectory | None, int, int]:
        """The session's last trajectory, its number of calls and of segments."""
        with self._lock:
            state = self._sessions.get(session)
            if state is None:
                return None, 0, 0
            return state.last, state.calls, state.segments

    def end(self, session: str) -> tuple[Trajectory | None, int, int]:
        """:meth:`last`, and the session is forgotten (the buffer keeps its calls)."""
        out = self.last(session)
        with self._lock:
            self._sessions.pop(session, None)
        return out

    def __len__(self) -> int:
        return len(self._sessions)


def _record(
    plan: Plan,
    choice: int,
    answer: Answer,
    trajectory: Trajectory,
    conversation: list[dict[str, Any]],
    version: int | None,
) -> TensorDict:
    """One call's choice in torchrl's LLM layout (see the module's docstring)."""
    full = list(trajectory.full_ids)
    prompt_len = len(trajectory.prompt_ids)
    mask = [0] * prompt_len + list(trajectory.env_mask)
    full_logprobs = [0.0] * prompt_len + list(trajectory.logprobs)
    return TensorDict(
        {
            "session": NonTensorData(plan.session),
            "segment": torch.tensor(plan.segment),
            "call": torch.tensor(plan.call),
            "choice": torch.tensor(choice),
            "finish_reason": NonTensorData(answer.finish_reason),
            POLICY_VERSION_KEY: torch.tensor(-1 if version is None else version),
            HISTORY_KEY: messages_to_history(conversation),
            PROMPT_TOKEN_KEY: torch.tensor(plan.prompt_ids, dtype=torch.long),
            RESPONSE_TOKEN_KEY: torch.tensor(answer.ids, dtype=torch.long),
            TOKEN_KEY: torch.tensor(full, dtype=torch.long),
            RESPONSE_LOG_PROBS_KEY: torch.tensor(answer.logprobs, dtype=torch.float32),
            FULL_LOG_PROBS_KEY: torch.tensor(full_logprobs, dtype=torch.float32),
            ASSISTANT_MASK_KEY: torch.tensor(mask, dtype=torch.bool),
        },
        batch_size=[],
    )
