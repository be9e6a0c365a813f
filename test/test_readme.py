"""The README's quickstart runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs(capsys):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "no python block in the README"
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "'prompt': '" in out and "'input_ids': tensor([" in out
    reward = namespace["rm"](namespace["rb"][namespace["torch"].arange(2)])["reward"]
    assert reward.shape == (2,) and reward.dtype == namespace["torch"].float32


def test_images_exist():
    """Every image the README shows is committed at the path it names."""
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text())
    assert images, "the README shows no figure"
    for path in images:
        assert (README.parent / path).is_file(), path
