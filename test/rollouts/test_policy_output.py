"""The policy's output layout: ``stack_rows`` builds what torchrl's attribute assignment builds.

torchrl's LLM wrappers write ragged output (``pad_output=False``) by assigning lists to a
tensorclass over a lazy stack (``tokens.response = [...]``); ``TrainerModelPolicy`` builds the
same layout row by row with ``stack_rows``. Tensors, strings and ``History`` rows are compared
container by container, leaf by leaf.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import (
    NonTensorData,
    TensorDict,
    is_tensor_collection,
    is_tensorclass,
    lazy_stack,
    set_list_to_stack,
)
from torchrl.data.llm import History
from torchrl.modules.llm import ChatHistory, LogProbs, Text, Tokens

from torchrl_trl_interop import messages_to_history
from torchrl_trl_interop._upstream._lazy_rows import extend_history, stack_rows

#: every test runs on both branches of the _upstream speed paths (fast and plain upstream)
pytestmark = pytest.mark.usefixtures("upstream_branch")


def _layout(value, depth=0) -> list:
    """The classes of ``value``'s containers and leaves, key by key, rows of lazy stacks too."""
    data = value._tensordict if is_tensorclass(value) else value
    shape = value.shape if isinstance(value, torch.Tensor) else value.batch_size
    out = [(depth, type(value).__name__, type(data).__name__, tuple(shape))]
    if type(data).__name__ == "LazyStackedTensorDict":
        out.append(("stack_dim", data.stack_dim))
        for row in data.tensordicts:
            out += _layout(row, depth + 1)
    elif is_tensor_collection(data) and not type(value).__name__.startswith("NonTensor"):
        for key in sorted(data.keys()):
            out += [key, *_layout(data.get(key), depth + 1)]
    return out


def _assigned(cls, columns: dict) -> object:
    """What torchrl's wrappers build: the lists assigned to a tensorclass over a lazy stack."""
    n = len(next(iter(columns.values())))
    out = TensorDict(batch_size=[n]).to_lazystack(0)
    value = cls._from_tensordict(out.empty())
    for name, column in columns.items():  # History rows as the policy assigned them: stacked
        setattr(value, name, lazy_stack(column) if isinstance(column[0], History) else column)
    out.set("value", value)
    return TensorDict(batch_size=[n]).update(out).get("value")


def _histories(n):
    return [
        History(role=["user"] * (i + 1), content=[f"q{i}"] * (i + 1), batch_size=(i + 1,))
        for i in range(n)
    ]


COLUMNS = {
    "tokens": (Tokens, lambda n: {"prompt": [torch.arange(i + 1) for i in range(n)]}),
    "log-probs": (LogProbs, lambda n: {"response": [-torch.rand(i + 2) for i in range(n)]}),
    "text": (Text, lambda n: {"prompt": [f"p{i}" for i in range(n)], "full": ["f"] * n}),
    "history": (ChatHistory, lambda n: {"prompt": _histories(n), "full": _histories(n)}),
}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("kind", list(COLUMNS))
def test_stack_rows_is_torchrls_layout(kind, n):
    cls, make = COLUMNS[kind]
    columns = make(n)
    with set_list_to_stack(True):
        ours, theirs = stack_rows(cls, **columns), _assigned(cls, columns)
        assert _layout(ours) == _layout(theirs)
        for name, column in columns.items():
            read = ours.get(name, as_list=True) if kind != "history" else getattr(ours, name)
            if kind == "history":
                assert [h.tolist() for h in read.unbind(0)] == [h.tolist() for h in column]
            elif kind == "text":
                assert list(read) == column
            else:
                assert all(torch.equal(a, b) for a, b in zip(read, column))


