"""Tool calls across the History <-> TRL message boundary.

TRL (and the OpenAI chat format that Hugging Face chat templates read) writes a tool-calling
turn as ``{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
{"name": ..., "arguments": {...}}}]}`` and the tool's answer as ``{"role": "tool", "name": ...,
"content": ...}``. TorchRL's :class:`~torchrl.data.llm.History` keeps a turn's calls in its
``tool_calls`` field (torchrl's own parser writes them bare, ``{"name", "arguments"}``) and has
no field for a tool turn's ``name``: it is the name of the call the turn answers, so it is
derived from the calls on the way out and checked against them on the way in.

``_conversation`` calls these functions only when a conversation holds
tool calls; plain conversations never reach this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["has_tool_calls", "messages_with_tool_calls", "tool_turns", "trl_tool_calls"]


def _td_has_tool_calls(td: Any) -> bool:
    if "tool_calls" in td.keys():
        return True
    return any(_td_has_tool_calls(sub) for sub in getattr(td, "tensordicts", ()))


def has_tool_calls(history: Any) -> bool:
    """Whether any turn of ``history`` (a :class:`~torchrl.data.llm.History`) holds tool calls.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> has_tool_calls(messages_to_history([{"role": "user", "content": "Hi"}]))
        False
    """
    return _td_has_tool_calls(history._tensordict)


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


def _turns_to_messages(turns: list[dict[str, Any]], keep_system: bool) -> list[dict[str, Any]]:
    """One conversation of ``History.tolist()`` turns as TRL messages (tool calls, tool names)."""
    messages = []
    names: list[Any] = []  # names of the calls not answered yet
    for turn in turns:
        message = {"role": turn["role"], "content": turn["content"]}
        calls = turn.get("tool_calls")
        if isinstance(calls, (list, tuple)) and calls:  # an empty list is stored as a tensor
            message["tool_calls"] = trl_tool_calls(calls)
            names = _call_names(message["tool_calls"])
        elif turn["role"] == "tool" and names:
            name = names.pop(0)
            if name is not None:
                message["name"] = name
        if keep_system or turn["role"] != "system":
            messages.append(message)
    return messages


def messages_with_tool_calls(history: Any, keep_system: bool) -> list:
    """:func:`~torchrl_trl_interop.history_to_messages` for a History with tool calls.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}
        >>> chat = [{"role": "assistant", "content": "", "tool_calls": [call]},
        ...         {"role": "tool", "name": "add", "content": "4"}]
        >>> messages_with_tool_calls(messages_to_history(chat), keep_system=True) == chat
        True
    """

    def convert(node: Any, depth: int) -> list:
        if depth == 0:
            return _turns_to_messages(node, keep_system)
        return [convert(sub, depth - 1) for sub in node]

    return convert(history.tolist(), history.ndim - 1)


def tool_turns(messages: Sequence[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The History fields of each turn of one conversation that holds tool calls.

    ``content: None`` (allowed next to ``tool_calls``) becomes ``""``; a tool turn's ``name``
    must be the name of the call it answers (a History cannot hold another one).

    Raises:
        TypeError: if ``tool_calls`` is not a list of dicts.
        ValueError: if a tool turn's ``name`` is not the name of the call it answers.

    Examples:
        >>> call = {"type": "function", "function": {"name": "add", "arguments": {}}}
        >>> tool_turns([{"role": "assistant", "content": None, "tool_calls": [call]}], "m")
        [{'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'add', 'arguments': {}}}]}]
    """
    turns = []
    names: list[Any] = []
    for i, message in enumerate(messages):
        turn = {"role": message["role"], "content": message.get("content") or ""}
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, (list, tuple)) or not all(isinstance(c, dict) for c in calls):
                raise TypeError(
                    f"messages_to_history: {where}[{i}]['tool_calls'] should be a list of dicts "
                    f"(TRL's {{'type': 'function', 'function': {{...}}}}), got {calls!r:.200}."
                )
            turn["tool_calls"] = [dict(c) for c in calls]
            names = _call_names(calls)
        elif message["role"] == "tool" and "name" in message:
            expected = names.pop(0) if names else None
            if message["name"] != expected:
                raise ValueError(
                    f"messages_to_history: {where}[{i}] is a tool turn named "
                    f"{message['name']!r}, but the call it answers is {expected!r}. A History "
                    "keeps no name for tool turns (it is derived from the calls): answer the "
                    "calls in order, or drop 'name'."
                )
        elif message["role"] == "tool" and names:
            names.pop(0)
        turns.append(turn)
    return turns
