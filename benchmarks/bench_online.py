"""Benchmark: the online loop's cost per turn (``as_trl_rollout_func(ChatEnv)``) vs TRL's generate.

One ``GRPOTrainer`` per variant, same toy Llama (2 layers), on CPU with one torch thread. The
benchmark's own layout: hidden 64, 8 completions (2 prompts x 4) of exactly 16 tokens
(``min_new_tokens``: both sides generate the same work); ``--layout HIDDEN,COMPLETIONS,TOKENS``
picks others (model size, batch, answer length), ``--all-layouts`` runs the own one and three
others (``OTHER_LAYOUTS``, what ``make bench`` runs). What is timed is one GRPO generation step,
``GRPOTrainer._generate(prompts)``, in process CPU time:

* **trl**: TRL's own generation (no ``rollout_func``), the reference;
* **env**: ``rollout_func=as_trl_rollout_func(ChatEnv)``, single turn;
* **env, 2 turns**: a ChatEnv whose tool transform answers every turn, ``max_turns=2``: its time
  is divided by 2 (per policy turn).

The three run interleaved, ``--repeats`` times, after a warm-up call; each ratio is taken within
one repeat (the machine is shared and noisy) and the median and the min-max spread are printed.
``--sweep`` repeats the measurement for hidden sizes 64 -> 512 (where the fixed overhead stops
mattering). ``--before PATH`` measures a second checkout of the package too (``PATH`` on
``PYTHONPATH`` in a subprocess), alternating with this one, so "before" and "after" come from one
run. ``--breakdown`` also times, per policy turn, the torchrl, transformers and package
functions the loop calls (``_PARTS``). ``--train`` runs the former demo instead: a short GRPO run that prints rewards and KL per
step for the three variants (``docs/online.rst``).

Run with ``python benchmarks/bench_online.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

VARIANTS = ("trl", "env", "env, 2 turns")
TURNS = {"trl": 1, "env": 1, "env, 2 turns": 2}

#: (hidden size, completions per step, answer tokens)
Layout = tuple[int, int, int]
#: the benchmark's own toy configuration, and three others (model size, batch, answer length)
OWN_LAYOUT: Layout = (64, 8, 16)
OTHER_LAYOUTS: tuple[Layout, ...] = ((64, 4, 8), (128, 16, 16), (64, 8, 32))


def _layout(text: str) -> Layout:
    """``"64,8,16"`` -> ``(64, 8, 16)`` (the ``--layout`` argument)."""
    try:
        hidden, batch, answer = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected HIDDEN,COMPLETIONS,TOKENS (e.g. 64,8,16), got {text!r}"
        ) from None
    if min(hidden, batch, answer) <= 0 or batch % 4 or hidden % 4:
        raise argparse.ArgumentTypeError(
            f"{text!r}: sizes must be positive, COMPLETIONS and HIDDEN multiples of 4"
        )
    return hidden, batch, answer


def _name(layout: Layout) -> str:
    return ",".join(map(str, layout))


def answer_length(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


def env_reward(completions, env_reward, **kwargs):
    return list(env_reward)


def _trainer(
    variant: str,
    model,
    tok,
    out_dir: str,
    *,
    steps: int,
    beta: float,
    exact: bool,
    batch: int = 8,
    answer: int = 16,
):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from torchrl_trl_interop import RewardTransform, as_trl_rollout_func
    from torchrl_trl_interop.testing import IM_START, toy_chat_env, toy_grpo_args, toy_prompts

    data = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(64)]}
    )
    rollout_func, reward = None, answer_length
    if variant != "trl":
        env = toy_chat_env(
            tok,
            batch_size=batch,
            reply=TURNS[variant] == 2,
            transforms=[RewardTransform(answer_length)],
        )
        rollout_func = as_trl_rollout_func(env, max_turns=TURNS[variant])
        reward = env_reward
    generation_kwargs = {"suppress_tokens": [tok.convert_tokens_to_ids(IM_START)]}
    if exact:  # every completion exactly max_completion_length tokens, on both sides
        generation_kwargs["min_new_tokens"] = answer
    torch.manual_seed(0)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=GRPOConfig(
            **toy_grpo_args(
                out_dir,
                tokenizer=tok,
                num_generations=4,
                max_completion_length=answer,
                beta=beta,
                generation_kwargs=generation_kwargs,
                max_steps=steps,
                per_device_train_batch_size=batch,
            )
        ),
        train_dataset=data,
        processing_class=tok,
        rollout_func=rollout_func,
    )


#: torchrl and package functions timed by --breakdown: (owner, attribute path, label)
_PARTS = (
    ("torchrl.envs", "EnvBase.reset", "torchrl: env.reset"),
    ("torchrl.envs", "EnvBase.step", "torchrl: env.step (ChatEnv + transforms)"),
    ("torchrl.envs.transforms", "Transform.inv", "torchrl:   of which Transform.inv's clone"),
    ("torchrl.envs", "EnvBase.step_mdp", "torchrl: env.step_mdp"),
    (
        "torchrl_trl_interop.rollouts._episodes",
        "step",
        "ours: env step, no copy (_upstream/_env_step)",
    ),
    (
        "torchrl_trl_interop.rollouts._episodes",
        "step_mdp",
        "ours: step_mdp, no copy (_upstream/_env_step)",
    ),
    ("transformers", "GenerationMixin.generate", "transformers: model.generate"),
    ("torchrl.data.llm", "History.from_text", "torchrl: History.from_text (answer parse)"),
    ("torchrl_trl_interop._chat_format", "ChatFormat.render", "ours: chat-template renders"),
    ("torchrl_trl_interop._chat_format", "ChatFormat.encode", "ours: rendered text tokenized"),
    ("torchrl_trl_interop._chat_format", "ChatFormat.answer", "ours: answers read from tokens"),
    ("torchrl_trl_interop.rollouts._episodes", "_to_messages", "ours: History -> messages"),
    ("torchrl_trl_interop.rollouts._episodes", "read_policy_rows", "ours: policy output rows"),
    ("torchrl_trl_interop.rollouts._episodes", "reset", "ours: env reset"),
    (
        "torchrl_trl_interop.rollouts._trainer_policy",
        "TrainerModelPolicy._generate_step",
        "ours: the policy's step (generate included)",
    ),
    ("torchrl_trl_interop.rollouts._episodes", "_add_rewards", "ours: rewards read"),
    ("torchrl_trl_interop.rollouts._trainer_policy", "answer_turn", "ours: answers as History"),
    ("torchrl_trl_interop.rollouts._episodes", "_Episodes._give_tokens", "ours: tokens given"),
    ("torchrl_trl_interop._chat_format", "ChatFormat.of", "ours: chat format looked up"),
    (
        "torchrl_trl_interop.rollouts._trainer_policy",
        "TrainerModelPolicy._sample",
        "ours: the policy's sampling (generate included)",
    ),
    (
        "torchrl_trl_interop.rewards._env_transform",
        "RewardTransform._step",
        "ours: reward transform",
    ),
)


def _timed(parts: dict):
    """Wraps every function of ``_PARTS`` to add its CPU time to ``parts[label]``."""
    import importlib

    def wrap(function, label):
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                parts[label] = parts.get(label, 0.0) + time.process_time() - start

        return timed

    for module, path, label in _PARTS:
        try:  # a checkout may lack it (--before)
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *outer, name = path.split(".")
        for attr in outer:
            owner = getattr(owner, attr, None)
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, wrap(getattr(owner, name), label))


def measure(layout: Layout, repeats: int, breakdown: bool) -> dict:
    """Per-turn CPU ms of one generation step for every variant, and per-repeat ratios to trl.

    With ``breakdown``, the environment variants run ``repeats`` more times with the functions of
    ``_PARTS`` timed (after the timings: the wrappers cost time too).
    """
    from torchrl_trl_interop import __file__ as package
    from torchrl_trl_interop.testing import toy_causal_lm, toy_prompts, toy_tokenizer

    tok = toy_tokenizer()
    hidden, batch, answer = layout
    prompts = [[{"role": "user", "content": p}] for p in toy_prompts(batch // 4) for _ in range(4)]
    parts: dict[str, dict[str, float]] = {variant: {} for variant in VARIANTS[1:]}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for variant in VARIANTS:
            model = toy_causal_lm(
                tokenizer=tok,
                num_hidden_layers=2,
                hidden_size=hidden,
                intermediate_size=2 * hidden,
                num_attention_heads=4,
                num_key_value_heads=4,
            )
            trainers[variant] = _trainer(
                variant, model, tok, tmp, steps=1, beta=0.0, exact=True, batch=batch, answer=answer
            )
            trainers[variant].model.train()
            trainers[variant]._generate(prompts)  # warm-up
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(repeats):
            for variant in VARIANTS:
                start = time.process_time()
                trainers[variant]._generate(prompts)
                times[variant].append(1000 * (time.process_time() - start) / TURNS[variant])
        if breakdown:
            spent: dict[str, float] = {}
            _timed(spent)
            for variant in VARIANTS[1:]:
                spent.clear()
                for _ in range(repeats):
                    trainers[variant]._generate(prompts)
                scale = 1000 / repeats / TURNS[variant]
                parts[variant] = {label: t * scale for label, t in spent.items()}
    ratios = {v: [t / b for t, b in zip(times[v], times["trl"])] for v in VARIANTS if v != "trl"}
    return {"ms": times, "ratio": ratios, "parts": parts, "package": os.path.dirname(package)}


def _summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _measure_in(checkout: str | None, layout: Layout, repeats: int, breakdown: bool) -> dict:
    """:func:`measure` in a fresh process importing the package from ``checkout`` (or here)."""
    env = dict(os.environ)
    if checkout is not None:  # wins: sys.path[0] is this folder, not the repository root
        env["PYTHONPATH"] = os.pathsep.join([checkout, env.get("PYTHONPATH", "")])
    args = [sys.executable, __file__, "--_child", _name(layout), str(repeats), str(int(breakdown))]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode:
        raise RuntimeError(f"measurement in {checkout or 'this checkout'} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def overhead(args: argparse.Namespace) -> None:
    sides = {"after": None} if args.before is None else {"before": args.before, "after": None}
    layouts = [(size, 8, 16) for size in (64, 128, 256, 512)] if args.sweep else args.layout
    print(
        "GRPO generation step (GRPOTrainer._generate), toy Llama (2 layers), completions of "
        f"exactly the answer length, CPU ms per policy turn, one torch thread; {args.rounds} processes x "
        f"{args.repeats} interleaved repeats: median [min-max]; 'min/min' is the ratio of the "
        "fastest repeats (the least disturbed by other load)"
    )
    for layout in layouts:
        merged: dict[str, dict] = {}
        for _ in range(args.rounds):  # sides alternate: both see the same machine load
            for side, checkout in sides.items():
                result = _measure_in(checkout, layout, args.repeats, args.breakdown)
                into = merged.setdefault(side, {"ms": {}, "ratio": {}, "parts": []})
                into["package"] = result["package"]
                into["parts"].append(result["parts"])
                for part in ("ms", "ratio"):
                    for variant, values in result[part].items():
                        into[part].setdefault(variant, []).extend(values)
        hidden, batch, answer = layout
        print(f"\nhidden {hidden}, {batch} completions ({batch // 4} prompts x 4), {answer} tokens")
        for side, result in merged.items():
            print(f"  {side}: {result['package']}")
            fastest = min(result["ms"]["trl"])
            for variant in VARIANTS:
                ms = "{:.1f} ms [{:.1f}-{:.1f}]".format(*_summary(result["ms"][variant]))
                ratio = result["ratio"].get(variant, [1.0])
                ratio = "{:.2f}x [{:.2f}-{:.2f}]".format(*_summary(ratio))
                least = min(result["ms"][variant]) / fastest
                print(f"    {variant:13s}  {ms:26s}  vs trl {ratio:20s}  min/min {least:.2f}x")
            if args.breakdown:
                for variant in VARIANTS[1:]:
                    print(f"    {variant}, per policy turn (median over processes):")
                    labels = {label for run in result["parts"] for label in run[variant]}
                    for label in sorted(labels):
                        values = [run[variant].get(label, 0.0) for run in result["parts"]]
                        print(f"      {label:45s} {statistics.median(values):7.1f} ms")


def train(args: argparse.Namespace) -> None:
    """The short GRPO run: reward and KL per step, and the generation share of the time."""
    from transformers import AutoModelForCausalLM

    from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "toy-llama")
        tok = toy_tokenizer()
        toy_causal_lm(tokenizer=tok).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        results = {}
        for variant in VARIANTS:
            trainer = _trainer(
                variant,
                AutoModelForCausalLM.from_pretrained(model_dir),
                tok,
                os.path.join(tmp, "out"),
                steps=args.steps,
                beta=0.04,
                exact=False,
            )
            generate, spent = trainer._generate, {"generation": 0.0}

            def timed_generate(prompts, generate=generate, spent=spent):
                start = time.perf_counter()
                try:
                    return generate(prompts)
                finally:
                    spent["generation"] += time.perf_counter() - start

            trainer._generate = timed_generate
            start = time.perf_counter()
            trainer.train()
            logs = [log for log in trainer.state.log_history if "reward" in log]
            results[variant] = {
                "reward": [log["reward"] for log in logs],
                "kl": [log.get("kl") for log in logs],
                "length": [log["completions/mean_length"] for log in logs],
                "generation": spent["generation"],
                "total": time.perf_counter() - start,
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


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--_child"]:  # one measurement, as JSON, for _measure_in
        print(json.dumps(measure(_layout(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per process")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side and size")
    parser.add_argument("--breakdown", action="store_true", help="time torchrl's parts too")
    parser.add_argument(
        "--layout",
        type=_layout,
        action="append",
        metavar="HIDDEN,COMPLETIONS,TOKENS",
        help="model hidden size, completions per step (a multiple of 4: prompts x 4) and answer "
        f"length; repeat for several (default: {_name(OWN_LAYOUT)})",
    )
    parser.add_argument(
        "--all-layouts",
        action="store_true",
        help=f"{_name(OWN_LAYOUT)} and {' '.join(_name(layout) for layout in OTHER_LAYOUTS)}",
    )
    parser.add_argument("--sweep", action="store_true", help="hidden sizes 64, 128, 256, 512")
    parser.add_argument("--before", metavar="PATH", help="another checkout to measure too")
    parser.add_argument("--train", action="store_true", help="the short GRPO run instead")
    parser.add_argument("--steps", type=int, default=6, help="with --train")
    args = parser.parse_args()
    args.layout = args.layout or [OWN_LAYOUT]
    if args.all_layouts:
        args.layout = [OWN_LAYOUT, *OTHER_LAYOUTS]
    train(args) if args.train else overhead(args)


if __name__ == "__main__":
    main()
