"""Benchmark: the OpenAI-compatible endpoint against calling the policy in this process, on CPU.

Each figure is measured in one run (the machines are shared: compare within a run). The same
toy policy (a ``TrainerModelPolicy``: the toy Llama, ``--new-tokens`` sampled tokens, never
stopping early) answers the same chat prompts, rendered with the tokenizer's template:

* **in process, batched**: the policy called directly on batches of ``--clients`` prompts
  (what the endpoint's worker does with a full batch: the floor);
* **in process, one by one**: the policy called on one prompt at a time;
* **HTTP, one client**: the ``openai`` client, one request after the other
  (``return_token_ids``): each request pays HTTP, JSON, the template's rendering and one
  policy call of its own;
* **HTTP, N concurrent clients**: ``--clients`` threads with their own ``openai`` client, each
  sending its requests one after the other: the worker batches the requests waiting together.

Two layouts: the toy Llama (1 layer, width 32) and a wider one (``toy_big_llama``: 12 layers,
width 256), so that the endpoint's fixed cost per request shows against a cheap and a costlier
policy call. Answers per second and the ratio to the in-process batched floor.

The four are interleaved over ``--rounds`` rounds (the median of each), one torch thread.
Run with ``python benchmarks/bench_agents.py [--requests 48] [--clients 8] [--new-tokens 16]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import openai
import torch
from transformers import GenerationConfig

from torchrl_trl_interop import OpenAIServer, TrainerModelPolicy
from torchrl_trl_interop.agents._policy_calls import PolicyCaller
from torchrl_trl_interop.testing import toy_big_llama, toy_causal_lm, toy_tokenizer

MODEL = "toy"


def _policy(model, tok, new_tokens):
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # every answer the same length: the rates compare
        do_sample=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return TrainerModelPolicy(model, tok, config, 1.0)


def _messages(i):
    return [{"role": "user", "content": f"What is {i % 10} plus {i % 7}?"}]


def in_process(policy, tok, requests, batch):
    """Answers per second, the policy called directly on batches of ``batch`` prompts."""
    from torchrl_trl_interop._chat_format import ChatFormat

    caller = PolicyCaller(policy, tok)
    chat = ChatFormat.of(tok)
    start = time.perf_counter()
    for first in range(0, requests, batch):
        rows = range(first, min(first + batch, requests))
        caller(chat.prompt_ids([_messages(i) for i in rows]))
    return requests / (time.perf_counter() - start)


def over_http(server, requests, clients):
    """Answers per second through the endpoint, ``clients`` clients at once."""
    errors = []

    def client_loop(k):
        client = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0, timeout=600)
        for i in range(k, requests, clients):
            try:
                client.chat.completions.create(
                    model=MODEL, messages=_messages(i), extra_body={"return_token_ids": True}
                )
            except Exception as err:  # reported below
                errors.append(err)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    return requests / (time.perf_counter() - start)


def run(name, model, tok, args):
    """The four ways, interleaved over ``--rounds`` rounds; the median rate of each."""
    policy = _policy(model, tok, args.new_tokens)
    many = f"HTTP, {args.clients} concurrent clients"
    rates: dict[str, list[float]] = {}
    calls = {}
    served = OpenAIServer(policy, tokenizer=tok, model_name=MODEL, batch_wait_s=args.batch_wait_s)
    with served as server:
        in_process(policy, tok, args.clients, args.clients)  # warm-up
        over_http(server, args.clients, args.clients)
        for _ in range(args.rounds):
            rates.setdefault("in process, batched", []).append(
                in_process(policy, tok, args.requests, args.clients)
            )
            rates.setdefault("in process, one by one", []).append(
                in_process(policy, tok, args.requests, 1)
            )
            for label, clients in (("HTTP, one client", 1), (many, args.clients)):
                before = server._batcher.batches
                rates.setdefault(label, []).append(over_http(server, args.requests, clients))
                calls[label] = server._batcher.batches - before
    floor = statistics.median(rates["in process, batched"])
    print(
        f"\n{name}: {args.requests} answers of {args.new_tokens} tokens, median of "
        f"{args.rounds}, batch_wait_s={args.batch_wait_s}"
    )
    for label, values in rates.items():
        rate = statistics.median(values)
        spent = f"   ({calls[label]} policy calls)" if label in calls else ""
        print(f"  {label:<32} {rate:8.1f} answers/s   {rate / floor:5.2f}x{spent}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-wait-s", type=float, default=0.002)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core for the policy: the shared machine's load varies less
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    tok = toy_tokenizer()
    run("toy Llama (1 layer, width 32)", toy_causal_lm(tokenizer=tok), tok, args)
    run("toy_big_llama (12 layers, width 256)", toy_big_llama(), tok, args)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
