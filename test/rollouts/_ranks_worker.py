"""One rank of the online loop on several ranks (``test_ranks.py``; gloo, CPU).

Scenarios (``SCENARIO``: one, or several comma-separated, run in turn in the same processes),
each writing what this rank saw to ``OUT_DIR/<scenario>.rank<R>.json``:

* ``train``: ``GRPOTrainer`` (DDP) with ``rollout_func=as_trl_rollout_func(ChatEnv,
  env_seed=7)`` on the toy task's questions, a global batch of one prompt x
  ``num_generations=4``: on 2 ranks each rank holds half a group. Records every rollout call,
  every reward call, the logged reward, KL, loss and gradient norm per step, the seeds the
  environment got, and saves the final weights (``weights.rank<R>.pt``). A
  ``BufferCheckpointCallback`` saves a buffer with the last step's checkpoint (in
  ``OUT_DIR/run``); each rank records whether that save was whole when it went on.
* ``fsdp2``: the trainer's model sharded with ``torch.distributed.fsdp.fully_shard`` (every
  forward is a collective); multi-turn episodes that end after 1 turn on rank 0 and after 3 on
  rank 1. Records the rollouts, the model's forward and ``generate`` calls, the same rollouts
  by an unsharded copy of the model with the same seed, and rollouts with dynamic sampling
  (``candidate_group_size=8``: each rank's half group samples 4 candidates, in 2 env batches).
* ``ray`` (layout B on N ranks): rank 0 starts a local Ray cluster and every rank joins it (as
  ``ray start --head`` and ``RAY_ADDRESS`` do); every rank builds the same
  ``RayRemotePolicy`` (2 replicas of a bf16 generator) and ``WeightSyncCallback(delta=True)``,
  and trains ``GRPOTrainer`` (learning rate ``1e-6``) on a 2-turn environment through it. Records each rollout call's versions, the
  logged staleness, the pushes, the replicas' checksums and the trainer's final checksum.
* ``vllm`` (layout C on N ranks): ``GRPOTrainer`` with TRL's vLLM generation in server mode
  (``attach_toy_vllm``: the stand-in client on rank 0), ``max_turns=3``, episodes that end
  after 1 turn on rank 0 and 3 on rank 1. Records the server's generate calls and syncs, the
  trainer's weights when each step began, each rank's idle generate calls and final checksum.

The toy model is read from ``OUT_DIR/model`` (rank 0 writes it when missing). Usage::

    torchrun --nproc_per_node=N test/rollouts/_ranks_worker.py OUT_DIR SCENARIO [STEPS]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# the ``ray`` scenario's throwaway local cluster: no token to hand from rank 0 to the others
# (Ray reads the mode when it is imported; a real cluster's nodes share its token file)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from torchrl_trl_interop import RewardTransform, as_trl_rollout_func  # noqa: E402
from torchrl_trl_interop.testing import (  # noqa: E402
    arithmetic_questions,
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_tokenizer,
)

GLOBAL_BATCH = 4  # one prompt x num_generations per step, whatever the number of ranks
GROUP = 4


class Recorder:
    """A rollout function that keeps every call's prompts and output (JSON-ready)."""

    def __init__(self, rollout_func):
        self.rollout_func = rollout_func
        self.calls = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        self.calls.append({"prompts": prompts, **out})
        return out


class EnvReward:
    """A GRPO reward function: the environment's reward. Records what it scored."""

    __name__ = "env_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, env_reward, **kwargs):
        self.calls.append({"prompts": prompts, "completion_ids": completion_ids})
        return list(env_reward)


def save_model(model_dir: Path) -> None:
    """The toy model and tokenizer on disk: ``beta > 0`` builds its reference model by path."""
    tok = toy_tokenizer()
    toy_causal_lm(tokenizer=tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)


def grpo_trainer(
    out_dir, rollout_func, reward, *, world: int, steps: int, model, callbacks=None, **overrides
):
    """The GRPO run of the ``train`` scenario, for ``world`` ranks; the same global batch.

    ``model`` is a saved toy model's folder (or a model, with ``beta=0``); ``overrides`` go to
    ``GRPOConfig``.
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    prompts = [[{"role": "user", "content": q}] for q in arithmetic_questions()]
    args = GRPOConfig(
        **toy_grpo_args(
            out_dir,
            tokenizer=tok,
            num_generations=GROUP,
            beta=0.04 if isinstance(model, (str, Path)) else 0.0,  # a KL to the reference model
            max_steps=steps,
            per_device_train_batch_size=GLOBAL_BATCH // world,
            **overrides,
        )
    )
    return GRPOTrainer(
        model=str(model) if isinstance(model, Path) else model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        rollout_func=rollout_func,
        callbacks=callbacks,
    )


LOGGED = ("reward", "kl", "loss", "grad_norm")
ENV_SEED = 7


class SavedBeforeOn(TrainerCallback):
    """A callback placed after ``BufferCheckpointCallback``: whether the buffer's save (rank 0's)
    was whole when this rank's callbacks went on past a save step."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, **kwargs):
        from torchrl_trl_interop.data._buffer_files import is_complete

        if control.should_save:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / "replay_buffer"
            self.seen.append(is_complete(path))


