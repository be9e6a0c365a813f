"""Generation on Ray, training in the driver: ``RayRemotePolicy`` and torchrl's ``RayLLMCollector``.

One local Ray instance (2 CPUs) serves the whole module. A real ``GRPOTrainer`` trains with
``as_trl_rollout_func(env, policy=RayRemotePolicy(factory, num_replicas=2))`` and a
``WeightSyncCallback``, no other glue; a ``WeightSyncCallback`` pushes a real trainer's weights
into a ``RayLLMCollector``; a dead actor is an error, not a hang.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import pytest

from torchrl_trl_interop import (
    RayRemotePolicy,
    WeightSyncCallback,
    as_trl_rollout_func,
    trainer_generation_config,
    weights_checksum,
)
from torchrl_trl_interop.testing import (
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_generator_policy,
    toy_grpo_args,
    toy_primed_chat_env,
    toy_prompts,
    toy_tokenizer,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def prompts_dataset(n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(n)]})


def version_reward(completions, policy_version, **kwargs):
    version_reward.seen.append(list(policy_version))
    return [float(len(c[-1]["content"])) for c in completions]


version_reward.seen = []


def test_grpo_trains_with_two_ray_replicas(ray_cluster, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    args = GRPOConfig(**toy_grpo_args(tmp_path, tokenizer=tok, max_steps=4))
    model = toy_causal_lm(tokenizer=tok)
    factory = partial(  # other initial weights than the trainer's: only the pushes align them
        toy_generator_policy, trainer_generation_config(args, tok, model=model), seed=1
    )
    generator = RayRemotePolicy(factory, num_replicas=2, timeout=120, num_threads=1)
    version_reward.seen = []
    try:
        sync = WeightSyncCallback(generator, every_n_steps=2)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=version_reward,
            args=args,
            train_dataset=prompts_dataset(16),
            processing_class=tok,
            rollout_func=as_trl_rollout_func(
                toy_chat_env(tok, batch_size=4), policy=generator, max_staleness=1
            ),
            callbacks=[sync],
        )
        before = weights_checksum(trainer.model)
        trainer.train()

        assert trainer.state.global_step == 4 and sync.version == 4
        assert weights_checksum(trainer.model) != before
        # every replica ends with the trainer's weights, as version 4
        final = weights_checksum(trainer.model)
        assert generator.weights_checksums() == [(4, final), (4, final)]
        # each row's version is the last push before its step (pushes at 0, 2, 4)
        assert version_reward.seen == [[0] * 4, [0] * 4, [2] * 4, [2] * 4]
        logged = [
            h["rollout/staleness_max"]
            for h in trainer.state.log_history
            if "rollout/staleness_max" in h
        ]
        assert logged == [0.0, 1.0, 0.0, 1.0]
    finally:
        generator.close()


def test_rows_are_split_across_replicas_in_order(ray_cluster):
    """Each replica answers its own contiguous chunk; rows come back in order, stamped."""
    from tensordict import TensorDict

    from torchrl_trl_interop import history_to_messages

    tok = toy_tokenizer()
    generator = RayRemotePolicy(partial(toy_generator_policy, seed=1), num_replicas=2, timeout=120)
    try:
        with pytest.raises(RuntimeError, match="not started.*update_policy_weights_"):
            generator.weights_checksums()
        trainer_model = toy_causal_lm(tokenizer=tok, seed=3)
        generator.update_policy_weights_(trainer_model, policy_version=7)
        queries = ["Hi", "Hello there", "What is 2 plus 2?", "Bye"]
        env = toy_chat_env(tok, batch_size=4)
        out = generator(env.reset(TensorDict({"query": queries}, batch_size=[4])))
        assert out.get("policy_version").tolist() == [7, 7, 7, 7]
        prompts = history_to_messages(out.get(("history", "prompt")))
        assert [p[-1]["content"] for p in prompts] == queries
        assert len(out.get(("tokens", "response"), as_list=True)) == 4
        # a push that does not fit raises before anything is sent; the replicas keep version 7
        with pytest.raises(ValueError, match="do not fit the generator"):
            generator.update_policy_weights_(
                toy_causal_lm(tokenizer=tok, hidden_size=64), policy_version=8
            )
        assert [v for v, _ in generator.weights_checksums()] == [7, 7]
    finally:
        generator.close()


def crash(actor):
    """In an actor: its process exits at once."""
    os._exit(1)


def test_a_dead_actor_is_an_error_not_a_hang(ray_cluster):
    generator = RayRemotePolicy(partial(toy_generator_policy, seed=1), num_replicas=2, timeout=60)
    try:
        generator.update_policy_weights_(toy_causal_lm(tokenizer=toy_tokenizer()), policy_version=0)
        # replica 1's process exits (a crash, the OOM killer); Ray runs a caller's tasks in order
        generator._actors[1].__ray_call__.remote(crash)
        with pytest.raises(RuntimeError, match="actor of replica 1 died"):
            generator.weights_checksums()
        with pytest.raises(RuntimeError, match="replica 1 died"):
            generator.update_policy_weights_(
                toy_causal_lm(tokenizer=toy_tokenizer()), policy_version=1
            )
    finally:
        generator.close()


def test_actors_ray_cannot_place_time_out(ray_cluster):
    """More CPUs than the cluster has: the start ends at the timeout, saying why."""
    generator = RayRemotePolicy(toy_generator_policy, remote_config={"num_cpus": 8}, timeout=3)
    with pytest.raises(TimeoutError, match=r"Ray could not place them: each needs \{'num_cpus': 8"):
        generator.update_policy_weights_(toy_causal_lm(tokenizer=toy_tokenizer()), policy_version=0)
    assert not generator.started  # its actors were ended


def test_ray_remote_policy_errors():
    with pytest.raises(TypeError, match="policy_factory must be a callable"):
        RayRemotePolicy("a policy")
    with pytest.raises(ValueError, match="num_replicas must be a positive int"):
        RayRemotePolicy(toy_generator_policy, num_replicas=0)
    with pytest.raises(TypeError, match="remote_config must be a dict"):
        RayRemotePolicy(toy_generator_policy, remote_config=["num_gpus"])
    with pytest.raises(TypeError, match="cannot be pickled"):
        __import__("pickle").dumps(RayRemotePolicy(toy_generator_policy))


def remote_policy_checksum(collector):
    """In the collector's actor: its policy's model checksum."""
    return weights_checksum(collector.policy.model)


def test_callback_pushes_into_a_ray_llm_collector_during_training(ray_cluster, tmp_path):
    """The pushed weights land in the wrapper's layout; rows after a push carry the step."""
    from torchrl.collectors.llm import RayLLMCollector
    from trl import GRPOConfig, GRPOTrainer

    ray = ray_cluster
    tok = toy_tokenizer()
    collector = RayLLMCollector(
        env=partial(toy_primed_chat_env, batch_size=2),
        policy_factory=partial(toy_generator_policy, seed=1),
        dialog_turns_per_batch=2,
        remote_config={"num_cpus": 1},
        track_policy_version=True,
    )
    try:
        # every 3 steps: pushes at steps 0 and 3, torchrl's own count would say 2
        sync = WeightSyncCallback(collector, every_n_steps=3)
        trainer = GRPOTrainer(
            model=toy_causal_lm(tokenizer=tok),
            reward_funcs=toy_answer_length,
            args=GRPOConfig(**toy_grpo_args(tmp_path, tokenizer=tok, max_steps=3)),
            train_dataset=prompts_dataset(12),
            processing_class=tok,
            callbacks=[sync],
        )
        trainer.train()
        assert sync.version == 3 and len(sync.sync_seconds) == 2
        assert collector.policy_version == 3
        remote_sum = ray.get(collector._collector.__ray_call__.remote(remote_policy_checksum))
        assert remote_sum == weights_checksum(trainer.model)
        rows = collector.next()  # the collector survived the pushes and collects
        assert rows.get(("next", "policy_version")).flatten().unique().tolist() == [3]
    finally:
        collector.shutdown()
