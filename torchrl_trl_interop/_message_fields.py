"""A History that keeps every field of a chat message: :class:`MessageHistory`.

A TRL (OpenAI-format) message may hold more than its ``role``, ``content`` and ``tool_calls``:
``reasoning_content`` (what Qwen3- and DeepSeek-R1-style chat templates render as
``<think>``), a tool turn's ``tool_call_id`` (Mistral and Llama 3.1 templates need it), a
speaker's ``name``, a ``None`` where a dataset's schema has a field a message lacks.
TorchRL's :class:`~torchrl.data.llm.History` has no slot for them, and a tensorclass refuses
unknown fields, so they ride in one more per-turn field, ``extra_fields``, of a History
subclass. ``_conversation`` builds one only when a conversation holds such fields; every other
conversation stays a plain History.
"""

from __future__ import annotations

from typing import Any

from tensordict import lazy_stack
from torchrl.data.llm import History

__all__ = ["MessageHistory", "merge_extra_fields"]


def merge_extra_fields(turns: Any) -> Any:
    """``History.tolist()`` turns (nested lists of dicts) with each turn's ``extra_fields``
    merged into it, as the message it came from held them. New dicts; the input is unchanged.

    Examples:
        >>> merge_extra_fields([{"role": "user", "content": "Hi", "extra_fields": {"name": "Ann"}}])
        [{'role': 'user', 'content': 'Hi', 'name': 'Ann'}]
    """
    if isinstance(turns, dict):
        turn = dict(turns)
        turn.update(turn.pop("extra_fields", None) or {})
        return turn
    return [merge_extra_fields(sub) for sub in turns]


class MessageHistory(History):
    """A :class:`~torchrl.data.llm.History` whose turns keep the other fields of their messages.

    ``extra_fields`` holds, per turn, a dict of the message's fields that History has no slot
    for (``None`` for a turn without any). :func:`~torchrl_trl_interop.messages_to_history`
    builds one when a message holds such a field (``reasoning_content``, ``tool_call_id``,
    ``name``, ...), and :func:`~torchrl_trl_interop.history_to_messages` gives the messages
    back exactly. It is a History for TorchRL: :meth:`tolist` gives each turn with its fields
    merged in, so :meth:`~torchrl.data.llm.History.apply_chat_template` renders them (a
    template that reads ``message.reasoning_content`` sees it).

    A column of a replay buffer holds one class: stacking a plain History with a MessageHistory
    gives a plain ``LazyStackedTensorDict``.

    Examples:
        >>> from torchrl_trl_interop import history_to_messages, messages_to_history
        >>> chat = [{"role": "user", "content": "2+2?"},
        ...         {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}]
        >>> history = messages_to_history(chat)
        >>> type(history).__name__, history[1].extra_fields
        ('MessageHistory', {'reasoning_content': '2 and 2 make 4.'})
        >>> history.tolist()[1]["reasoning_content"]
        '2 and 2 make 4.'
        >>> from tensordict import set_list_to_stack
        >>> with set_list_to_stack(True):
        ...     again = MessageHistory.from_chats(history.tolist())
        >>> history_to_messages(again) == chat
        True
        >>> history_to_messages(history) == chat
        True
    """

    extra_fields: dict | None = None

    def tolist(self, *args: Any, **kwargs: Any) -> Any:
        """The turns as dicts (see :meth:`~tensordict.TensorDictBase.tolist`), each with its
        ``extra_fields`` merged in."""
        return merge_extra_fields(super().tolist(*args, **kwargs))

    @classmethod
    def from_chats(cls, chats: list) -> MessageHistory:
        """:meth:`History.from_chats <torchrl.data.llm.History.from_chats>`, taking messages with
        any fields: those History has no slot for go to ``extra_fields``; the inverse of
        :meth:`tolist`. Like History's, it needs tensordict's list-to-stack mode."""
        if isinstance(chats[0], dict):
            return lazy_stack([cls(**_turn_of(message)) for message in chats])
        return lazy_stack([cls.from_chats(chat) for chat in chats])


def _turn_of(message: dict) -> dict:
    """A message's fields as a :class:`MessageHistory` turn's."""
    turn = {k: v for k, v in message.items() if k in MessageHistory.__dataclass_fields__}
    extra = {k: v for k, v in message.items() if k not in turn}
    if extra:
        turn["extra_fields"] = {**(turn.get("extra_fields") or {}), **extra}
    return turn


# Pickles (saved buffers, spawn workers) name the class by its public path, which stays put
# when the private module moves.
MessageHistory.__module__ = "torchrl_trl_interop"
