"""Conversions between TorchRL's :class:`~torchrl.data.llm.History` and TRL's conversational format.

TRL writes a conversation as a list of ``{"role": ..., "content": ...}`` dicts (a "message list");
TorchRL holds it as a :class:`~torchrl.data.llm.History` TensorClass whose last batch dimension is
the turn. This module holds the conversions the dataset, the reward wrapper, the reward bridges,
the online loop and the tutorial call. Two speed paths read a History's payloads without them
and give the same messages (each tested against these functions): ``_history_fields`` (roles and
contents in one walk) and ``rollouts/_policy_output`` (a History extended by the policy's
answer). How a conversation becomes tokens is ``_chat_format``'s.

Every field of a message crosses the boundary, kept exactly (no stripping, no template):

* ``role`` and ``content`` as History's fields;
* a tool-calling turn as TRL (and the OpenAI chat format that Hugging Face chat templates read)
  writes it, ``{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
  "function": {"name": ..., "arguments": {...}}}]}``, and the tool's answer, ``{"role": "tool",
  "name": ..., "content": ...}``: TorchRL's History keeps a turn's calls in its ``tool_calls``
  field (torchrl's own parser writes them bare, ``{"name", "arguments"}``) and has no field for a
  tool turn's ``name``, which in a plain History is the name of the call the turn answers,
  derived from the calls on the way out and checked against them on the way in;
* any other field (``reasoning_content``, ``tool_call_id``, a user's ``name``, a tool turn
  without the name of its call, ``tool_calls: None``...) would be lost by a plain History: the
  conversation is then held by a :class:`MessageHistory`, whose ``extra_fields`` keep those
  fields exactly, and whose tool turns get no derived name.

torchrl's placeholder turns (``"<none>"``, which fill a ``ChatEnv`` batch's shorter
conversations) are no one's message: every conversion to messages leaves them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import (
    NonTensorStack,
    TensorDictBase,
    is_non_tensor,
    lazy_stack,
    set_list_to_stack,
)
from tensordict.utils import NestedKey
from torchrl.data.llm import History

from ._checks import as_names, boundary, check_bool, check_dicts
from ._deprecation import warn_deprecated
from ._keys import PLACEHOLDER_ROLE, as_nested_key, flatten_nested, get_entry, key_parts
from ._upstream._history_fields import history_fields
from ._upstream._lazy_rows import (
    holds_field,
    over_same_leaves,
    shared_flag,
    tensorclass_over,
    text_stack,
)

__all__ = [
    "MessageHistory",
    "conversations_to_histories",
    "has_tool_calls",
    "has_turn_fields",
    "history_to_messages",
    "is_conversational",
    "is_message_list",
    "merge_extra_fields",
    "message_turns",
    "messages_of_turns",
    "messages_to_history",
    "real_turns",
    "row_values",
    "split_completion",
    "split_prompt_completion",
    "trl_tool_calls",
]


# -- MessageHistory: a History that keeps every field of a message ------------------------------


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


# -- turns with more than a role and a content: tool calls, extra fields -----------------------

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
                    f"{where}[{i}]['tool_calls'] should be a list of dicts (TRL's {{'type': "
                    f"'function', 'function': {{...}}}}), got {calls!r:.200}."
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
                    f"{where}[{i}] is a tool turn named {name!r}, but the call it answers is "
                    f"{expected!r}. A tool turn's name is the name of the call it answers: "
                    "answer the calls in order, or drop 'name'."
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


# -- History <-> TRL message lists --------------------------------------------------------------

Message = dict[str, str]


def is_message_list(value: Any) -> bool:
    """Tells whether ``value`` is one conversation in TRL's format (a list of role/content dicts).

    Examples:
        >>> is_message_list([{"role": "user", "content": "Hi"}])
        True
        >>> is_message_list("Hi"), is_message_list([])
        (False, False)
    """
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def is_conversational(example: dict[str, Any]) -> bool:
    """Deprecated (warns; removed in 0.3.0): use TRL's ``trl.data_utils.is_conversational``,
    which this copied: whether a TRL row's standard columns hold conversations.

    Examples:
        >>> import warnings
        >>> warnings.simplefilter("ignore", DeprecationWarning)
        >>> is_conversational({"prompt": [{"role": "user", "content": "Hi"}]})
        True
        >>> is_conversational({"prompt": "Hi", "completion": " there"})
        False
    """
    warn_deprecated("torchrl_trl_interop.is_conversational")
    if not isinstance(example, Mapping):
        raise TypeError(f"is_conversational: example must be a dict, got {type(example).__name__}.")
    columns = [
        c for c in ("prompt", "chosen", "rejected", "completion", "messages") if c in example
    ]
    return bool(columns) and is_message_list(example[columns[0]])


def _zip_turns(roles: Any, contents: Any, depth: int, keep_system: bool) -> list:
    if depth == 0:
        return [
            {"role": r, "content": c}
            for r, c in zip(roles, contents)
            if (keep_system or r != "system") and r != PLACEHOLDER_ROLE
        ]
    return [_zip_turns(r, c, depth - 1, keep_system) for r, c in zip(roles, contents)]


@boundary("history_to_messages")
def history_to_messages(history: History, *, keep_system: bool = True) -> list:
    """Converts a :class:`~torchrl.data.llm.History` into TRL message lists.

    The last batch dimension of ``history`` is the turn; every leading dimension becomes one
    level of list nesting, so a ``[T]`` History gives one message list and a ``[B, T]`` History
    (ragged ``T`` included, as :meth:`History.from_chats` builds it) gives ``B`` message lists.

    Args:
        history (History): a History with at least one batch dimension (the turns).

    Keyword Args:
        keep_system (bool, optional): if ``False``, system turns are dropped. Defaults to ``True``.

    Returns:
        a (nested) list of ``{"role": ..., "content": ...}`` dicts. A turn's ``tool_calls``
        are carried in TRL's format (``[{"type": "function", "function": {"name", "arguments"}}]``).
        A :class:`~torchrl_trl_interop.MessageHistory` gives each message its other fields back
        (``extra_fields``: ``reasoning_content``, ``tool_call_id``, ...), exactly; in a plain
        History a ``tool`` turn that answers a call gets the call's ``"name"``. Other History
        fields (``is_complete``, ``tool_responses``) are not part of TRL's format and are not
        copied.

    torchrl's placeholder turns (``"<none>"``, which fill a ``ChatEnv`` batch's shorter
    conversations) are no one's message: they are left out. A lazy stack of rows of different
    History classes (a :class:`~torchrl_trl_interop.MessageHistory` row beside plain ones, as
    a buffer of real conversations holds them) gives one message list per row.

    Raises:
        TypeError: if ``history`` is not a History.
        ValueError: if ``history`` has no batch dimension (a single message, no turn axis).

    Examples:
        >>> from tensordict import set_list_to_stack
        >>> from torchrl.data.llm import History
        >>> chats = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        ...          [{"role": "user", "content": "2+2?"}]]
        >>> with set_list_to_stack(True):
        ...     history = History.from_chats(chats)
        >>> history_to_messages(history) == chats
        True
        >>> history_to_messages(history[0])
        [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
    """
    rows = _history_rows(history)
    if rows is not None:  # rows of different History classes (some with extra fields)
        check_bool(keep_system, "keep_system")
        return [history_to_messages(row, keep_system=keep_system) for row in rows]
    if not isinstance(history, History):
        raise TypeError(
            "history_to_messages expects a torchrl.data.llm.History, got "
            f"{type(history).__name__}. Build one with History.from_chats(list_of_message_lists) "
            "or messages_to_history(...)."
        )
    check_bool(keep_system, "keep_system")
    if history.ndim == 0:
        raise ValueError(
            "history_to_messages got a History with batch_size=[] (a single message, no turn "
            "dimension). Add the turn dimension first: history.unsqueeze(0)."
        )
    if has_turn_fields(history):
        return messages_of_turns(history, keep_system)
    roles, contents = history_fields(history)
    return _zip_turns(roles, contents, history.ndim - 1, keep_system)


def _history_rows(value: Any) -> list | None:
    """The rows of a lazy stack of Histories of different classes (a
    :class:`~torchrl_trl_interop.MessageHistory` row beside plain ones: tensordict stacks them as
    a ``LazyStackedTensorDict``, not as a History), else ``None``."""
    rows = getattr(value, "tensordicts", None)
    if rows is None or getattr(value, "stack_dim", None) != 0 or not rows:
        return None
    return list(rows) if all(isinstance(row, History) for row in rows) else None


def messages_of(roles: list, contents: list) -> list:
    """Message lists from per-row ``roles`` and ``contents`` (as :func:`history_column` gives),
    torchrl's placeholder turns left out."""
    return _zip_turns(roles, contents, 1, True)


def real_turns(roles: list, contents: list) -> tuple[list, list]:
    """Per-row ``roles`` and ``contents`` without torchrl's placeholder turns (the ``"<none>"``
    turns a ``ChatEnv`` batch fills its shorter conversations with): they are no one's message.

    Examples:
        >>> real_turns([["user", "<none>"], ["user", "assistant"]], [["Hi", ""], ["Ho", "Yo"]])
        ([['user'], ['user', 'assistant']], [['Hi'], ['Ho', 'Yo']])
    """
    if not any(PLACEHOLDER_ROLE in row for row in roles):
        return roles, contents
    kept = [[k for k, r in enumerate(row) if r != PLACEHOLDER_ROLE] for row in roles]
    return (
        [[row[k] for k in keep] for row, keep in zip(roles, kept)],
        [[row[k] for k in keep] for row, keep in zip(contents, kept)],
    )


def _check_message_list(messages: Any, where: str) -> None:
    if not isinstance(messages, (list, tuple)):
        raise TypeError(
            f"{where} should be a list of {{'role', 'content'}} dicts, got "
            f"{type(messages).__name__}."
        )
    check_dicts(messages, where, "with 'role' and 'content'")
    for i, message in enumerate(messages):
        for field in ("role", "content"):
            if field == "content" and message.get("content") is None and message.get("tool_calls"):
                continue  # TRL's tool-calling turn: the calls are its content
            if not isinstance(message.get(field), str):
                raise ValueError(
                    f"{where}[{i}] needs a str {field!r}, got {message.get(field)!r} (message: "
                    f"{message!r}). Multimodal or tool content must be rendered to text first."
                )


def _depth(messages: Sequence) -> int:
    """0 for one message list, 1 for a list of message lists, etc."""
    depth = 0
    node: Any = messages
    while isinstance(node, (list, tuple)) and node and isinstance(node[0], (list, tuple)):
        depth += 1
        node = node[0]
    return depth


def _parse(messages: Any, depth: int, where: str) -> Any:
    """Checks ``messages``; each conversation becomes ``(messages, turns, plain)`` (``turns``
    ``None`` for role and content only; else see :func:`.message_turns`)."""
    if depth == 0:
        _check_message_list(messages, where)
        if not messages:
            raise ValueError(
                f"{where} is an empty conversation; a History needs at least one turn."
            )
        if all(len(m) == 2 and "content" in m for m in messages):  # role and content only
            return messages, None, True
        return (messages, *message_turns(messages, where))
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} should be a non-empty list of conversations.")
    return [_parse(m, depth - 1, f"{where}[{i}]") for i, m in enumerate(messages)]


