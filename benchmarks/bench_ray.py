"""Benchmark: generation on Ray actors, and weight pushes into them, on CPU.

Each figure is measured in one run (the machines are shared: compare within a run):

* **Generation throughput** (rows/s): the same rows (``--rows`` chat prompts from
  ``toy_chat_env``, ``--new-tokens`` sampled tokens each) answered by the toy generator policy
  (``toy_generator_policy``, a torchrl ``TransformersWrapper``) in this process, and by a
  :class:`~torchrl_trl_interop.RayRemotePolicy` with 1 and 2 replicas (each actor one torch
  thread, as this process). Median over ``--repeats`` calls after a warm-up, interleaved.
* **One weight sync** (seconds per sync, GB/s, bytes sent): a 20-layer toy Llama of width 256
  (66 MB of fp32 weights, 185 tensors) pushed by ``WeightSyncCallback`` into a model in this
  process and into a ``RayRemotePolicy`` of 1 and 2 replicas (one ``ray.put`` straight from the
  stream, every actor copies it in), against the floor: one ``copy_`` of every tensor into a
  preallocated buffer in this process (in the receiver's dtype). Receivers in fp32 (a whole
  push), and in bf16: whole, and delta pushes (``delta=True``) each after one AdamW step at
  ``lr=1e-6`` (TRL's default learning rate) on a random batch, the step not timed. GB/s is the
  receiver's model bytes over the seconds of a sync (what a whole push would move), bytes what
  the push sent. Median after :data:`WARMUP` untimed syncs; :data:`GAP_S` seconds between two
  syncs, as a training step would leave (Ray frees a push's object asynchronously: back-to-back
  puts land on fresh pages).

Run with ``python benchmarks/bench_ray.py`` (``make bench``); it starts a local Ray instance
(``ray.init(num_cpus=3)``: the 1- and 2-replica policies are live at once).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch

#: seconds between two timed syncs (a training step's stand-in, not timed): Ray frees the last
#: push's object asynchronously, and a put landing before that goes to fresh pages of the object
#: store (page faults: ~45 ms for 66 MB on this machine, against ~6 ms into reused memory)
GAP_S = 0.2


#: untimed syncs before the timed ones: the object store's first objects land on fresh pages
WARMUP = 3


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


#: the pushed model: 20 layers of width 256, 16.6M parameters, 66 MB of fp32 weights
PUSH_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 20,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def push_model(dtype: torch.dtype | None = None, seed: int = 0):
    """The pushed model (module-level: a Ray actor builds it too), in ``dtype``."""
    from torchrl_trl_interop.testing import toy_causal_lm

    model = toy_causal_lm(seed=seed, **PUSH_SIZES)
    return model if dtype is None else model.to(dtype)


def _optimizer_step(model, optimizer) -> None:
    ids = torch.randint(5, 60, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _timed_pairs(sync, floor, repeats: int, warmup: int, between=None) -> tuple[float, float]:
    """Median seconds of ``sync()`` and of ``floor()``, timed in turn (the floor right before each
    sync: the same load hits both), after ``warmup`` untimed syncs; ``between()`` (untimed) and
    :data:`GAP_S` before each sync."""
    syncs, floors = [], []
    for timed in [False] * warmup + [True] * repeats:
        if between is not None:
            between()
        time.sleep(GAP_S)
        start = time.perf_counter()
        floor()
        floor_s = time.perf_counter() - start
        start = time.perf_counter()
        sync()
        if timed:
            syncs.append(time.perf_counter() - start)
            floors.append(floor_s)
    return statistics.median(syncs), statistics.median(floors)


def push(repeats: int) -> list[tuple[str, float, float, float, float]]:
    """``(name, median seconds, bytes sent, receiver model bytes, median floor seconds)`` of each
    sync, each with its own floor (one ``copy_`` per tensor in the receiver's dtype, timed in
    turn with it)."""
    from torchrl_trl_interop import RayRemotePolicy, WeightSyncCallback
    from torchrl_trl_interop.weights._tensors import named_tensors

    model = push_model()
    tensors = {name: t.detach() for name, t in named_tensors(model).items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    floors = {}
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        buffers = {name: torch.empty_like(t, dtype=dtype) for name, t in tensors.items()}

        def floor(buffers=buffers):
            with torch.no_grad():
                for name, t in tensors.items():
                    buffers[name].copy_(t)

        floors[label] = floor
    results = []
    for dtype, label in ((None, "fp32"), (torch.bfloat16, "bf16")):
        sync = WeightSyncCallback(push_model(dtype))
        step = iter(range(10**6))
        seconds, floor_s = _timed_pairs(
            lambda s=sync, i=step: s.push(model, next(i)), floors[label], repeats, 1
        )
        sent = sync.pushes[-1]["bytes"]
        results.append((f"into a model in this process ({label})", seconds, sent, sent, floor_s))
    for n in (1, 2):
        replicas = f"{n} replica{'s' if n > 1 else ''}"
        for dtype, label in ((None, "fp32"), (torch.bfloat16, "bf16")):
            remote = RayRemotePolicy(
                partial(push_model, dtype), num_replicas=n, num_threads=1, timeout=600
            )
            try:
                sync = WeightSyncCallback(remote)
                step = iter(range(10**6))
                seconds, floor_s = _timed_pairs(
                    lambda s=sync, i=step: s.push(model, next(i)), floors[label], repeats, WARMUP
                )
                whole = sync.pushes[-1]["bytes"]
                name = f"into RayRemotePolicy, {replicas} ({label}, whole)"
                results.append((name, seconds, whole, whole, floor_s))
                if dtype is None:
                    continue
                delta = WeightSyncCallback(remote, delta=True, full_push_every=10**6)
                versions = iter(range(10**5, 10**6))
                delta.push(model, next(versions))  # whole: the delta's base
                seconds, floor_s = _timed_pairs(
                    lambda d=delta, v=versions: d.push(model, next(v)),
                    floors[label],
                    repeats,
                    WARMUP,
                    between=lambda: _optimizer_step(model, optimizer),
                )
                sent = statistics.median(p["bytes"] for p in delta.pushes[1 + WARMUP :])
                assert all(p["delta"] for p in delta.pushes[1:]), "a delta push went whole"
                name = f"into RayRemotePolicy, {replicas} (bf16, delta, one step at lr 1e-6)"
                results.append((name, seconds, sent, whole, floor_s))
            finally:
                remote.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pushes-only", action="store_true", help="skip the generation rows")
    args = parser.parse_args()

    import ray

    torch.set_num_threads(1)
    # 3 actors live at once (1 + 2 replicas, one logical CPU each) on this 2-core machine
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        figures = [] if args.pushes_only else generation(args.rows, args.new_tokens, args.repeats)
        if figures:
            base = figures[0][1]
            print(f"Generation: {args.rows} rows, {args.new_tokens} new tokens each (rows/s)")
        for name, rate in figures:
            print(f"  {name:40s} {rate:8.1f} rows/s  {rate / base:5.2f}x")
        pushes = push(args.repeats)
        print(f"One weight sync of a 66 MB fp32 model (median of {args.repeats}; the floor: one")
        print("copy_ per tensor in this process, in the receiver's dtype, timed in turn with it)")
        for name, seconds, sent, model_bytes, floor in pushes:
            print(
                f"  {name:62s} {seconds * 1e3:7.1f} ms  {model_bytes / seconds / 1e9:5.2f} GB/s  "
                f"{sent / 1e6:6.2f} MB sent  floor {floor * 1e3:5.1f} ms  "
                f"{seconds / floor:5.1f}x"
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
