"""Benchmark: generation on Ray actors, and weight pushes into them, on CPU.

Each figure is measured in one run (the machines are shared: compare within a run):

* **Generation throughput** (rows/s): the same rows (``--rows`` chat prompts from
  ``toy_chat_env``, ``--new-tokens`` sampled tokens each) answered by the toy generator policy
  (``toy_generator_policy``, a torchrl ``TransformersWrapper``) in this process, and by a
  :class:`~torchrl_trl_interop.RayRemotePolicy` with 1 and 2 replicas (each actor one torch
  thread, as this process). Median over ``--repeats`` calls after a warm-up, interleaved.
* **One weight push** (seconds, GB/s): a 12-layer toy Llama (``toy_big_llama``, 40 MB of fp32
  weights) pushed by ``WeightSyncCallback`` into a ``RayRemotePolicy`` of 1 and 2 replicas
  (streamed into one flat buffer, one ``ray.put``, every actor commits), against the floor: one
  ``copy_`` of every tensor into a preallocated buffer in this process. Interleaved; median.

Run with ``python benchmarks/bench_ray.py`` (``make bench``); it starts a local Ray instance
(``ray.init(num_cpus=3)``: the 1- and 2-replica policies are live at once).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def generation(rows: int, new_tokens: int, repeats: int) -> list[tuple[str, float]]:
    """Rows/s of the in-process policy and of 1 and 2 Ray replicas on the same rows."""
    from tensordict import TensorDict

    from torchrl_trl_interop import RayRemotePolicy
    from torchrl_trl_interop.testing import (
        toy_causal_lm,
        toy_chat_env,
        toy_generator_policy,
        toy_prompts,
        toy_tokenizer,
    )

    tok = toy_tokenizer()
    env = toy_chat_env(tok, batch_size=rows)
    td = env.reset(TensorDict({"query": toy_prompts(rows)}, batch_size=[rows]))
    factory = partial(toy_generator_policy, max_new_tokens=new_tokens, seed=1)
    weights = toy_causal_lm(tokenizer=tok)
    local = factory()
    policies = {"in this process": local}
    for n in (1, 2):
        remote = RayRemotePolicy(factory, num_replicas=n, num_threads=1, timeout=600)
        remote.update_policy_weights_(weights, policy_version=0)
        policies[f"RayRemotePolicy, {n} replica{'s' if n > 1 else ''}"] = remote
    times: dict[str, list[float]] = {name: [] for name in policies}
    for policy in policies.values():
        policy(td.clone())  # warm-up
    for _ in range(repeats):  # interleaved: the machine's load hits every policy alike
        for name, policy in policies.items():
            start = time.perf_counter()
            policy(td.clone())
            times[name].append(time.perf_counter() - start)
    for name, policy in policies.items():
        if name != "in this process":
            policy.close()
    return [(name, rows / statistics.median(t)) for name, t in times.items()]


def push(repeats: int) -> list[tuple[str, float]]:
    """Median seconds of the copy floor and of a push into 1 and 2 Ray replicas."""
    from torchrl_trl_interop import RayRemotePolicy, WeightSyncCallback
    from torchrl_trl_interop.testing import toy_big_llama
    from torchrl_trl_interop.weights._tensors import named_tensors

    model = toy_big_llama()
    tensors = named_tensors(model)
    floor_buffers = {name: torch.empty_like(t) for name, t in tensors.items()}

    def floor():
        with torch.no_grad():
            for name, t in tensors.items():
                floor_buffers[name].copy_(t)

    results = [("floor: one copy_ per tensor", _median_seconds(floor, repeats))]
    for n in (1, 2):
        remote = RayRemotePolicy(toy_big_llama, num_replicas=n, num_threads=1, timeout=600)
        sync = WeightSyncCallback(remote)
        step = iter(range(10**6))
        try:
            seconds = _median_seconds(lambda s=sync, i=step: s.push(model, next(i)), repeats)
        finally:
            remote.close()
        results.append((f"into RayRemotePolicy, {n} replica{'s' if n > 1 else ''}", seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import ray

    torch.set_num_threads(1)
    # 3 actors live at once (1 + 2 replicas, one logical CPU each) on this 2-core machine
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        figures = generation(args.rows, args.new_tokens, args.repeats)
        base = figures[0][1]
        print(f"Generation: {args.rows} rows, {args.new_tokens} new tokens each (rows/s)")
        for name, rate in figures:
            print(f"  {name:40s} {rate:8.1f} rows/s  {rate / base:5.2f}x")
        nbytes = sum(t.numel() * t.element_size() for t in _big_tensors())
        print(f"One push of toy_big_llama ({nbytes / 1e6:.0f} MB)")
        pushes = push(args.repeats)
        floor = pushes[0][1]
        for name, seconds in pushes:
            print(
                f"  {name:40s} {seconds * 1e3:8.1f} ms  {nbytes / seconds / 1e9:5.2f} GB/s  "
                f"{seconds / floor:5.1f}x the floor"
            )
    finally:
        ray.shutdown()


def _big_tensors():
    from torchrl_trl_interop.testing import toy_big_llama
    from torchrl_trl_interop.weights._tensors import named_tensors

    return list(named_tensors(toy_big_llama()).values())


if __name__ == "__main__":
    main()