def _all_plain(parsed: Any, depth: int) -> bool:
    if depth == 0:
        return parsed[2]
    return all(_all_plain(p, depth - 1) for p in parsed)


def _construct(parsed: Any, depth: int, cls: type) -> History:
    """The History (of class ``cls``) of parsed conversations."""
    if depth > 1:
        return lazy_stack([_construct(p, depth - 1, cls) for p in parsed])
    if depth == 1:
        rows: list[History] = []
        for i, conversation in enumerate(parsed):
            again = None
            if i and conversation[1] is None and conversation[0] == parsed[i - 1][0]:
                again = over_same_leaves(rows[-1])  # GRPO's group: the turns built once
            rows.append(again if again is not None else _construct(conversation, 0, cls))
        return lazy_stack(rows)
    messages, turns, _ = parsed
    if turns is None:  # the fields History's constructor sets, built directly (half its time)
        size = torch.Size([len(messages)])
        fields = {
            "role": text_stack([m["role"] for m in messages]),
            "content": text_stack([m["content"] for m in messages]),
            "is_complete": shared_flag(True, size),
        }
        return tensorclass_over(cls, fields, size)
    if cls is not MessageHistory:  # plain: the extra fields are tool names it derives
        turns = [{k: v for k, v in turn.items() if k != "extra_fields"} for turn in turns]
    return lazy_stack([cls(**turn) for turn in turns])


