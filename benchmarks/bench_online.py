"""Benchmark: a short GRPO run with a TorchRL environment as the rollout engine, on CPU.

``GRPOTrainer`` trains a toy Llama (saved to a temporary folder, so the trainer can build its
reference model from it and log a KL) for ``--steps`` steps, three ways in the same run:

* **trl**: TRL's own generation (no ``rollout_func``), the reference;
* **env**: ``rollout_func=as_trl_rollout_func(ChatEnv)``, single turn;
* **env, 2 turns**: a ChatEnv whose tool transform answers every turn, ``max_turns=2``.

The reward is the environment's own (``env_reward``: the length of each answer, scored in the
environment by a TRL-style reward function through ``as_reward_transform``); for **trl** the same
function is a GRPO reward function. For each step it prints the mean reward and the KL to the
reference (``beta > 0``), and for each variant the time split: generation (inside
``GRPOTrainer._generate``: the rollout function, or TRL's generate) versus the rest of the step
(scoring, log-probs, backward, optimizer). Run with ``python benchmarks/bench_online.py``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

from torchrl_trl_interop import as_reward_transform, as_trl_rollout_func
from torchrl_trl_interop.testing import (
    IM_START,
    toy_causal_lm,
    toy_chat_env,
    toy_prompts,
    toy_tokenizer,
    toy_trainer_args,
)


def answer_length(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


def env_reward(completions, env_reward, **kwargs):
    return list(env_reward)


def run(variant: str, model_dir: str, out_dir: str, steps: int, completion_length: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    data = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(64)]}
    )
    rollout_func, reward = None, answer_length
    if variant != "trl":
        two_turns = variant == "env, 2 turns"
        env = toy_chat_env(
            tok,
            batch_size=8,
            reply=two_turns,
            transforms=[as_reward_transform(answer_length)],
        )
        rollout_func = as_trl_rollout_func(env, max_turns=2 if two_turns else 1)
        reward = env_reward
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward,
        args=GRPOConfig(
            num_generations=4,
            max_completion_length=completion_length,
            learning_rate=1e-2,
            beta=0.04,
            bf16=False,
            generation_kwargs={"suppress_tokens": [tok.convert_tokens_to_ids(IM_START)]},
            **toy_trainer_args(out_dir, max_steps=steps, per_device_train_batch_size=8),
        ),
        train_dataset=data,
        processing_class=tok,
        rollout_func=rollout_func,
    )
    generate = trainer._generate
    spent = {"generation": 0.0}

    def timed_generate(prompts):
        start = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            spent["generation"] += time.perf_counter() - start

    trainer._generate = timed_generate
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = [log for log in trainer.state.log_history if "reward" in log]
    return {
        "reward": [log["reward"] for log in logs],
        "kl": [log.get("kl") for log in logs],
        "length": [log["completions/mean_length"] for log in logs],
        "generation": spent["generation"],
        "total": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--completion-length", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "toy-llama")
        tok = toy_tokenizer()
        toy_causal_lm(tokenizer=tok).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        results = {
            variant: run(
                variant, model_dir, os.path.join(tmp, "out"), args.steps, args.completion_length
            )
            for variant in ("trl", "env", "env, 2 turns")
        }
    print(f"GRPO, toy Llama, {args.steps} steps, 8 completions (2 prompts x 4) per step")
    for variant, r in results.items():
        print(f"\n{variant}")
        print("  step  reward   kl        policy tokens")
        for i, (rew, kl, n) in enumerate(zip(r["reward"], r["kl"], r["length"]), 1):
            print(f"  {i:4d}  {rew:7.3f}  {kl:.2e}  {n:6.1f}")
        rest = r["total"] - r["generation"]
        print(
            f"  time: {r['total']:.2f} s; generation {r['generation']:.2f} s "
            f"({100 * r['generation'] / r['total']:.0f}%), training {rest:.2f} s"
        )
    base = results["trl"]["generation"]
    for variant in ("env", "env, 2 turns"):
        print(f"generation time, {variant} vs trl: {results[variant]['generation'] / base:.2f}x")


if __name__ == "__main__":
    main()
