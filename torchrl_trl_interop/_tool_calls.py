"""Turns with more than a role and a content across the History <-> TRL message boundary.

TRL (and the OpenAI chat format that Hugging Face chat templates read) writes a tool-calling
turn as ``{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
{"name": ..., "arguments": {...}}}]}`` and the tool's answer as ``{"role": "tool", "name": ...,
"content": ...}``. TorchRL's :class:`~torchrl.data.llm.History` keeps a turn's calls in its
``tool_calls`` field (torchrl's own parser writes them bare, ``{"name", "arguments"}``) and has
no field for a tool turn's ``name``: in a plain History it is the name of the call the turn
answers, derived from the calls on the way out and checked against them on the way in.

Any other field of a message (``reasoning_content``, ``tool_call_id``, a user's ``name``, a
tool turn without the name of its call, ``tool_calls: None``...) would be lost by a plain
History: the conversation is then held by a :class:`~torchrl_trl_interop.MessageHistory`, whose
``extra_fields`` keep those fields exactly, and whose tool turns get no derived name.

``_conversation`` calls these functions only for conversations that hold tool calls or other
fields; plain conversations never reach this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._checks import signed
from ._keys import PLACEHOLDER_ROLE
from ._message_fields import MessageHistory
from ._upstream._lazy_rows import holds_field

__all__ = [
    "has_tool_calls",
    "has_turn_fields",
    "message_turns",
    "messages_of_turns",
    "trl_tool_calls",
]

#: The message fields every History holds; the others are tool calls or extra fields.
_HISTORY_FIELDS = ("role", "content")
_ABSENT = object()  # a field a message does not have


def has_tool_calls(history: Any) -> bool:
    """Whether any turn of ``history`` (a :class:`~torchrl.data.llm.History`) holds tool calls.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> has_tool_calls(messages_to_history([{"role": "user", "content": "Hi"}]))
        False
    """
    return holds_field(history, "tool_calls")


def has_turn_fields(history: Any) -> bool:
    """Whether a turn of ``history`` holds more than a role and a content (tool calls, or the
    other fields of a :class:`~torchrl_trl_interop.MessageHistory`): such a History is read as
    message lists (:func:`messages_of_turns`), not as roles and contents.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> has_turn_fields(messages_to_history([{"role": "user", "content": "Hi"}]))
        False
        >>> has_turn_fields(messages_to_history([{"role": "user", "content": "Hi", "name": "Ann"}]))
        True
    """
    return isinstance(history, MessageHistory) or has_tool_calls(history)


def trl_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """A turn's tool calls in TRL's format; torchrl's bare ``{"name", "arguments"}`` are wrapped.

    Examples:
        >>> trl_tool_calls([{"name": "add", "arguments": {"a": 1}}])
        [{'type': 'function', 'function': {'name': 'add', 'arguments': {'a': 1}}}]
    """
    return [
        dict(c) if "function" in c else {"type": "function", "function": dict(c)} for c in calls
    ]


def _call_names(calls: Sequence[dict[str, Any]]) -> list[Any]:
    return [c.get("function", c).get("name") for c in calls]


def _turns_to_messages(
    turns: list[dict[str, Any]], keep_system: bool, derive_names: bool
) -> list[dict[str, Any]]:
    """One conversation of ``History.tolist()`` turns as TRL messages: tool calls in TRL's
    format, the extra fields merged in, and (``derive_names``) a tool turn named after its call."""
    messages = []
    names: list[Any] = []  # names of the calls not answered yet
    for turn in turns:
        if turn["role"] == PLACEHOLDER_ROLE:  # torchrl's filling of a shorter conversation
            continue
        message = {"role": turn["role"], "content": turn["content"]}
        calls = turn.get("tool_calls")
        if isinstance(calls, (list, tuple)) and calls:  # an empty list is stored as a tensor
            message["tool_calls"] = trl_tool_calls(calls)
            names = _call_names(message["tool_calls"])
        elif turn["role"] == "tool" and names:
            name = names.pop(0)
            if name is not None and derive_names:
                message["name"] = name
        message.update(turn.get("extra_fields") or {})
        if keep_system or turn["role"] != "system":
            messages.append(message)
    return messages


def messages_of_turns(history: Any, keep_system: bool) -> list:
    """:func:`~torchrl_trl_interop.history_to_messages` for a History whose turns hold more than
    a role and a content (tool calls, extra fields).

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}
        >>> chat = [{"role": "assistant", "content": "", "tool_calls": [call]},
        ...         {"role": "tool", "name": "add", "content": "4"}]
        >>> messages_of_turns(messages_to_history(chat), keep_system=True) == chat
        True
    """
    from torchrl.data.llm import History

    derive_names = not isinstance(history, MessageHistory)

    def convert(node: Any, depth: int) -> list:
        if depth == 0:
            return _turns_to_messages(node, keep_system, derive_names)
        return [convert(sub, depth - 1) for sub in node]

    # History's own tolist: a MessageHistory's extra fields apart, as they are stored
    return convert(History.tolist(history), history.ndim - 1)


def message_turns(messages: Sequence[dict[str, Any]], where: str) -> tuple[list[dict], bool]:
    """The History fields of each turn of one conversation, and whether a plain History holds it.

    Each turn gets ``role``, ``content`` (``None`` next to ``tool_calls`` becomes ``""``),
    ``tool_calls`` when it calls tools, and ``extra_fields``: every other field of the message,
    exactly. The flag is ``True`` when a plain History gives the messages back without those
    extra fields: they hold only tool turns' names, each the name of the call the turn answers
    (derived on the way out), and a tool turn answering a call has its name; the caller then
    drops ``extra_fields``. Otherwise the conversation needs a
    :class:`~torchrl_trl_interop.MessageHistory`.

    Raises:
        TypeError: if ``tool_calls`` is not a list of dicts.
        ValueError: if a tool turn's ``name`` is not the name of the call it answers.

    Examples:
        >>> call = {"type": "function", "function": {"name": "add", "arguments": {}}}
        >>> turns, plain = message_turns(
        ...     [{"role": "assistant", "content": None, "tool_calls": [call]},
        ...      {"role": "tool", "tool_call_id": "7", "content": "2"}], "m")
        >>> plain, turns[1]
        (False, {'role': 'tool', 'content': '2', 'extra_fields': {'tool_call_id': '7'}})
    """
    turns = []
    plain = True
    names: list[Any] = []  # names of the calls not answered yet
    for i, message in enumerate(messages):
        turn = {"role": message["role"], "content": message.get("content")}
        extra = {k: v for k, v in message.items() if k not in _HISTORY_FIELDS}
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, (list, tuple)) or not all(isinstance(c, dict) for c in calls):
                raise TypeError(
                    signed(
                        f"{where}[{i}]['tool_calls'] should be a list of dicts (TRL's {{'type': "
                        f"'function', 'function': {{...}}}}), got {calls!r:.200}."
                    )
                )
            turn["content"] = message.get("content") or ""
            turn["tool_calls"] = [dict(c) for c in calls]
            del extra["tool_calls"]
            names = _call_names(calls)
        elif message["role"] == "tool":
            expected = names.pop(0) if names else None
            name = message.get("name", _ABSENT)
            if expected is not None and name not in (expected, None, _ABSENT):
                raise ValueError(
                    signed(
                        f"{where}[{i}] is a tool turn named {name!r}, but the call it answers is "
                        f"{expected!r}. A tool turn's name is the name of the call it answers: "
                        "answer the calls in order, or drop 'name'."
                    )
                )
            # what a plain History gives back: the name of the call it answers, if any
            plain &= name == (_ABSENT if expected is None else expected)
            extra.pop("name", None)
        plain &= not extra
        if message["role"] == "tool" and "name" in message:
            extra["name"] = message["name"]
        if extra:
            turn["extra_fields"] = extra
        turns.append(turn)
    return turns, plain
