"""Tests for torchrl_trl_interop.conversation: History <-> TRL messages, both directions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, lazy_stack, list_to_stack, set_list_to_stack
from tensordict import _utils_options as td_options
from torchrl.data.llm import History

from torchrl_trl_interop import (
    TorchRLBufferDataset,
    history_to_messages,
    is_message_list,
    messages_to_history,
    replay_buffer_from_hf,
    rows_to_tensordict,
    split_prompt_completion,
)
from torchrl_trl_interop._upstream import plain_upstream
from torchrl_trl_interop._upstream._history_fields import (
    _layout_fields,
    _layout_values,
    history_fields,
    history_messages,
)
from torchrl_trl_interop.testing import toy_chats


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


CHAT = [_msg("system", "Be brief."), _msg("user", "2+2?"), _msg("assistant", "4")]


class TestHistoryToMessages:
    def test_one_conversation(self):
        history = messages_to_history(CHAT)
        assert history.batch_size == torch.Size([3])
        assert history_to_messages(history) == CHAT

    def test_ragged_batch(self):
        chats = toy_chats(5)
        assert len({len(c) for c in chats}) > 1  # ragged turn counts
        with set_list_to_stack(True):
            history = History.from_chats(chats)
        assert history_to_messages(history) == chats

    def test_group_batch(self):
        chats = toy_chats(6)
        nested = [chats[:3], chats[3:]]
        history = messages_to_history(nested)
        assert history.batch_size[:2] == torch.Size([2, 3])
        assert history_to_messages(history) == nested

    def test_keep_system(self):
        history = messages_to_history([CHAT, CHAT[1:]])
        assert history_to_messages(history, keep_system=False) == [CHAT[1:], CHAT[1:]]

    def test_not_a_history(self):
        with pytest.raises(TypeError, match="expects a torchrl.data.llm.History, got list"):
            history_to_messages(CHAT)

    def test_no_turn_dimension(self):
        with pytest.raises(ValueError, match=r"batch_size=\[\] \(a single message"):
            history_to_messages(messages_to_history(CHAT)[0])


class TestMessagesToHistory:
    @pytest.mark.parametrize(
        "messages",
        [
            CHAT,  # [T]
            toy_chats(4),  # [B, T] ragged
            [toy_chats(4)[:2], toy_chats(4)[2:]],  # [E, G, T] ragged
            [[CHAT, CHAT[:1]], [CHAT[:2], CHAT]],  # [E, G, T] ragged
        ],
        ids=["T", "B,T", "E,G,T", "E,G,T-2"],
    )
    def test_round_trip_messages(self, messages):
        assert history_to_messages(messages_to_history(messages)) == messages

    @pytest.mark.parametrize("shape", ["T", "B,T", "E,G,T"])
    def test_round_trip_history(self, shape):
        chats = toy_chats(4)
        with set_list_to_stack(True):
            if shape == "T":
                history = History.from_chats([chats[2]])[0]
            elif shape == "B,T":
                history = History.from_chats(chats)
            else:
                history = lazy_stack([History.from_chats(chats[:2]), History.from_chats(chats[2:])])
        back = messages_to_history(history_to_messages(history))
        assert back.batch_size[:-1] == history.batch_size[:-1]
        assert history_to_messages(back) == history_to_messages(history)
        assert back.role == history.role
        assert back.content == history.content

    @pytest.mark.parametrize("group", [2, 4])
    def test_a_group_of_equal_conversations_gives_rows_of_their_own(self, group):
        """GRPO's prompts, each repeated ``group`` times in a row (its turns built once): every
        row reads as its conversation, and extending one in place (a tool transform) changes no
        other row."""
        chats = [c for c in (CHAT[:2], CHAT[1:2]) for _ in range(group)]
        history = messages_to_history(chats)
        assert history_to_messages(history) == chats
        rows = history.unbind(0)
        rows[0].extend(History(role="assistant", content="4", batch_size=(1,)), inplace=True, dim=0)
        assert history_to_messages(rows[0]) == [*CHAT[:2], _msg("assistant", "4")]
        assert [history_to_messages(r) for r in rows[1:]] == chats[1:]
        assert history.role == History.from_chats(chats).role

    def test_input_not_mutated(self):
        chats = toy_chats(3)
        snapshot = [[dict(m) for m in c] for c in chats]
        messages_to_history(chats)
        assert chats == snapshot

    def test_message_not_a_dict(self):
        with pytest.raises(TypeError, match=r"messages\[1\] should be a dict"):
            messages_to_history([_msg("user", "Hi"), "oops"])

    def test_conversation_not_a_list(self):
        with pytest.raises(TypeError, match="messages should be a list of"):
            messages_to_history("Hello")

    @pytest.mark.parametrize(
        "bad, field",
        [(_msg("user", None), "content"), ({"content": "Hi"}, "role"), (_msg(3, "x"), "role")],
    )
    def test_non_str_field(self, bad, field):
        with pytest.raises(ValueError, match=f"needs a str '{field}'"):
            messages_to_history([bad])

    def test_multimodal_content(self):
        bad = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
        with pytest.raises(ValueError, match="rendered to text first"):
            messages_to_history([bad])

    def test_empty_conversation(self):
        with pytest.raises(ValueError, match="empty conversation"):
            messages_to_history([])
        with pytest.raises(ValueError, match=r"messages\[1\] is an empty conversation"):
            messages_to_history([CHAT, []])


class TestGlobalModeUnchanged:
    """Conversions scope tensordict's list-to-stack mode; the process-wide setting stays."""

    @staticmethod
    def _convert_everything():
        history = messages_to_history(toy_chats(3))
        assert history_to_messages(history) == toy_chats(3)
        td = rows_to_tensordict([{"prompt": CHAT, "x": 1}, {"prompt": CHAT[:1], "x": 2}])
        with set_list_to_stack(True):  # torchrl's History needs it to be read back
            assert history_to_messages(td.get("prompt")) == [CHAT, CHAT[:1]]

    def test_unset(self, monkeypatch):
        monkeypatch.setattr(td_options, "_LIST_TO_STACK", None)
        monkeypatch.delenv("LIST_TO_STACK", raising=False)
        self._convert_everything()
        assert list_to_stack(allow_none=True) is None
        assert td_options._LIST_TO_STACK is None

    @pytest.mark.parametrize("mode", [True, False])
    def test_set_by_the_user(self, mode):
        with set_list_to_stack(mode):
            self._convert_everything()
            assert list_to_stack() is mode
            assert td_options._LIST_TO_STACK is mode


