"""The one weight push in this process: every entry point sends through ``weights._push.push``.

``WeightSyncCallback`` and ``TorchRLWeightTransfer`` push into a module in this process or a
local ``LLMCollector``; weights that do not fit the receiving model raise before anything is
copied, naming the parameter and both shapes, or the names that differ (issue 20, item 13).
"""

from __future__ import annotations

import pytest
import torch

from torchrl_trl_interop import TorchRLWeightTransfer, WeightSyncCallback, weights_checksum
from torchrl_trl_interop.testing import toy_causal_lm, toy_primed_chat_env, toy_tokenizer
from torchrl_trl_interop.weights._tensors import model_weights

WIDER = {"intermediate_size": 128}  # another MLP width than the toy default: other shapes


def named(model):
    return ((name, p.detach()) for name, p in model.named_parameters())


def wrapper(model):
    from torchrl.modules.llm import TransformersWrapper

    tok = toy_tokenizer(padding_side="left")
    return TransformersWrapper(model, tokenizer=tok, input_mode="history", generate=True)


@pytest.fixture
def collector():
    from torchrl.collectors.llm import LLMCollector

    tok = toy_tokenizer(padding_side="left")
    policy = wrapper(toy_causal_lm(tokenizer=tok, seed=1))
    collector = LLMCollector(
        toy_primed_chat_env(tok), policy=policy, dialog_turns_per_batch=2, track_policy_version=True
    )
    yield collector
    collector.shutdown()


class TestMismatchedWeights:
    """Item 13: a copy with other shapes or names names them, instead of torchrl's ``KeyError``
    listing two identical key lists."""

    @pytest.mark.parametrize("target", ["model", "wrapper"])
    def test_shapes_are_named(self, target):
        receiver = toy_causal_lm()
        before = weights_checksum(receiver)
        callback = WeightSyncCallback(receiver if target == "model" else wrapper(receiver))
        with pytest.raises(ValueError) as info:
            callback.push(toy_causal_lm(**WIDER), 1)
        message = str(info.value)
        assert "WeightSyncCallback: the weights do not fit the policy" in message
        assert (
            "parameter 'model.layers.0.mlp.gate_proj.weight': trainer [128, 32], policy [64, 32]"
            in message
        )
        assert "(3 of " in message  # gate, up and down projections
        assert len(message) < 1000
        assert weights_checksum(receiver) == before and callback.version is None

    def test_prefixed_names_are_named(self):
        receiver = toy_causal_lm()
        compiled = torch.compile(toy_causal_lm())  # its names carry "_orig_mod."
        with pytest.raises(KeyError) as info:
            WeightSyncCallback(receiver).push(compiled, 1)
        message = str(info.value)
        assert "sent names the policy lacks: ['_orig_mod.model.embed_tokens.weight'" in message
        assert "policy names not sent: ['model.embed_tokens.weight'" in message
        assert "prefix '_orig_mod.'" in message and "model._orig_mod" in message

    def test_weight_transfer_names_the_parameter(self):
        receiver = toy_causal_lm()
        transfer = TorchRLWeightTransfer(wrapper(receiver))
        with pytest.raises(
            ValueError,
            match=r"TorchRLWeightTransfer: .*gate_proj.weight': trainer \[128, 32\], policy \[64, 32\]",
        ):
            transfer.send_weights(named(toy_causal_lm(**WIDER)))
        assert transfer.version == 0
        with pytest.raises(KeyError, match=r"1 sent names the policy lacks: \['extra.weight'\]"):
            transfer.send_weights(iter([("extra.weight", torch.zeros(2))]))

    def test_local_collector_is_checked(self, collector):
        with pytest.raises(
            ValueError, match=r"gate_proj.weight': trainer \[128, 32\], policy \[64, 32\]"
        ):
            WeightSyncCallback(collector).push(toy_causal_lm(**WIDER), 1)
        assert collector.policy_version == 0


class TestOnePush:
    def test_transfer_goes_through_the_collector(self, collector):
        """TRL's stream (trainable parameters only) reaches the collector's policy through the
        collector's own ``update_policy_weights_``, and its ``PolicyVersion`` is stamped there."""
        trainer_model = toy_causal_lm()
        transfer = TorchRLWeightTransfer(collector)
        transfer.send_weights(named(trainer_model))
        assert collector.policy_version == transfer.version == 1
        assert weights_checksum(collector.policy.model) == weights_checksum(trainer_model)
        with torch.no_grad():
            trainer_model.lm_head.weight.add_(1.0)
        WeightSyncCallback(collector).push(trainer_model, 7)
        assert collector.policy_version == 7
        assert weights_checksum(collector.policy.model) == weights_checksum(trainer_model)

    def test_a_weights_tensordict_and_an_extra_tracker(self):
        from torchrl.envs.llm.transforms import PolicyVersion

        receiver, trainer_model = toy_causal_lm(), toy_causal_lm(seed=1)
        tracker = PolicyVersion(version_type=int)
        callback = WeightSyncCallback(wrapper(receiver), policy_version=tracker)
        callback.push(model_weights(trainer_model), 3)
        assert tracker.version == 3 and callback.version == 3
        assert weights_checksum(receiver) == weights_checksum(trainer_model)


