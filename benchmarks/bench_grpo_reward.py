"""Benchmark: GRPO's reward-model scoring through ``as_trl_reward_func`` versus TRL's own path.

256 completions of ragged lengths (16..512 tokens), one prompt per 8 completions, scored by a toy
Llama reward model (hidden 128, 2 layers), one CPU thread:

* **trl**: what ``GRPOTrainer._calculate_rewards`` (TRL 1.16) does with a reward *model*: render
  (conversational: ``trl.data_utils.apply_chat_template``) or join prompt + completion, tokenize
  every text in one call right-padded, one model call under ``inference_mode`` (the same lines,
  copied, since the method needs a whole trainer);
* **ours**: ``as_trl_reward_func(HFRewardModelWrapper(model, tokenizer=..., text_key=... or
  history_key=...), max_batch_size=32)`` (rows sorted by length, 32 per call), and
  ``max_batch_size=None`` (one call);

for standard (text) and conversational (History) prompts. Timings are medians of interleaved
repetitions on process CPU time, ratios paired per repetition (TRL time / ours). Scores are
checked to agree first. Then the wrapper's own time per call on a stub model (16 x 128 tokens,
dense) and the host syncs it makes, and its host syncs in every dense layout (left / right
padding, pad value equal to / not the model's pad id, bool / int mask) around the stub and
around a toy Llama (beyond the reads of the Llama's own forward). Run with ``python benchmarks/bench_grpo_reward.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dataset import time_interleaved  # noqa: E402

from torchrl_trl_interop import HFRewardModelWrapper, as_trl_reward_func
from torchrl_trl_interop.testing import (
    TOY_CORPUS,
    count_host_syncs,
    stub_reward_model,
    toy_reward_model,
    toy_tokenizer,
)


def make_inputs(n: int, group: int, low: int, high: int, tok, seed: int = 0):
    """``n`` prompt/completion pairs; completions of ``low..high`` tokens under ``tok``."""
    rng = random.Random(seed)
    words = " ".join(TOY_CORPUS).split()
    prompts, completions = [], []
    for i in range(n):
        if i % group == 0:
            prompt = "Question: " + " ".join(rng.choice(words) for _ in range(12))
        target = rng.randint(low, high)
        text, count = "", 0
        while count < target:
            text += " " + rng.choice(words)
            count = (
                len(tok(text, add_special_tokens=False)["input_ids"]) if len(text) > target else 0
            )
        prompts.append(prompt)
        completions.append(text)
    return prompts, completions


def as_chats(prompts, completions):
    return (
        [[{"role": "user", "content": p}] for p in prompts],
        [[{"role": "assistant", "content": c}] for c in completions],
    )


def trl_reward_model_path(model, tok, prompts, completions) -> list[float]:
    """The lines of ``GRPOTrainer._calculate_rewards`` (TRL 1.16) for an ``nn.Module`` reward."""
    from trl.data_utils import apply_chat_template, is_conversational

    if is_conversational({"prompt": prompts[0]}):
        messages = [{"messages": p + c} for p, c in zip(prompts, completions, strict=True)]
        texts = [apply_chat_template(x, tok)["text"] for x in messages]
    else:
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    inputs = tok(
        text=texts,
        return_tensors="pt",
        padding=True,
        padding_side="right",
        add_special_tokens=False,
    )
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].tolist()


def reward_rows(args) -> list[str]:
    tok = toy_tokenizer()
    model = toy_reward_model(
        "llama",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    prompts, completions = make_inputs(args.n, 8, args.min_len, args.max_len, tok)
    chat_prompts, chat_completions = as_chats(prompts, completions)
    text_rm = HFRewardModelWrapper(
        model, tokenizer=tok, text_key="text", append_eos=False, inference_mode=True
    )
    chat_rm = HFRewardModelWrapper(
        model, tokenizer=tok, history_key=("history", "full"), inference_mode=True
    )
    text_bucketed = as_trl_reward_func(
        text_rm, text_key="text", history_key=None, max_batch_size=args.mbs
    )
    text_one = as_trl_reward_func(text_rm, text_key="text", history_key=None, max_batch_size=None)
    chat_bucketed = as_trl_reward_func(chat_rm, max_batch_size=args.mbs)
    chat_one = as_trl_reward_func(chat_rm, max_batch_size=None)
    funcs = {
        "standard": {
            "trl": lambda: trl_reward_model_path(model, tok, prompts, completions),
            "ours": lambda: text_bucketed(prompts, completions),
            "ours, one call": lambda: text_one(prompts, completions),
        },
        "conversational": {
            "trl": lambda: trl_reward_model_path(model, tok, chat_prompts, chat_completions),
            "ours": lambda: chat_bucketed(chat_prompts, chat_completions),
            "ours, one call": lambda: chat_one(chat_prompts, chat_completions),
        },
    }
    lines = [
        f"| {args.n} completions ({args.min_len}-{args.max_len} tokens) | TRL (CPU s) | "
        f"ours, `max_batch_size={args.mbs}` (CPU s) | speed-up | ours, one call (CPU s) | speed-up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for kind, fns in funcs.items():
        reference = torch.tensor(fns["trl"]())
        for name in ("ours", "ours, one call"):
            torch.testing.assert_close(torch.tensor(fns[name]()), reference, atol=1e-4, rtol=0)
        timed = time_interleaved(
            {k: (lambda n, f=f: (f(), n)[1]) for k, f in fns.items()}, 1, 1, args.repeats
        )
        med = {k: statistics.median(t.cpu) for k, t in timed.items()}
        bucketed = timed["ours"].ratio(timed["trl"])
        one = timed["ours, one call"].ratio(timed["trl"])
        lines.append(
            f"| {kind} | {med['trl']:.2f} | {med['ours']:.2f} | {bucketed:.2f}x | "
            f"{med['ours, one call']:.2f} | {one:.2f}x |"
        )
        verdicts.append(
            f"- {kind}, `max_batch_size={args.mbs}`: {bucketed:.2f}x TRL (target >= 2.5x): "
            f"{'PASS' if bucketed >= 2.5 else 'FAIL'}"
        )
        if kind == "conversational":
            verdicts.append(
                f"- {kind}, one call: {one:.2f}x TRL (target >= 1x, never slower): "
                f"{'PASS' if one >= 1 else 'FAIL'}"
            )
    return lines + [""] + verdicts


def wrapper_own_time(args) -> list[str]:
    """The wrapper's own time per call around a stub model, and its host syncs (dense input)."""
    model = stub_reward_model()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (16, 128), generator=g)
    mask = torch.ones(16, 128, dtype=torch.bool)
    mask[::3, 100:] = False  # some rows right-padded
    td = TensorDict({("tokens", "full"): ids, ("masks", "all_attention_mask"): mask}, [16])
    wrapper = HFRewardModelWrapper(model, inference_mode=True)
    with count_host_syncs() as syncs:
        wrapper(td)

    def direct():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask.long())

    own, total = [], []
    for _ in range(args.stub_reps):
        start = time.process_time()
        wrapper(td)
        middle = time.process_time()
        direct()
        end = time.process_time()
        own.append((middle - start) - (end - middle))
        total.append(middle - start)
    own_ms = statistics.median(own) * 1e3
    layouts = host_syncs_per_layout()
    worst = max(n for n, _ in layouts.values())
    return [
        f"`HFRewardModelWrapper` around a stub model, 16 x 128 dense tokens: {own_ms:.3f} ms own "
        f"time per call (call {statistics.median(total) * 1e3:.3f} ms minus the stub called "
        f"directly), {syncs.count} host sync(s) ({', '.join(syncs.calls) or 'none'}).",
        f"- own time: {own_ms:.3f} ms (target <= 0.3 ms): {'PASS' if own_ms <= 0.3 else 'FAIL'}",
        f"- host syncs: {syncs.count} (target <= 1): {'PASS' if syncs.count <= 1 else 'FAIL'}",
        "",
        "Host syncs per call in every dense layout (4 rows of 3-12 tokens), stub model / toy "
        "Llama (vocabulary and position limits known) beyond the reads of its own forward:",
        "",
        "| padding | pad value | mask | stub | Llama, beyond its own |",
        "|---|---|---|---:|---:|",
        *(
            f"| {side} | {pad} | {mask} | {stub} | {llama} |"
            for (side, pad, mask), (stub, llama) in layouts.items()
        ),
        "",
        f"- host syncs, every dense layout: at most {worst} (target <= 1): "
        f"{'PASS' if worst <= 1 else 'FAIL'}",
    ]