class TestPredicates:
    def test_is_message_list(self):
        assert is_message_list(CHAT)
        assert not is_message_list([])
        assert not is_message_list("Hi")
        assert not is_message_list([{"role": "user"}])

    def test_is_conversational_is_deprecated_for_trls(self):
        """The deprecated copy warns (naming TRL's check and the version that removes it), and
        answers as TRL's does until then; its errors name its argument."""
        from trl.data_utils import is_conversational as trls

        from torchrl_trl_interop import is_conversational

        rows = [
            {"messages": CHAT},
            {"prompt": CHAT[:2], "completion": CHAT[2:]},
            {"prompt": "Hi", "chosen": "a", "rejected": "b"},
            {"other": CHAT},
        ]
        warned = r"removed in 0\.3\.0: use trl\.data_utils\.is_conversational"
        with pytest.warns(DeprecationWarning, match=warned):
            ours = [is_conversational(row) for row in rows]
            with pytest.raises(TypeError, match="example must be a dict"):
                is_conversational(None)
        assert ours == [trls(row) for row in rows] == [True, True, False, False]


class TestSplitPromptCompletion:
    def test_single_turn(self):
        assert split_prompt_completion(CHAT) == (CHAT[:2], CHAT[2:])

    def test_trailing_run_of_completion_roles(self):
        chat = CHAT + [_msg("tool", "42"), _msg("assistant", "It is 4.")]
        assert split_prompt_completion(chat) == (chat[:4], chat[4:])
        prompt, completion = split_prompt_completion(chat, completion_roles=("assistant", "tool"))
        assert (prompt, completion) == (chat[:2], chat[2:])

    def test_copies(self):
        prompt, completion = split_prompt_completion(CHAT)
        completion[0]["content"] = "changed"
        assert CHAT[2]["content"] == "4"

    def test_empty_prompt(self):
        assert split_prompt_completion([_msg("assistant", "Hi")]) == ([], [_msg("assistant", "Hi")])

    def test_no_completion(self):
        with pytest.raises(ValueError, match="ends with a 'user' turn"):
            split_prompt_completion(CHAT[:2])

    def test_not_a_conversation(self):
        with pytest.raises(TypeError, match="expects one conversation"):
            split_prompt_completion("Hi")


