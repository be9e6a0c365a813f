"""Shared pytest fixtures: offline toy tokenizer and models (built in torchrl_trl_interop.testing)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# OpenMP threads that wait for each other sleep instead of spinning (set before torch loads; the
# processes the tests start inherit it). Spinning, a toy model's many small parallel ops ran 13x
# slower whenever another process (a background job, a generator, another user) held a core:
# each op's barrier waited for the thread that process had preempted.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def doc_pages(tmp_path_factory):
    """Runs each page of ``docs/`` once per session (``test/_doc_pages.py``): the tests that
    check a page read the same run."""
    from _doc_pages import PageRuns

    return PageRuns(tmp_path_factory.mktemp("doc-pages"))


def pytest_collection_finish(session):
    """Starts the background jobs the kept tests ask for (``test/_background.py``): their
    processes run on the core the other tests leave idle. ``_background`` is imported by the
    test modules that register a job: not imported, there is none."""
    background = sys.modules.get("_background")
    if background is not None:
        background.start(session)


def pytest_sessionfinish(session):
    background = sys.modules.get("_background")
    if background is not None:
        background.stop(session)


def pytest_terminal_summary(terminalreporter, config):
    background = sys.modules.get("_background")
    if background is not None and config.option.durations is not None:
        lines = background.summary(config)
        if lines:
            terminalreporter.section("background jobs (test/_background.py)")
            for line in lines:
                terminalreporter.write_line(line)


@pytest.fixture
def tokenizer():
    from torchrl_trl_interop.testing import toy_tokenizer

    return toy_tokenizer()


@pytest.fixture
def left_tokenizer():
    from torchrl_trl_interop.testing import toy_tokenizer

    return toy_tokenizer(padding_side="left")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        # the marker, not item.keywords: keywords hold every parent's name too, so a checkout
        # in a folder named "gpu" skipped the whole suite
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


#: Whether the running test builds a trainer config that autocasts on purpose (``autocast`` mark).
_AUTOCAST_ALLOWED = [False]


def pytest_configure(config):
    """Every trainer config a test builds states fp32: one that would autocast fails the test.

    TRL's configs default to ``bf16=True`` when ``fp16`` is not set, and a CPU with native bf16
    (AMX, AVX512-BF16) then trains under bf16 autocast, so a test's numbers would depend on the
    machine. transformers' ``TrainingArguments.__post_init__`` (which TRL's configs call after
    resolving that default) is wrapped once here; ``@pytest.mark.autocast`` lets a test mean it.
    """
    try:
        from transformers import TrainingArguments
    except ImportError:  # the hf extra is not installed: no trainer config to check
        return
    original = TrainingArguments.__post_init__

    def fp32_only(self):
        original(self)
        if (self.bf16 or self.fp16) and not _AUTOCAST_ALLOWED[0]:
            raise AssertionError(
                f"{type(self).__name__} would autocast (bf16={self.bf16}, fp16={self.fp16}): "
                "every trainer config a test builds states fp32: pass bf16=False (to the config "
                "or to torchrl_trl_interop.testing.toy_trainer_args), build it from toy_grpo_args, "
                "or mark a test that autocasts on purpose with @pytest.mark.autocast."
            )

    TrainingArguments.__post_init__ = fp32_only


def pytest_runtest_setup(item):
    _AUTOCAST_ALLOWED[0] = item.get_closest_marker("autocast") is not None


def pytest_runtest_teardown(item):
    _AUTOCAST_ALLOWED[0] = False


@pytest.fixture(params=["fast", "plain"])
def upstream_branch(request):
    """Runs a test on both branches of the ``_upstream`` speed paths: the fast one (on the
    versions it was measured on) and the plain upstream call (:func:`plain_upstream`)."""
    from torchrl_trl_interop._upstream import (
        TENSORDICT_MEASURED,
        TORCHRL_MEASURED,
        plain_upstream,
        use_fast,
    )

    if request.param == "plain":
        with plain_upstream():
            yield request.param
        return
    assert use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED), "the installed versions are measured"
    yield request.param
