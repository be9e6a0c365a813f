"""Generation on Ray, training in the driver: ``RayRemotePolicy`` and torchrl's ``RayLLMCollector``.

One local Ray cluster (``ray.cluster_utils.Cluster``, a head of 2 CPUs) serves the whole module.
A real ``GRPOTrainer`` trains with ``as_trl_rollout_func(env, policy=RayRemotePolicy(factory,
num_replicas=2))`` and a ``WeightSyncCallback``, no other glue, and logs every push; delta pushes
into bf16 replicas are bit-exact; a second ``RayRemotePolicy`` of the same name shares the
actors (another trainer rank); a ``WeightSyncCallback`` pushes a real trainer's weights into a
``RayLLMCollector``; a receiver killed in the middle of a push fails the trainer's step, naming
it; and a second node joins the cluster, serves replicas, and its removal is an error at the
next call (last: it changes the cluster).
"""

from __future__ import annotations

import sys
import time
from functools import partial
from types import SimpleNamespace

import pytest
import torch

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
from torchrl_trl_interop.weights._tensors import model_weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, log_to_driver=False)
    yield ray, cluster
    ray.shutdown()
    cluster.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def prompts_dataset(n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(n)]})


def version_reward(completions, policy_version, **kwargs):
    version_reward.seen.append(list(policy_version))
    return [float(len(c[-1]["content"])) for c in completions]


version_reward.seen = []


def step_end(callback, model, step):
    """What the trainer calls after optimizer step ``step``."""
    state = SimpleNamespace(global_step=step, is_world_process_zero=True)
    return callback.on_step_end(None, state, None, model=model)


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
        history = trainer.state.log_history
        logged = [h["rollout/staleness_max"] for h in history if "rollout/staleness_max" in h]
        assert logged == [0.0, 1.0, 0.0, 1.0]
        # every push's bytes, seconds and version reach the trainer's logs (pushes at 0, 2, 4)
        full = sum(t.numel() * t.element_size() for t in model_weights(model).values(True, True))
        assert [p["bytes"] for p in sync.pushes] == [full] * 3
        pushed = [(h["step"], h["weights/version"]) for h in history if "weights/version" in h]
        assert pushed == [(1, 0), (2, 2), (4, 4)]
        assert all(h["weights/push_bytes"] == full for h in history if "weights/version" in h)
        assert all(h["weights/push_seconds"] > 0 for h in history if "weights/version" in h)
    finally:
        generator.close()


def test_rows_split_across_replicas_and_another_rank_shares_them(ray_cluster, monkeypatch):
    """Each replica answers its own contiguous chunk; rows come back in order, stamped. The same
    policy built again (another trainer rank) finds the actors by name and does not own them.
    Then a replica is killed in the middle of a push."""
    from tensordict import TensorDict

    from torchrl_trl_interop import history_to_messages

    tok = toy_tokenizer()
    factory = partial(toy_generator_policy, seed=1)
    generator = RayRemotePolicy(factory, num_replicas=2, timeout=120, name="shared-pool")
    other_rank = RayRemotePolicy(factory, num_replicas=2, timeout=120, name="shared-pool")
    try:
        with pytest.raises(RuntimeError, match="not started.*update_policy_weights_"):
            other_rank.weights_checksums()
        trainer_model = toy_causal_lm(tokenizer=tok, seed=3)
        generator.update_policy_weights_(trainer_model, policy_version=7)
        queries = ["Hi", "Hello there", "What is 2 plus 2?", "Bye"]
        env = toy_chat_env(tok, batch_size=4)
        td = env.reset(TensorDict({"query": queries}, batch_size=[4]))
        out = other_rank(td)  # found by name: the pushed weights, the pushed version
        assert out.get("policy_version").tolist() == [7, 7, 7, 7]
        assert (generator.owner, other_rank.owner) == (True, False)
        prompts = history_to_messages(out.get(("history", "prompt")))
        assert [p[-1]["content"] for p in prompts] == queries
        assert len(out.get(("tokens", "response"), as_list=True)) == 4
        with pytest.raises(ValueError, match=r"no row \(batch_size=\[0\]\)"):
            generator(td[:0])
        # a push that does not fit raises before anything is sent; the replicas keep version 7
        with pytest.raises(ValueError, match="do not fit the generator"):
            generator.update_policy_weights_(
                toy_causal_lm(tokenizer=tok, hidden_size=64), policy_version=8
            )
        assert [v for v, _ in other_rank.weights_checksums()] == [7, 7]
        with pytest.raises(ValueError, match="started with num_replicas=2, this.*num_replicas=1"):
            RayRemotePolicy(factory, timeout=120, name="shared-pool").weights_checksums()
        other_rank.close()  # not the owner: the actors go on serving
        assert [v for v, _ in generator.weights_checksums()] == [7, 7]
        killed_mid_push(generator, trainer_model, monkeypatch)
    finally:
        generator.close()


