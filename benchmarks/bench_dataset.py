"""Benchmark: TorchRLBufferDataset throughput versus raw sampling, upstream and HF ``datasets``.

One run prints one markdown table (paste it into the README): rows/s, ratio to raw
``rb.sample`` and ratio to upstream ``torchrl.modules.llm.TorchRLBufferDataset`` (torchrl
0.14.1), for

* **padded**: ``LazyTensorStorage``, 20,000 rows of ``("tokens", "full")`` int64 ``[256]`` and
  ``("masks", "all_attention_mask")`` bool ``[256]`` (right-padded, true lengths uniform
  32..256), a nested float ``("reward", "score")``; the same with a ``prompt`` string column;
* **ragged**: ``LazyStackStorage``, 20,000 rows of true length uniform 32..512 (the lazy stack
  TorchRL's LLM wrappers write); upstream crashes there and the table says so;

and, per scenario: raw ``rb.sample(256)``, upstream, ours, HF ``datasets.Dataset`` row
iteration, then each through ``DataLoader(batch_size=32)`` with ``DataCollatorWithPadding``, and
ours with :class:`~torchrl_trl_interop.PaddingCollator`. It also times ``as_hf_dataset()``
construction (ours vs upstream, ``ListStorage`` and ``LazyTensorStorage``) and samples the
process RSS while ours streams 20,000 rows.

Fairness rules, the same for every contender:

* every contender hands over the same number of rows (``256 * (rows // 256)``), and the loop
  touches every value it is handed with :func:`touch` (no credit for laziness);
* one torch thread (on a 2-core shared machine a busy second core stalls 2-thread gathers);
* contenders are interleaved within each repetition and the median of ``--repeats`` is kept, so
  load from other processes hits all alike; building the buffers and HF datasets is not timed.

Run with ``python benchmarks/bench_dataset.py`` (``--quick`` for a 2k-row smoke run).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import resource
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, lazy_stack
from torch.utils.data import DataLoader, IterableDataset
from torchrl.data import LazyStackStorage, LazyTensorStorage, ListStorage, ReplayBuffer

from torchrl_trl_interop import PaddingCollator, TorchRLBufferDataset
from torchrl_trl_interop.testing import toy_tokenizer

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")
SCORE = ("reward", "score")
PROMPT = "prompt"
#: what the collator runs call the stored keys (DataCollatorWithPadding wants these names)
NAMES = {TOKENS: "input_ids", MASK: "attention_mask", SCORE: "score"}
SAMPLE_BATCH = 256  # rows per rb.sample call, for every dataset contender
LOADER_BATCH = 32  # DataLoader batch size
PAD_ID = 0  # toy_tokenizer's pad id, used to pad the stored rows

Row = dict[str, Any]


# ---------------------------------------------------------------------------
# Touching values: the consumer every contender feeds
# ---------------------------------------------------------------------------

TOUCH_MODE = "element"


def touch(value: Any) -> None:
    """Reads ``value`` so that nothing handed over can stay lazy.

    The same function runs on every value of every contender: a tensor has one element read
    into Python (``--touch element``, the default: the figure measures the dataset, not the
    consumer) or is summed (``--touch sum``: every element is read, which adds ~1-2 us per
    tensor per row to every per-row contender alike); a string has its length taken; a list
    (HF rows) has its length taken and its last item touched; a dict has every value touched.
    """
    if isinstance(value, torch.Tensor):
        if TOUCH_MODE == "sum":
            value.sum().item()
        elif value.ndim == 0:
            value.item()
        elif value.numel():
            value.reshape(-1)[-1].item()
    elif isinstance(value, str):
        len(value)
    elif isinstance(value, list):
        if len(value):
            touch(value[-1])
    elif isinstance(value, dict):
        for v in value.values():
            touch(v)


def touch_rows(rows: Iterable[Row]) -> int:
    """Touches every value of every row; returns the number of rows."""
    n = 0
    for row in rows:
        for value in row.values():
            touch(value)
        n += 1
    return n


def touch_batches(batches: Iterable[Row]) -> int:
    """Touches every column of collated batches; returns the number of rows."""
    n = 0
    for batch in batches:
        for value in batch.values():
            touch(value)
        n += len(batch["input_ids"])
    return n


def touch_sampled(batch: TensorDictBase) -> int:
    """Touches every column of a raw ``rb.sample`` batch; returns its number of rows.

    Dense tensors are touched once per column (they are one value); strings once per row;
    a ragged lazy-stacked column is read with ``as_list=True`` and each row touched.
    """
    ragged = isinstance(batch, LazyStackedTensorDict)
    for key in batch.keys(True, True):
        if key == PROMPT:
            for s in batch.get(key).tolist():
                touch(s)
        elif ragged:  # a plain get() would try to stack, and raise on ragged rows
            for value in batch.get(key, as_list=True):
                touch(value)
        else:
            touch(batch.get(key))
    return batch.batch_size[0]


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def make_padded(rows: int, width: int, vocab: int, *, prompt: bool, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    ids = torch.randint(3, vocab, (rows, width), generator=g).masked_fill_(~mask, PAD_ID)
    td = TensorDict(
        {TOKENS: ids, MASK: mask, SCORE: torch.randn(rows, generator=g)}, batch_size=[rows]
    )
    if prompt:
        td[PROMPT] = [f"What is {i} plus {2 * i}?" for i in range(rows)]
    return td


def make_ragged(rows: int, low: int, high: int, vocab: int, seed: int = 0) -> TensorDictBase:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (rows,), generator=g).tolist()
    scores = torch.randn(rows, generator=g)
    return lazy_stack(
        [
            TensorDict(
                {
                    TOKENS: torch.randint(3, vocab, (n,), generator=g),
                    MASK: torch.ones(n, dtype=torch.bool),
                    SCORE: scores[i],
                }
            )
            for i, n in enumerate(lengths)
        ]
    )


def buffer_of(storage_cls: type, data: TensorDictBase) -> ReplayBuffer:
    n = data.batch_size[0]
    rb = ReplayBuffer(storage=storage_cls(n))
    rb.extend(data)
    return rb


def hf_dataset_of(data: TensorDictBase, rows: int, *, prompt: bool):
    """The same rows as a map-style ``datasets.Dataset`` of Python lists (stored padding kept)."""
    from datasets import Dataset

    data = data[:rows]
    columns = {}
    for key, name in NAMES.items():
        if isinstance(data, TensorDict):
            columns[name] = data.get(key).tolist()
        else:
            columns[name] = [v.tolist() for v in data.get(key, as_list=True)]
    if prompt:
        columns[PROMPT] = data.get(PROMPT).tolist()
    return Dataset.from_dict(columns)


class RenamedRows(IterableDataset):
    """Renames the keys of another dataset's rows (upstream has no ``rename=``).

    Upstream yields ``"tokens.full"``-style names; ``DataCollatorWithPadding`` needs
    ``input_ids``/``attention_mask``. A dict comprehension per row (~0.5 us) is the cheapest
    fair way to give it those names from the same buffer, and is noise next to upstream's cost.
    """

    def __init__(self, dataset: Iterable[Row], names: dict[str, str]) -> None:
        self.dataset = dataset
        self.names = names

    def __iter__(self):
        names = self.names
        for row in self.dataset:
            yield {names[k]: v for k, v in row.items()}


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class Crashed(Exception):
    pass


def time_interleaved(
    fns: dict[str, Callable[[int], int]], rows: int, warmup_rows: int, repeats: int
) -> dict[str, float | str]:
    """Median seconds per contender for ``rows`` rows, or ``"crashes (ExcType)"``."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    result: dict[str, float | str] = {}
    for name, fn in fns.items():  # warm-up (and crash detection) on a few batches
        try:
            fn(warmup_rows)
        except Exception as err:  # noqa: BLE001 - reported in the table, not hidden
            result[name] = f"crashes ({type(err).__name__})"
    live = {name: fn for name, fn in fns.items() if name not in result}
    for _ in range(repeats):
        for name, fn in live.items():
            gc.collect()
            start = time.perf_counter()
            done = fn(rows)
            times[name].append(time.perf_counter() - start)
            if done != rows:
                raise AssertionError(f"{name} handed {done} rows, expected {rows}")
    for name in live:
        result[name] = statistics.median(times[name])
    return {name: result[name] for name in fns}


