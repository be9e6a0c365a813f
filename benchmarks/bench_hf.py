"""Benchmark: the Hugging Face views and the History column, each against its reference.

Rows of the table (both sides measured in the same run, interleaved, ratios paired per
repetition on process CPU time, one torch thread, as in ``bench_dataset.py``; each ratio shown
as its median [min-max] over the repetitions):

* ``to_hf_dataset()``, 50,000 dense rows x 128 tokens + a bool mask (``LazyTensorStorage``),
  versus building the same ``datasets.Dataset`` from the storage's tensors with
  ``pyarrow.ListArray.from_arrays`` (target: at most 2x that direct build);
* ``to_hf_dataset()``, 3,000 LLM-shaped rows (``LazyStackStorage``: ragged tokens and mask, a
  3-message History, a text), versus ``datasets.Dataset.from_list`` of the same Python rows
  (target: no slower);
* the torch dataset's epoch pass over those rows: the History column versus the tokens + mask
  columns (target: at least 0.5x the rows/s);

  each of these two on every History layout the package and TorchRL write, a row each: built by
  ``History.from_chats`` (TorchRL's wrappers), by our ``messages_to_history``
  (``replay_buffer_from_hf``), and both mixed in one buffer;
* ``as_hf_dataset()`` iteration (epoch mode) over 20,000 dense rows versus the torch dataset's
  epoch pass over the same rows (target: at most 1.5x its time);

then scaling of ``to_hf_dataset()``, the torch epoch pass and ``as_hf_dataset()`` iteration at
10k and 100k rows of 128 tokens (``--scale 1000000`` adds 1M), each in a fresh process so that
its peak RSS is its own. Run with ``python benchmarks/bench_hf.py`` (``--quick``: smaller).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dataset import Timing, fmt_ratio, time_interleaved, touch_rows  # noqa: E402

from torchrl_trl_interop import TorchRLBufferDataset, messages_to_history
from torchrl_trl_interop.testing import toy_chats

WIDTH = 128


def dense_buffer(rows: int, seed: int = 0) -> ReplayBuffer:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 32_000, (rows, WIDTH), generator=g)
    mask = torch.arange(WIDTH)[None] < torch.randint(16, WIDTH + 1, (rows, 1), generator=g)
    rb = ReplayBuffer(storage=LazyTensorStorage(rows))
    rb.extend(TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[rows]))
    return rb


def direct_arrow(rb: ReplayBuffer, hashed: bool = True):
    """The reference: the storage's tensors straight into Arrow lists, then a ``Dataset``
    (``hashed``: fingerprinted by ``datasets``, its default; else a random fingerprint, as ours)."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset
    from datasets.fingerprint import generate_random_fingerprint

    n = len(rb)
    storage = rb.storage._storage
    offsets = np.arange(n + 1, dtype=np.int32) * WIDTH
    columns = {
        name: pa.ListArray.from_arrays(offsets, pa.array(storage[name][:n].reshape(-1).numpy()))
        for name in ("input_ids", "attention_mask")
    }
    return Dataset(pa.table(columns), fingerprint=None if hashed else generate_random_fingerprint())


