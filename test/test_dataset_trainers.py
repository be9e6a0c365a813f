"""Real TRL trainers, trained for 2 steps, fed from torchrl replay buffers through the dataset."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import TorchRLBufferDataset
from torchrl_trl_interop.testing import toy_causal_lm, toy_reward_model, toy_trainer_args


def preference_buffer(n: int = 8) -> ReplayBuffer:
    prompts = [f"What is {i} plus {i}?" for i in range(n)]
    td = TensorDict(
        {
            "prompt": prompts,
            "chosen": [f" It is {2 * i}." for i in range(n)],
            "rejected": [" I do not know." for _ in range(n)],
        },
        batch_size=[n],
    )
    rb = ReplayBuffer(storage=LazyStackStorage(100))
    rb.extend(td)
    return rb


def weights_of(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(before, model):
    return any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


class TestRewardTrainer:
    @pytest.mark.parametrize("view", ["to_hf_dataset", "as_hf_dataset"])
    def test_trains_on_the_buffer(self, view, tokenizer, tmp_path):
        from trl import RewardConfig, RewardTrainer

        rb = preference_buffer()
        ds = TorchRLBufferDataset(rb, batch_size=4, num_batches=None)
        train = getattr(ds, view)()
        model = toy_reward_model("llama", tokenizer=tokenizer)
        before = weights_of(model)
        trainer = RewardTrainer(
            model=model,
            args=RewardConfig(max_length=64, **toy_trainer_args(tmp_path)),
            train_dataset=train,
            processing_class=tokenizer,
        )
        result = trainer.train()
        assert trainer.state.global_step == 2
        assert torch.isfinite(torch.tensor(result.training_loss))
        assert changed(before, model)


class TestGRPOTrainer:
    def test_trains_from_a_prompt_buffer(self, tokenizer, tmp_path):
        from trl import GRPOConfig, GRPOTrainer

        prompts = [f"Count to {i}:" for i in range(8)]
        td = TensorDict({"prompt": prompts, "target": torch.arange(8)}, batch_size=[8])
        rb = ReplayBuffer(storage=LazyTensorStorage(8))
        rb.extend(td)
        seen = []

        def length_reward(prompts, completions, completion_ids, target, **kwargs):
            seen.extend(zip(prompts, target))
            return [float(len(c)) for c in completions]

        model = toy_causal_lm(tokenizer=tokenizer)
        before = weights_of(model)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=GRPOConfig(
                num_generations=2,
                generation_batch_size=4,
                max_completion_length=4,
                learning_rate=1e-2,
                **toy_trainer_args(tmp_path),
            ),
            train_dataset=TorchRLBufferDataset(rb, batch_size=4).to_hf_dataset(),
            processing_class=tokenizer,
        )
        trainer.train()
        assert trainer.state.global_step == 2
        assert seen, "the reward function was never called"
        stored = dict(zip(prompts, range(8)))
        # Every row the trainer consumed is a stored row, columns intact.
        assert all(stored[p] == t for p, t in seen)
        assert changed(before, model)