def test_stack_rows_objects_hold_what_their_constructors_give():
    """Beyond the layout: each str leaf holds what ``NonTensorData(data=...)`` holds, and the
    tensorclass what ``_from_tensordict`` (``__post_init__`` included) gives over the rows."""
    with set_list_to_stack(True):
        text = stack_rows(Text, prompt=["p0", "p1"], full=["f0", "f1"])
        for row in text._tensordict.tensordicts:
            for value in ("prompt", "full"):
                leaf = row.get(value)
                made = NonTensorData(data=leaf.data)
                assert type(leaf) is type(made) and leaf.__dict__.keys() == made.__dict__.keys()
                assert leaf._non_tensordict == made._non_tensordict
                assert leaf._tensordict.batch_size == made._tensordict.batch_size == ()
        chat = stack_rows(ChatHistory, prompt=_histories(2), full=_histories(2))
        made = ChatHistory._from_tensordict(chat._tensordict)
        assert chat.__dict__.keys() == made.__dict__.keys()
        assert chat._non_tensordict == made._non_tensordict == {"response": None}
        assert chat.full.batch_size == made.full.batch_size == (2, -1)  # ragged: 1 and 2 turns


def test_stack_rows_needs_one_value_per_row():
    with pytest.raises(ValueError):
        stack_rows(Text, prompt=["a", "b"], full=["c"])


_CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"What is {i} plus 2?"},
    ]
    for i in range(3)
]
_ANSWERS = [
    "<|im_start|>assistant\n3<|im_end|>",  # complete
    "<|im_start|>assistant\n4 plus",  # cut short: is_complete False
    "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>",  # two turns
]


def _leaves(history) -> list:
    """Every NonTensorData leaf of a History, field by field, turn by turn."""
    td = history._tensordict
    if type(td).__name__ == "LazyStackedTensorDict":
        return [row.get(k) for k in sorted(td.tensordicts[0].keys()) for row in td.tensordicts]
    return [leaf for k in sorted(td.keys()) for leaf in getattr(td.get(k), "tensordicts", [])]


@pytest.mark.parametrize("prompts", ["from_chats", "messages_to_history"])
def test_extend_history_is_history_extend(prompts):
    """Same containers, same values, over the same leaves as ``History.extend`` (which concatenates
    with ``torch.cat``), for the prompt layouts torchrl and ``messages_to_history`` write, the
    answer layout ``from_text`` writes, and the extended layout itself (the next turn)."""
    with set_list_to_stack(True):
        build = History.from_chats if prompts == "from_chats" else messages_to_history
        rows = build(_CHATS).unbind(0)
        answers = [History.from_text(t, chat_template_name="chatml_format") for t in _ANSWERS]
        for prompt, answer in zip(rows, answers):
            theirs, ours = (
                prompt.extend(answer, inplace=False, dim=0),
                extend_history(prompt, answer),
            )
            assert _layout(ours) == _layout(theirs)
            assert ours.tolist() == theirs.tolist()
            assert ours.tolist()[: prompt.shape[0]] == prompt.tolist()  # the inputs unchanged
            if prompts == "from_chats":  # the leaves themselves, as torch.cat keeps them
                assert all(a is b for a, b in zip(_leaves(ours), _leaves(theirs)))
            again_theirs = theirs.extend(answer, inplace=False, dim=0)
            again_ours = extend_history(ours, answer)
            assert _layout(again_ours) == _layout(again_theirs)
            assert again_ours.tolist() == again_theirs.tolist()


def test_extend_history_other_fields_go_through_extend():
    """An answer with fields the prompt lacks (tool calls) is ``History.extend``'s to join: here
    tensordict refuses to concatenate them, and so does ``extend_history``, with its error."""
    with set_list_to_stack(True):
        prompt = History.from_chats(_CHATS[:1])[0]
        answer = History(
            role=["assistant"],
            content=[""],
            tool_calls=[[{"name": "add", "arguments": {"a": 1}}]],
            batch_size=(1,),
        )
        with pytest.raises(RuntimeError) as theirs:
            prompt.extend(answer, inplace=False, dim=0)
        with pytest.raises(RuntimeError) as ours:
            extend_history(prompt, answer)
        assert str(ours.value) == str(theirs.value)
