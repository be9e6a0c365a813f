"""Benchmark: HFRewardModelWrapper overhead and length bucketing, on a toy Llama reward model.

Batch 64, ragged lengths drawn uniformly in 32..512, one CPU thread, toy Llama (hidden 128,
2 layers) unless said otherwise:

* **overhead** of the wrapper versus calling the model directly on the same right-padded batch
  (``model(input_ids=..., attention_mask=...)``), target <= 3 %;
* **speed-up** of the wrapper with ``max_batch_size`` (rows sorted by length, each micro-batch
  padded to its own longest row) on the ragged lazy stack TorchRL writes, versus one padded call,
  target >= 1.3x;
* the wrapper's **own time** over the model's on the smallest toy Llama
  (``toy_reward_model("llama")``, 21.6k parameters), target <= 5% at the batch above; at 16 rows
  of 64..128 tokens (a 3.5 ms forward) for reference, without a target: the wrapper's own time
  is about fixed per call, so its share grows as the model's forward shrinks, and a
  real reward model's forward dwarfs it. Beside it, the floor every reward module pays
  (``CallAndWrite``: the module call and the reward write alone) and the same checks in the
  fewest ops (``ChecksFloor``).

Timings are medians over ``--reps`` repetitions, interleaved so that drift on a shared machine
hits every variant alike. Run with ``python benchmarks/bench_reward.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict, lazy_stack

from torchrl_trl_interop import HFRewardModelWrapper
from torchrl_trl_interop.testing import toy_reward_model

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")


def make_batch(batch: int, low: int, high: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (batch,), generator=g)
    rows = [torch.randint(3, vocab, (int(n),), generator=g) for n in lengths]
    width = int(lengths.max())
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)  # as HF tokenizers return it
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    padded = TensorDict({TOKENS: ids, MASK: mask}, batch_size=[batch])
    ragged = lazy_stack(
        [TensorDict({TOKENS: r, MASK: torch.ones(len(r), dtype=torch.bool)}) for r in rows]
    )
    return ids, mask, padded, ragged


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


class ForwardTimer:
    """Accumulates the time spent inside ``model.forward`` (forward pre- and post-hooks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.inside = 0.0
        self._start = 0.0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, *_: object) -> None:
        self._start = time.perf_counter()

    def _post(self, *_: object) -> None:
        self.inside += time.perf_counter() - self._start


def own_overhead(
    fns: dict[str, Callable[[], object]], timer: ForwardTimer, reps: int
) -> dict[str, tuple[float, float]]:
    """Per variant, medians of (time of ``fn`` - time inside the model) / time inside the model
    and of that own time in seconds, per call; the variants interleaved.

    Both parts are measured on the same call, so load from other processes on a shared machine
    (which moves end-to-end medians by several percent) largely cancels out.
    """
    ratios: dict[str, list[float]] = {name: [] for name in fns}
    own: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            timer.inside = 0.0
            start = time.perf_counter()
            fn()
            total = time.perf_counter() - start
            ratios[name].append((total - timer.inside) / timer.inside)
            own[name].append(total - timer.inside)
    return {name: (statistics.median(ratios[name]), statistics.median(own[name])) for name in fns}


class CallAndWrite(HFRewardModelWrapper):
    """The wrapper's floor: a ``forward`` that only calls the model on the right-padded tokens
    (without the mask, as the wrapper calls a causal model) and writes the reward. No mask read,
    no packing, no input check, no fill chosen, no finiteness read: what is left is the module
    call and the TensorDict write every reward module pays."""

    def forward(self, tensordict: TensorDict) -> TensorDict:
        with torch.no_grad():
            logits = self.model(input_ids=tensordict.get(TOKENS)).logits
        return tensordict.set("reward", logits[:, 0])