class TestRowsToTensordict:
    def test_column_kinds(self):
        rows = [
            {"prompt": CHAT, "text": "a", "n": 1, "x": 0.1, "b": True, "ids": [1, 2, 3], "o": None},
            {
                "prompt": CHAT[:1],
                "text": "",
                "n": 2,
                "x": 2.5,
                "b": False,
                "ids": [],
                "o": [1, "a"],
            },
        ]
        td = rows_to_tensordict(rows, rename={"prompt": ("history", "prompt")})
        assert td.batch_size == torch.Size([2])
        assert history_to_messages(td.get(("history", "prompt"))) == [CHAT, CHAT[:1]]
        assert td.get("text").tolist() == ["a", ""]
        assert td.get("n").dtype == torch.int64 and td.get("n").tolist() == [1, 2]
        assert td.get("x").dtype == torch.float64 and td.get("x").tolist() == [0.1, 2.5]
        assert td.get("b").dtype == torch.bool
        assert td.get("ids", as_list=True)[0].tolist() == [1, 2, 3]
        assert td.get("ids", as_list=True)[1].dtype == torch.int64
        assert td.get("o").tolist() == [None, [1, "a"]]

    def test_empty(self):
        with pytest.raises(ValueError, match="non-empty list of TRL rows"):
            rows_to_tensordict([])

    def test_row_not_a_dict(self):
        with pytest.raises(
            TypeError,
            match=r"rows\[1\] should be a dict mapping column names to values, got .b. of type str",
        ):
            rows_to_tensordict([{"a": 1}, "b"])

    def test_different_columns(self):
        with pytest.raises(KeyError, match="row 1 has columns"):
            rows_to_tensordict([{"a": 1}, {"b": 1}])

    def test_rename_unknown(self):
        with pytest.raises(
            KeyError, match=r"rename= names \['z'\], not among the rows' columns \['a'\]"
        ):
            rows_to_tensordict([{"a": 1}], rename={"z": "y"})

    def test_mixed_conversation_column(self):
        with pytest.raises(ValueError, match="column 'prompt' holds conversations"):
            rows_to_tensordict([{"prompt": CHAT}, {"prompt": "Hi"}])

    def test_result_is_a_tensordict(self):
        td = rows_to_tensordict([{"a": 1}])
        assert isinstance(td[0], TensorDict)


# -- property test ---------------------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),  # any unicode but lone surrogates
    max_size=12,
)
_message = st.builds(
    _msg, st.sampled_from(["system", "user", "assistant", "tool", "rôle-✓"]) | _text, _text
)
_chat = st.lists(_message, min_size=1, max_size=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chats=st.lists(_chat, min_size=1, max_size=4), groups=st.integers(1, 2))
def test_round_trip_property(chats, groups):
    assert history_to_messages(messages_to_history(chats[0])) == chats[0]
    assert history_to_messages(messages_to_history(chats)) == chats
    nested = [chats] * groups
    history = messages_to_history(nested)
    assert history_to_messages(history) == nested
    again = messages_to_history(history_to_messages(history))
    assert history_to_messages(again) == nested


def _reference_messages(history: History) -> list:
    """The conversion before the fast path: every field through the tensorclass, then zipped."""

    def zip_turns(roles, contents, depth):
        if depth == 0:
            return [{"role": r, "content": c} for r, c in zip(roles, contents)]
        return [zip_turns(r, c, depth - 1) for r, c in zip(roles, contents)]

    return zip_turns(history.role, history.content, history.ndim - 1)


def _role_content(messages: Any) -> Any:
    """Every message in (nested lists of) messages reduced to its role and content."""
    if isinstance(messages, dict):
        return {"role": messages["role"], "content": messages["content"]}
    return [_role_content(m) for m in messages]


_ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
_MESSAGE = st.fixed_dictionaries({"role": _ROLES, "content": st.text(max_size=8)})
_CHAT = st.lists(_MESSAGE, min_size=1, max_size=4)


