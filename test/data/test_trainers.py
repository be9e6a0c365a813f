"""Proof: real TRL trainers train (offline, tiny models, 2 steps) on data from TorchRL buffers.

Each test feeds a trainer from a torchrl ``ReplayBuffer`` through this package and checks that
the rows the trainer consumed are exactly the rows the buffer held: recorded in the data
collator (Reward, DPO, SFT) or in a reward function (GRPO), and compared with the buffer.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from tensordict import TensorDict, set_list_to_stack
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    TorchRLBufferDataset,
    TRLRewardFuncWrapper,
    as_trl_reward_func,
    build_preference_pairs,
    history_to_messages,
    messages_to_history,
)
from torchrl_trl_interop.testing import (
    toy_causal_lm,
    toy_chats,
    toy_reward_model,
    toy_tokenizer,
    toy_trainer_args,
)

QUESTIONS = ["What is two plus two?", "Hello world!", "How are you today?", "The quick brown fox"]
ANSWERS = ["Four.", "Two plus two is four.", "The lazy dog.", "Hello!", "I am fine.", "0 1 2"]


def common_args(tmp_path) -> dict:
    return toy_trainer_args(tmp_path, bf16=False)


def chat_ids(tok, messages, **kwargs) -> list[int]:
    """Token ids of a conversation rendered with the tokenizer's chat template."""
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"]


def assert_trained(trainer) -> None:
    assert trainer.state.global_step == 2
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


class RecordingCollator:
    """Wraps a trainer's data collator and records every example it is given."""

    def __init__(self, collator):
        self.collator = collator
        self.examples: list[dict] = []

    def __call__(self, examples):
        self.examples.extend(dict(e) for e in examples)
        return self.collator(examples)


def record_collator(trainer) -> RecordingCollator:
    recorder = RecordingCollator(trainer.data_collator)
    trainer.data_collator = recorder
    return recorder


def buffer_rows(rb: ReplayBuffer) -> list[dict]:
    """Every stored row as Python values (History -> message lists), read from the storage."""
    with set_list_to_stack(True):
        stored = rb[:]
        rows = []
        for i in range(len(rb)):
            row = {}
            for key in ("prompt", "chosen", "rejected", "margin"):
                if key in stored.keys():
                    value = stored[i].get(key)
                    row[key] = (
                        value.item()
                        if isinstance(value, torch.Tensor)
                        else history_to_messages(value)
                    )
            rows.append(row)
    return rows


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def scored_pairs(tok):
    """Preference pairs built from scored rollouts: 4 prompts x 3 completions, [E, G] layout.

    The rollouts are scored on the TorchRL side by a reward model (HFRewardModelWrapper) and a
    Python function, both run by one TRLRewardFuncWrapper, then turned into pairs.
    """
    system = {"role": "system", "content": "You are a helpful assistant."}
    rollouts = [
        [
            [system, {"role": "user", "content": q}, {"role": "assistant", "content": a}]
            for a in (ANSWERS[e], ANSWERS[e + 1], ANSWERS[e + 2])
        ]
        for e, q in enumerate(QUESTIONS)
    ]
    td = TensorDict({"history": {"full": messages_to_history(rollouts)}}, batch_size=[4, 3])
    rm = HFRewardModelWrapper(
        toy_reward_model("llama", tokenizer=tok, seed=1),
        tokenizer=tok,
        history_key=("history", "full"),
        inference_mode=True,
    )

    def brevity(completions, **kwargs):
        return [-0.1 * len(c[0]["content"]) for c in completions]

    scorer = TRLRewardFuncWrapper([as_trl_reward_func(rm), brevity])
    td = scorer(td)
    rb = build_preference_pairs(td)
    assert len(rb) == 4  # every group has distinct rewards
    return rb


def test_reward_trainer(tmp_path, tok, scored_pairs):
    from trl import RewardConfig, RewardTrainer

    data = TorchRLBufferDataset(scored_pairs, batch_size=4).to_hf_dataset()
    trainer = RewardTrainer(
        model=toy_reward_model("llama", tokenizer=tok),
        args=RewardConfig(**common_args(tmp_path), max_length=256),
        train_dataset=data,
        processing_class=tok,
    )
    recorder = record_collator(trainer)
    trainer.train()
    assert_trained(trainer)

    # The 4 pairs are consumed once each (2 steps x 2), tokenized from exactly the buffer rows.
    expected = Counter(
        (
            tuple(chat_ids(tok, row["prompt"] + row["chosen"])),
            tuple(chat_ids(tok, row["prompt"] + row["rejected"])),
            row["margin"],
        )
        for row in buffer_rows(scored_pairs)
    )
    consumed = Counter(
        (tuple(e["chosen_ids"]), tuple(e["rejected_ids"]), e["margin"]) for e in recorder.examples
    )
    assert consumed == expected


def test_dpo_trainer(tmp_path, tok, scored_pairs):
    from trl import DPOConfig, DPOTrainer

    data = TorchRLBufferDataset(scored_pairs, batch_size=4).to_hf_dataset()
    trainer = DPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        ref_model=toy_causal_lm(tokenizer=tok),
        args=DPOConfig(**common_args(tmp_path), max_length=256),
        train_dataset=data,
        processing_class=tok,
    )
    recorder = record_collator(trainer)
    trainer.train()
    assert_trained(trainer)

    expected = Counter()
    for row in buffer_rows(scored_pairs):
        prompt = chat_ids(tok, row["prompt"], add_generation_prompt=True)
        chosen = chat_ids(tok, row["prompt"] + row["chosen"])
        rejected = chat_ids(tok, row["prompt"] + row["rejected"])
        assert chosen[: len(prompt)] == prompt and rejected[: len(prompt)] == prompt
        expected[(tuple(prompt), tuple(chosen[len(prompt) :]), tuple(rejected[len(prompt) :]))] += 1
    consumed = Counter(
        (tuple(e["prompt_ids"]), tuple(e["chosen_ids"]), tuple(e["rejected_ids"]))
        for e in recorder.examples
    )
    assert consumed == expected


