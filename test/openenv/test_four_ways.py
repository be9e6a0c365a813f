"""``docs/openenv.rst`` as written: one environment, every loop, the same episode.

The page's Python code blocks run in order in one namespace (as a reader would paste them), and
every loop must have played the scripted episode the TorchRL environment plays itself
(``torchrl_episode``): the same conversation and the same reward.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from _openenv_helpers import torchrl_episode

PAGE = Path(__file__).resolve().parents[2] / "docs" / "openenv.rst"
WAYS = [
    "TorchRL collector",
    "GRPOTrainer(rollout_func=...)",
    "environment_factory=...",
    "OpenEnv server",
    "OpenEnv server -> OpenEnvChatEnv",
]

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
    pytest.mark.filterwarnings("ignore:The env passed to LLMCollector"),
]


def python_blocks(text: str) -> list[str]:
    """The ``.. code-block:: python`` bodies of an RST text, dedented, in order."""
    blocks = []
    for match in re.finditer(r"^( *)\.\. code-block:: python\n\n((?:\1 {4}.*\n|\n)+)", text, re.M):
        blocks.append(textwrap.dedent(match.group(2)))
    return blocks


def test_the_page_runs_and_every_loop_agrees(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the trainer's output_dir is relative
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 6
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{PAGE.name}[block {i}]", "exec"), namespace)  # noqa: S102

    ways = namespace["ways"]
    assert list(ways) == WAYS
    conversation, reward = reference(namespace["question"], namespace["script"])
    assert reward == 1.0  # the episode is the right one: the tool's reply, a rewarded answer
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]
    for way, got in ways.items():
        assert got == (conversation, reward), way
    printed = capsys.readouterr().out
    assert all(f"{way:34} 4 turns, reward 1.0" in printed for way in WAYS)


def reference(question, script):
    """The conversation and reward of the episode as the TorchRL environment plays it."""
    steps = torchrl_episode(question, script)
    conversation = list(steps[0][0])
    for answer, (added, _, _) in zip(script, steps[1:]):
        conversation += [{"role": "assistant", "content": answer}, *added]
    return conversation, sum(r for _, r, _ in steps[1:])