class TestFastPathMatchesTensorclassPath:
    """``history_to_messages`` reads role/content from the stack's lists once per batch; what it
    returns equals reading every field through the tensorclass (the path it replaced)."""

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        chats=st.lists(_CHAT, min_size=1, max_size=5),
        layout=st.sampled_from(
            [
                "from_chats",
                "buffer",
                "group",
                "tool_calls",
                "dense",
                "slice",
                "messages_to_history",
                "messages_to_history_buffer",
                "tensor_storage",
            ]
        ),
    )
    def test_random_layouts(self, chats, layout):
        from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

        with set_list_to_stack(True):
            if layout in ("dense", "tensor_storage"):  # equal turn counts: one [B, T] History
                chats = [(c * 4)[:3] for c in chats]
            if layout == "group":  # [E, G, T]
                history = messages_to_history([chats, chats[::-1]])
            elif layout.startswith("messages_to_history"):  # TensorDicts of NonTensorStacks
                history = messages_to_history(chats)
            elif layout == "tensor_storage":  # one TensorDict of [B, T] NonTensorStacks
                rb = ReplayBuffer(storage=LazyTensorStorage(8))
                rb.extend(TensorDict({"h": History.from_chats(chats)}, batch_size=[len(chats)]))
                history = rb[torch.arange(len(chats))].get("h")
            elif layout == "tool_calls":  # History with every optional field set
                history = lazy_stack(
                    [
                        History(
                            role=[m["role"] for m in c],
                            content=[m["content"] for m in c],
                            is_complete=[True] * len(c),
                            tool_calls=[[{"name": "f", "arguments": "{}"}]] * len(c),
                            batch_size=(len(c),),
                        )
                        for c in chats
                    ]
                )
            else:
                history = History.from_chats(chats)
            if layout in ("buffer", "messages_to_history_buffer"):  # TorchRL's LLM storage
                rb = ReplayBuffer(storage=LazyStackStorage(8))
                rb.extend(lazy_stack([TensorDict({"h": history[i]}) for i in range(len(chats))]))
                history = rb[torch.arange(len(chats))].get("h")
            if layout == "slice":
                history = history[::-1][: max(1, len(chats) - 1)]
            expected = _reference_messages(history)
            # tool calls are carried too (tool_calls.py, tested in test_hardening.py): compare
            # the role/content the fast path reads
            plain = _role_content if layout == "tool_calls" else (lambda x: x)
            assert plain(history_to_messages(history)) == expected
            fields = history_fields(history)  # the plain upstream branch reads the same
            with plain_upstream():
                assert plain(history_to_messages(history)) == expected
                assert history_fields(history) == fields
                if history.ndim == 2:
                    assert history_messages(history) == history.tolist(tolist_first=True)
            for row in range(history.batch_size[0]):
                assert plain(history_to_messages(history[row])) == expected[row]
            if layout != "tool_calls":  # every plain layout is read from its payloads
                assert _layout_fields(history._tensordict, history.ndim) is not None
            if history.ndim == 2:  # the turns' dicts a chat template renders: tolist's own
                assert history_messages(history) == history.tolist(tolist_first=True)
                fast = [
                    _layout_values(history._tensordict, 2, names, exact=True) is not None
                    for names in (("role", "content", "is_complete"), ("role", "content"))
                ]
                assert any(fast) == (layout != "tool_calls")  # read from the payloads

    def test_broadcast_payload(self):
        """A ``NonTensorData`` holds one value for its whole batch: read as that value per turn
        (``history.role`` gives the bare value there, so ``History.tolist`` is the reference)."""
        with set_list_to_stack(True):
            history = History(role="user", content="Hi", batch_size=[2, 3])
            assert _layout_fields(history._tensordict, 2) is not None
            assert history_to_messages(history) == _role_content(history.tolist())
            assert history_to_messages(history) == [[_msg("user", "Hi")] * 3] * 2
            with plain_upstream():
                assert history_to_messages(history) == [[_msg("user", "Hi")] * 3] * 2

    def test_messages_to_history_rows_in_both_views(self):
        """Rows whose History came from ``messages_to_history``, through a buffer, read the
        same in the torch dataset and the Arrow view as the conversations put in."""
        from torchrl.data import LazyStackStorage, ReplayBuffer

        chats = toy_chats(6)
        history = messages_to_history(chats)
        with set_list_to_stack(True):
            rb = ReplayBuffer(storage=LazyStackStorage(8))
            rb.extend(lazy_stack([TensorDict({"h": history[i]}) for i in range(len(chats))]))
        ds = TorchRLBufferDataset(rb, 3, epoch=True)
        assert [r["h"] for r in ds] == chats
        assert TorchRLBufferDataset(rb, 6).to_hf_dataset()["h"] == chats


