"""Shared pytest fixtures: offline toy tokenizer and models (built in torchrl_trl_interop.testing)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


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
        if "gpu" in item.keywords:
            item.add_marker(skip)
