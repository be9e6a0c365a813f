"""Benchmark: generation apart from training, on CPU.

Three figures, each measured in one run (the machines are shared: compare within a run):

* **GRPOTrainer, generation in the same process vs in another process.** ``GRPOTrainer`` with
  ``as_trl_rollout_func(env)`` (the trainer's model generates) and with
  ``as_trl_rollout_func(env, policy=RemotePolicy(...))`` plus ``WeightSyncCallback`` after every
  step. ``GRPOTrainer`` calls its rollout function synchronously, so there is no overlap here:
  the figure is the price of the process boundary and the weight sync.
* **Overlap: a collector apart from the trainer.** A GRPO step on 2 groups of 2 completions,
  (a) sequential: a torchrl ``LLMCollector`` in this process collects one batch, then the step
  trains on it; (b) overlapped: the same collector runs in a Ray actor (``ToyGenerator``), writing
  into a ``RayReplayBuffer`` that a ``TorchRLRolloutWorker`` drains, while the trainer trains; it
  pushes its weights after every step (``max_staleness=1``). Steps/s and the ratio.
* **The cost of one weight sync** for a ~10M-parameter Llama, and its throughput in GB/s: into a
  ``RemotePolicy`` (torchrl's ``MultiProcessWeightSyncScheme``, then the commit), into a policy
  in this process, and into a Ray actor's collector.

Run with ``python benchmarks/bench_remote.py``.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import tempfile
import time
from functools import partial

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from torchrl_trl_interop import (
    RemotePolicy,
    TorchRLRolloutWorker,
    WeightSyncCallback,
    as_trl_rollout_func,
    trainer_generation_config,
)
from torchrl_trl_interop.testing import (
    IM_START,
    ToyGenerator,
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_generator_policy,
    toy_grpo_step,
    toy_prompts,
    toy_tokenizer,
    toy_trainer_args,
)
from torchrl_trl_interop.weights._tensors import model_weights


def grpo_trainer_steps(remote: bool, steps: int, out_dir: str) -> float:
    """GRPOTrainer steps/s with generation in the same process or in a RemotePolicy."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    holder = {}

    def rollout_func(prompts, trainer):
        return holder["f"](prompts, trainer)

    torch.manual_seed(0)
    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=toy_answer_length,
        args=GRPOConfig(
            num_generations=4,
            max_completion_length=16,
            learning_rate=1e-2,
            bf16=False,
            generation_kwargs={"suppress_tokens": [tok.convert_tokens_to_ids(IM_START)]},
            **toy_trainer_args(out_dir, max_steps=steps + 1, per_device_train_batch_size=8),
        ),
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(64)]}
        ),
        processing_class=tok,
        rollout_func=rollout_func,
    )
    env = toy_chat_env(tok, batch_size=8)
    policy = None
    if remote:
        config = trainer_generation_config(trainer, tok)
        policy = RemotePolicy(partial(toy_generator_policy, config), num_threads=1)
        trainer.add_callback(WeightSyncCallback(policy, every_n_steps=1))
    holder["f"] = as_trl_rollout_func(env, policy=policy)
    times = []

    class Timer:
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    trainer.add_callback(Timer())
    trainer.train()
    if policy is not None:
        policy.close()
    return (len(times) - 1) / (times[-1] - times[0])  # the first step (warm-up) left out


def overlap_steps(ray, overlapped: bool, steps: int, new_tokens: int) -> tuple[float, float]:
    """GRPO steps/s on a collector's groups (sequential, or generated in a Ray actor), and the
    share of the time the trainer waited for samples (generation included when sequential)."""
    from torchrl.data import LazyStackStorage, RayReplayBuffer, ReplayBuffer

    model = toy_causal_lm(tokenizer=toy_tokenizer())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if overlapped:
        rb = RayReplayBuffer(
            storage=partial(LazyStackStorage, 4000), batch_size=4, remote_config={"num_cpus": 1}
        )
        generator = ray.remote(num_cpus=0, max_concurrency=3)(ToyGenerator).remote(
            rb.client(), max_new_tokens=new_tokens
        )
        ray.get(generator.update_weights.remote(model_weights(model), 0))
        running = generator.run.remote(10_000)
    else:
        rb = ReplayBuffer(storage=LazyStackStorage(4000))
        generator = ToyGenerator(rb, max_new_tokens=new_tokens)
        generator.update_weights(model_weights(model), 0)
    worker = TorchRLRolloutWorker(rb, num_generations=2, max_staleness=1, score_model=False)
    worker.start()
    stamps, version, waited = [], 0, []
    while len(stamps) < steps + 1:
        start = time.perf_counter()
        if not overlapped:
            generator.run(1)  # one batch: 4 completions, 2 groups
        try:
            samples = [worker.rollout_buffer.get(timeout=60) for _ in range(4)]
        except queue.Empty:
            raise RuntimeError("the generator produced nothing for 60 s") from None
        waited.append(time.perf_counter() - start)
        if version - min(s.model_version for s in samples) > 1:
            continue  # too stale: dropped, as TRL's consumer does
        toy_grpo_step(model, optimizer, samples)
        version += 1
        if overlapped:
            ray.get(generator.update_weights.remote(model_weights(model), version))
        else:
            generator.update_weights(model_weights(model), version)
        worker.update_model_version(version)
        stamps.append(time.perf_counter())
    worker.stop()
    if overlapped:
        ray.get(generator.stop.remote())
        ray.get(running)
        rb.close()
    span = stamps[-1] - stamps[0]
    return steps / span, sum(waited[-steps:]) / span


