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
ours with :class:`~torchrl_trl_interop.PaddingCollator`. On dense storage a bare column-wise
``unbind`` split (sample, one ``unbind`` per column, zip into dicts) is timed too: the floor of
any dataset that yields one dict of tensors per row. It also times ``as_hf_dataset()``
construction (ours vs upstream on ``ListStorage`` and ``LazyTensorStorage``, with and without
strings) and samples the process RSS while ours streams 20,000 rows.

Fairness rules, the same for every contender:

* every contender hands over the same number of rows (``256 * (rows // 256)``), and the loop
  touches every value it is handed with :func:`touch` (no credit for laziness);
* one torch thread (on a 2-core shared machine a busy second core stalls 2-thread gathers);
* contenders are interleaved within each repetition (in rotated order) and ratios are the
  median over ``--repeats`` of per-repetition ratios of *process CPU time*, which moves by a
  few percent under load from other processes where wall time moves by tens of percent (the
  machine's own speed moves both: see :class:`Timing`); wall-clock rows/s are printed
  alongside;
* building the buffers and HF datasets is not timed; each scenario's data lives only while it
  runs, so no contender pays garbage-collector passes over another scenario's objects.

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

    The same function runs on every value of every contender. A tensor has one element read
    into Python (``--touch element``, the default: the last element, through a NumPy view,
    the cheapest element read there is, ~0.6 us, so the figures measure the datasets rather
    than the consumer) or is summed (``--touch sum``: every element read, ~1.3-2 us per tensor,
    which adds the same absolute cost to every per-row contender); a string has its length
    taken; a list (HF rows) has its length taken and its last item touched; a dict has every
    value touched.
    """
    if isinstance(value, torch.Tensor):
        if TOUCH_MODE == "sum":
            value.sum().item()
        elif value.ndim:
            array = value.numpy()
            if array.size:
                array.item(-1)
        else:
            value.item()
    elif isinstance(value, str):
        len(value)
    elif isinstance(value, list):
        if value:
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


def touch_sampled(batch: TensorDictBase, keys: list) -> int:
    """Touches every column (``keys``) of a raw ``rb.sample`` batch; returns its number of rows.

    Dense tensors are touched once per column (they are one value); strings once per row;
    a ragged lazy-stacked column is read with ``as_list=True`` and each row touched.
    """
    ragged = isinstance(batch, LazyStackedTensorDict)
    for key in keys:
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

RAW = "raw `rb.sample(256)`"
UNBIND = "column-wise `unbind` split (reference)"
UPSTREAM = "upstream"
OURS = "ours"
HF_ROWS = "HF `datasets.Dataset` rows"
UPSTREAM_DCWP = "upstream + `DataCollatorWithPadding`"
OURS_DCWP = "ours + `DataCollatorWithPadding`"
HF_DCWP = "HF `datasets` + `DataCollatorWithPadding`"
OURS_PC = "ours + `PaddingCollator`"
COLLATED = (UPSTREAM_DCWP, OURS_DCWP, HF_DCWP, OURS_PC)


class Timing:
    """Per-repetition CPU and wall seconds of one contender, or the exception it raised.

    Ratios use process CPU time: on a shared 2-core machine the process is descheduled for a
    third of the wall time or more, which moves wall-clock medians by tens of percent
    (everything here runs on one thread, so CPU time is the wall time an idle machine would
    show). CPU time moves too: the same loop took 19-29 ms of it in 60 back-to-back runs on a
    quiet CI-like machine (2026-12-06), slower stretches that hit a whole repetition, so a
    ratio is paired per repetition and read over several.
    """

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.crash: str | None = None

    def rate(self, rows: int, wall: bool = False) -> float:
        return rows / statistics.median(self.wall if wall else self.cpu)

    def ratios(self, ref: Timing) -> list[float]:
        """``ref time / own time`` per repetition (paired: same repetition); empty on a crash."""
        if self.crash or ref.crash:
            return []
        return [r / t for r, t in zip(ref.cpu, self.cpu)]

    def ratio(self, ref: Timing) -> float | None:
        """Median over repetitions of ``ref time / own time`` (paired: same repetition)."""
        ratios = self.ratios(ref)
        return statistics.median(ratios) if ratios else None


def time_interleaved(
    fns: dict[str, Callable[[int], int]], rows: int, warmup_rows: int, repeats: int
) -> dict[str, Timing]:
    """Times each contender on ``rows`` rows, ``repeats`` times, interleaved and rotated."""
    timings = {name: Timing() for name in fns}
    for name, fn in fns.items():  # warm-up (and crash detection) on a few batches
        try:
            fn(warmup_rows)
        except Exception as err:  # noqa: BLE001 - reported in the table, not hidden
            timings[name].crash = f"crashes ({type(err).__name__})"
    live = [name for name in fns if timings[name].crash is None]
    for rep in range(repeats):
        shift = rep % len(live)
        for name in live[shift:] + live[:shift]:  # rotate, so no contender always runs first
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            done = fns[name](rows)
            timings[name].cpu.append(time.process_time() - cpu)
            timings[name].wall.append(time.perf_counter() - wall)
            if done != rows:
                raise AssertionError(f"{name} handed {done} rows, expected {rows}")
    return timings


def run_scenario(
    rb: ReplayBuffer,
    hf,
    tokenizer,
    rows: int,
    repeats: int,
    *,
    collate: bool,
) -> dict[str, Timing]:
    """Times every contender on one buffer."""
    from torchrl.modules.llm import TorchRLBufferDataset as UpstreamDataset
    from transformers import DataCollatorWithPadding

    keys = list(NAMES)
    up_names = {".".join(k): v for k, v in NAMES.items()}
    dense = not isinstance(rb.storage, LazyStackStorage)

    def raw(n: int) -> int:
        done, keys = 0, None
        for _ in range(n // SAMPLE_BATCH):
            batch = rb.sample(SAMPLE_BATCH)
            if keys is None:  # listed once, as the datasets do
                keys = list(batch.keys(True, True))
            done += touch_sampled(batch, keys)
        return done

    def unbind_split(n: int) -> int:
        # The least any per-row dataset can do on dense storage: one unbind (or tolist, for
        # strings) per column per batch, zipped into dicts. Crashes on ragged lazy stacks.
        done, keys, names = 0, None, None
        for _ in range(n // SAMPLE_BATCH):
            batch = rb.sample(SAMPLE_BATCH)
            if keys is None:
                keys = list(batch.keys(True, True))
                names = [k if isinstance(k, str) else ".".join(k) for k in keys]
            columns = [
                batch.get(k).tolist() if k == PROMPT else batch.get(k).unbind(0) for k in keys
            ]
            done += touch_rows(dict(zip(names, values)) for values in zip(*columns))
        return done

    def upstream(n: int) -> int:
        return touch_rows(UpstreamDataset(rb, SAMPLE_BATCH, num_batches=n // SAMPLE_BATCH))

    def ours(n: int) -> int:
        return touch_rows(TorchRLBufferDataset(rb, SAMPLE_BATCH, num_batches=n // SAMPLE_BATCH))

    def hf_rows(n: int) -> int:
        return touch_rows(itertools.islice(hf, n))

    fns: dict[str, Callable[[int], int]] = {RAW: raw}
    if dense:
        fns[UNBIND] = unbind_split
    fns.update({UPSTREAM: upstream, OURS: ours, HF_ROWS: hf_rows})
    if collate:
        dcwp = DataCollatorWithPadding(tokenizer)
        padding = PaddingCollator(tokenizer)
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
            # map-style, as Trainer reads it: the DataLoader fetches each batch of rows with
            # Dataset.__getitems__
            return touch_batches(
                DataLoader(hf_collate, batch_size=LOADER_BATCH, sampler=range(n), collate_fn=dcwp)
            )

        fns.update(
            {
                UPSTREAM_DCWP: upstream_dcwp,
                OURS_DCWP: lambda n: touch_batches(loader(ours_ds(n), dcwp)),
                HF_DCWP: hf_dcwp,
                OURS_PC: lambda n: touch_batches(loader(ours_ds(n), padding)),
            }
        )
    return time_interleaved(fns, rows, 2 * SAMPLE_BATCH, repeats)


# ---------------------------------------------------------------------------
# as_hf_dataset() construction and memory
# ---------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def time_once(fn: Callable[[], object], cap_s: float | None = None) -> float | str:
    """Process CPU seconds for one call, or ``"> cap s"`` past ``cap_s`` CPU seconds (SIGPROF)."""

    def on_alarm(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGPROF, on_alarm) if cap_s else None
    if cap_s:
        signal.setitimer(signal.ITIMER_PROF, cap_s)
    start = time.process_time()
    try:
        fn()
    except _Timeout:
        return f"> {cap_s:.0f} s (stopped)"
    finally:
        if cap_s:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, old)
    return time.process_time() - start


def cpu_per_call(fn: Callable[[], object], at_least: float = 0.05) -> float:
    """Process CPU seconds per call of ``fn``, over as many calls as take ``at_least`` seconds:
    this machine's process clock can move in 1 ms steps, so a sub-millisecond call timed alone
    reads 0."""
    calls, start = 0, time.process_time()
    while (spent := time.process_time() - start) < at_least:
        fn()
        calls += 1
    return spent / calls


def time_as_hf(buffers: dict[str, ReplayBuffer], args: argparse.Namespace) -> list[str]:
    from torchrl.modules.llm import TorchRLBufferDataset as UpstreamDataset

    lines = [
        "| storage | ours `as_hf_dataset()` (CPU) | upstream `as_hf_dataset()` (CPU) | upstream / ours |",
        "|---|---:|---:|---:|",
    ]
    for name, rb in buffers.items():
        ours = statistics.median(
            cpu_per_call(lambda rb=rb: TorchRLBufferDataset(rb, SAMPLE_BATCH).as_hf_dataset())
            for _ in range(max(args.repeats, 3))
        )
        # upstream lets `datasets` pickle the whole buffer to fingerprint the generator:
        # seconds to a minute, so it runs once, stopped after --hf-cap CPU seconds.
        up = time_once(lambda rb=rb: UpstreamDataset(rb, SAMPLE_BATCH).as_hf_dataset(), args.hf_cap)
        ratio = f"{up / ours:,.0f}x" if isinstance(up, float) else f"> {args.hf_cap / ours:,.0f}x"
        up_s = f"{up:.2f} s" if isinstance(up, float) else up
        lines.append(f"| {name} | {ours * 1e3:.1f} ms | {up_s} | {ratio} |")
    return lines


def current_rss() -> int:
    """Resident set size now, in bytes (psutil; without it, the peak so far from getrusage)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
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


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(scenarios: dict[str, dict[str, Timing]], rows: int) -> list[str]:
    lines = [
        "| scenario | contender | rows/s (CPU) | rows/s (wall) | vs raw | vs upstream |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for scenario, timings in scenarios.items():
        for name, t in timings.items():
            upstream = timings[UPSTREAM_DCWP if name in COLLATED else UPSTREAM]
            if t.crash:
                speed = wall = t.crash
            else:
                speed, wall = f"{t.rate(rows):,.0f}", f"{t.rate(rows, wall=True):,.0f}"
            lines.append(
                f"| {scenario} | {name} | {speed} | {wall} | {fmt_ratio(t.ratio(timings[RAW]))} "
                f"| {fmt_ratio(t.ratio(upstream))} |"
            )
    return lines


def target(label: str, value: float | None, goal: float) -> str:
    if value is None:
        return f"- {label}: not measured: FAIL (target >= {goal:g}x)"
    verdict = "PASS" if value >= goal else "FAIL"
    return f"- {label}: {value:.2f}x (target >= {goal:g}x): {verdict}"


def main() -> None:
    global TOUCH_MODE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows stored and iterated")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; the median is kept")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,048 rows, 1 repeat")
    parser.add_argument("--touch", choices=["element", "sum"], default="element")
    parser.add_argument(
        "--hf-cap",
        type=float,
        default=60.0,
        help="stop upstream as_hf_dataset() after this many CPU seconds",
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 2_048, 1
    TOUCH_MODE = args.touch
    torch.set_num_threads(1)
    rows = SAMPLE_BATCH * (args.rows // SAMPLE_BATCH)  # every contender hands over this many
    if rows == 0:
        parser.error(f"--rows must be >= {SAMPLE_BATCH}")
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:5.0f} s] {msg}", file=sys.stderr, flush=True)

    tokenizer = toy_tokenizer()
    vocab = len(tokenizer)
    log(f"building padded buffers of {args.rows:,} rows")
    padded = make_padded(args.rows, 256, vocab, prompt=True)
    no_prompt = padded.exclude(PROMPT)
    rb_padded = buffer_of(LazyTensorStorage, no_prompt)
    rb_prompt = buffer_of(LazyTensorStorage, padded)

    # Memory first, before the HF datasets and other buffers inflate the process.
    log("measuring RSS while ours streams rows")
    rss = measure_rss(rb_prompt, rows)

    # Each scenario's data is built just before it runs and dropped after, so that no contender
    # pays for garbage-collector passes over another scenario's Python objects.
    scenarios: dict[str, dict[str, Timing]] = {}
    hf_prompt = hf_dataset_of(padded, rows, prompt=True)
    log(f"timing padded ({args.repeats} repeats)")
    scenarios["padded"] = run_scenario(
        rb_padded, hf_prompt.remove_columns(PROMPT), tokenizer, rows, args.repeats, collate=True
    )
    log(f"timing padded + prompt ({args.repeats} repeats)")
    scenarios["padded + prompt"] = run_scenario(
        rb_prompt, hf_prompt, tokenizer, rows, args.repeats, collate=False
    )
    del hf_prompt
    log(f"building the ragged buffer of {args.rows:,} rows")
    ragged = make_ragged(args.rows, 32, 512, vocab)
    rb_ragged = buffer_of(LazyStackStorage, ragged)
    hf_ragged = hf_dataset_of(ragged, rows, prompt=False)
    log(f"timing ragged ({args.repeats} repeats)")
    scenarios["ragged"] = run_scenario(
        rb_ragged, hf_ragged, tokenizer, rows, args.repeats, collate=True
    )
    del ragged, rb_ragged, hf_ragged
    gc.collect()

    log("timing as_hf_dataset()")
    as_hf = time_as_hf(
        {
            f"ListStorage ({args.rows:,} rows)": buffer_of(ListStorage, no_prompt),
            f"LazyTensorStorage ({args.rows:,} rows)": rb_padded,
            f"LazyTensorStorage + prompt ({args.rows:,} rows)": rb_prompt,
        },
        args,
    )
    log("done")

    print()
    print(
        f"TorchRLBufferDataset, {rows:,} rows per contender ({SAMPLE_BATCH} per `rb.sample`, "
        f"`DataLoader(batch_size={LOADER_BATCH}, num_workers=0)`), 1 torch thread, every value "
        f"touched ({TOUCH_MODE}), median of {args.repeats}; torch {torch.__version__}. Ratios are "
        "paired per repetition on process CPU time; `vs upstream` compares with upstream on the "
        "same scenario (collated rows: with upstream + `DataCollatorWithPadding`)."
    )
    print()
    print("\n".join(table(scenarios, rows)))
    print()
    print("\n".join(as_hf))
    print()
    print(
        f"RSS while ours streams {rows:,} rows (padded + prompt): {rss['start']:.0f} MiB before, "
        f"{rss['early']:.0f} MiB after {rss['early_rows']:,} rows, {rss['end']:.0f} MiB after "
        f"{rows:,} rows (peak {rss['peak']:.0f} MiB, growth {rss['growth']:+.1f} MiB); "
        f"process ru_maxrss at that point {rss['ru_maxrss']:.0f} MiB."
    )
    print()
    padded_t = scenarios["padded"]
    print("Targets (padded, LazyTensorStorage):")
    print(target("ours vs raw `rb.sample`", padded_t[OURS].ratio(padded_t[RAW]), 0.25))
    print(target("ours vs upstream", padded_t[OURS].ratio(padded_t[UPSTREAM]), 4))
    print(
        target(
            "ours + `PaddingCollator` vs upstream + `DataCollatorWithPadding`",
            padded_t[OURS_PC].ratio(padded_t[UPSTREAM_DCWP]),
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
