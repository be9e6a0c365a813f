"""The staging transport as a torchrl ``WeightSyncScheme``, and every target reaching the one push
through a scheme (issue 36).

``StagingWeightSyncScheme`` follows torchrl's sender/receiver contract (``init_on_sender`` /
``connect`` / ``send``; ``init_on_receiver`` / ``connect`` / ``receive``), is registered as
torchrl's ``"staging"`` backend, and carries a push into a receiver in another process, pickled
as torchrl's collectors pickle their schemes into their workers.
"""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch
from torch import multiprocessing as mp

from torchrl_trl_interop import RemotePolicy, WeightSyncCallback, weights_checksum
from torchrl_trl_interop.testing import toy_causal_lm, toy_primed_chat_env, toy_tokenizer
from torchrl_trl_interop.weights._adapters import TargetScheme, as_weight_sync_scheme
from torchrl_trl_interop.weights._scheme import StagingWeightSyncScheme
from torchrl_trl_interop.weights._staging import StagingBuffer


def pair(generator_model):
    """A sender and the receiver a worker would get (the sender's state, pickled)."""
    sender = StagingWeightSyncScheme(timeout=60)
    sender.init_on_sender(model_id="policy", model=generator_model)
    receiver = StagingWeightSyncScheme()
    receiver.__setstate__(sender.__getstate__())
    receiver.init_on_receiver(model_id="policy", model=generator_model)
    sender.connect()
    receiver.connect()
    return sender, receiver


def receive_in_thread(receiver):
    worker = threading.Thread(target=receiver.receive, kwargs={"timeout": 60})
    worker.start()
    return worker


def _worker(scheme, results):
    """A collector worker: the policy, the scheme's receiver side, one receive()."""
    model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
    scheme.init_on_receiver(model_id="policy", model=model)
    scheme.connect()
    scheme.receive(timeout=120)
    results.put((scheme.policy_version, weights_checksum(model)))


class TestStagingWeightSyncScheme:
    def test_registered_with_torchrl(self):
        from torchrl.weight_update.weight_sync_schemes import WeightSyncScheme

        scheme = WeightSyncScheme.from_backend("staging", timeout=5)
        assert isinstance(scheme, StagingWeightSyncScheme) and scheme.timeout == 5

    def test_push_lands_with_its_version(self):
        trainer_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=0)
        generator_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
        sender, receiver = pair(generator_model)
        worker = receive_in_thread(receiver)
        assert sender.send(trainer_model, policy_version=4) == 4
        worker.join()
        assert weights_checksum(generator_model) == weights_checksum(trainer_model)
        assert receiver.policy_version == sender.policy_version == 4

    def test_partial_push_keeps_the_rest(self):
        from tensordict import TensorDict

        generator_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
        before = {n: p.detach().clone() for n, p in generator_model.named_parameters()}
        sender, receiver = pair(generator_model)
        name = "model.norm.weight"
        weights = TensorDict({name: torch.full_like(before[name], 2.0)}).unflatten_keys(".")
        worker = receive_in_thread(receiver)
        sender.send(weights, policy_version=1, partial=True)
        worker.join()
        params = dict(generator_model.named_parameters())
        assert (params[name] == 2.0).all()
        assert all(torch.equal(params[n], t) for n, t in before.items() if n != name)

    def test_mismatch_raises_before_sending(self):
        generator_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
        checksum = weights_checksum(generator_model)
        sender, receiver = pair(generator_model)
        wider = toy_causal_lm(tokenizer=toy_tokenizer(), intermediate_size=128)
        with pytest.raises(ValueError, match="parameter 'model.layers.0.mlp.gate_proj.weight'"):
            sender.send(wider, policy_version=1)
        assert receiver.receive(timeout=0.2) is None  # nothing was committed
        assert weights_checksum(generator_model) == checksum

    def test_send_needs_the_sender_side(self):
        with pytest.raises(RuntimeError, match="not initialised on the sender side"):
            StagingWeightSyncScheme().send(torch.nn.Linear(2, 2), policy_version=0)

    def test_receiver_in_another_process(self):
        """Pickled into a spawned worker as torchrl's collectors do: the push lands there."""
        trainer_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=0)
        sender = StagingWeightSyncScheme(timeout=120)
        sender.init_on_sender(
            model_id="policy", model=toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
        )
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        process = ctx.Process(target=_worker, args=(sender, results), daemon=True)
        process.start()
        try:
            sender.connect()
            assert sender.send(trainer_model, policy_version=7) == 7
            assert results.get(timeout=120) == (7, weights_checksum(trainer_model))
        finally:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