def host_syncs_per_layout() -> dict[tuple[str, str, str], tuple[int, int]]:
    """``(stub count, Llama count minus its own forward's)`` per dense layout: left/right
    padding, pad value equal to / not the model's pad id, bool/int mask."""
    from torchrl_trl_interop.testing import toy_padded

    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 300, (n,), generator=g) for n in (7, 3, 12, 5)]
    stub, llama = stub_reward_model(), toy_reward_model("llama", pad_token_id=0)
    counts = {}
    for side in ("right", "left"):
        for pad, pad_name in ((0, "= pad id"), (7, "!= pad id")):
            for mask_dtype, mask_name in ((torch.bool, "bool"), (torch.long, "int")):
                ids, mask = toy_padded(rows, side, padding_value=pad, mask_dtype=mask_dtype)
                td = TensorDict({("tokens", "full"): ids, ("masks", "all_attention_mask"): mask})
                seen = []
                for model in (stub, llama):
                    with count_host_syncs() as syncs:
                        HFRewardModelWrapper(model, inference_mode=True)(td.clone())
                    with count_host_syncs() as own, torch.no_grad():
                        model(input_ids=ids, attention_mask=mask.long())
                    seen.append(syncs.count - own.count)
                counts[(side, pad_name, mask_name)] = (seen[0], seen[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--mbs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stub-reps", type=int, default=500)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.n, args.max_len, args.repeats, args.stub_reps = 64, 256, 1, 50
    torch.set_num_threads(1)
    print(
        "GRPO reward-model scoring, toy Llama reward model (hidden 128, 2 layers), 1 thread, "
        f"median of {args.repeats} interleaved repetitions (process CPU time; speed-up = TRL "
        "time / ours, paired per repetition)."
    )
    print()
    print("\n".join(reward_rows(args)))
    print()
    print("\n".join(wrapper_own_time(args)))


if __name__ == "__main__":
    main()