def killed_mid_push(generator, trainer_model, monkeypatch):
    """Replica 1's process is killed while the weights are being put in the object store: the
    trainer's step raises at once, naming the replica and the cause; so does the next call."""
    import ray

    from torchrl_trl_interop.weights import _ray_policy

    sync = WeightSyncCallback(generator)
    to_wire, calls = _ray_policy._to_wire, []

    def killing(tensor, dtype):  # the 3rd tensor of the push: replica 1's process ends
        calls.append(1)
        if len(calls) == 3:
            ray.kill(generator._actors[1])
        return to_wire(tensor, dtype)

    monkeypatch.setattr(_ray_policy, "_to_wire", killing)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        step_end(sync, trainer_model, 8)
    assert time.monotonic() - start < 60  # at once, not at the 120 s timeout
    message = str(info.value)
    assert message.startswith("WeightSyncCallback: the RayRemotePolicy's actor of replica 1")
    assert "died during the weights of version 8" in message and sync.version is None
    with pytest.raises(RuntimeError, match="actor of replica 1 .* died during checksum"):
        generator.weights_checksums()


def bf16(model):
    """The checksum of ``model``'s weights cast to bf16: what a bf16 receiver must hold."""
    return weights_checksum(model_weights(model).to(torch.bfloat16))


def test_delta_pushes_into_bf16_replicas_are_bit_exact(ray_cluster):
    """One AdamW step at lr 1e-6 changes few bf16 weights: the delta is a tenth of a whole push,
    and after every push each replica holds the trainer's weights cast to bf16, bit for bit."""
    tok = toy_tokenizer()
    trainer_model = toy_causal_lm(tokenizer=tok)
    factory = partial(toy_generator_policy, seed=1, dtype=torch.bfloat16)
    generator = RayRemotePolicy(factory, num_replicas=2, timeout=120, num_threads=1)
    optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-6)
    sync = WeightSyncCallback(generator, delta=True, full_push_every=3)
    try:
        sync.on_train_begin(None, SimpleNamespace(global_step=0), None, model=trainer_model)
        assert generator.weights_checksums() == [(0, bf16(trainer_model))] * 2
        for step in range(1, 5):
            ids = torch.randint(5, 60, (2, 12))
            trainer_model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step_end(sync, trainer_model, step)
            assert generator.weights_checksums() == [(step, bf16(trainer_model))] * 2
        whole = sync.pushes[0]["bytes"]
        assert whole == sum(t.numel() * 2 for t in model_weights(trainer_model).values(True, True))
        # whole every 3 pushes; each delta at most a tenth of a whole push
        assert [p["delta"] for p in sync.pushes] == [False, True, True, False, True]
        assert all(p["bytes"] <= whole / 10 for p in sync.pushes if p["delta"])
        # a large step changes most weights: sent whole, still exact
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        step_end(sync, trainer_model, 5)
        assert not sync.pushes[-1]["delta"] and sync.pushes[-1]["bytes"] == whole
        assert generator.weights_checksums() == [(5, bf16(trainer_model))] * 2
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
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        RayRemotePolicy(toy_generator_policy, name="")
    for timeout in (-5, 0, float("inf")):
        with pytest.raises(ValueError, match=r"RayRemotePolicy: timeout must be a finite number"):
            RayRemotePolicy(toy_generator_policy, timeout=timeout)
    with pytest.raises(TypeError, match="cannot be pickled"):
        __import__("pickle").dumps(RayRemotePolicy(toy_generator_policy))
    policy = RayRemotePolicy(toy_generator_policy)
    model = toy_causal_lm()
    with pytest.raises(TypeError, match="RayRemotePolicy: policy_version must be an int, got '1'"):
        policy.update_policy_weights_(model, policy_version="1")
    with pytest.raises(ValueError, match="RayRemotePolicy: policy_version must be an int >= 0"):
        policy.update_policy_weights_(model, policy_version=-3)
    assert not policy.started  # checked before anything starts