@boundary("messages_to_history")
def messages_to_history(messages: Sequence) -> History:
    """Converts TRL message lists into a :class:`~torchrl.data.llm.History`.

    The inverse of :func:`history_to_messages`: one message list gives a ``[T]`` History, a list
    of ``B`` message lists gives a ``[B, T]`` History (a lazy stack when turn counts differ), and
    so on for deeper nesting. tensordict's list-to-stack mode is scoped inside this call; the
    process-wide setting is left as it was.

    Args:
        messages (list): a message list, or a (nested) list of message lists.

    Every field of a message is kept. Tool calls go to History's ``tool_calls`` (a ``content:
    None`` beside them becomes ``""``); a tool turn's ``name`` must be that of the call it
    answers. Any other field (``reasoning_content``, ``tool_call_id``, a user's ``name``, a
    ``None``...), or a tool turn without its call's name, makes the result a
    :class:`~torchrl_trl_interop.MessageHistory`, whose ``extra_fields`` keep them.

    Raises:
        TypeError: if a message is not a dict, a conversation is not a list, or ``tool_calls``
            is not a list of dicts.
        ValueError: if a message lacks a str ``role``/``content`` (``content`` may be ``None``
            next to ``tool_calls``), a conversation is empty, or a tool turn's ``name`` is not
            that of the call it answers.

    Examples:
        >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
        >>> history = messages_to_history(chat)
        >>> history.batch_size
        torch.Size([2])
        >>> ragged = messages_to_history([chat, chat[:1]])
        >>> history_to_messages(ragged)[1]
        [{'role': 'user', 'content': 'Hi'}]

        A field History has no slot for rides along:

        >>> named = [{"role": "user", "content": "Hi", "name": "Ann"}]
        >>> history_to_messages(messages_to_history([named, chat])) == [named, chat]
        True
    """
    depth = _depth(messages)
    with set_list_to_stack(True):
        parsed = _parse(messages, depth, "messages")
        cls = History if _all_plain(parsed, depth) else MessageHistory
        return _construct(parsed, depth, cls)


