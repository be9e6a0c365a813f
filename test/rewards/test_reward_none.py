"""A TRL reward function returning ``None`` inside a TorchRL environment (issue 34): in the loop
``docs/online.rst`` shows (``RewardTransform`` -> ``LLMCollector`` -> ``MCAdvantage``), a ``None``
is a NaN that ``MCAdvantage`` spreads over its group; the transform's ``nonfinite=`` policy (as
``HFRewardModelWrapper``'s) raises by default, and warns when asked."""

from __future__ import annotations

import pytest
import torch
from torchrl.collectors.llm import LLMCollector
from torchrl.data import LazyStackStorage, ReplayBuffer
from torchrl.envs import StepCounter
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer
from torchrl.modules.llm import TransformersWrapper
from torchrl.objectives.llm import MCAdvantage

from torchrl_trl_interop import RewardTransform
from torchrl_trl_interop.testing import toy_causal_lm, toy_prompts

pytestmark = pytest.mark.filterwarnings("ignore:The env passed to LLMCollector")


def scores_first_prompt_only(prompts, completions, **kwargs):
    """A TRL reward function that does not score the second of the toy prompts."""
    second = toy_prompts(2)[1]
    return [
        None if second in str(p) else 1.0 + len(c[-1]["content"])
        for p, c in zip(prompts, completions)
    ]


def collect(tok, **transform_kwargs):
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(
        [{"query": p} for p in toy_prompts(2)],
        batch_size=2,
        collate_fn=lambda rows: {"query": [r["query"] for r in rows]},
    )
    env = ChatEnv(batch_size=(2,), tokenizer=tok, input_mode="history")
    env = env.append_transform(DataLoadingPrimer(dataloader=loader, repeats=2, batch_size=(2,)))
    env = env.append_transform(StepCounter(max_steps=1))
    env = env.append_transform(RewardTransform(scores_first_prompt_only, **transform_kwargs))
    policy = TransformersWrapper(
        toy_causal_lm(tokenizer=tok),
        tokenizer=tok,
        input_mode="history",
        generate=True,
        generate_kwargs={"max_new_tokens": 4, "do_sample": True},
        pad_output=False,
    )
    rb = ReplayBuffer(storage=LazyStackStorage(8), transform=MCAdvantage(grpo_size=2))
    collector = LLMCollector(
        env, policy=policy, dialog_turns_per_batch=2, total_dialog_turns=4, replay_buffer=rb
    )
    try:
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    return rb[:]


def test_a_none_reward_is_an_error_by_default(left_tokenizer):
    with pytest.raises(ValueError, match=r"2 of 2 row\(s\) is NaN or infinite.*nonfinite=.warn."):
        collect(left_tokenizer)


def test_nonfinite_warn_writes_it_and_says_so(left_tokenizer):
    with pytest.warns(RuntimeWarning, match="returning None"):
        batch = collect(left_tokenizer, nonfinite="warn")
    reward = batch["next", "reward"].reshape(-1)
    assert reward.isnan().sum() == 2 and reward.isfinite().sum() == 2
    # what the default refuses: the NaN reaches its group's advantage
    assert batch["advantage"].reshape(len(batch), -1).isnan().any(-1).sum() == 2


def test_bad_nonfinite():
    with pytest.raises(ValueError, match="nonfinite='never'"):
        RewardTransform(scores_first_prompt_only, nonfinite="never")