def train_grpo(tmp_path, tok, data, reward_funcs):
    """Two GRPO steps of 2 prompts x 2 generations: every row of a 4-row dataset, twice each."""
    from trl import GRPOConfig, GRPOTrainer

    config = {**common_args(tmp_path), "per_device_train_batch_size": 4, "num_generations": 2}
    config.update(max_completion_length=4, temperature=1.0)
    model = toy_causal_lm(tokenizer=tok)
    args = GRPOConfig(**config)
    trainer = GRPOTrainer(model, reward_funcs, args, train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2
    return trainer


def test_grpo_trainer(tmp_path, tok):

    # A buffer of History prompts (plus an extra column that reward functions receive).
    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS]
    rb = ReplayBuffer(storage=LazyStackStorage(10))
    rb.extend(
        TensorDict(
            {
                "history": {"prompt": messages_to_history(prompts)},
                "answer": ["four", "hello", "fine", "dog"],
            },
            batch_size=[4],
        )
    )
    data = TorchRLBufferDataset(
        rb, batch_size=4, rename={("history", "prompt"): "prompt"}
    ).to_hf_dataset()

    rm = HFRewardModelWrapper(
        toy_reward_model("llama", tokenizer=tok),
        tokenizer=tok,
        history_key=("history", "full"),
        inference_mode=True,
    )
    reward_model_func = as_trl_reward_func(rm)
    seen: list[tuple] = []

    def mentions_answer(prompts, completions, completion_ids, answer, **kwargs):
        assert "trainer_state" in kwargs
        seen.extend(
            (tuple(tuple(sorted(m.items())) for m in p), a) for p, a in zip(prompts, answer)
        )
        return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]

    trainer = train_grpo(tmp_path, tok, data, [reward_model_func, mentions_answer])
    metrics = {k for log in trainer.state.log_history for k in log}
    assert "rewards/HFRewardModelWrapper/mean" in metrics
    assert "rewards/mentions_answer/mean" in metrics

    # 2 steps x 2 prompts x 2 generations: every buffer row, each repeated num_generations times.
    stored = [
        (tuple(tuple(sorted(m.items())) for m in p), a)
        for p, a in zip(prompts, ["four", "hello", "fine", "dog"])
    ]
    assert Counter(seen) == Counter({row: 2 for row in stored})


def test_grpo_reward_function_gets_scores_as_written(tmp_path, tok):
    """Regression (issue 20, item 4): a ``score`` column written as Python numbers (``1`` is
    stored as int64, ``0.5`` as float32, one row each) was typed from row 0: the reward function
    of a real GRPOTrainer received ``0`` for ``0.5``."""
    scores = [1, 0.5, 2, 0.25]
    rb = ReplayBuffer(storage=LazyStackStorage(4))
    for question, score in zip(QUESTIONS, scores):
        rb.add(TensorDict({"prompt": question, "score": score}))
    data = TorchRLBufferDataset(rb, batch_size=4).to_hf_dataset()
    seen: list[tuple] = []

    def stored_score(prompts, completions, score, **kwargs):
        seen.extend(zip(prompts, score))
        return [float(s) for s in score]

    train_grpo(tmp_path, tok, data, [stored_score])
    assert Counter(seen) == Counter({(q, float(s)): 2 for q, s in zip(QUESTIONS, scores)})


def test_sft_trainer(tmp_path, tok):
    from trl import SFTConfig, SFTTrainer

    chats = toy_chats(4)
    rb = ReplayBuffer(storage=LazyStackStorage(10))
    rb.extend(TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[4]))
    data = TorchRLBufferDataset(
        rb, batch_size=4, rename={("history", "full"): "messages"}
    ).to_hf_dataset()
    assert data["messages"] == chats

    trainer = SFTTrainer(
        model=toy_causal_lm(tokenizer=tok),
        args=SFTConfig(**common_args(tmp_path), max_length=256),
        train_dataset=data,
        processing_class=tok,
    )
    recorder = record_collator(trainer)
    trainer.train()
    assert_trained(trainer)

    with set_list_to_stack(True):
        stored = history_to_messages(rb[:].get(("history", "full")))
    expected = Counter(tuple(chat_ids(tok, c)) for c in stored)
    consumed = Counter(tuple(e["input_ids"]) for e in recorder.examples)
    assert consumed == expected


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


# Standard-format (string) rows, on both Hugging Face views and a tensor storage.


class TestStandardFormat:
    @pytest.mark.parametrize("view", ["to_hf_dataset", "as_hf_dataset"])
    def test_reward_trainer_on_both_views(self, view, tokenizer, tmp_path):
        from trl import RewardConfig, RewardTrainer

        rb = preference_buffer()
        ds = TorchRLBufferDataset(rb, batch_size=4, num_batches=None)
        train = getattr(ds, view)()
        model = toy_reward_model("llama", tokenizer=tokenizer)
        before = weights_of(model)
        trainer = RewardTrainer(
            model=model,
            args=RewardConfig(max_length=64, **toy_trainer_args(tmp_path, bf16=False)),
            train_dataset=train,
            processing_class=tokenizer,
        )
        result = trainer.train()
        assert trainer.state.global_step == 2
        assert torch.isfinite(torch.tensor(result.training_loss))
        assert changed(before, model)

    def test_grpo_trains_from_a_prompt_buffer(self, tokenizer, tmp_path):
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
                **toy_trainer_args(tmp_path, bf16=False),
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