def conversations_to_histories(
    conversations: Sequence, *, message_history: bool = False
) -> tuple[list[History], bool]:
    """One ``[T]`` History per conversation (e.g. the rows of a dataset column), all of one
    class: :class:`~torchrl_trl_interop.MessageHistory` if a conversation needs it or
    ``message_history``, else plain History. Also returns whether they are MessageHistory.

    Examples:
        >>> histories, fields = conversations_to_histories(
        ...     [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Yo", "name": "Bo"}]])
        >>> [type(h).__name__ for h in histories], fields
        (['MessageHistory', 'MessageHistory'], True)
    """
    with set_list_to_stack(True):
        parsed = [_parse(c, 0, "messages") for c in conversations]
        cls = History if not message_history and _all_plain(parsed, 1) else MessageHistory
        return [_construct(p, 0, cls) for p in parsed], cls is MessageHistory


@boundary("split_prompt_completion")
def split_prompt_completion(
    messages: Sequence[Message], *, completion_roles: Sequence[str] = ("assistant",)
) -> tuple[list[Message], list[Message]]:
    """Splits one conversation into TRL's ``prompt`` and ``completion`` message lists.

    The completion is the trailing run of turns whose role is in ``completion_roles`` (by default
    the final assistant turn(s)); the prompt is everything before it. ``prompt + completion`` is
    the input, message for message (new lists, the dicts are copied).

    Args:
        messages (list of dict): one conversation, ``[{"role": ..., "content": ...}, ...]``.

    Keyword Args:
        completion_roles (sequence of str, optional): roles that make up the completion.
            ``("assistant", "tool")`` keeps a whole tool-calling episode in the completion.
            Defaults to ``("assistant",)``.

    Returns:
        a ``(prompt, completion)`` pair of message lists; ``prompt`` may be empty.

    Raises:
        TypeError: if ``messages`` is not a message list.
        ValueError: if the conversation does not end with a ``completion_roles`` turn.

    Examples:
        >>> chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
        >>> split_prompt_completion(chat)
        ([{'role': 'user', 'content': '2+2?'}], [{'role': 'assistant', 'content': '4'}])
    """
    if not is_message_list(messages):
        raise TypeError(
            "split_prompt_completion expects one conversation (a non-empty list of "
            f"{{'role', 'content'}} dicts), got {type(messages).__name__}: {messages!r:.200}."
        )
    return split_completion(messages, as_names(completion_roles, "completion_roles"))