class ChecksFloor(HFRewardModelWrapper):
    """The wrapper's checks at their cheapest: on a dense, right-padded batch, every check the
    wrapper makes (ids inside the vocabulary, no empty row, no row ending with the pad id it
    fills with, rows already packed to the right, finite rewards) in 16 tensor ops and two reads,
    the first before the model runs (free on CPU, a sync on a GPU). No clamp, no packing, no
    lazy stack, nested list or device move, and it raises on any other input.
    The pad id and the vocabulary size are read once, here, not per call."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, inference_mode=True)
        self.pad, self.vocab = model.config.pad_token_id, model.config.vocab_size

    def forward(self, tensordict: TensorDict) -> TensorDict:
        ids, mask = tensordict.get(TOKENS), tensordict.get(MASK)
        real = mask != 0
        lengths = real.sum(-1)
        ids = ids * real
        low, high = torch.aminmax(ids)
        last = ids.gather(1, (lengths - 1).clamp_(min=0).unsqueeze(1))
        right_padded = torch.arange(ids.shape[-1]) < lengths.unsqueeze(1)
        facts = torch.stack([low, high, lengths.min(), (last == self.pad).sum()]).tolist()
        if facts[0] < 0 or facts[1] >= self.vocab or not facts[2] or facts[3]:
            raise ValueError(f"ChecksFloor: input the wrapper would reject or refill: {facts}")
        if not torch.equal(right_padded, real):
            raise ValueError("ChecksFloor: reads right-padded rows only")
        with torch.no_grad():
            reward = self.model(input_ids=ids).logits[:, 0]
        if not bool((reward - reward == 0).all()):
            raise ValueError("ChecksFloor: a reward is not finite")
        return tensordict.set("reward", reward)


def smallest_toy_rows(args: argparse.Namespace) -> list[str]:
    """The wrapper's own time over the model's on ``toy_reward_model("llama")`` (21.6k
    parameters), at the benchmark's batch and at 16 rows x 64..128 tokens (issue 36), beside a
    direct masked call's own time (``no_grad`` and the module call, the same timer) and the two
    calls' end-to-end medians."""
    model = toy_reward_model("llama")
    params = sum(p.numel() for p in model.parameters())
    wrapper = HFRewardModelWrapper(model, inference_mode=True)
    floor = CallAndWrite(model, inference_mode=True)
    checks = ChecksFloor(model)
    configs = [(args.batch, args.min_len, args.max_len), (16, 64, 128)]
    fns = {}
    for batch, low, high in configs:
        ids, mask, padded, _ = make_batch(batch, low, high, model.config.vocab_size)
        name = f"{batch} rows x {low}..{high} tokens"
        # the floor scores what the wrapper scores: rows padded with 0, the model's pad id
        reference = wrapper(padded.clone())["reward"]
        torch.testing.assert_close(floor(padded.clone())["reward"], reference)
        torch.testing.assert_close(checks(padded.clone())["reward"], reference)

        def direct(ids=ids, mask=mask) -> torch.Tensor:
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask).logits

        fns[name] = lambda padded=padded: wrapper(padded)
        fns[f"{name}, direct"] = direct
        fns[f"{name}, floor"] = lambda padded=padded: floor(padded)
        fns[f"{name}, checks floor"] = lambda padded=padded: checks(padded)
    results = own_overhead(fns, ForwardTimer(model), args.small_reps)
    totals = time_interleaved(fns, args.small_reps)
    lines = [
        f"wrapper's own time / model time, same call, smallest toy Llama ({params:,} parameters), "
        f"median of {args.small_reps} (target <= 5%); a direct masked call's own time by the same "
        "timer; end to end, wrapper / direct call (the wrapper leaves out the mask of a causal "
        "model, which a direct call on the padded batch pays for); the floor: the module call "
        "and the reward write alone (CallAndWrite: no mask read, packing, check or fill); the "
        "checks floor: the same checks in the fewest tensor ops, on right-padded rows only "
        "(ChecksFloor). The first batch holds the target; the second, a 3.5 ms forward, is for "
        "reference (the wrapper's own time is about fixed per call):"
    ]
    for batch, low, high in configs:
        name = f"{batch} rows x {low}..{high} tokens"
        ratio, seconds = results[name]
        direct_ratio = results[f"{name}, direct"][0]
        first = (batch, low, high) == configs[0]
        verdict = ("PASS" if ratio <= 0.05 else "FAIL") if first else "for reference"
        lines.append(
            f"  {name:<26} {ratio * 100:+6.2f}% ({seconds * 1e3:.2f} ms own): {verdict}; direct "
            f"{direct_ratio * 100:+.2f}%; end to end {totals[name] / totals[f'{name}, direct']:.2f}x; "
            f"floor {results[f'{name}, floor'][0] * 100:+.2f}%; checks floor "
            f"{results[f'{name}, checks floor'][0] * 100:+.2f}%"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--max-batch-sizes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--small-reps", type=int, default=40, help="repetitions on the smallest toy Llama"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = toy_reward_model(
        "llama",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    vocab = model.config.vocab_size
    ids, mask, padded, ragged = make_batch(args.batch, args.min_len, args.max_len, vocab)

    wrapper = HFRewardModelWrapper(model, inference_mode=True)
    bucketed = {
        mbs: HFRewardModelWrapper(model, inference_mode=True, max_batch_size=mbs)
        for mbs in args.max_batch_sizes
    }

    def direct() -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits

    fns: dict[str, Callable[[], object]] = {
        "direct model call, padded": direct,
        "wrapper, same padded batch": lambda: wrapper(padded),
        "wrapper, ragged, one call": lambda: wrapper(ragged),
    }
    for mbs, w in bucketed.items():
        fns[f"wrapper, ragged, max_batch_size={mbs}"] = lambda w=w: w(ragged)

    # same scores whichever way the batch is cut
    reference = wrapper(padded.clone())["reward"]
    for w in bucketed.values():
        torch.testing.assert_close(w(ragged)["reward"], reference, atol=1e-4, rtol=0)

    medians = time_interleaved(fns, args.reps)
    timer = ForwardTimer(model)
    own = own_overhead({"padded": lambda: wrapper(padded)}, timer, args.reps)["padded"][0]
    base = medians["direct model call, padded"]
    print(
        f"HFRewardModelWrapper, toy Llama (hidden 128, 2 layers), batch {args.batch}, lengths "
        f"uniform {args.min_len}..{args.max_len}, {args.threads} thread(s), median of {args.reps}"
    )
    print(f"{'variant':<40} {'median ms':>10} {'speed-up':>9}")
    for name, seconds in medians.items():
        print(f"{name:<40} {seconds * 1e3:>10.1f} {base / seconds:>8.2f}x")
    end_to_end = medians["wrapper, same padded batch"] / base - 1
    best = min(args.max_batch_sizes, key=lambda m: medians[f"wrapper, ragged, max_batch_size={m}"])
    speedup = base / medians[f"wrapper, ragged, max_batch_size={best}"]
    print()
    print("overhead vs direct call on the same padded batch (target <= 3%):")
    print(f"  wrapper's own time / model time, same call: {own * 100:+.2f}%")
    print(f"  end-to-end medians (includes machine noise): {end_to_end * 100:+.1f}%")
    print(
        f"speed-up of bucketing (max_batch_size={best}) vs one padded call: {speedup:.2f}x "
        "(target >= 1.3x)"
    )
    print()
    print("\n".join(smallest_toy_rows(args)))


if __name__ == "__main__":
    main()
