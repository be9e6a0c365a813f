"""``_upstream/_weights``: torchrl's private attributes the push reads, on both branches.

On the measured torchrl the push reads a ``VLLMWeightSender``'s metadata (checked before NCCL)
and its registered collectors (their version set to the trainer's step), and a
``RayLLMCollector``'s actor handle; under ``plain_upstream()`` (another torchrl) it takes
torchrl's public route: the same tensors broadcast, unchecked, torchrl's hook counting pushes.
"""

from __future__ import annotations

import pytest
import torch

from torchrl_trl_interop import WeightSyncCallback
from torchrl_trl_interop._upstream import plain_upstream
from torchrl_trl_interop._upstream._weights import (
    ray_collector_handle,
    vllm_sender_collectors,
    vllm_sender_layout,
)
from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
from torchrl_trl_interop.weights._adapters import TargetScheme, as_weight_sync_scheme


class RecordingTransport:
    """Stands in for torchrl's NCCL transport (no GPU): records what would be broadcast."""

    def __init__(self):
        self.sent = []

    def send_weights(self, model_id, weights):
        self.sent.append(weights)


def joined_sender(model):
    """torchrl's VLLMWeightSender as init_all_workers_group leaves it, over a recording transport,
    with one registered collector."""
    from torchrl.envs.llm.transforms import PolicyVersion
    from torchrl.weight_update.llm import VLLMWeightSyncScheme
    from torchrl.weight_update.llm.vllm_nccl import get_model_metadata

    sender = VLLMWeightSyncScheme(master_port=29997).create_sender()
    sender._model_metadata = get_model_metadata(model)
    sender._transport = RecordingTransport()
    collector = type("Collector", (), {})()
    collector.policy_version_tracker = PolicyVersion()
    collector.increment_version = collector.policy_version_tracker.increment_version
    sender.register_collector(collector)
    return sender, collector


class TestVLLMSenderReads:
    @pytest.mark.parametrize("plain", [False, True])
    def test_same_tensors_either_branch(self, plain):
        model = toy_causal_lm(tokenizer=toy_tokenizer())
        sender, collector = joined_sender(model)
        if plain:
            with plain_upstream():
                assert vllm_sender_layout(sender) is None and vllm_sender_collectors(sender) == []
                WeightSyncCallback(sender).push(model, 3)
        else:
            assert set(vllm_sender_layout(sender)) == {n for n, _ in model.named_parameters()}
            assert vllm_sender_collectors(sender) == [collector]
            WeightSyncCallback(sender).push(model, 3)
        (sent,) = sender._transport.sent
        assert sorted(sent) == sorted(n for n, _ in model.named_parameters())
        assert all(torch.equal(sent[n], p) for n, p in model.named_parameters())
        # measured: the trainer's step; plain: torchrl's own hook counts the one push
        assert collector.policy_version_tracker.version == (1 if plain else 3)

    def test_check_only_on_the_measured_branch(self):
        sender, _ = joined_sender(toy_causal_lm(tokenizer=toy_tokenizer()))
        wider = toy_causal_lm(tokenizer=toy_tokenizer(), hidden_size=64)
        with pytest.raises(ValueError, match="do not fit the vLLM engine"):
            WeightSyncCallback(sender).push(wider, 1)
        assert sender._transport.sent == []
        with plain_upstream():  # nothing to check against: torchrl's broadcast decides
            assert vllm_sender_layout(sender) is None


class ActorHandle:
    """Stands in for a Ray actor handle (the name is what the reader checks)."""


class FakeRayCollector:
    """The shape of torchrl's RayLLMCollector: a handle, and the public weight update."""

    def __init__(self):
        self._collector = ActorHandle()
        self.updates = []

    def update_policy_weights_(self, weights):
        self.updates.append(weights)


class TestRayCollectorRead:
    def test_measured_branch_pushes_in_the_actor(self):
        collector = FakeRayCollector()
        assert ray_collector_handle(collector) is collector._collector
        scheme = as_weight_sync_scheme(collector)
        assert isinstance(scheme, TargetScheme) and scheme.route.__name__ == "_to_ray_collector"

    def test_plain_branch_uses_the_public_update(self):
        collector = FakeRayCollector()
        model = torch.nn.Linear(2, 2)
        with plain_upstream():
            assert ray_collector_handle(collector) is None
            WeightSyncCallback(collector).push(model, 2)
        (weights,) = collector.updates
        assert torch.equal(weights["weight"], model.weight.detach())