def split_completion(
    messages: Sequence[Message], roles: tuple[str, ...], context: str = ""
) -> tuple[list[Message], list[Message]]:
    """:func:`split_prompt_completion` of a message list, ``roles`` already checked: the per-row
    step of a caller that checked its arguments once. ``context`` opens the error (``"rollout 3:
    "``), which is signed by the public call being made.

    Raises:
        ValueError: if the conversation does not end with a ``roles`` turn.

    Examples:
        >>> split_completion([{"role": "user", "content": "Hi"}], ("assistant",), "rollout 0: ")
        Traceback (most recent call last):
        ...
        ValueError: rollout 0: the conversation ends with a 'user' turn, not one of completion_roles=('assistant',), so it holds no completion. Score conversations after the policy answered, or widen completion_roles.
    """
    start = len(messages)
    while start > 0 and messages[start - 1]["role"] in roles:
        start -= 1
    if start == len(messages):
        raise ValueError(
            f"{context}the conversation ends with a {messages[-1]['role']!r} turn, not one of "
            f"completion_roles={roles}, so it holds no completion. Score conversations after "
            "the policy answered, or widen completion_roles."
        )
    prompt = [dict(m) for m in messages[:start]]
    completion = [dict(m) for m in messages[start:]]
    return prompt, completion


def row_values(td: TensorDictBase, key: NestedKey, arg: str) -> list:
    """One Python value per element of ``td``'s batch, row-major (History -> message lists).

    Works for any batch shape (``[]``, ``[B]``, ``[E, G]``) and ragged lazy stacks. Errors are
    signed by the public call being made.

    Raises:
        TypeError: if ``key`` is not a key, or the entry is not a History, strings or a tensor.
        KeyError: if ``key`` is absent (``arg`` and the keys present are named).
        ValueError: if the entry's leading shape is not the batch shape.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"x": torch.arange(4).reshape(2, 2)}, batch_size=[2, 2])
        >>> row_values(td, "x", "x_key")
        [0, 1, 2, 3]
    """
    key = as_nested_key(key, arg)
    value = get_entry(
        td, key_parts(key), arg, hint=f"Pass {arg}=... naming where the rollouts hold it."
    )
    if isinstance(value, list):  # a ragged lazy stack of tensors: go row by row
        return [v for sub in td.unbind(0) for v in row_values(sub, key, arg)]
    if isinstance(value, History):
        if value.ndim != td.ndim + 1:
            raise ValueError(
                f"{arg}={key!r} holds a History of batch size {tuple(value.batch_size)}; "
                f"expected the tensordict's {tuple(td.batch_size)} plus one turn dimension."
            )
        return flatten_nested(history_to_messages(value), td.ndim)
    if isinstance(value, torch.Tensor):
        if value.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                f"{arg}={key!r} has shape {tuple(value.shape)}; expected leading dims "
                f"{tuple(td.batch_size)}."
            )
        return list(value.reshape(td.batch_size.numel(), *value.shape[td.ndim :]).tolist())
    if is_non_tensor(value):
        if td.ndim == 0:
            return [value.tolist() if isinstance(value, NonTensorStack) else value.data]
        return flatten_nested(value.tolist(), td.ndim)
    raise TypeError(
        f"{arg}={key!r} holds a {type(value).__name__}; expected a History, strings or a tensor."
    )