def remote_policy_checksum(collector):
    """In the collector's actor: its policy's model checksum."""
    return weights_checksum(collector.policy.model)


def test_callback_pushes_into_a_ray_llm_collector_during_training(
    ray_cluster, tmp_path, monkeypatch
):
    """The pushed weights land in the wrapper's layout; rows after a push carry the step. Then
    the collector's actor is killed in the middle of a push: the step raises, naming it."""
    from torchrl.collectors.llm import RayLLMCollector
    from trl import GRPOConfig, GRPOTrainer

    from torchrl_trl_interop.weights import _remote_collector

    ray, _ = ray_cluster
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
        sync = WeightSyncCallback(collector, every_n_steps=3, timeout=120)
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
        assert [p["bytes"] for p in sync.pushes] == [sync.pushes[0]["bytes"]] * 2
        rows = collector.next()  # the collector survived the pushes and collects
        assert rows.get(("next", "policy_version")).flatten().unique().tolist() == [3]

        check, actor = _remote_collector.check_weights_fit, collector._collector

        def then_killed(*args, **kwargs):  # checked against the actor's policy, then it dies
            check(*args, **kwargs)
            ray.kill(actor)

        monkeypatch.setattr(_remote_collector, "check_weights_fit", then_killed)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="RayLLMCollector's Ray actor died during the push"):
            step_end(sync, trainer.model, 6)
        assert time.monotonic() - start < 60
    finally:
        monkeypatch.undo()
        try:
            collector.shutdown()
        except Exception:  # noqa: BLE001 - its actor was killed on purpose
            pass
        del collector  # before ray.shutdown (the module's), as the docs advise


def node_of(actor):
    """In an actor: the id of its node."""
    import ray

    return ray.get_runtime_context().get_node_id()


def test_replicas_on_a_second_node_serve_and_its_loss_is_an_error(ray_cluster):
    """Last in the module (it changes the cluster): a second node joins; replicas placed there
    take pushes and answer; the node removed, the next call raises within the timeout, naming
    the replica."""
    from tensordict import TensorDict

    ray, cluster = ray_cluster
    node = cluster.add_node(num_cpus=1, resources={"second_node": 2})
    cluster.wait_for_nodes()
    tok = toy_tokenizer()
    generator = RayRemotePolicy(
        partial(toy_generator_policy, seed=1),
        num_replicas=2,
        remote_config={"num_cpus": 0, "resources": {"second_node": 1}},
        timeout=120,
    )
    try:
        trainer_model = toy_causal_lm(tokenizer=tok, seed=3)
        generator.update_policy_weights_(trainer_model, policy_version=2)
        nodes = ray.get([a.__ray_call__.remote(node_of) for a in generator._actors])
        assert nodes == [node.node_id] * 2
        assert generator.weights_checksums() == [(2, weights_checksum(trainer_model))] * 2
        env = toy_chat_env(tok, batch_size=2)
        td = env.reset(TensorDict({"query": ["Hi", "Bye"]}, batch_size=[2]))
        assert generator(td).get("policy_version").tolist() == [2, 2]

        cluster.remove_node(node)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"actor of replica \d .* died during a call"):
            generator(td)
        assert time.monotonic() - start < 60
    finally:
        generator.close()
