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
def test_tutorial_runs_end_to_end(tmp_path):
    """Runs the tutorial as ``make demo`` does, from another directory: exit code, figure, summary."""
    env = {
        **os.environ,
        "MPLBACKEND": "Agg",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = subprocess.run(
        [sys.executable, str(TUTORIAL)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"

    figure = tmp_path / "outputs" / "trl_interop_summary.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
    assert f"figure                : {figure.resolve()}" in proc.stdout
    match = re.search(
        r"RM held-out accuracy\s*: ([\d.]+) untrained -> ([\d.]+) trained", proc.stdout
    )
    assert match is not None, proc.stdout[-2000:]
    before, after = map(float, match.groups())
    assert after > before
    for line in ("rollouts collected", "preference pairs", "RM mean margin", "time"):
        assert re.search(rf"^{line}\s*:", proc.stdout, flags=re.M), line