def train(out_dir: Path, rank: int, world: int, steps: int) -> dict:
    from torchrl_trl_interop import BufferCheckpointCallback
    from torchrl_trl_interop.testing import toy_buffer

    env = toy_chat_env(batch_size=2, transforms=[RewardTransform(toy_answer_length)])
    seeds = []
    env.base_env._set_seed = seeds.append  # a ChatEnv ignores its seed: record it
    rollout_func = as_trl_rollout_func(env, env_seed=ENV_SEED)
    recorder, reward, order = Recorder(rollout_func), EnvReward(), SavedBeforeOn()
    callbacks = [BufferCheckpointCallback(toy_buffer(8)), order]
    trainer = grpo_trainer(
        out_dir / "run",  # one output_dir for every rank, as in a real launch
        recorder,
        reward,
        world=world,
        steps=steps,
        model=out_dir / "model",
        callbacks=callbacks,
        save_strategy="steps",
        save_steps=steps,
    )
    trainer.train()
    torch.save(trainer.model.state_dict(), out_dir / f"weights.rank{rank}.pt")
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "global_step": trainer.state.global_step,
        "rollouts": recorder.calls,
        "rewards": reward.calls,
        "logs": [{k: h[k] for k in LOGGED} for h in logs],
        "env_seeds": seeds,
        "buffer_saved_before_on": order.seen,
    }


class CallCounter:
    """Counts a model's forward calls (hook) and ``generate`` calls (instance attribute)."""

    def __init__(self, model):
        self.forwards = self.generates = 0
        model.register_forward_pre_hook(self._forward)
        generate = model.generate

        def counted(*args, **kwargs):
            self.generates += 1
            return generate(*args, **kwargs)

        model.generate = counted

    def _forward(self, module, args):
        self.forwards += 1


