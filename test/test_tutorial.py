"""The sphinx-gallery tutorial: well-formed, and runs end to end as a plain script (``make demo``)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "tutorials" / "trl_interop.py"
GALLERY_HEADER = ROOT / "tutorials" / "README.txt"


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


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~4 min of CPU on one thread; a shared machine stretches it
def test_tutorial_runs_end_to_end(tmp_path):
    """Runs the tutorial as ``make demo`` does, from another directory: exit code, figure, summary."""
    # no offline switches here: the tutorial's demo_setup() sets them itself
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # as `make demo` runs it
    proc = subprocess.run(
        [sys.executable, str(TUTORIAL)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1700,
        env=env,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"

    figure = tmp_path / "outputs" / "trl_interop_summary.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
    summary = _summary(proc.stdout)
    assert list(summary)[-7:] == ["policy answers readable", *SUMMARY_TAIL]
    assert summary["figure"] == str(figure.resolve())
    readable = re.fullmatch(r"(\d+)%", summary["policy answers readable"])
    assert readable is not None and int(readable.group(1)) >= 90
    first, last = _arrow(summary["task reward (GRPO)"])
    assert last - first >= 0.15  # the demo learns: B clearly above A
    before, after = _arrow(summary["RM held-out accuracy"])
    assert after > before
    first, last = _arrow(summary["tool-loop reward (GRPO)"])
    assert last - first >= 0.15  # TRL's tool loop with a TorchRL env: more answers right
    first, last = _arrow(summary["tool calls per answer"])
    assert last > first  # and the calculator called more often
    assert re.fullmatch(r"\d+ s", summary["time"])
    for line in ("rollouts collected", "preference pairs"):
        assert line in summary, line
    # the README shows what `make demo` prints, within README_TOLERANCE
    shown = _summary(README_SUMMARY)
    assert summary["policy answers readable"] == shown["policy answers readable"]
    for label in ARROWS:
        ran, readme = _arrow(summary[label]), _arrow(shown[label])
        assert all(abs(a - b) <= README_TOLERANCE for a, b in zip(ran, readme)), (
            label,
            ran,
            readme,
        )


SUMMARY_TAIL = [
    "task reward (GRPO)",
    "RM held-out accuracy",
    "tool-loop reward (GRPO)",
    "tool calls per answer",
    "time",
    "figure",
]
ARROWS = SUMMARY_TAIL[:4]
#: How far a run's "A -> B" numbers may be from the README's. On one machine a run repeats them
#: to the digit (one torch thread, fixed seeds); another CPU's math kernels may round a float
#: differently, and a GRPO run amplifies that.
README_TOLERANCE = 0.1
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
    match = re.fullmatch(r"([\d.]+) -> ([\d.]+)", value)
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
        "tool-loop reward (GRPO) : 0.70 -> 0.95\n"
        "tool calls per answer   : 0.50 -> 0.90\n"
        "time                    : 187 s\n"
        "figure                  : /tmp/outputs/trl_interop_summary.png\n"
    )
    summary = _summary(stdout)
    assert list(summary) == ["preference pairs", "policy answers readable", *SUMMARY_TAIL]
    assert _arrow(summary["task reward (GRPO)"]) == (0.61, 0.98)
    assert summary["figure"] == "/tmp/outputs/trl_interop_summary.png"


def test_readme_shows_every_summary_line():
    """The README's summary block has every line the tutorial's summary ends with."""
    assert list(_summary(README_SUMMARY)) == ["policy answers readable", *SUMMARY_TAIL]