class Pendulum(torch.nn.Module):
    """A one-weight policy for torchrl's pendulum (its angle is a scalar per env)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def forward(self, th):
        return self.lin(th.unsqueeze(-1))


def pendulum_env():
    from torchrl.envs import PendulumEnv

    return PendulumEnv()


class TestInTorchRLCollector:
    def test_multi_sync_collector_workers_get_the_push(self, monkeypatch):
        """torchrl's own MultiSyncCollector, two worker processes, our scheme: after
        update_policy_weights_ every worker acts with the pushed weights; then a worker is
        killed in the middle of a push."""
        from tensordict.nn import TensorDictModule
        from torchrl.collectors import MultiSyncCollector

        net = Pendulum()
        policy = TensorDictModule(net, in_keys=["th"], out_keys=["action"])
        scheme = StagingWeightSyncScheme(timeout=120)
        collector = MultiSyncCollector(
            [pendulum_env, pendulum_env],
            policy,
            frames_per_batch=20,
            total_frames=200,
            weight_sync_schemes={"policy": scheme},
        )
        try:
            batches = iter(collector)
            first = next(batches)
            assert not torch.allclose(first["action"], torch.full_like(first["action"], 0.25))
            with torch.no_grad():
                net.lin.weight.zero_()
                net.lin.bias.fill_(0.25)
            collector.update_policy_weights_()
            after = next(batches)
            assert torch.equal(after["action"], torch.full_like(after["action"], 0.25))
            assert scheme.policy_version == 0
            killed_mid_push(collector, scheme, monkeypatch)
        finally:
            collector.shutdown(raise_on_error=False)  # one of its workers was killed


def killed_mid_push(collector, scheme, monkeypatch):
    """A worker killed while the weights are copied into the staging buffer: the trainer's push
    raises at once (not at its timeout), naming the worker and its exit code."""
    import os
    import signal
    import time

    from tensordict.nn import TensorDictModule

    fill = StagingBuffer.fill

    def then_killed(staging, stream):  # in this process: the sender's copy
        names = fill(staging, stream)
        os.kill(collector.procs[1].pid, signal.SIGKILL)
        collector.procs[1].join(timeout=30)
        return names

    monkeypatch.setattr(StagingBuffer, "fill", then_killed)
    trainer_policy = TensorDictModule(Pendulum(), in_keys=["th"], out_keys=["action"])
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        WeightSyncCallback(scheme).push(trainer_policy, 3)
    assert time.monotonic() - start < 30
    assert str(info.value).startswith(
        "WeightSyncCallback: worker 1 of the MultiSyncCollector died (exit code -9) before "
        "committing the weights of version 3 through its StagingWeightSyncScheme"
    )


class TestEveryTargetIsAScheme:
    def test_remote_policy_exposes_its_staging_scheme(self):
        policy = RemotePolicy(partial(toy_causal_lm, tokenizer=toy_tokenizer(), seed=1))
        scheme = as_weight_sync_scheme(policy)
        assert scheme is policy.weight_sync_scheme
        assert isinstance(scheme, StagingWeightSyncScheme) and scheme.initialized_on_sender

    def test_collector_and_vllm_sender_are_adapted(self):
        from torchrl.collectors.llm import LLMCollector
        from torchrl.modules.llm import TransformersWrapper
        from torchrl.weight_update.llm import VLLMWeightSyncScheme

        tok = toy_tokenizer(padding_side="left")
        policy = TransformersWrapper(
            toy_causal_lm(tokenizer=tok), tokenizer=tok, input_mode="history", generate=True
        )
        collector = LLMCollector(toy_primed_chat_env(tok), policy=policy, dialog_turns_per_batch=2)
        sender = VLLMWeightSyncScheme(master_port=29998).create_sender()
        try:
            for target in (collector, sender):
                scheme = as_weight_sync_scheme(target)
                assert isinstance(scheme, TargetScheme) and scheme.target is target
        finally:
            collector.shutdown()

    def test_schemes_pass_through_and_modules_are_copied(self):
        scheme = StagingWeightSyncScheme()
        assert as_weight_sync_scheme(scheme) is scheme
        assert as_weight_sync_scheme(torch.nn.Linear(2, 2)) is None

    def test_a_scheme_is_a_callback_target(self):
        """WeightSyncCallback(scheme): ours takes the trainer's step as its version."""
        trainer_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=0)
        generator_model = toy_causal_lm(tokenizer=toy_tokenizer(), seed=1)
        sender, receiver = pair(generator_model)
        worker = receive_in_thread(receiver)
        WeightSyncCallback(sender).push(trainer_model, 5)
        worker.join()
        assert receiver.policy_version == 5
        assert weights_checksum(generator_model) == weights_checksum(trainer_model)

    def test_unknown_target_keeps_its_error(self):
        with pytest.raises(TypeError, match="target=object cannot receive weights"):
            WeightSyncCallback(object())