def fsdp2(out_dir: Path, rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    from torchrl_trl_interop import TrainerModelPolicy, trainer_generation_config

    tok = toy_tokenizer()
    model = toy_causal_lm(tokenizer=tok, num_hidden_layers=2)
    reference = toy_causal_lm(tokenizer=tok, num_hidden_layers=2)  # same seed: same weights
    trainer = grpo_trainer(out_dir, lambda p, t: None, EnvReward(), world=2, steps=1, model=model)
    for layer in model.model.layers:  # in place: the trainer's model is now sharded
        fully_shard(layer)
    fully_shard(model)
    counter = CallCounter(model)

    turns = 1 if rank == 0 else 3  # episodes end after different numbers of turns
    prompts = [[{"role": "user", "content": arithmetic_questions()[5]}]] * 2  # half a group
    env = toy_chat_env(tok, batch_size=2, reply=True, max_steps=turns)
    torch.manual_seed(100 + rank)
    sharded = as_trl_rollout_func(env, max_turns=3)(prompts, trainer)

    config = trainer_generation_config(trainer, tok)
    policy = TrainerModelPolicy(reference, tok, config, trainer.temperature)
    torch.manual_seed(100 + rank)
    plain = as_trl_rollout_func(env, policy=policy, max_turns=3, recompute_logprobs=False)(
        prompts, trainer
    )
    generates = counter.generates

    # dynamic sampling on the sharded model: this rank's half group samples 4 candidates (2 env
    # batches), keeps 2; the ranks' episodes still end after 1 and 3 turns
    reward = [RewardTransform(toy_answer_length)]
    env = toy_chat_env(tok, batch_size=2, reply=True, max_steps=turns, transforms=reward)
    dynamic = as_trl_rollout_func(env, max_turns=3, candidate_group_size=8)(prompts, trainer)
    weight = model.model.layers[0].mlp.up_proj.weight  # a DTensor: this rank holds half
    return {
        "sharded": sharded,
        "plain": plain,
        "dynamic": dynamic,
        "forwards": counter.forwards,
        "generates": generates,
        "dynamic_generates": counter.generates - generates,
        "shard_rows": [weight.to_local().shape[0], weight.shape[0]],
    }


class StepWeights(TrainerCallback):
    """Each step's weights (their checksum) when it begins: what that step generates with."""

    def __init__(self):
        self.checksums = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        from torchrl_trl_interop import weights_checksum

        self.checksums.append(weights_checksum(model))


def join_ray(rank: int):
    """Rank 0 starts a local Ray cluster, every other rank joins it (``ray start --head`` and
    ``RAY_ADDRESS`` in a real launch)."""
    import ray
    import torch.distributed as dist

    address = [None]
    if rank == 0:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        address = [ray.get_runtime_context().gcs_address]
    dist.broadcast_object_list(address, src=0)
    if rank != 0:
        ray.init(address=address[0], log_to_driver=False)
    return ray


def leave_ray(ray, rank: int) -> None:
    """The other ranks leave first, then rank 0 (the head) stops the cluster."""
    import torch.distributed as dist

    if rank != 0:
        ray.shutdown()
    dist.barrier()
    if rank == 0:
        ray.shutdown()


def layout_trainer(out_dir, rollout_func, world: int, steps: int, callbacks, **overrides):
    """The GRPO run of layouts B and C: the toy model (the same on every rank, ``beta=0``),
    rewarded by its answers' length."""
    model = toy_causal_lm(tokenizer=toy_tokenizer())
    return grpo_trainer(
        out_dir,
        rollout_func,
        toy_answer_length,
        world=world,
        steps=steps,
        model=model,
        callbacks=callbacks,
        **overrides,
    )


def ray_layout(out_dir: Path, rank: int, world: int, steps: int) -> dict:
    from functools import partial

    from torchrl_trl_interop import RayRemotePolicy, WeightSyncCallback, weights_checksum
    from torchrl_trl_interop.testing import toy_generator_policy
    from torchrl_trl_interop.weights._tensors import model_weights

    ray = join_ray(rank)
    tok = toy_tokenizer()
    # other initial weights than the trainer's: only the pushes align them
    factory = partial(toy_generator_policy, seed=1, dtype=torch.bfloat16)  # a bf16 generator
    generator = RayRemotePolicy(factory, num_replicas=2, timeout=240, num_threads=1)
    sync = WeightSyncCallback(generator, delta=True, full_push_every=2)
    env = toy_chat_env(tok, batch_size=2, reply=True, max_steps=2)  # 2 turns
    recorder = Recorder(as_trl_rollout_func(env, policy=generator, max_turns=2, max_staleness=0))
    trainer = layout_trainer(
        out_dir,
        recorder,
        world,
        steps,
        [sync],
        learning_rate=1e-6,  # TRL's default: most bf16 weights do not change in a step
    )
    trainer.train()
    result = {
        "global_step": trainer.state.global_step,
        "versions": [call["policy_version"] for call in recorder.calls],
        "env_masks": [call["env_mask"] for call in recorder.calls],
        "staleness_max": [
            h["rollout/staleness_max"]
            for h in trainer.state.log_history
            if "rollout/staleness_max" in h
        ],
        "pushes": sync.pushes,
        "logged_bytes": [
            h["weights/push_bytes"] for h in trainer.state.log_history if "weights/push_bytes" in h
        ],
        "owner": generator.owner,
        "replicas": generator.weights_checksums(),
        "trainer": weights_checksum(trainer.model),
        "trainer_bf16": weights_checksum(model_weights(trainer.model).to(torch.bfloat16)),
    }
    torch.distributed.barrier()  # every rank read the replicas before their owner ends them
    generator.close()
    leave_ray(ray, rank)
    return result


def vllm_layout(out_dir: Path, rank: int, world: int, steps: int) -> dict:
    from torchrl_trl_interop import weights_checksum
    from torchrl_trl_interop.testing._generation import attach_toy_vllm

    tok = toy_tokenizer()
    turns = 1 if rank == 0 else 3  # episodes end after different numbers of turns
    env = toy_chat_env(tok, batch_size=2, reply=True, max_steps=turns)
    rollout_func = as_trl_rollout_func(env, max_turns=3)
    recorder, weights = Recorder(rollout_func), StepWeights()
    trainer = layout_trainer(out_dir, recorder, world, steps, [weights])
    server = attach_toy_vllm(trainer, toy_causal_lm(tokenizer=tok, seed=1))
    trainer.train()
    from torchrl_trl_interop.rollouts._vllm import _POLICIES

    policy = _POLICIES[trainer.vllm_generation]
    return {
        "global_step": trainer.state.global_step,
        "env_masks": [call["env_mask"] for call in recorder.calls],
        "generated": server.generated,  # rank 0's client is the server
        "synced_checksums": server.synced_checksums,
        "step_checksums": weights.checksums,
        "idle_calls": policy.idle_calls,
        "trainer": weights_checksum(trainer.model),
    }


def main() -> None:
    import torch.distributed as dist

    out_dir, scenario = Path(sys.argv[1]), sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if rank == 0 and not (out_dir / "model").exists():
        save_model(out_dir / "model")
    dist.barrier()
    for name in scenario.split(","):  # several in one launch: the start-up is paid once
        if name == "train":
            out = train(out_dir, rank, world, steps)
        elif name == "fsdp2":
            out = fsdp2(out_dir / f"rank{rank}", rank)
        elif name == "ray":
            out = ray_layout(out_dir / "ray", rank, world, steps)
        elif name == "vllm":
            out = vllm_layout(out_dir / "vllm", rank, world, steps)
        else:
            raise ValueError(f"unknown scenario {name!r}")
        (out_dir / f"{name}.rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