def llm_rows(
    rows: int, seed: int = 0, history_from: str = "from_chats"
) -> tuple[ReplayBuffer, list[dict]]:
    """LLM-shaped rows: ragged tokens and mask, a 3-message History, a text; and the same rows
    as Python values (what ``Dataset.from_list`` is given).

    ``history_from`` picks the History's layout, among those the package and TorchRL write:
    ``"from_chats"`` (``History.from_chats``, as TorchRL's LLM wrappers build it: each row a
    lazy stack of turns), ``"messages_to_history"`` (our ``messages_to_history``, as
    ``replay_buffer_from_hf`` writes it: each row's fields stack its turns), ``"mixed"`` (both,
    alternating every 16 rows: a buffer a collector and ``replay_buffer_from_hf`` both wrote).
    """
    from torchrl.data.llm import History

    g = torch.Generator().manual_seed(seed)
    chats = [c[:3] for c in toy_chats(rows, seed=seed)]
    chats = [c + [{"role": "assistant", "content": "ok"}] * (3 - len(c)) for c in chats]
    lengths = torch.randint(16, 512, (rows,), generator=g).tolist()
    tokens = [torch.randint(3, 32_000, (n,), generator=g) for n in lengths]
    build = {"from_chats": History.from_chats, "messages_to_history": messages_to_history}
    with set_list_to_stack(True):
        if history_from == "mixed":
            layouts = [("from_chats", "messages_to_history")[(i // 16) % 2] for i in range(rows)]
        else:
            layouts = [history_from] * rows
        tds = [
            TensorDict(
                {
                    "tokens": {"full": tokens[i]},
                    "masks": {"all_attention_mask": torch.ones(n, dtype=torch.bool)},
                    "history": {"full": build[layouts[i]]([chats[i]])[0]},
                    "text": {"full": f"answer {i}"},
                }
            )
            for i, n in enumerate(lengths)
        ]
        rb = ReplayBuffer(storage=LazyStackStorage(rows))
        rb.extend(lazy_stack(tds))
    python = [
        {
            "tokens.full": tokens[i].tolist(),
            "masks.all_attention_mask": [True] * n,
            "history.full": chats[i],
            "text.full": f"answer {i}",
        }
        for i, n in enumerate(lengths)
    ]
    return rb, python


#: the History layouts of ``llm_rows``, as the table names them
LABELS = {
    "from_chats": "`History.from_chats`",
    "messages_to_history": "`messages_to_history`",
    "mixed": "both layouts, mixed",
}


def paired(timings: dict[str, Timing], ours: str, ref: str, unit: str) -> list[float]:
    """Per repetition, ``time(ours) / time(ref)`` (``unit="time"``) or its inverse, the ratio
    of rows/s (``unit="rows/s"``): paired, both sides timed in the same repetition."""
    if unit == "time":
        return timings[ref].ratios(timings[ours])
    return timings[ours].ratios(timings[ref])


def check(label: str, value: float | None, goal: float, at_most: bool) -> str:
    if value is None:
        return f"- {label}: not measured: FAIL"
    ok = value <= goal if at_most else value >= goal
    sign = "<=" if at_most else ">="
    return f"- {label}: {value:.2f}x (target {sign} {goal:g}x): {'PASS' if ok else 'FAIL'}"


def main_table(args: argparse.Namespace) -> None:
    from datasets import Dataset

    lines = [
        "| path | ours (CPU s) | reference (CPU s) | ratio [min-max] | target |",
        "|---|---:|---:|---:|---|",
    ]
    verdicts = []

    def row(label, timings, ours, ref, goal, at_most, unit="time"):
        """A table row: the medians and the paired ratio's median [min-max] over repetitions
        (the verdict reads its median; ``goal=None``: a row for reference, no verdict)."""
        o = statistics_median(timings[ours].cpu)
        r = statistics_median(timings[ref].cpu)
        ratios = paired(timings, ours, ref, unit)
        ratio = statistics_median(ratios) if ratios else None
        spread = f" [{min(ratios):.2f}-{max(ratios):.2f}]" if ratios else ""
        target = "-" if goal is None else f"{'<=' if at_most else '>='} {goal:g}x"
        lines.append(f"| {label} | {o:.3f} | {r:.3f} | {fmt_ratio(ratio)}{spread} | {target} |")
        if goal is not None:
            verdicts.append(check(label, ratio, goal, at_most))

    n_dense = args.dense_rows
    rb = dense_buffer(n_dense)
    t = time_interleaved(
        {
            "ours": lambda n: len(TorchRLBufferDataset(rb, 256).to_hf_dataset()),
            "direct": lambda n: len(direct_arrow(rb)),
            "direct, not hashed": lambda n: len(direct_arrow(rb, hashed=False)),
        },
        n_dense,
        n_dense,
        args.repeats,
    )
    row(
        f"`to_hf_dataset()`, {n_dense:,} dense rows x {WIDTH} + bool mask, vs direct Arrow build",
        t,
        "ours",
        "direct",
        2,
        True,
    )
    row(  # for reference: that build aliases the storage's memory, ours owns a copy
        "same, vs the direct build not hashed (a random fingerprint, as ours; no copy)",
        t,
        "ours",
        "direct, not hashed",
        None,
        True,
    )

    n_llm = args.llm_rows
    # every row below runs on each History layout the package and TorchRL write (``llm_rows``)
    layouts = ("from_chats", "messages_to_history", "mixed")
    built = {layout: llm_rows(n_llm, history_from=layout) for layout in layouts}
    python = built["from_chats"][1]  # the same Python rows whatever the layout
    views = {
        layout: (lambda n, rb=rb: len(TorchRLBufferDataset(rb, 256).to_hf_dataset()))
        for layout, (rb, _) in built.items()
    }
    t = time_interleaved(
        {**views, "from_list": lambda n: len(Dataset.from_list(python))}, n_llm, n_llm, args.repeats
    )
    for layout in layouts:
        row(
            f"`to_hf_dataset()`, {n_llm:,} LLM-shaped rows, History by {LABELS[layout]}, vs "
            "`Dataset.from_list`",
            t,
            layout,
            "from_list",
            1,
            True,
        )

    def epoch(rb, keys):
        return lambda n: touch_rows(TorchRLBufferDataset(rb, 256, epoch=True, keys=keys))

    history = [("history", "full")]
    tokens = [("tokens", "full"), ("masks", "all_attention_mask")]
    passes = {layout: epoch(rb, history) for layout, (rb, _) in built.items()}
    t = time_interleaved(
        {**passes, "tokens": epoch(built["from_chats"][0], tokens)}, n_llm, n_llm, args.repeats
    )
    for layout in layouts:
        row(
            f"torch dataset, History by {LABELS[layout]} vs tokens+mask columns ({n_llm:,} "
            "rows; ratio of rows/s)",
            t,
            layout,
            "tokens",
            0.5,
            False,
            "rows/s",
        )

    n_iter = args.iter_rows
    rb_iter = dense_buffer(n_iter)
    ds = TorchRLBufferDataset(rb_iter, 256, epoch=True)
    t = time_interleaved(
        {
            "as_hf": lambda n: touch_rows(ds.as_hf_dataset()),
            "torch": lambda n: touch_rows(ds),
        },
        n_iter,
        n_iter,
        args.repeats,
    )
    row(
        f"`as_hf_dataset()` iteration, {n_iter:,} dense rows, vs torch epoch pass",
        t,
        "as_hf",
        "torch",
        1.5,
        True,
    )
    print(
        f"Hugging Face views, one torch thread, {args.repeats} interleaved repetitions, process "
        "CPU time; 'ratio' is ours / reference in time, or in rows/s for the History rows: "
        "the median [min-max] of the ratios paired per repetition (the verdict reads the "
        "median)."
    )
    print()
    print("\n".join(lines))
    print()
    print("\n".join(verdicts))


def statistics_median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


# -- scaling: each point in its own process, so that peak RSS is its own ----------------------


def status_mib(field: str) -> float:
    """A memory figure of this process from ``/proc/self/status``, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> float:
    """Resets the process's peak RSS to its current RSS (Linux), so that the peak measured next
    is the path's own; returns the current RSS in MiB."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:  # not Linux: the peak includes what came before
        pass
    return status_mib("VmRSS")


def scale_point(kind: str, rows: int) -> dict:
    torch.set_num_threads(1)
    # imports and first-call set-up are not part of the figure
    TorchRLBufferDataset(dense_buffer(256), 256, epoch=True).to_hf_dataset()
    touch_rows(TorchRLBufferDataset(dense_buffer(256), 256, epoch=True).as_hf_dataset())
    rb = dense_buffer(rows)
    gc.collect()
    base = reset_peak_rss()
    ds = TorchRLBufferDataset(rb, 256, epoch=True)
    start, cpu = time.perf_counter(), time.process_time()
    if kind == "to_hf_dataset":
        n = len(ds.to_hf_dataset())
    elif kind == "to_hf_dataset(cache_file)":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            n = len(ds.to_hf_dataset(cache_file=os.path.join(tmp, "rows.arrow")))
    elif kind == "epoch pass":
        n = touch_rows(ds)
    else:
        n = touch_rows(ds.as_hf_dataset())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert n == rows, (kind, n, rows)
    return {"seconds": seconds, "cpu": cpu, "peak": status_mib("VmHWM"), "buffer": base}


def scaling(sizes: list[int]) -> None:
    kinds = ["to_hf_dataset", "to_hf_dataset(cache_file)", "epoch pass", "as_hf_dataset"]
    print()
    print(
        f"Scaling, rows of {WIDTH} int64 tokens + a bool mask (`LazyTensorStorage`), each point "
        "in a fresh process: CPU and wall seconds, the peak RSS while the path ran, and the RSS "
        "just before it (imports and the buffer)."
    )
    print()
    print("| rows | path | CPU s | wall s | rows/s (CPU) | peak RSS (MiB) | RSS before (MiB) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rows in sizes:
        for kind in kinds:
            done = subprocess.run(
                [sys.executable, __file__, "--point", kind, str(rows)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                error = (done.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {rows:,} | {kind} | failed: {error[:80]} | | | | |", flush=True)
                continue
            p = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"| {rows:,} | {kind} | {p['cpu']:.2f} | {p['seconds']:.2f} | "
                f"{rows / p['cpu']:,.0f} | {p['peak']:.0f} | {p['buffer']:.0f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 15: the machine's slower stretches hit whole repetitions; over 5, one paired median
    # moved from 0.42x to 0.77x between runs (History row, 2026-12-05/06)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dense-rows", type=int, default=50_000)
    parser.add_argument("--llm-rows", type=int, default=3_000)
    parser.add_argument("--iter-rows", type=int, default=20_000)
    parser.add_argument("--scale", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only-scale", action="store_true", help="skip the table of ratios")
    parser.add_argument("--point", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        print(json.dumps(scale_point(args.point[0], int(args.point[1]))))
        return
    if args.quick:
        args.repeats, args.dense_rows, args.llm_rows, args.iter_rows = 1, 5_000, 500, 2_048
        args.scale = [10_000]
    torch.set_num_threads(1)
    if not args.only_scale:
        main_table(args)
    if args.scale:
        scaling(args.scale)


if __name__ == "__main__":
    main()