def ten_million_llama():
    return toy_causal_lm(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=4,
    )


def sync_cost(ray, repeats: int) -> dict[str, float]:
    """Median seconds of one WeightSyncCallback push of a ~10M-parameter model."""
    from torchrl.modules.llm import TransformersWrapper

    model = ten_million_llama()
    results = {"parameters": float(sum(p.numel() for p in model.parameters()))}
    tensors = model_weights(model).values(include_nested=True, leaves_only=True)
    results["bytes"] = float(sum(t.numel() * t.element_size() for t in tensors))
    remote = RemotePolicy(ten_million_llama, num_threads=1)
    local = TransformersWrapper(
        ten_million_llama(), tokenizer=toy_tokenizer(padding_side="left"), input_mode="history"
    )

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self):
            self.model = ten_million_llama()

        def update(self, weights, version):
            WeightSyncCallback(self.model).push(weights, version)
            return version

    holder = Holder.remote()
    ray.get(holder.update.remote(model_weights(model), 0))  # warm-up
    for name, push in (
        ("RemotePolicy (torchrl MultiProcessWeightSyncScheme)", WeightSyncCallback(remote).push),
        ("policy in this process (in-place copy)", WeightSyncCallback(local).push),
        ("Ray actor (ray.get of a remote push)", None),
    ):
        seconds = []
        for step in range(repeats + 1):
            start = time.perf_counter()
            if push is None:
                ray.get(holder.update.remote(model_weights(model), step))
            else:
                push(model, step)
            seconds.append(time.perf_counter() - start)
        results[name] = statistics.median(seconds[1:])  # the first (process start) left out
    remote.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overlap-steps", type=int, default=12)
    parser.add_argument("--sync-repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=48, help="per completion (overlap)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        same = grpo_trainer_steps(False, args.steps, os.path.join(tmp, "a"))
        other = grpo_trainer_steps(True, args.steps, os.path.join(tmp, "b"))
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"GRPOTrainer, {args.steps} steps of 8 completions (2 prompts x 4), 16 tokens")
    print(f"  generation in the trainer's process:   {same:.3f} steps/s")
    print(f"  generation in another process (sync):  {other:.3f} steps/s ({other / same:.2f}x)")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        sequential, seq_wait = overlap_steps(ray, False, args.overlap_steps, args.new_tokens)
        overlapped, ovl_wait = overlap_steps(ray, True, args.overlap_steps, args.new_tokens)
        print(
            f"\nGRPO steps on a collector's groups, {args.overlap_steps} steps of 4 completions "
            f"of up to {args.new_tokens} tokens"
        )
        print(
            f"  sequential (collect, then train):       {sequential:.3f} steps/s, "
            f"{100 * seq_wait:.0f}% of the time generating"
        )
        print(
            f"  overlapped (collector in a Ray actor):  {overlapped:.3f} steps/s "
            f"({overlapped / sequential:.2f}x), {100 * ovl_wait:.0f}% of the time waiting"
        )
        costs = sync_cost(ray, args.sync_repeats)
    finally:
        ray.shutdown()
    size = costs.pop("bytes")
    print(
        f"\nOne weight sync, {costs.pop('parameters') / 1e6:.1f}M parameters, "
        f"{size / 1e6:.0f} MB (median)"
    )
    for name, seconds in costs.items():
        print(f"  {name}: {1000 * seconds:.0f} ms ({size / seconds / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
