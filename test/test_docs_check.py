"""The rendered docs check (``make docs-check``): what it accepts, what it reports, and one real
headless-Chromium run on a small page (skipped where no Chromium is installed)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_rendered", ROOT / "docs" / "check_rendered.py"
)
check_rendered = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_rendered)

NEW_SUMMARY = """\
some earlier output
policy answers readable : 96%
task reward (GRPO)      : 0.18 -> 0.71
RM held-out accuracy    : 0.50 -> 0.88
RM pairs by wide margin : 0.10 -> 0.95
time                    : 212 s
figure                  : /tmp/outputs/trl_interop.png
"""
# The summary the tutorial printed before issue 15: accuracy with words, no policy/GRPO lines.
OLD_SUMMARY = """\
rollouts collected    : 40 (24 for training, 8 fresh, 8 in Part 1)
RM held-out accuracy  : 0.50 untrained -> 0.83 trained
time                  : 61 s
figure                : /tmp/outputs/trl_interop.png
"""


def test_summary_lines_matched_by_label():
    assert check_rendered.missing_summary_lines(NEW_SUMMARY) == []
    assert check_rendered.summary_lines(NEW_SUMMARY) == NEW_SUMMARY.splitlines()[1:]


def test_old_summary_names_what_is_missing():
    problems = check_rendered.missing_summary_lines(OLD_SUMMARY)
    assert len(problems) == 3
    assert "'policy answers readable'" in problems[0] and "P%" in problems[0]
    assert "'task reward (GRPO)'" in problems[1] and "A -> B" in problems[1]
    assert "'RM pairs by wide margin'" in problems[2] and "W -> V" in problems[2]


@pytest.mark.parametrize(
    "line",
    [
        "task reward (GRPO)      : n/a",
        "task reward (GRPO)      : 0.18 ->",
        "task reward (GRPO)      : 0.18 -> nan",
    ],
)
def test_malformed_value_is_reported_with_the_line(line):
    problems = check_rendered.missing_summary_lines(
        NEW_SUMMARY.replace(NEW_SUMMARY.splitlines()[2], line)
    )
    assert problems == [
        f"summary line 'task reward (GRPO)' is there but its value does not read as 'A -> B': "
        f"{line!r}"
    ]


def test_label_must_start_a_line():
    text = NEW_SUMMARY.replace("policy answers readable : 96%", "see policy answers readable : 96%")
    assert (
        "no summary line 'policy answers readable'" in check_rendered.missing_summary_lines(text)[0]
    )


def _img(src, complete=True, width=640, shown=True):
    return {"src": src, "complete": complete, "width": width, "height": 480, "shown": shown}


def test_figure_must_be_a_loaded_gallery_image():
    figure = "../_images/sphx_glr_trl_interop_001.png"
    assert check_rendered.missing_figure([_img(figure)], "trl_interop") == []
    thumb_only = check_rendered.missing_figure(
        [_img("../_images/sphx_glr_trl_interop_thumb.png")], "trl_interop"
    )
    assert "no <img> of the gallery's figure" in thumb_only[0]
    assert "sphx_glr_trl_interop_thumb.png" in thumb_only[0]
    broken = check_rendered.missing_figure([_img(figure, complete=True, width=0)], "trl_interop")
    assert "did not load" in broken[0] and "natural size 0x480" in broken[0]
    hidden = check_rendered.missing_figure([_img(figure, shown=False)], "trl_interop")
    assert "is not shown" in hidden[0]


@pytest.mark.skipif(check_rendered.find_chromium() is None, reason="no Chromium installed")
def test_real_browser_run(tmp_path, capsys):
    """A built-page look-alike: the figure loads in Chromium and the summary is read off the page;
    then the same page with the figure file missing and a summary line dropped fails."""
    pil = pytest.importorskip("PIL.Image")
    images = tmp_path / "_images"
    images.mkdir()
    pil.new("RGB", (64, 48), "white").save(images / "sphx_glr_demo_001.png")
    page = tmp_path / "auto_examples" / "demo.html"
    page.parent.mkdir()
    body = (
        '<img src="../_images/sphx_glr_demo_001.png" class="sphx-glr-single-img">'
        f"<pre>{NEW_SUMMARY}</pre><p>Total running time of the script: (1 minutes 2.0 seconds)</p>"
    )
    page.write_text(f"<html><body>{body}</body></html>", encoding="utf-8")
    shot = tmp_path / "shot.png"

    assert check_rendered.check(page, shot) == 0
    out = capsys.readouterr().out
    assert "on the page: task reward (GRPO)      : 0.18 -> 0.71" in out
    assert shot.stat().st_size > 0
    assert not list(page.parent.glob(".docs-check-*"))  # the probe copy is removed

    (images / "sphx_glr_demo_001.png").unlink()
    page.write_text(page.read_text().replace("RM held-out accuracy", "RM accuracy"))
    assert check_rendered.check(page, None) == 1
    out = capsys.readouterr().out
    assert "did not load" in out and "no summary line 'RM held-out accuracy'" in out


def test_missing_page_or_browser_is_reported(tmp_path, capsys, monkeypatch):
    assert check_rendered.check(tmp_path / "nope.html", None) == 2
    assert "build the docs first (make docs)" in capsys.readouterr().out
    page = tmp_path / "page.html"
    page.write_text("<html><body></body></html>")
    monkeypatch.setenv("CHROMIUM", "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert check_rendered.check(page, None) == 2
    assert "no Chromium found" in capsys.readouterr().out