class TestPushFigures:
    """Every push's bytes, seconds and version reach the trainer's logs."""

    def test_each_push_is_recorded_and_logged(self):
        from types import SimpleNamespace

        receiver, trainer_model = toy_causal_lm(), toy_causal_lm(seed=1)
        callback = WeightSyncCallback(receiver)
        state = SimpleNamespace(global_step=0, log_history=[])
        callback.on_train_begin(None, state, None, model=trainer_model)
        state.global_step = 1
        callback.on_step_end(None, state, None, model=trainer_model)
        whole = sum(
            t.numel() * t.element_size() for t in model_weights(receiver).values(True, True)
        )
        assert [(p["version"], p["bytes"], p["delta"]) for p in callback.pushes] == [
            (0, whole, False),
            (1, whole, False),
        ]
        # the trainer appended its copy of the step's logs, then calls on_log with them
        logs = {"loss": 0.5}
        state.log_history.append({**logs, "step": 1})
        callback.on_log(None, state, None, logs=logs)
        assert logs["weights/push_bytes"] == whole and logs["weights/version"] == 1
        assert logs["weights/push_seconds"] == pytest.approx(
            sum(p["seconds"] for p in callback.pushes) / 2
        )
        assert logs["weights/push_delta"] == 0.0
        assert state.log_history[-1] == {**logs, "step": 1}
        later = {"loss": 0.4}  # no push since: nothing added
        callback.on_log(None, state, None, logs=later)
        assert later == {"loss": 0.4}

    def test_a_state_dict_is_pushed_and_other_weights_are_refused(self):
        from torchrl_trl_interop.weights._push import push

        receiver, trainer_model = toy_causal_lm(), toy_causal_lm(seed=1)
        assert push(receiver, trainer_model.state_dict(), 2).bytes > 0
        assert weights_checksum(receiver) == weights_checksum(trainer_model)
        with pytest.raises(TypeError, match=r"weights must be a model, a TensorDict .* state_dict"):
            push(receiver, [1, 2], 3)
        with pytest.raises(TypeError, match=r"Entry 'w' holds a list"):
            push(receiver, {"w": [1.0]}, 3)
        with pytest.raises(TypeError, match="policy_version must be an int, got '1'"):
            push(receiver, trainer_model, "1")
        with pytest.raises(ValueError, match="policy_version must be an int >= 0.*=-3"):
            push(receiver, trainer_model, -3)

    def test_arguments_are_checked(self):
        target = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="WeightSyncCallback: delta=True needs a target"):
            WeightSyncCallback(target, delta=True)
        with pytest.raises(TypeError, match="delta must be a bool"):
            WeightSyncCallback(target, delta="yes")
        with pytest.raises(ValueError, match="full_push_every must be a positive int"):
            WeightSyncCallback(target, full_push_every=0)
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
            WeightSyncCallback(target, timeout=0)


class TestRanks:
    """Which rank pushes what: each rank its own receivers, rank 0 alone a shared one."""

    def test_who_pushes(self):
        from torchrl.weight_update import MultiProcessWeightSyncScheme
        from torchrl.weight_update.llm import VLLMWeightSyncScheme

        from torchrl_trl_interop import RayRemotePolicy, RemotePolicy
        from torchrl_trl_interop.weights._push import pushed_by_every_rank

        own = [torch.nn.Linear(2, 2), RemotePolicy(toy_causal_lm)]
        shared = [
            RayRemotePolicy(toy_causal_lm),
            VLLMWeightSyncScheme(master_port=29997).create_sender(),
            MultiProcessWeightSyncScheme(),
        ]
        assert [pushed_by_every_rank(t) for t in own + shared] == [True] * 2 + [False] * 3

    def test_another_rank_pushes_its_own_receiver_not_a_shared_one(self):
        from types import SimpleNamespace

        from torchrl_trl_interop import RayRemotePolicy

        state = SimpleNamespace(global_step=0, is_world_process_zero=False)
        receiver, trainer_model = toy_causal_lm(), toy_causal_lm(seed=1)
        callback = WeightSyncCallback(receiver)
        callback.on_train_begin(None, state, None, model=trainer_model)
        assert weights_checksum(receiver) == weights_checksum(trainer_model)
        shared = RayRemotePolicy(toy_causal_lm)
        callback = WeightSyncCallback(shared)
        callback.on_train_begin(None, state, None, model=trainer_model)  # rank 0 pushes it
        assert not shared.started and callback.version == 0 and callback.pushes == []
