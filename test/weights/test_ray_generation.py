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
import time
from functools import partial

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'"),
]

MAX_STALENESS = 1


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
    from torchrl_trl_interop.testing import (
        ToyGenerator,
        toy_causal_lm,
        toy_grpo_step,
        toy_tokenizer,
    )
    from torchrl_trl_interop.weights._tensors import model_weights

    ray = ray_session
    rb = RayReplayBuffer(
        storage=partial(LazyStackStorage, 1000), batch_size=4, remote_config={"num_cpus": 1}
    )
    try:
        generator = ray.remote(num_cpus=0, max_concurrency=3)(ToyGenerator).remote(rb.client())
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
            losses.append(toy_grpo_step(trainer_model, optimizer, group))
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
        assert ray.get(generator.checksum.remote()) == (version, weights_checksum(trainer_model))
    finally:
        rb.close()
