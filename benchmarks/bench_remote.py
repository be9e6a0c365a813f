"""Benchmark: weight pushes, and generation apart from training, on CPU.

Each figure is measured in one run (the machines are shared: compare within a run):

* **One weight push** (the default, seconds): a 12-layer toy Llama (``toy_big_llama``, 40 MB of
  fp32 weights) pushed by ``WeightSyncCallback`` into a ``RemotePolicy`` (another process: the
  weights streamed into its shared staging buffer, then committed there) and into a model in
  this process, against the floor: one ``copy_`` of every tensor into a preallocated
  shared-memory buffer in this process. Interleaved, one torch thread per process; median
  time, GB/s and the ratio to the floor. Then the peak extra memory of the trainer's process
  during a push (plain, and with a LoRA adapter merged on the way), against the model's size.
* ``--full`` adds, in minutes:

  * **GRPOTrainer, generation in the same process vs in another process.** ``GRPOTrainer``
    with ``as_trl_rollout_func(env)`` (the trainer's model generates) and with
    ``as_trl_rollout_func(env, policy=RemotePolicy(...))`` plus ``WeightSyncCallback`` after
    every step. ``GRPOTrainer`` calls its rollout function synchronously, so there is no
    overlap here: the figure is the price of the process boundary and the weight sync.
  * **Overlap: a collector apart from the trainer.** A GRPO step on 2 groups of 2
    completions, (a) sequential: a torchrl ``LLMCollector`` in this process collects one
    batch, then the step trains on it; (b) overlapped: the same collector runs in a Ray actor
    (``ToyGenerator``), writing into a ``RayReplayBuffer`` that a ``TorchRLRolloutWorker``
    drains, while the trainer trains; it pushes its weights after every step
    (``max_staleness=1``). Steps/s and the ratio. And one push into the Ray actor's model.

Run with ``python benchmarks/bench_remote.py [--full]``.
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
    ToyGenerator,
    peak_memory_growth,
    toy_answer_length,
    toy_big_llama,
    toy_causal_lm,
    toy_chat_env,
    toy_generator_policy,
    toy_grpo_args,
    toy_grpo_step,
    toy_lora_model,
    toy_prompts,
    toy_tokenizer,
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
            **toy_grpo_args(
                out_dir,
                tokenizer=tok,
                num_generations=4,
                max_completion_length=16,
                max_steps=steps + 1,
                per_device_train_batch_size=8,
            )
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


def _median_ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds)


def push_figures(repeats: int) -> dict[str, float]:
    """One push of a 12-layer toy Llama (``toy_big_llama``), timed against its floor, in one run.

    Interleaved, ``repeats`` times each (after one warm-up): the floor, one ``copy_`` of every
    tensor into a preallocated shared-memory buffer in this process; ``WeightSyncCallback`` into
    a policy in this process; ``WeightSyncCallback`` into a ``RemotePolicy``. Then the peak extra
    memory of the trainer's process during a ``RemotePolicy`` push, and during a push of the
    same model with a LoRA adapter on every linear layer (merged on the way).
    """
    model = toy_big_llama(seed=1)
    tensors = list(model.state_dict(keep_vars=True).items())
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    floor = {name: torch.empty_like(t).share_memory_() for name, t in named.items()}
    size = sum(t.numel() * t.element_size() for t in named.values())
    remote = RemotePolicy(toy_big_llama, num_threads=1)
    local = toy_big_llama()

    def copy(step):
        with torch.no_grad():
            for name, tensor in named.items():
                floor[name].copy_(tensor)

    ways = {
        "floor: one copy_ per tensor into shared memory": copy,
        "WeightSyncCallback into a model in this process": WeightSyncCallback(local).push,
        "WeightSyncCallback into a RemotePolicy": WeightSyncCallback(remote).push,
    }
    seconds = {name: [] for name in ways}
    for step in range(repeats + 1):
        for name, way in ways.items():
            start = time.perf_counter()
            if name.startswith("floor"):
                way(step)
            else:
                way(model, step)
            if step:  # the first (process start, first touch of the buffers) left out
                seconds[name].append(time.perf_counter() - start)
    results = {"bytes": float(size), "tensors": float(len(named)), "largest": 0.0}
    results["largest"] = float(max(t.numel() * t.element_size() for _, t in tensors))
    results.update({name: statistics.median(s) for name, s in seconds.items()})
    with peak_memory_growth() as grown:
        WeightSyncCallback(remote).push(model, repeats + 1)
    results["peak, RemotePolicy push"] = float(grown["bytes"])
    try:
        lora = toy_lora_model(model)
        WeightSyncCallback(remote).push(lora, repeats + 2)
        with peak_memory_growth() as grown:
            WeightSyncCallback(remote).push(lora, repeats + 3)
        results["peak, RemotePolicy push of a LoRA model (merged)"] = float(grown["bytes"])
    except (KeyError, RuntimeError) as error:  # a version without LoRA support
        print(f"  (LoRA push failed: {type(error).__name__}: {str(error)[:120]})")
    remote.close()
    return results


def print_push_figures(figures: dict[str, float]) -> None:
    size = figures.pop("bytes")
    print(
        f"\nOne weight push of a 12-layer toy Llama, {figures.pop('tensors'):.0f} tensors, "
        f"{size / 1e6:.0f} MB fp32 (median, one torch thread per process)"
    )
    largest = figures.pop("largest")
    floor = next(v for k, v in figures.items() if k.startswith("floor"))
    for name, value in figures.items():
        if name.startswith("peak"):
            print(
                f"  {name}: {value / 1e6:.1f} MB (the model {size / 1e6:.0f} MB, its largest "
                f"tensor {largest / 1e6:.1f} MB)"
            )
        else:
            print(
                f"  {name}: {1000 * value:.1f} ms ({size / value / 1e9:.2f} GB/s, "
                f"{value / floor:.1f}x the copy)"
            )


def sync_cost(ray, repeats: int) -> dict[str, float]:
    """Median seconds of one push of the same model into a Ray actor's model."""
    model = toy_big_llama(seed=1)

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self):
            self.model = toy_big_llama()

        def update(self, weights, version):
            WeightSyncCallback(self.model).push(weights, version)
            return version

    holder = Holder.remote()
    ray.get(holder.update.remote(model_weights(model), 0))  # warm-up
    seconds = []
    for step in range(repeats):
        start = time.perf_counter()
        ray.get(holder.update.remote(model_weights(model), step + 1))
        seconds.append(time.perf_counter() - start)
    return {"Ray actor (ray.get of a remote push)": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overlap-steps", type=int, default=12)
    parser.add_argument("--sync-repeats", type=int, default=9)
    parser.add_argument("--new-tokens", type=int, default=48, help="per completion (overlap)")
    parser.add_argument(
        "--full", action="store_true", help="also GRPOTrainer and the Ray overlap (minutes)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print_push_figures(push_figures(args.sync_repeats))
    if not args.full:
        return
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        same = grpo_trainer_steps(False, args.steps, os.path.join(tmp, "a"))
        other = grpo_trainer_steps(True, args.steps, os.path.join(tmp, "b"))
    print(f"\nGRPOTrainer, {args.steps} steps of 8 completions (2 prompts x 4), 16 tokens")
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
        for name, seconds in sync_cost(ray, args.sync_repeats).items():
            print(f"  one push into a {name}: {1000 * seconds:.0f} ms")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