def chat(answer: str) -> list[dict]:
    return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]


class TestToolCalls:
    """Regression (issue 10, item 9): ``history_to_messages`` dropped tool calls; ``messages_to_history`` refused them."""

    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    tool_chat = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]

    def test_round_trip_in_trl_format(self):
        chats = [self.tool_chat, chat("4")]
        history = messages_to_history(chats)
        assert history_to_messages(history) == chats
        assert history_to_messages(history[0], keep_system=False) == self.tool_chat[1:]
        nested = [[self.tool_chat, chat("5")], [chat("4"), chat("6")]]
        assert history_to_messages(messages_to_history(nested)) == nested

    def test_content_none_next_to_tool_calls(self):
        turn = {"role": "assistant", "content": None, "tool_calls": [self.call]}
        out = history_to_messages(messages_to_history([chat("4")[0], turn]))
        assert out[1] == {**turn, "content": ""}
        with pytest.raises(ValueError, match=r"needs a str 'content', got None"):
            messages_to_history([{"role": "assistant", "content": None}])

    def test_torchrl_bare_calls_come_out_in_trl_format(self):
        from tensordict import set_list_to_stack
        from torchrl.data.llm import History

        bare = {"name": "add", "arguments": {"a": 2, "b": 2}}
        with set_list_to_stack(True):
            history = lazy_stack(
                [
                    History(role="assistant", content="", tool_calls=[bare]),
                    History(role="tool", content="4"),
                ]
            )
        assert history_to_messages(history) == self.tool_chat[2:4]

    def test_tool_name_must_match_the_call(self):
        wrong = [*self.tool_chat[:3], {"role": "tool", "name": "mul", "content": "4"}]
        with pytest.raises(ValueError, match=r"messages\[3\] is a tool turn named 'mul'.*'add'"):
            messages_to_history(wrong)
        with pytest.raises(TypeError, match=r"\['tool_calls'\] should be a list of dicts"):
            messages_to_history([{"role": "assistant", "content": "", "tool_calls": "add(2)"}])

    def test_through_a_buffer_and_both_hf_views(self):
        rows = [{"messages": self.tool_chat}, {"messages": chat("4")}]
        rb = replay_buffer_from_hf(rows)
        ds = TorchRLBufferDataset(rb, 2, epoch=True)
        assert [r["messages"] for r in ds] == [self.tool_chat, chat("4")]
        assert [r["messages"] for r in ds.as_hf_dataset(num_shards=1)] == [
            self.tool_chat,
            chat("4"),
        ]
        first = TorchRLBufferDataset(replay_buffer_from_hf(rows[:1]), 1).to_hf_dataset()[0]
        calls = [m for m in first["messages"] if m["tool_calls"]]
        assert calls[0]["tool_calls"] == [self.call]


