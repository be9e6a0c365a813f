"""Benchmark: dynamic sampling (``candidate_group_size=K``) on the toy arithmetic task, on CPU.

A toy Llama is warm-started with TRL's ``SFTTrainer`` on a sloppy teacher that adds right only
``--accuracy`` of the time (:func:`~torchrl_trl_interop.testing.arithmetic_chats`), so that the
sparse reward :func:`~torchrl_trl_interop.testing.correct_answer`, computed in the environment
(``RewardTransform``), leaves most GRPO groups with no spread. From that one checkpoint,
``GRPOTrainer(rollout_func=as_trl_rollout_func(env, candidate_group_size=K))`` trains for
``--steps`` steps, the same seed, once per ``K`` (``plain``: no candidates).

For each step it prints TRL's ``frac_reward_zero_std`` and ``reward`` (the mean over the rows
the trainer got: with candidates, a biased sample, chosen for spread), the mean reward over
*every* candidate sampled (the policy's accuracy, unbiased), our
``rollout/zero_std_groups_before`` (what plain sampling would have returned) and the time spent
generating (inside ``GRPOTrainer._generate``: the rollout function, candidates included). Run
with ``python benchmarks/bench_dynamic_sampling.py`` (quick: ~4 min on one core);
``--steps 30`` for longer curves.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from torchrl_trl_interop.testing import demo_setup  # noqa: E402

demo_setup(seed=0, threads=1)

import torch  # noqa: E402

from torchrl_trl_interop import RewardTransform, as_trl_rollout_func  # noqa: E402
from torchrl_trl_interop.testing import (  # noqa: E402
    arithmetic_chats,
    arithmetic_questions,
    correct_answer,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_tokenizer,
    toy_trainer_args,
)

GROUP = 4  # num_generations


def env_reward(completions, env_reward, **kwargs):
    return list(env_reward)


def timed(f: Callable, spent: list[float]) -> Callable:
    """``f``, appending the seconds each call takes to ``spent``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    return call


def warm_start(model_dir: str, out_dir: str, steps: int, accuracy: float) -> None:
    """SFT on the sloppy teacher; the checkpoint every GRPO run starts from."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = toy_tokenizer(padding_side="left")
    model = toy_causal_lm(
        tokenizer=tok, hidden_size=64, intermediate_size=128, num_hidden_layers=2, seed=0
    )
    chats = arithmetic_chats(2000, accuracy=accuracy, seed=0)
    SFTTrainer(
        model=model,
        args=SFTConfig(
            learning_rate=1e-2,
            warmup_steps=20,
            **toy_trainer_args(
                out_dir,
                max_steps=steps,
                per_device_train_batch_size=32,
                logging_steps=100,
                bf16=False,
            ),
        ),
        train_dataset=Dataset.from_dict({"messages": chats}),
        processing_class=tok,
    ).train()
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)


def run(
    candidates: int | None, model_dir: str, out_dir: str, steps: int, groups: int, seed: int
) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer(padding_side="left")
    questions = arithmetic_questions()
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})
    env_batch = groups * (candidates or GROUP)  # one environment batch per step
    env = toy_chat_env(tok, batch_size=env_batch, transforms=[RewardTransform(correct_answer)])
    rollout_func = as_trl_rollout_func(env, candidate_group_size=candidates)
    sampled: list[list[float]] = []  # every candidate's reward, per call
    rollout = rollout_func._rollout

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        sampled.append(list(out["env_reward"]))
        return out

    rollout_func._rollout = recorded
    torch.manual_seed(seed)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=env_reward,
        args=GRPOConfig(
            **toy_grpo_args(
                out_dir,
                tokenizer=tok,
                num_generations=GROUP,
                max_completion_length=12,
                learning_rate=5e-3,
                max_steps=steps,
                per_device_train_batch_size=groups * GROUP,
                seed=seed,
            )
        ),
        train_dataset=data,
        processing_class=tok,
        rollout_func=rollout_func,
    )
    spent: list[float] = []  # seconds in GRPOTrainer._generate, per step
    trainer._generate = timed(trainer._generate, spent)
    trainer.remove_callback(PrinterCallback)  # the tables below say it all
    took: list[float] = []
    timed(trainer.train, took)()
    logs = [log for log in trainer.state.log_history if "reward" in log]
    return {
        "zero_std": [log["frac_reward_zero_std"] for log in logs],
        "before": [log.get("rollout/zero_std_groups_before") for log in logs],
        "reward": [log["reward"] for log in logs],
        "accuracy": [sum(r) / len(r) for r in sampled],
        "generation": spent,
        "total": took[0],
    }


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    rule = "  ".join("=" * w for w in widths)
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([rule, line(header), rule, *map(line, rows), rule])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="groups per step")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--accuracy", type=float, default=0.15, help="the teacher's")
    parser.add_argument("--seed", type=int, default=0, help="of the GRPO runs")
    parser.add_argument("--candidates", type=int, nargs="*", default=[8, 16])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "warm")
        start = time.perf_counter()
        warm_start(model_dir, os.path.join(tmp, "sft"), args.sft_steps, args.accuracy)
        print(f"warm start: {args.sft_steps} SFT steps, {time.perf_counter() - start:.0f} s")
        results = {
            k: run(
                k, model_dir, os.path.join(tmp, f"grpo-{k}"), args.steps, args.prompts, args.seed
            )
            for k in [None, *args.candidates]
        }
    name = lambda k: "plain" if k is None else f"K={k}"  # noqa: E731
    print(
        f"\nGRPO on the toy task, {args.steps} steps, {args.prompts} prompts x "
        f"num_generations={GROUP} per step, teacher accuracy {args.accuracy}, seed {args.seed}\n"
    )
    keys = list(results)
    shares = [["step", *(f"{name(k)}: {w}" for k in keys for w in ("before", "after") if k)]]
    shares[0].insert(1, "plain")
    rewards = [["step", "plain", *(f"{name(k)}: {w}" for k in keys if k for w in ("all", "kept"))]]
    for step in range(args.steps):
        row, rew = [str(step + 1)], [str(step + 1)]
        for k in keys:
            r = results[k]
            row += [f"{r['zero_std'][step]:.2f}"] if k is None else [f"{r['before'][step]:.2f}"]
            row += [f"{r['zero_std'][step]:.2f}"] if k is not None else []
            rew += [f"{r['accuracy'][step]:.2f}"]
            rew += [f"{r['reward'][step]:.2f}"] if k is not None else []
        shares.append(row)
        rewards.append(rew)
    print("Groups without reward spread (TRL's frac_reward_zero_std; before: our")
    print("rollout/zero_std_groups_before, what plain sampling of the same call would return)")
    print(table(shares[1:], shares[0]))
    print("\nMean reward (all: every rollout sampled, the policy's accuracy; kept: TRL's reward,")
    print("over the rows the trainer got)")
    print(table(rewards[1:], rewards[0]))
    print()
    base = sum(results[None]["generation"])
    rows = []
    for k, r in results.items():
        gen = sum(r["generation"])
        rows.append(
            [
                name(k),
                str(k or GROUP),
                f"{sum(r['zero_std']) / args.steps:.2f}",
                f"{1000 * gen / args.steps:.0f}",
                f"{gen / base:.2f}x",
                f"{r['total'] / args.steps:.2f}",
                f"{r['total'] / results[None]['total']:.2f}x",
            ]
        )
    header = ["run", "rollouts/group", "zero-std", "gen. ms/step", "gen. x", "s/step", "step x"]
    print(table(rows, header))


if __name__ == "__main__":
    main()
