"""The sphinx-gallery tutorial: well-formed, and runs end to end as a plain script (``make demo``)."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from pathlib import Path

import pytest
from _background import background

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "tutorials" / "trl_interop.py"
GALLERY_HEADER = ROOT / "tutorials" / "README.txt"
RECORDER = ROOT / "test" / "_precision_recorder.py"


def _title(text: str) -> tuple[str, str]:
    """The first two non-empty lines of an RST text: the title and its underline."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return lines[0], lines[1]


def test_gallery_format():
    """sphinx-gallery needs a module docstring with an RST title, and ``# %%`` cells."""
    source = TUTORIAL.read_text(encoding="utf-8")
    docstring = ast.get_docstring(ast.parse(source), clean=False)
    assert docstring is not None and source.lstrip().startswith('"""')
    title, underline = _title(docstring)
    assert set(underline) == {"="} and len(underline) >= len(title)
    assert source.count("\n# %%\n") >= 10
    assert "plt.show(" not in source  # never block a run on a window

    title, underline = _title(GALLERY_HEADER.read_text(encoding="utf-8"))
    assert set(underline) == {"="} and len(underline) >= len(title)


@background(timeout_s=1700)  # ~90 s alone, on one thread; longer on a busy machine
def tutorial_run(job):
    """``python tutorials/trl_interop.py`` from a fresh folder, as ``make demo`` runs it, with
    every trainer config it builds recorded (``_precision_recorder.py``): ``(exit code, stdout,
    stderr, folder)``. ``demo_setup`` pins torch to one thread (and sets the offline switches)."""
    command = [sys.executable, str(RECORDER), str(job.folder / "configs.json"), str(TUTORIAL)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # as `make demo` runs it
    proc = job.popen(command, log="stdout.txt", err="stderr.txt", cwd=job.folder, env=env)
    (code,) = job.wait(proc)
    return code, job.log("stdout.txt"), job.log("stderr.txt"), job.folder


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~4 min of CPU on one thread; a shared machine stretches it
def test_tutorial_runs_end_to_end(tutorial_run):
    """Runs the tutorial as ``make demo`` does, from another directory (in the background from
    the session's start: ``_background.py``): exit code, figure, the summary's claims within
    bands that hold on any CPU, and every trainer config in fp32."""
    code, stdout, stderr, folder = tutorial_run
    assert code == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"

    # every trainer config the tutorial built states fp32: none autocasts, on any CPU
    built = json.loads((folder / "configs.json").read_text())
    assert {c["config"] for c in built} >= {"SFTConfig", "RewardConfig", "GRPOConfig"}, built
    assert [c for c in built if c["bf16"] or c["fp16"]] == []

    figure = folder / "outputs" / "trl_interop_summary.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
    summary = _summary(stdout)
    assert list(summary)[-8:] == ["policy answers readable", *SUMMARY_TAIL]
    assert summary["figure"] == str(figure.resolve())
    assert re.fullmatch(r"\d+ s", summary["time"])
    for line in ("rollouts collected", "preference pairs"):
        assert line in summary, line
    check_bands(summary)


def check_bands(summary: dict[str, str]) -> None:
    """What the demo must show, in bands that hold on any CPU (a GRPO run amplifies another
    CPU's rounding, so its numbers move; what it learns does not)."""
    readable = re.fullmatch(r"(\d+)%", summary["policy answers readable"])
    assert readable is not None and int(readable.group(1)) >= 90
    first, last = _arrow(summary["task reward (GRPO)"])
    assert last - first >= 0.15 and last >= 0.8  # the demo learns: B clearly above A
    before, after = _arrow(summary["RM held-out accuracy"])
    assert after >= 0.9 and before <= 0.8
    before, after = _arrow(summary["RM pairs by wide margin"])
    # margins far above bfloat16's step (~0.008 at a score of 1.7): no rounding flips those pairs
    assert after >= 0.9 and before <= 0.1
    first, last = _arrow(summary["tool-loop reward (GRPO)"])
    assert last - first >= 0.15  # TRL's tool loop with a TorchRL env: more answers right
    first, last = _arrow(summary["tool calls per answer"])
    assert last - first >= 0.2  # and the calculator called more often


#: The held-out margin of a pair ranked right by a wide margin (the tutorial's MIN_MARGIN).
MIN_MARGIN = 0.5

SUMMARY_TAIL = [
    "task reward (GRPO)",
    "RM held-out accuracy",
    "RM pairs by wide margin",
    "tool-loop reward (GRPO)",
    "tool calls per answer",
    "time",
    "figure",
]
README = ROOT / "README.md"
README_SUMMARY = re.search(
    r"```text\n(policy answers readable.*?)```", README.read_text(encoding="utf-8"), re.S
).group(1)


def _summary(stdout: str) -> dict[str, str]:
    """The ``name : value`` lines at the end of the output, in order (names padded to 23)."""
    lines = stdout.rstrip().splitlines()
    out: dict[str, str] = {}
    for line in reversed(lines):
        match = re.fullmatch(r"([a-zA-Z ()-]{23}) : (.+)", line)
        if match is None:
            break
        out[match.group(1).rstrip()] = match.group(2)
    return dict(reversed(list(out.items())))


def _arrow(value: str) -> tuple[float, float]:
    match = re.fullmatch(r"([-+]?[\d.]+) -> ([-+]?[\d.]+)", value)
    assert match is not None, value
    return float(match.group(1)), float(match.group(2))


def test_summary_parser():
    """The parser reads the exact lines ``make demo`` ends with, and nothing above them."""
    stdout = (
        "training loss: [0.6, 0.5]\n"
        "preference pairs        : 132 for training, 45 held out\n"
        "policy answers readable : 100%\n"
        "task reward (GRPO)      : 0.61 -> 0.98\n"
        "RM held-out accuracy    : 0.64 -> 0.82\n"
        "RM pairs by wide margin : 0.10 -> 0.95\n"
        "tool-loop reward (GRPO) : 0.70 -> 0.95\n"
        "tool calls per answer   : 0.50 -> 0.90\n"
        "time                    : 187 s\n"
        "figure                  : /tmp/outputs/trl_interop_summary.png\n"
    )
    summary = _summary(stdout)
    assert list(summary) == ["preference pairs", "policy answers readable", *SUMMARY_TAIL]
    assert _arrow(summary["task reward (GRPO)"]) == (0.61, 0.98)
    assert _arrow(summary["RM pairs by wide margin"]) == (0.1, 0.95)
    assert summary["figure"] == "/tmp/outputs/trl_interop_summary.png"


def test_readme_shows_every_summary_line():
    """The README's summary block has every line the tutorial's summary ends with, and its
    numbers lie in the bands the end-to-end run is held to."""
    shown = _summary(README_SUMMARY)
    assert list(shown) == ["policy answers readable", *SUMMARY_TAIL]
    check_bands(shown)


def test_tutorial_min_margin_is_the_bands():
    """The margin a "wide margin" pair clears is the one the tutorial asserts itself."""
    source = TUTORIAL.read_text(encoding="utf-8")
    assert re.search(rf"^MIN_MARGIN = {MIN_MARGIN}\b", source, re.M)