class TestMessageFields:
    """Regression (issue 20, item 8): fields other than role/content/tool calls were dropped
    (``reasoning_content``, a user's ``name``) or replaced (a tool turn's ``tool_call_id`` by a
    derived ``name``)."""

    call = {"type": "function", "id": "call_7", "function": {"name": "add", "arguments": {"a": 2}}}
    chats = {
        "reasoning": [
            _msg("user", "2+2?"),
            {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."},
        ],
        "user_name": [{"role": "user", "content": "Hi", "name": "Ann"}, _msg("assistant", "Hey")],
        "tool_call_id": [
            _msg("user", "2+2?"),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_7", "content": "4"},  # no name: none added
            {"role": "assistant", "content": "4", "reasoning_content": None},
        ],
        "tool_turn_without_name": [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            _msg("tool", "4"),
        ],
        "schema_nones": [  # what a datasets.Dataset gives: every field of its schema, None if unset
            {"role": "user", "content": "2+2?", "name": None, "tool_calls": None},
            {"role": "assistant", "content": "4", "name": None, "tool_calls": None},
        ],
    }

    @pytest.mark.parametrize("case", sorted(chats))
    def test_round_trip_is_exact(self, case):
        chat = self.chats[case]
        history = messages_to_history(chat)
        assert type(history).__name__ == "MessageHistory" and isinstance(history, History)
        assert history_to_messages(history) == chat
        nested = [[chat, CHAT], [CHAT, chat]]  # one class for the whole batch
        assert history_to_messages(messages_to_history(nested)) == nested
        assert history_to_messages(messages_to_history(nested)[1, 1]) == chat
        again = messages_to_history(history_to_messages(history))
        assert history_to_messages(again) == chat
        no_system = history_to_messages(messages_to_history([CHAT, chat]), keep_system=False)
        assert no_system == [CHAT[1:], [m for m in chat if m["role"] != "system"]]

    def test_plain_conversations_stay_plain_history(self):
        plain = TestToolCalls.tool_chat  # tool turn named after its call: derived on the way out
        assert type(messages_to_history([CHAT, plain])) is History
        assert type(messages_to_history(CHAT)) is History

    def test_a_wrong_tool_name_is_still_refused(self):
        chat = [*self.chats["tool_call_id"][:2], {"role": "tool", "name": "mul", "content": "4"}]
        with pytest.raises(ValueError, match=r"messages\[2\] is a tool turn named 'mul'.*'add'"):
            messages_to_history([{**chat[0], "name": "Ann"}, *chat[1:]])

    def test_torchrl_sees_the_fields(self, tokenizer):
        from torchrl_trl_interop import MessageHistory

        chat = self.chats["reasoning"]
        history = messages_to_history(chat)
        template = (
            "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>"
            "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}{% endfor %}"
        )
        rendered = history.apply_chat_template(
            tokenizer=tokenizer, chat_template=template, add_generation_prompt=False
        )
        assert rendered == "<user>2+2?<assistant><think>2 and 2 make 4.</think>4"
        with set_list_to_stack(True):
            again = MessageHistory.from_chats(history.tolist())
        assert history_to_messages(again) == chat

    @pytest.mark.parametrize("storage", ["LazyStackStorage", "ListStorage"])
    def test_through_a_buffer_and_every_view(self, storage):
        import torchrl.data

        rows = [{"messages": chat} for chat in self.chats.values()]
        rb = replay_buffer_from_hf(rows, storage=getattr(torchrl.data, storage)(len(rows)))
        ds = TorchRLBufferDataset(rb, 2, epoch=True)
        assert [dict(r) for r in ds] == rows
        assert list(ds.as_hf_dataset(num_shards=1)) == rows
        from datasets import Dataset

        assert ds.to_hf_dataset().to_list() == Dataset.from_list(rows).to_list()


_FIELD = st.sampled_from(["reasoning_content", "name", "tool_call_id", "thinking", "weight"])
_fielded_message = st.builds(
    lambda m, extra: {**m, **extra},
    _message,
    st.dictionaries(_FIELD, st.none() | _text | st.integers(-3, 3), max_size=2),
)
_calling_turn = st.builds(  # an assistant turn calling "add", then its tool turn
    lambda content, name, extra: [
        {"role": "assistant", "content": content, "tool_calls": [TestMessageFields.call]},
        {"role": "tool", "content": "4", **name, **extra},
    ],
    st.none() | st.just(""),
    st.sampled_from([{}, {"name": "add"}, {"name": None}]),
    st.dictionaries(st.just("tool_call_id"), _text, max_size=1),
)
_fielded_chat = st.lists(
    _fielded_message.map(lambda m: [m]) | _calling_turn, min_size=1, max_size=3
).map(lambda parts: [m for part in parts for m in part])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chats=st.lists(_fielded_chat, min_size=1, max_size=3))
def test_round_trip_property_with_message_fields(chats):
    """Any extra fields on any turn, tool calls and their answers: the messages come back (a
    tool-calling turn's ``content: None`` as ``""``)."""
    chats = [
        [{**m, "content": m["content"] or ""} if m.get("tool_calls") else m for m in chat]
        for chat in chats
    ]
    history = messages_to_history(chats)
    assert history_to_messages(history) == chats
    assert [history_to_messages(history[i]) for i in range(len(chats))] == chats