def run_scenario(
    title: str,
    rb: ReplayBuffer,
    hf,
    tokenizer,
    rows: int,
    args: argparse.Namespace,
    *,
    collate: bool,
) -> list[tuple[str, str, float | str, str]]:
    """Times every contender on one buffer; returns table rows (scenario, name, value, group)."""
    from torchrl.modules.llm import TorchRLBufferDataset as UpstreamDataset
    from transformers import DataCollatorWithPadding

    dcwp = DataCollatorWithPadding(tokenizer)
    padding = PaddingCollator(tokenizer)
    keys = list(NAMES)
    up_names = {".".join(k): v for k, v in NAMES.items()}

    def raw(n: int) -> int:
        return sum(touch_sampled(rb.sample(SAMPLE_BATCH)) for _ in range(n // SAMPLE_BATCH))

    def upstream(n: int) -> int:
        return touch_rows(UpstreamDataset(rb, SAMPLE_BATCH, num_batches=n // SAMPLE_BATCH))

    def ours(n: int) -> int:
        return touch_rows(TorchRLBufferDataset(rb, SAMPLE_BATCH, num_batches=n // SAMPLE_BATCH))

    def hf_rows(n: int) -> int:
        return touch_rows(itertools.islice(hf, n))

    fns: dict[str, Callable[[int], int]] = {
        "raw `rb.sample(256)`": raw,
        "upstream": upstream,
        "ours": ours,
        "HF `datasets.Dataset` rows": hf_rows,
    }
    if collate:
        hf_collate = hf.remove_columns(PROMPT) if PROMPT in hf.column_names else hf

        def loader(dataset, collate_fn) -> DataLoader:
            return DataLoader(dataset, batch_size=LOADER_BATCH, collate_fn=collate_fn)

        def ours_ds(n: int) -> TorchRLBufferDataset:
            # keys= drops strings (DataCollatorWithPadding raises on them); rename= gives the
            # collator's names; attention_mask_key= trims each row to its attended span, so
            # the collators pad to each batch's longest row only.
            return TorchRLBufferDataset(
                rb,
                SAMPLE_BATCH,
                num_batches=n // SAMPLE_BATCH,
                keys=keys,
                rename=NAMES,
                attention_mask_key=MASK,
            )

        def upstream_dcwp(n: int) -> int:
            ds = UpstreamDataset(rb, SAMPLE_BATCH, num_batches=n // SAMPLE_BATCH, keys=keys)
            return touch_batches(loader(RenamedRows(ds, up_names), dcwp))

        def hf_dcwp(n: int) -> int:
            # map-style: the DataLoader fetches each batch with Dataset.__getitems__
            return touch_batches(
                DataLoader(hf_collate, batch_size=LOADER_BATCH, sampler=range(n), collate_fn=dcwp)
            )

        fns.update(
            {
                "upstream + `DataCollatorWithPadding`": upstream_dcwp,
                "ours + `DataCollatorWithPadding`": lambda n: touch_batches(
                    loader(ours_ds(n), dcwp)
                ),
                "HF `datasets` + `DataCollatorWithPadding`": hf_dcwp,
                "ours + `PaddingCollator`": lambda n: touch_batches(loader(ours_ds(n), padding)),
            }
        )
    warmup = 2 * SAMPLE_BATCH
    print(f"  timing {title} ({len(fns)} contenders x {args.repeats})...", file=sys.stderr)
    medians = time_interleaved(fns, rows, warmup, args.repeats)
    return [
        (title, name, value, "collated" if "+" in name else "rows")
        for name, value in medians.items()
    ]


# ---------------------------------------------------------------------------
# as_hf_dataset() construction and memory
# ---------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def time_once(fn: Callable[[], object], cap_s: float | None = None) -> float | str:
    """Seconds for one call, or ``"> cap s"`` when it runs past ``cap_s`` (SIGALRM)."""

    def on_alarm(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, on_alarm) if cap_s else None
    if cap_s:
        signal.setitimer(signal.ITIMER_REAL, cap_s)
    start = time.perf_counter()
    try:
        fn()
    except _Timeout:
        return f"> {cap_s:.0f} s (stopped)"
    finally:
        if cap_s:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return time.perf_counter() - start


def time_as_hf(buffers: dict[str, ReplayBuffer], args: argparse.Namespace) -> list[str]:
    from torchrl.modules.llm import TorchRLBufferDataset as UpstreamDataset

    lines = [
        "| storage | ours `as_hf_dataset()` | upstream `as_hf_dataset()` | upstream / ours |",
        "|---|---:|---:|---:|",
    ]
    for name, rb in buffers.items():
        print(f"  timing as_hf_dataset() on {name}...", file=sys.stderr)
        ours = statistics.median(
            time_once(lambda rb=rb: TorchRLBufferDataset(rb, SAMPLE_BATCH).as_hf_dataset())
            for _ in range(max(args.repeats, 3))
        )
        # upstream lets `datasets` pickle the whole buffer to fingerprint the generator:
        # seconds to a minute, so it runs once, stopped after --hf-cap seconds.
        up = time_once(lambda rb=rb: UpstreamDataset(rb, SAMPLE_BATCH).as_hf_dataset(), args.hf_cap)
        ratio = f"{up / ours:,.0f}x" if isinstance(up, float) else f"> {args.hf_cap / ours:,.0f}x"
        up_s = f"{up:.2f} s" if isinstance(up, float) else up
        lines.append(f"| {name} | {ours * 1e3:.1f} ms | {up_s} | {ratio} |")
    return lines


def current_rss() -> int | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return None
    return psutil.Process(os.getpid()).memory_info().rss


def measure_rss(rb: ReplayBuffer, rows: int) -> dict[str, float]:
    """Streams ``rows`` rows through ours (``num_batches=None``), sampling RSS after each batch."""
    mib = 1 / 2**20
    ds = TorchRLBufferDataset(rb, SAMPLE_BATCH, num_batches=None)
    samples: list[tuple[int, int]] = []
    early = max(rows // 10, SAMPLE_BATCH)
    gc.collect()
    start_rss = current_rss()
    n = 0
    for row in ds:
        for value in row.values():
            touch(value)
        n += 1
        if n % SAMPLE_BATCH == 0:
            samples.append((n, current_rss()))
        if n >= rows:
            break
    at_early = next(rss for k, rss in samples if k >= early)
    return {
        "start": start_rss * mib,
        "early_rows": early,
        "early": at_early * mib,
        "end": samples[-1][1] * mib,
        "peak": max(rss for _, rss in samples) * mib,
        "growth": (samples[-1][1] - at_early) * mib,
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
    }


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt_ratio(value: float | str, ref: float | str) -> str:
    if isinstance(value, str) or isinstance(ref, str):
        return "-"
    return f"{ref / value:.2f}x"


def table(results: list[tuple[str, str, float | str, str]], rows: int) -> list[str]:
    lines = [
        "| scenario | contender | rows/s | vs raw | vs upstream |",
        "|---|---|---:|---:|---:|",
    ]
    by_key = {(s, name): value for s, name, value, _ in results}
    for scenario, name, value, group in results:
        raw = by_key[(scenario, "raw `rb.sample(256)`")]
        upstream = by_key.get(
            (
                scenario,
                "upstream + `DataCollatorWithPadding`" if group == "collated" else "upstream",
            )
        )
        speed = value if isinstance(value, str) else f"{rows / value:,.0f}"
        lines.append(
            f"| {scenario} | {name} | {speed} | {fmt_ratio(value, raw)} | "
            f"{fmt_ratio(value, upstream) if upstream is not None else '-'} |"
        )
    return lines


def target(label: str, value: float | str, goal: float) -> str:
    if isinstance(value, str):
        return f"- {label}: {value}: FAIL (target >= {goal:g}x)"
    verdict = "PASS" if value >= goal else "FAIL"
    return f"- {label}: {value:.2f}x (target >= {goal:g}x): {verdict}"


def main() -> None:
    global TOUCH_MODE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows stored and iterated")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions; the median is kept")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,048 rows, 1 repeat")
    parser.add_argument("--touch", choices=["element", "sum"], default="element")
    parser.add_argument(
        "--hf-cap", type=float, default=60.0, help="stop upstream as_hf_dataset() after this (s)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 2_048, 1
    TOUCH_MODE = args.touch
    torch.set_num_threads(1)
    rows = SAMPLE_BATCH * (args.rows // SAMPLE_BATCH)  # every contender hands over this many
    if rows == 0:
        parser.error(f"--rows must be >= {SAMPLE_BATCH}")

    tokenizer = toy_tokenizer()
    vocab = len(tokenizer)
    print(f"building buffers of {args.rows:,} rows...", file=sys.stderr)
    padded = make_padded(args.rows, 256, vocab, prompt=True)
    no_prompt = padded.exclude(PROMPT)
    ragged = make_ragged(args.rows, 32, 512, vocab)
    rb_padded = buffer_of(LazyTensorStorage, no_prompt)
    rb_prompt = buffer_of(LazyTensorStorage, padded)
    rb_ragged = buffer_of(LazyStackStorage, ragged)

    # Memory first, before the HF datasets and other buffers inflate the process.
    print("measuring RSS while ours streams rows...", file=sys.stderr)
    rss = measure_rss(rb_prompt, rows)

    hf_prompt = hf_dataset_of(padded, rows, prompt=True)
    hf_padded = hf_prompt.remove_columns(PROMPT)
    hf_ragged = hf_dataset_of(ragged, rows, prompt=False)

    results = []
    results += run_scenario("padded", rb_padded, hf_padded, tokenizer, rows, args, collate=True)
    results += run_scenario(
        "padded + prompt", rb_prompt, hf_prompt, tokenizer, rows, args, collate=False
    )
    results += run_scenario("ragged", rb_ragged, hf_ragged, tokenizer, rows, args, collate=True)

    del hf_prompt, hf_padded, hf_ragged
    rb_list = buffer_of(ListStorage, no_prompt)
    as_hf = time_as_hf(
        {
            f"ListStorage ({args.rows:,} rows)": rb_list,
            f"LazyTensorStorage ({args.rows:,} rows)": rb_padded,
        },
        args,
    )

    print()
    print(
        f"TorchRLBufferDataset, {rows:,} rows per contender ({SAMPLE_BATCH} per rb.sample, "
        f"DataLoader batch {LOADER_BATCH}, num_workers=0), 1 torch thread, touch={TOUCH_MODE}, "
        f"median of {args.repeats}; torch {torch.__version__}. `vs upstream` compares with upstream "
        "on the same scenario (collated rows: with upstream + `DataCollatorWithPadding`)."
    )
    print()
    print("\n".join(table(results, rows)))
    print()
    print("\n".join(as_hf))
    print()
    print(
        f"RSS while ours streams {rows:,} rows (padded + prompt): {rss['start']:.0f} MiB before, "
        f"{rss['early']:.0f} MiB after {rss['early_rows']:,} rows, {rss['end']:.0f} MiB after "
        f"{rows:,} rows (peak {rss['peak']:.0f} MiB, growth {rss['growth']:+.1f} MiB); "
        f"process ru_maxrss {rss['ru_maxrss']:.0f} MiB."
    )
    print()
    get = {(s, name): value for s, name, value, _ in results}

    def ratio(a: str, b: str, scenario: str = "padded") -> float | str:
        va, vb = get[(scenario, a)], get[(scenario, b)]
        return va if isinstance(va, str) else (vb / va if not isinstance(vb, str) else vb)

    print("Targets (padded, LazyTensorStorage):")
    print(target("ours vs raw `rb.sample`", ratio("ours", "raw `rb.sample(256)`"), 0.25))
    print(target("ours vs upstream", ratio("ours", "upstream"), 4))
    print(
        target(
            "ours + `PaddingCollator` vs upstream + `DataCollatorWithPadding`",
            ratio("ours + `PaddingCollator`", "upstream + `DataCollatorWithPadding`"),
            10,
        )
    )
    grows = rss["growth"] > 8
    print(
        f"- RSS growth from {rss['early_rows']:,} to {rows:,} rows: {rss['growth']:+.1f} MiB "
        f"(target ~0, <= 8 MiB): {'FAIL' if grows else 'PASS'}"
    )


if __name__ == "__main__":
    main()
