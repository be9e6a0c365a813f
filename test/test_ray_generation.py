"""Generation in a Ray actor, training in the driver: a ``RayReplayBuffer`` between them.

A Ray actor runs a torchrl ``LLMCollector`` (toy model, ``track_policy_version=True``) that writes
into a ``RayReplayBuffer``; the driver's ``TorchRLRolloutWorker`` reads every row once, groups
them and drops groups older than ``max_staleness``; a training loop takes GRPO steps on the
groups and pushes its weights to the actor after every step. Every group is consumed or dropped
exactly once, and none consumed is older than the bound.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from functools import partial

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'"),
]

MAX_STALENESS = 1


def answer_length(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


class Generator:
    """The Ray actor: a collector writing into the buffer, weights pushed in by the trainer."""

    def __init__(self, buffer_client):
        from torchrl.collectors.llm import LLMCollector

        from torchrl_trl_interop import as_reward_transform
        from torchrl_trl_interop.testing import toy_generator_policy, toy_primed_chat_env

        torch.set_num_threads(1)
        env = toy_primed_chat_env(transforms=[as_reward_transform(answer_length)])
        self.policy = toy_generator_policy(seed=1)
        self.collector = LLMCollector(
            env,
            policy=self.policy,
            dialog_turns_per_batch=4,
            replay_buffer=buffer_client,
            track_policy_version=True,
        )
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self, max_batches):
        batches = iter(self.collector)
        for done in range(max_batches):
            if self.stopped.is_set():
                return done
            with self.lock:  # no weight update in the middle of a batch
                next(batches)
        return max_batches

    def stop(self):
        self.stopped.set()

    def update_weights(self, weights, version):
        from torchrl_trl_interop import WeightSyncCallback

        with self.lock:
            WeightSyncCallback(self.collector).push(weights, version)
        return self.collector.policy_version

    def checksum(self):
        from torchrl_trl_interop import weights_checksum

        with self.lock:
            return weights_checksum(self.policy.model)


def grpo_step(model, optimizer, samples):
    """One clipped-ratio GRPO step on RolloutSamples (old log-probs, group advantages)."""
    losses = []
    for s in samples:
        ids = torch.as_tensor(s.input_ids)[None]
        mask = torch.as_tensor(s.completion_mask[1:], dtype=torch.bool)
        logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        logps = logps.gather(-1, ids[0, 1:, None]).squeeze(-1)[mask]
        ratio = (logps - torch.as_tensor(s.old_log_probs[1:])[mask]).exp()
        clipped = ratio.clamp(0.8, 1.2)
        losses.append(-torch.min(ratio * s.advantage, clipped * s.advantage).mean())
    loss = torch.stack(losses).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.fixture(scope="module")
def ray_session():
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_trainer_reads_a_ray_collectors_buffer(ray_session):
    from torchrl.data import LazyStackStorage, RayReplayBuffer

    from torchrl_trl_interop import TorchRLRolloutWorker, weights_checksum
    from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
    from torchrl_trl_interop.weight_sync import model_weights

    ray = ray_session
    rb = RayReplayBuffer(
        storage=partial(LazyStackStorage, 1000), batch_size=4, remote_config={"num_cpus": 1}
    )
    try:
        generator = ray.remote(num_cpus=0, max_concurrency=3)(Generator).remote(rb.client())
        trainer_model = toy_causal_lm(tokenizer=toy_tokenizer())
        optimizer = torch.optim.SGD(trainer_model.parameters(), lr=0.5)
        assert ray.get(generator.update_weights.remote(model_weights(trainer_model), 0)) == 0
        running = generator.run.remote(40)

        worker = TorchRLRolloutWorker(
            rb, num_generations=2, max_staleness=MAX_STALENESS, score_model=False
        )
        worker.start()
        consumed, dropped_late, version, losses, staleness = [], [], 0, [], []
        deadline = time.monotonic() + 90
        while version < 6 and time.monotonic() < deadline:
            worker.check_health(stale_after_s=90)
            try:
                group = [worker.rollout_buffer.get(timeout=1) for _ in range(2)]
            except queue.Empty:
                continue
            assert group[0].group_id == group[1].group_id
            if version - group[0].model_version > MAX_STALENESS:  # TRL's consumer rule
                dropped_late.extend(group)
                continue
            consumed.extend(group)
            staleness.append(version - group[0].model_version)
            losses.append(grpo_step(trainer_model, optimizer, group))
            version += 1
            weights = model_weights(trainer_model)
            assert ray.get(generator.update_weights.remote(weights, version)) == version
            worker.update_model_version(version)
        ray.get(generator.stop.remote())
        ray.get(running)
        time.sleep(0.5)
        worker.stop()
        assert version == 6, "the trainer starved"
        assert all(torch.isfinite(torch.tensor(losses)))

        # every row written is read once: consumed, dropped (worker or trainer) or pending
        written = rb.write_count
        dropped_early = 0
        while not worker.metrics_queue.empty():
            dropped_early += worker.metrics_queue.get().get("rollout/dropped_stale_total", 0)
        queued = []
        while not worker.rollout_buffer.empty():
            queued.append(worker.rollout_buffer.get())
        pending = sum(len(g) for g in worker._pending.values())
        seen = [int(s.metrics["buffer_index"]) for s in consumed + dropped_late + queued]
        assert len(seen) == len(set(seen))
        assert len(seen) + dropped_early + pending == written
        assert {s.group_id for s in consumed}.isdisjoint({s.group_id for s in dropped_late})
        # none consumed older than the bound; versions advanced on the generator's side
        assert 0 <= min(staleness) and max(staleness) <= MAX_STALENESS
        assert max(s.model_version for s in consumed) >= 4
        # after the last push the generator holds the trainer's weights
        assert ray.get(generator.checksum.remote()) == weights_checksum(trainer_model)
    finally:
        rb.close()
