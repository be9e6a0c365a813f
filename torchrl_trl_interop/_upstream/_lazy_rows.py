"""torchrl's LLM tensorclasses built row by row: the ragged policy output and a History's extension.

:func:`stack_rows` writes the ragged layout torchrl's wrappers write with ``pad_output=False``
(one ``TensorDict`` per row in a lazy stack, under torchrl's tensorclass) in one pass, where
torchrl's attribute assignment runs one validated ``set`` per row and field (its str leaves built
as ``NonTensorData``'s constructor builds them, without its argument handling, and a
``ChatHistory`` without the ``__post_init__`` check that changes nothing on these rows);
:func:`extend_history` appends a row's answer to its prompt as ``History.extend`` does, over the
same leaves, without tensordict's concatenation (figures: ``benchmarks/RESULTS.rst``);
:func:`text_stack` is ``NonTensorStack.from_list`` of str or bool with those fast leaves
(``messages_to_history``'s columns, a one-turn answer's fields) and :func:`shared_flag` a History's
``is_complete`` leaf.

Both read tensordict's internals (``TensorDict._new_unsafe``,
``NonTensorStack._new_lazy_unsafe``, a tensorclass's ``_tensordict``, ``_non_tensordict``,
``_is_initialized`` and ``_from_tensordict``):
they run on the tensordict versions they were measured on
(:data:`~torchrl_trl_interop._upstream.TENSORDICT_MEASURED`); on any other, :func:`stack_rows`
is a ``lazy_stack`` of one tensorclass per row and :func:`extend_history` is
``history.extend(turns, inplace=False, dim=0)``.

The upstream fix that would retire them: a tensorclass built from a list of rows in one pass
(tensordict), and ``History.extend`` (``torch.cat`` of non-tensor stacks) over the inputs'
leaves without re-validating them (tensordict).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict, lazy_stack

from ._gate import TENSORDICT_MEASURED, use_fast

_SCALAR = torch.Size(())
#: the leaf values :func:`text_stack` builds directly (what ``NonTensorData(data=v)`` holds as is)
_LEAF_TYPES = (str, bool)
#: whether :func:`_text_leaf` built its first leaf (``NonTensorData.__post_init__`` ran once)
_leaf_class_ready = False

__all__ = [
    "extend_history",
    "holds_field",
    "over_same_leaves",
    "shared_flag",
    "stack_rows",
    "tensorclass_over",
    "text_stack",
]

#: the internals this module reads (test/test_layout.py checks the list against the code)
READS = (
    "tensordict.TensorDict._new_unsafe",
    "tensordict.TensorDict._has_names",
    "tensordict.NonTensorStack._new_lazy_unsafe",
    "tensordict.tensorclass._tensordict",
    "tensordict.tensorclass._non_tensordict",
    "tensordict.tensorclass._is_initialized",
    "tensordict.tensorclass._from_tensordict",
)


def stack_rows(cls: Any, **columns: list) -> Any:
    """``cls`` (a torchrl LLM tensorclass) over a lazy stack of one ``TensorDict`` per row.

    This is the layout torchrl's wrappers write with ``pad_output=False``: their attribute
    assignment of a list (``tokens.response = [...]``) sets each row into a lazy stack, one
    validated ``set`` per row and field. Here each row is built once; strings become
    ``NonTensorData`` as a ``set`` makes them. Every column holds one value per row.

    Examples:
        >>> import torch
        >>> from torchrl.modules.llm import Tokens
        >>> tokens = stack_rows(Tokens, prompt=[torch.tensor([1, 2]), torch.tensor([3])])
        >>> tokens.batch_size, tokens.get("prompt", as_list=True)[1]
        (torch.Size([2]), tensor([3]))
    """
    names = list(columns)
    if not use_fast(TENSORDICT_MEASURED):
        return lazy_stack(
            [
                cls(**dict(zip(names, values)), batch_size=[])
                for values in zip(*columns.values(), strict=True)
            ]
        )
    rows = [
        TensorDict._new_unsafe(
            {
                name: _text_leaf(value) if isinstance(value, str) else value
                for name, value in zip(names, values)
            },
            batch_size=_SCALAR,
        )
        for values in zip(*columns.values(), strict=True)
    ]
    stacked = LazyStackedTensorDict(*rows, stack_dim=0)
    if _post_init_is_noop(cls, columns):
        return _without_post_init(cls, stacked, names)
    return cls._from_tensordict(stacked)


def _text_leaf(value: str | bool, batch_size: torch.Size = _SCALAR) -> NonTensorData:
    """``NonTensorData(data=value, batch_size=batch_size)``, what a ``set`` makes of a str (or a
    bool), built as its constructor builds it (the same fields) without the constructor's
    argument handling."""
    global _leaf_class_ready
    empty = TensorDict._new_unsafe({}, batch_size=batch_size)
    payload = {"data": value, "_is_non_tensor": True, "_metadata": None}
    if not _leaf_class_ready:  # its __post_init__ patches the class on the first leaf, once
        leaf = NonTensorData._from_tensordict(empty, payload)
        _leaf_class_ready = True
    else:  # what _from_tensordict sets, without its key checks (these are the class's fields)
        leaf = NonTensorData.__new__(NonTensorData)
        leaf.__dict__["_tensordict"] = empty
        leaf.__dict__["_non_tensordict"] = payload
    leaf.__dict__["_is_initialized"] = True
    return leaf


def shared_flag(value: bool, batch_size: torch.Size) -> NonTensorData:
    """``NonTensorData(value, batch_size=batch_size)``: one flag for every element (a History's
    ``is_complete``, as its constructor sets it), built as :func:`text_stack` builds its leaves.

    Examples:
        >>> import torch
        >>> shared_flag(True, torch.Size([2])).tolist()
        [True, True]
    """
    if type(value) is not bool or not use_fast(TENSORDICT_MEASURED):
        return NonTensorData(value, batch_size=batch_size)
    return _text_leaf(value, batch_size)


def text_stack(values: list) -> NonTensorStack:
    """``NonTensorStack.from_list(values)``; a list of str (or bool: a turn's flags) gets its
    leaves as ``NonTensorData``'s constructor builds them (see :func:`stack_rows`), stacked
    without re-validating them (one device, one shape: they were just built so).

    Examples:
        >>> text_stack(["user", "assistant"]).tolist()
        ['user', 'assistant']
        >>> text_stack([True]).tolist()
        [True]
    """
    fast = values and all(type(v) in _LEAF_TYPES for v in values)
    if not fast or not use_fast(TENSORDICT_MEASURED):
        return NonTensorStack.from_list(values)
    return NonTensorStack._new_lazy_unsafe(*[_text_leaf(v) for v in values], stack_dim=0)


def _post_init_is_noop(cls: Any, columns: dict[str, list]) -> bool:
    """Whether ``cls``'s ``__post_init__`` would change nothing on a stack of ``columns``' rows.

    torchrl's ``ChatHistory.__post_init__`` unsqueezes a History with no turn dimension; with
    every row's History one-dimensional (its turns) it changes nothing, but it reads each field
    of the lazy stack (a stack of the rows' Histories). The other LLM
    tensorclasses have none.
    """
    from torchrl.modules.llm import ChatHistory

    if cls is not ChatHistory:
        return False
    return all(getattr(v, "batch_dims", None) == 1 for column in columns.values() for v in column)


def _without_post_init(cls: Any, td: Any, names: list[str]) -> Any:
    """``cls._from_tensordict(td)`` (``td``'s keys: ``names``) without ``cls.__post_init__``."""
    obj = cls.__new__(cls)
    obj.__dict__["_tensordict"] = td
    obj.__dict__["_non_tensordict"] = {k: None for k in cls.__expected_keys__ if k not in names}
    return obj


def _turns_td(history: Any) -> Any:
    """The tensordict of a 1-D History (its turns) with no names and no device, or ``None``."""
    td = getattr(history, "_tensordict", None)
    if td is None or td.batch_dims != 1 or td._has_names() or td.device is not None:
        return None
    return td


def _turn_leaves(history: Any) -> dict[str, list[NonTensorData]] | None:
    """A 1-D History's ``NonTensorData`` leaves, field by field, one per turn: for the two
    layouts torchrl writes (a lazy stack of one ``TensorDict`` per turn, as ``from_chats`` and
    ``from_text`` build; a ``TensorDict`` of ``NonTensorStack`` columns, as ``extend`` does, or
    of a ``NonTensorData`` shared by every turn, as a History of equal flags holds them).
    ``None`` for any other layout."""
    td = _turns_td(history)
    if td is None:
        return None
    if type(td) is LazyStackedTensorDict and td.stack_dim == 0 and td.tensordicts:
        turns = td.tensordicts
        fields = list(turns[0].keys())
        leaves: dict[str, list] = {field: [] for field in fields}
        for turn in turns:
            if type(turn) is not TensorDict or turn.batch_dims or list(turn.keys()) != fields:
                return None
            for field, leaf in turn.items():
                if type(leaf) is not NonTensorData:
                    return None
                leaves[field].append(leaf)
        return leaves
    if type(td) is TensorDict:
        leaves = {}
        for field, column in td.items():
            if type(column) is NonTensorData:  # one value for every turn: one leaf per turn
                data = column._non_tensordict["data"]
                if type(data) in _LEAF_TYPES and column._non_tensordict.get("_metadata") is None:
                    leaves[field] = [_text_leaf(data) for _ in range(td.batch_size[0])]
                else:  # what unbind makes of it
                    leaves[field] = list(column.unbind(0))
            elif type(column) is NonTensorStack and column.stack_dim == 0:
                leaves[field] = list(column.tensordicts)
            else:
                return None
            if not all(
                type(leaf) is NonTensorData and not leaf.batch_dims for leaf in leaves[field]
            ):
                return None
        return leaves if leaves else None
    return None


def extend_history(history: Any, turns: Any) -> Any:
    """``history.extend(turns, inplace=False, dim=0)`` for two 1-D Histories, without
    tensordict's concatenation.

    ``torch.cat`` of two Histories builds a ``TensorDict`` whose fields are ``NonTensorStack``
    columns over both inputs' own ``NonTensorData`` leaves. This builds the same containers
    over the same leaves directly, for the layouts torchrl writes whose fields match; any other
    input goes through ``extend``.

    Examples:
        >>> from torchrl.data.llm import History
        >>> prompt = History.from_chats([[{"role": "user", "content": "Hi"}]])[0]
        >>> answer = History.from_chats([[{"role": "assistant", "content": "Hello"}]])[0]
        >>> full = extend_history(prompt, answer)
        >>> [(turn["role"], turn["content"]) for turn in full.tolist()]
        [('user', 'Hi'), ('assistant', 'Hello')]
    """
    if not use_fast(TENSORDICT_MEASURED):
        return history.extend(turns, inplace=False, dim=0)
    first, second = _turn_leaves(history), _turn_leaves(turns)
    if first is None or second is None or list(first) != list(second):
        return history.extend(turns, inplace=False, dim=0)
    columns = {
        field: NonTensorStack._new_lazy_unsafe(*leaves, *second[field], stack_dim=0)
        for field, leaves in first.items()
    }
    size = torch.Size([history.batch_size[0] + turns.batch_size[0]])
    return type(history)._from_tensordict(TensorDict._new_unsafe(columns, batch_size=size))


def over_same_leaves(history: Any) -> Any:
    """A new 1-D History over ``history``'s own leaves (a ``TensorDict`` of ``NonTensorStack``
    columns and ``NonTensorData`` flags, as :func:`~torchrl_trl_interop.messages_to_history`
    builds it): new containers, which an in-place change replaces, the same leaves, as
    ``history.clone()`` holds equal ones. ``None`` for any other layout, or off the measured
    tensordict versions.

    Examples:
        >>> from torchrl_trl_interop import messages_to_history
        >>> history = messages_to_history([{"role": "user", "content": "Hi"}])
        >>> again = over_same_leaves(history)
        >>> again.tolist() == history.tolist(), again._tensordict is history._tensordict
        (True, False)
    """
    if not use_fast(TENSORDICT_MEASURED):
        return None
    td = _turns_td(history)
    if type(td) is not TensorDict:
        return None
    fields = {}
    for name, column in td.items():
        if type(column) is NonTensorStack and column.stack_dim == 0:
            column = NonTensorStack._new_lazy_unsafe(*column.tensordicts, stack_dim=0)
        elif type(column) is not NonTensorData:
            return None
        fields[name] = column
    return type(history)._from_tensordict(TensorDict._new_unsafe(fields, batch_size=td.batch_size))


def tensorclass_over(cls: Any, fields: dict, batch_size: torch.Size) -> Any:
    """``cls`` (a tensorclass) over a ``TensorDict`` of ``fields``, built without validating
    them (the caller built them for ``batch_size``); elsewhere ``cls.from_tensordict``.

    Examples:
        >>> import torch
        >>> from tensordict import NonTensorStack
        >>> from torchrl.data.llm import History
        >>> fields = {"role": NonTensorStack.from_list(["user"]),
        ...           "content": NonTensorStack.from_list(["Hi"])}
        >>> tensorclass_over(History, fields, torch.Size([1])).tolist()
        [{'role': 'user', 'content': 'Hi'}]
    """
    if use_fast(TENSORDICT_MEASURED):
        return cls._from_tensordict(TensorDict._new_unsafe(fields, batch_size=batch_size))
    return cls.from_tensordict(TensorDict(fields, batch_size=batch_size))


def holds_field(value: Any, name: str) -> bool:
    """Whether any element of ``value`` (a tensorclass such as a History, lazy stacks too)
    holds a field ``name``; elsewhere read from ``value.tolist()``'s dicts.

    Examples:
        >>> from torchrl.data.llm import History
        >>> holds_field(History.from_chats([[{"role": "user", "content": "Hi"}]]), "tool_calls")
        False
    """
    if use_fast(TENSORDICT_MEASURED):
        return _td_holds(value._tensordict, name)

    def walk(tree: Any) -> bool:
        if isinstance(tree, dict):
            return name in tree
        return any(walk(sub) for sub in tree)

    return walk(value.tolist(tolist_first=True))


def _td_holds(td: Any, name: str) -> bool:
    if name in td.keys():
        return True
    return any(_td_holds(sub, name) for sub in getattr(td, "tensordicts", ()))
