"""Conversions between TorchRL's :class:`~torchrl.data.llm.History` and TRL's conversational format.

TRL writes a conversation as a list of ``{"role": ..., "content": ...}`` dicts (a "message list");
TorchRL holds it as a :class:`~torchrl.data.llm.History` TensorClass whose last batch dimension is
the turn. This module holds the conversions the dataset, the reward wrapper, the reward bridges
and the tutorial call. Three speed paths read a History's payloads without them and give the
same messages (each tested against these functions): ``_history_fields`` (roles and contents in
one walk), ``rollouts/_render`` (the online loop's chat-template renders) and
``rollouts/_policy_output`` (a History extended by the policy's answer).

Every field of a message crosses the boundary, kept exactly (no stripping, no template):
``role`` and ``content`` as History's fields, tool calls and the other fields through
``_tool_calls`` (the fields History has no slot for ride in a
:class:`~torchrl_trl_interop.MessageHistory`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDictBase,
    is_non_tensor,
    lazy_stack,
    set_list_to_stack,
)
from tensordict.utils import NestedKey

from ._checks import as_names, boundary, check_bool, check_dicts, signed
from ._deprecation import warn_deprecated
from ._keys import PLACEHOLDER_ROLE, as_nested_key, flatten_nested, get_entry, key_parts
from ._message_fields import MessageHistory
from ._tool_calls import has_turn_fields, message_turns, messages_of_turns
from ._upstream._history_fields import history_fields
from ._upstream._lazy_rows import tensorclass_over, text_stack

if TYPE_CHECKING:  # pragma: no cover
    from torchrl.data.llm import History

__all__ = [
    "conversations_to_histories",
    "history_to_messages",
    "is_conversational",
    "is_message_list",
    "messages_to_history",
    "real_turns",
    "row_values",
    "split_completion",
    "split_prompt_completion",
]

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
    from torchrl.data.llm import History

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
    from torchrl.data.llm import History

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
            signed(
                f"{where} should be a list of {{'role', 'content'}} dicts, got "
                f"{type(messages).__name__}."
            )
        )
    check_dicts(messages, where, "with 'role' and 'content'")
    for i, message in enumerate(messages):
        for field in ("role", "content"):
            if field == "content" and message.get("content") is None and message.get("tool_calls"):
                continue  # TRL's tool-calling turn: the calls are its content
            if not isinstance(message.get(field), str):
                raise ValueError(
                    signed(
                        f"{where}[{i}] needs a str {field!r}, got {message.get(field)!r} (message: "
                        f"{message!r}). Multimodal or tool content must be rendered to text first."
                    )
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
                signed(f"{where} is an empty conversation; a History needs at least one turn.")
            )
        if all(len(m) == 2 and "content" in m for m in messages):  # role and content only
            return messages, None, True
        return (messages, *message_turns(messages, where))
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(signed(f"{where} should be a non-empty list of conversations."))
    return [_parse(m, depth - 1, f"{where}[{i}]") for i, m in enumerate(messages)]


def _all_plain(parsed: Any, depth: int) -> bool:
    if depth == 0:
        return parsed[2]
    return all(_all_plain(p, depth - 1) for p in parsed)


def _construct(parsed: Any, depth: int, cls: type) -> History:
    """The History (of class ``cls``) of parsed conversations."""
    if depth > 0:
        return lazy_stack([_construct(p, depth - 1, cls) for p in parsed])
    messages, turns, _ = parsed
    if turns is None:  # the fields History's constructor sets, built directly (half its time)
        size = torch.Size([len(messages)])
        fields = {
            "role": text_stack([m["role"] for m in messages]),
            "content": text_stack([m["content"] for m in messages]),
            "is_complete": NonTensorData(True, batch_size=size),
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
    from torchrl.data.llm import History

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
    from torchrl.data.llm import History

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
            signed(
                f"{context}the conversation ends with a {messages[-1]['role']!r} turn, not one of "
                f"completion_roles={roles}, so it holds no completion. Score conversations after "
                "the policy answered, or widen completion_roles."
            )
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
    from torchrl.data.llm import History

    try:
        key = as_nested_key(key, arg)
    except TypeError as err:
        raise TypeError(signed(err.args[0])) from None
    value = get_entry(
        td, key_parts(key), arg, hint=f"Pass {arg}=... naming where the rollouts hold it."
    )
    if isinstance(value, list):  # a ragged lazy stack of tensors: go row by row
        return [v for sub in td.unbind(0) for v in row_values(sub, key, arg)]
    if isinstance(value, History):
        if value.ndim != td.ndim + 1:
            raise ValueError(
                signed(
                    f"{arg}={key!r} holds a History of batch size {tuple(value.batch_size)}; "
                    f"expected the tensordict's {tuple(td.batch_size)} plus one turn dimension."
                )
            )
        return flatten_nested(history_to_messages(value), td.ndim)
    if isinstance(value, torch.Tensor):
        if value.shape[: td.ndim] != td.batch_size:
            raise ValueError(
                signed(
                    f"{arg}={key!r} has shape {tuple(value.shape)}; expected leading dims "
                    f"{tuple(td.batch_size)}."
                )
            )
        return list(value.reshape(td.batch_size.numel(), *value.shape[td.ndim :]).tolist())
    if is_non_tensor(value):
        if td.ndim == 0:
            return [value.tolist() if isinstance(value, NonTensorStack) else value.data]
        return flatten_nested(value.tolist(), td.ndim)
    raise TypeError(
        signed(
            f"{arg}={key!r} holds a {type(value).__name__}; expected a History, strings or a "
            "tensor."
        )
    )
