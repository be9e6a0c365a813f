"""``docs/openenv.rst`` as written: one environment, every loop, the same episode.

The page's Python code blocks run in order in one namespace (as a reader would paste them; the
run is the one ``test/test_docs_code.py`` checks, made once per session), and every loop must
have played the scripted episode the TorchRL environment plays itself
(``torchrl_episode``): the same conversation and the same reward.
"""

from __future__ import annotations

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


def test_the_page_runs_and_every_loop_agrees(doc_pages):
    """The page's run (once per session: ``test/_doc_pages.py``), read: every loop played the
    episode the TorchRL environment plays itself."""
    run = doc_pages.run(PAGE)
    assert sum(block.kind == "code" for block in run.blocks) >= 6
    namespace = run.namespace

    ways = namespace["ways"]
    assert list(ways) == WAYS
    conversation, reward = reference(namespace["question"], namespace["script"])
    assert reward == 1.0  # the episode is the right one: the tool's reply, a rewarded answer
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]
    for way, got in ways.items():
        assert got == (conversation, reward), way
    assert all(f"{way:34} 4 turns, reward 1.0" in run.out for way in WAYS)


def reference(question, script):
    """The conversation and reward of the episode as the TorchRL environment plays it."""
    steps = torchrl_episode(question, script)
    conversation = list(steps[0][0])
    for answer, (added, _, _) in zip(script, steps[1:]):
        conversation += [{"role": "assistant", "content": answer}, *added]
    return conversation, sum(r for _, r, _ in steps[1:])
