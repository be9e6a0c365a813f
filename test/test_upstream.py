"""``_upstream``: each reach into torchrl's and tensordict's internals, on both branches.

The speed paths' own tests run on both branches (the ``upstream_branch`` fixture in
``test/rollouts/test_env_step.py``, ``test_policy_output.py``, ``test_render.py``,
``test/data/test_direct.py``; ``test/test_conversation.py`` for the History reader). Here: the
small readers, the missing hooks (the same value where the attribute is there, a clear error
where it is gone) and the gates.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, lazy_stack
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer
from torchrl.data.llm import History

from torchrl_trl_interop import CommittedWriter, messages_to_history
from torchrl_trl_interop._upstream import (
    TENSORDICT_MEASURED,
    TORCHRL_MEASURED,
    _buffers,
    _committed_writer,
    measured_on,
    plain_upstream,
    use_fast,
)
from torchrl_trl_interop._upstream._history_fields import (
    history_column,
    non_tensor_payloads,
    row_entries,
)
from torchrl_trl_interop._upstream._lazy_rows import (
    holds_field,
    over_same_leaves,
    shared_flag,
    tensorclass_over,
    text_stack,
)

pytestmark = pytest.mark.usefixtures("upstream_branch")


def _rb(n: int = 3, **kwargs) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(8), **kwargs)
    rb.extend(TensorDict({"x": torch.arange(n), "s": [f"r{i}" for i in range(n)]}, [n]))
    return rb


class TestGate:
    def test_measured_here(self):
        assert measured_on(*TORCHRL_MEASURED) and measured_on(*TENSORDICT_MEASURED)

    def test_plain_upstream_turns_every_gate_off_and_back(self, upstream_branch):
        inside = upstream_branch == "plain"
        assert use_fast(TORCHRL_MEASURED) is not inside
        with plain_upstream():
            assert not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED)
        assert use_fast(TORCHRL_MEASURED) is not inside

    def test_an_unmeasured_version_takes_the_plain_branch(self):
        assert not use_fast(("torchrl", "99.0", "100.0"))


class TestTensordictReaders:
    CHATS = [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {}}]},
        ],
    ]

    def test_non_tensor_payloads(self):
        values = [NonTensorData("a"), NonTensorData({"k": 1})]
        assert non_tensor_payloads(values) == ["a", {"k": 1}]

    def test_row_entries(self):
        rows = [TensorDict({"a": {"b": torch.tensor(i)}, "s": f"t{i}"}) for i in range(3)]
        stack = lazy_stack(rows)
        assert [int(v) for v in row_entries(stack, ("a", "b"))] == [0, 1, 2]
        assert [v.data for v in row_entries(stack, ("s",))] == ["t0", "t1", "t2"]
        assert row_entries(TensorDict({"a": torch.zeros(2)}, [2]), ("a",)) is None

    def test_tensorclass_over_is_the_validated_build(self):
        size = torch.Size([2])
        fields = {
            "role": NonTensorStack.from_list(["user", "assistant"]),
            "content": NonTensorStack.from_list(["Hi", "Ho"]),
        }
        ours = tensorclass_over(History, dict(fields), size)
        assert type(ours) is History and ours.batch_size == size
        assert ours.tolist() == History.from_tensordict(TensorDict(fields, size)).tolist()

    @pytest.mark.parametrize(
        "values", [["user", "assistant"], ["Hi"], ["a", 1], [True], [False, "x"]]
    )
    def test_text_stack_is_from_list(self, values, upstream_branch):
        """The same stack as ``NonTensorStack.from_list``, leaf by leaf (each leaf's fields as
        ``NonTensorData(data=...)`` sets them)."""
        ours, theirs = text_stack(values), NonTensorStack.from_list(values)
        assert type(ours) is type(theirs) and ours.batch_size == theirs.batch_size
        assert ours.stack_dim == theirs.stack_dim and ours.tolist() == theirs.tolist() == values
        for a, b in zip(ours.tensordicts, theirs.tensordicts, strict=True):
            assert type(a) is type(b) and a.__dict__.keys() == b.__dict__.keys()
            assert a._non_tensordict == b._non_tensordict
            assert a._tensordict.batch_size == b._tensordict.batch_size

    def test_over_same_leaves_is_a_copy_an_in_place_change_leaves_alone(self, upstream_branch):
        """New containers over the same leaves: equal to the History, and extending it in place
        (what torchrl's tool transforms do to a prompt) leaves the History as it was; off the
        measured versions, ``None`` (the caller builds the row again)."""
        chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
        history = messages_to_history(chat)
        again = over_same_leaves(history)
        if upstream_branch == "plain":
            assert again is None
            return
        assert type(again) is type(history) and again.batch_size == history.batch_size
        assert again.tolist() == history.tolist()
        assert again._tensordict is not history._tensordict
        assert all(
            a.tensordicts == b.tensordicts and a is not b
            for a, b in zip(again._tensordict.values(), history._tensordict.values())
            if isinstance(a, NonTensorStack)
        )
        again.extend(History(role="assistant", content="Yo", batch_size=(1,)), inplace=True, dim=0)
        assert [m["content"] for m in again.tolist()] == ["S", "Hi", "Yo"]
        assert history.tolist() == History.from_chats([chat])[0].tolist()
        assert over_same_leaves(History.from_chats([chat])[0]) is None  # a lazy stack of turns

    def test_shared_flag_is_the_constructors(self, upstream_branch):
        size = torch.Size([3])
        ours, theirs = shared_flag(True, size), NonTensorData(True, batch_size=size)
        assert type(ours) is type(theirs) and ours.batch_size == theirs.batch_size
        assert ours.__dict__.keys() == theirs.__dict__.keys()
        assert ours._non_tensordict == theirs._non_tensordict
        assert ours.tolist() == theirs.tolist() == [True] * 3

    @pytest.mark.parametrize("build", ["from_chats", "messages_to_history", "both"])
    def test_history_column(self, build, upstream_branch):
        """Per row, the roles and contents of its ``[T]`` History (ragged: 1 to 3 turns), as
        the tensorclass gives them, whatever each row's layout; ``None`` (read through
        ``batch.get``) off the measured versions and when a row holds tool calls."""
        chats = [
            [{"role": "user", "content": "Hi"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}] * 2,
        ]
        builds = {"from_chats": History.from_chats, "messages_to_history": messages_to_history}
        make = [builds[build if build != "both" else list(builds)[i % 2]] for i in range(3)]
        rows = [TensorDict({"h": {"full": f([c])[0]}}) for f, c in zip(make, chats)]
        column = history_column(lazy_stack(rows), ("h", "full"))
        if upstream_branch == "plain":
            assert column is None
            return
        roles = [[m["role"] for m in c] for c in chats]
        contents = [[m["content"] for m in c] for c in chats]
        assert column == (roles, contents)
        assert [row["h", "full"].role for row in rows] == roles  # what the tensorclass reads
        calls = TensorDict({"h": {"full": messages_to_history(self.CHATS[1])}})
        assert history_column(lazy_stack([*rows, calls]), ("h", "full")) is None

    @pytest.mark.parametrize("chat", [0, 1])
    def test_holds_field(self, chat):
        history = messages_to_history(self.CHATS[chat])
        assert holds_field(history, "tool_calls") is (chat == 1)
        assert holds_field(history, "role")
        both = messages_to_history(self.CHATS)  # [2, T]: a lazy stack of conversations
        assert holds_field(both, "tool_calls")


class TestBufferHooks:
    def test_generator(self):
        g = torch.Generator()
        rb = _rb(generator=g)
        assert _buffers.buffer_generator(rb) is g
        assert _buffers.generator_of(rb.sampler) is g
        assert _buffers.buffer_generator(_rb()) is None

    def test_storage_data(self):
        rb = _rb()
        data = _buffers.storage_data(rb.storage)
        assert isinstance(data, TensorDict) and data["x"][:3].tolist() == [0, 1, 2]
        assert _buffers.storage_data(ListStorage(4)) is None
        assert _buffers.storage_data(LazyTensorStorage(4)) is None  # nothing written yet

    def test_write_counters_and_writer(self):
        rb = _rb(5)
        assert _buffers.write_counters(_buffers.buffer_writer(rb)) == (5, 5)
        assert _buffers.write_counters(None) == (None, None)

    def test_empty_storage_and_lock(self):
        rb = _rb()
        with _buffers.replay_lock(rb):
            _buffers.empty_storage(rb.storage)
        assert len(rb) == 0

    def test_a_missing_hook_is_a_clear_error_off_the_measured_versions(self, upstream_branch):
        class Renamed:  # a storage of a torchrl that renamed its reset
            pass

        if upstream_branch == "fast":
            with pytest.raises(AttributeError):
                _buffers.empty_storage(Renamed())
        else:
            with pytest.raises(RuntimeError, match=r"Renamed has no '_empty'.*torchrl 0\.14\.1"):
                _buffers.empty_storage(Renamed())


class TestCommittedWriter:
    def test_empty_publishes_an_empty_buffer(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(8), writer=CommittedWriter())
        rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        assert rb.writer.committed == (2, 3)
        rb.empty()  # torchrl calls the writer's _empty: the readers see it
        assert rb.writer.committed == (4, 0)

    def test_a_torchrl_without_the_hook_is_refused(self, monkeypatch, upstream_branch):
        for cls in _committed_writer.RoundRobinWriter.__mro__:  # a torchrl that renamed it
            if "_empty" in vars(cls):
                monkeypatch.delattr(cls, "_empty")
        if upstream_branch == "fast":  # the measured torchrl has it: nothing is checked
            CommittedWriter()
        else:
            with pytest.raises(RuntimeError, match="writers have no '_empty'"):
                CommittedWriter()


class TestGenerateStep:
    def test_the_policy_generates_its_own_way(self):
        from torchrl.modules.llm import TransformersWrapper

        from torchrl_trl_interop import TrainerModelPolicy

        step = TrainerModelPolicy._from_transformers_generate_history
        assert step is vars(TrainerModelPolicy)["_generate_step"]
        assert step is not TransformersWrapper._from_transformers_generate_history

    @staticmethod
    def _policy(**kwargs):
        from transformers import GenerationConfig

        from torchrl_trl_interop import TrainerModelPolicy
        from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer

        tok = toy_tokenizer()
        config = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=2)
        return TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, 1.0, **kwargs), tok

    def test_forward_in_place_is_torchrls(self, upstream_branch):
        """The rollout's call (a reset's rows, generated into in place) gives what torchrl's
        ``forward`` gives, entry by entry; off the measured versions it is torchrl's."""
        from torchrl.modules.llm import TransformersWrapper

        from torchrl_trl_interop._upstream._policy_hooks import generates_in_place
        from torchrl_trl_interop.testing import toy_chat_env

        policy, tok = self._policy()
        env = toy_chat_env(tok, batch_size=3)
        chats = [[{"role": "user", "content": q}] for q in ("Hi", "Hi", "2+2?")]
        reset = env.reset(TensorDict({"query": messages_to_history(chats)}, batch_size=[3]))
        assert generates_in_place(policy, reset, None, {}) is (upstream_branch == "fast")
        ours = policy(reset.copy())
        theirs = TransformersWrapper.forward(policy, reset.copy())
        assert type(ours) is type(theirs)
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        for key in [("tokens", k) for k in ("prompt", "response", "full")] + [
            ("log_probs", "response"),
            ("masks", "all_attention_mask"),
        ]:
            for a, b in zip(ours.get(key, as_list=True), theirs.get(key, as_list=True)):
                torch.testing.assert_close(a, b)
        for key in [("text", k) for k in ("prompt", "response", "full")]:
            assert ours.get(key).tolist() == theirs.get(key).tolist()
        for key in [("history", k) for k in ("prompt", "response", "full")]:
            assert ours.get(key).tolist() == theirs.get(key).tolist()

    def test_forward_in_place_only_for_the_rollouts_call(self, upstream_branch):
        from torchrl_trl_interop._upstream._policy_hooks import generates_in_place

        policy, _ = self._policy()
        rows = TensorDict(batch_size=[2])
        if upstream_branch == "plain":
            assert not generates_in_place(policy, rows, None, {})
            return
        assert generates_in_place(policy, rows, None, {})
        assert generates_in_place(policy, lazy_stack([TensorDict(), TensorDict()]), None, {})
        assert not generates_in_place(policy, rows, None, {"max_new_tokens": 1})
        assert not generates_in_place(policy, rows, TensorDict(batch_size=[2]), {})
        assert not generates_in_place(policy, TensorDict(batch_size=[2, 1]), None, {})
        assert not generates_in_place(policy, TensorDict(batch_size=[2], device="cpu"), None, {})
        policy.inplace = False
        assert not generates_in_place(policy, rows, None, {})

    def test_rows_under(self, upstream_branch):
        from torchrl.modules.llm import ChatHistory

        from torchrl_trl_interop._upstream._policy_hooks import rows_under

        prompts = [messages_to_history([{"role": "user", "content": q}]) for q in ("a", "b")]
        chat = ChatHistory._from_tensordict(
            lazy_stack([TensorDict({"prompt": p}) for p in prompts])
        )
        td = TensorDict({"history": chat}, batch_size=[2])
        lazy = lazy_stack([TensorDict({"history": {"prompt": p}}) for p in prompts])
        for layout in (td, lazy):
            rows = rows_under(layout, ("history", "prompt"))
            if upstream_branch == "plain" and layout is td:  # the tensorclass's internals
                assert rows is None
            else:
                assert [r.tolist() for r in rows] == [p.tolist() for p in prompts]
        assert (
            rows_under(
                TensorDict({"history": {"prompt": torch.zeros(2)}}, [2]), ("history", "prompt")
            )
            is None
        )

    def test_a_torchrl_without_the_step_is_refused(self, monkeypatch, upstream_branch):
        from torchrl.modules.llm import TransformersWrapper

        from torchrl_trl_interop import TrainerModelPolicy
        from torchrl_trl_interop._upstream._policy_hooks import check_generate_step

        monkeypatch.delattr(TransformersWrapper, "_from_transformers_generate_history")
        if upstream_branch == "fast":  # the measured torchrl has it: nothing is checked
            check_generate_step()
        else:
            with pytest.raises(RuntimeError, match="^torchrl .* has no"):
                check_generate_step()
            with pytest.raises(RuntimeError, match="TrainerModelPolicy: torchrl .* has no"):
                TrainerModelPolicy(None, None, None, 1.0)  # refused before the model is read
