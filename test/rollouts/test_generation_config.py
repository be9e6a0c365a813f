"""``trainer_generation_config`` from a ``GRPOConfig`` equals the one from the trainer it builds.

A generator in another process is built before the trainer whose rollout function calls it
(``docs/remote.rst``, layout 2): its ``GenerationConfig`` comes from the trainer's arguments.
"""

from __future__ import annotations

import pytest

from torchrl_trl_interop import trainer_generation_config
from torchrl_trl_interop.testing import (
    IM_START,
    toy_answer_length,
    toy_causal_lm,
    toy_prompts,
    toy_tokenizer,
    toy_trainer_args,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")


@pytest.mark.parametrize("extra_eos", [False, True])
def test_config_from_args_is_the_trainers(tmp_path, extra_eos):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    model = toy_causal_lm(tokenizer=tok)
    if extra_eos:  # the model declares another end-of-turn id: the trainer stops on both
        model.generation_config.eos_token_id = [
            tok.eos_token_id,
            tok.convert_tokens_to_ids(IM_START),
        ]
    args = GRPOConfig(
        num_generations=2,
        max_completion_length=5,
        temperature=0.7,
        top_k=20,
        repetition_penalty=1.1,
        generation_kwargs={"no_repeat_ngram_size": 3},
        **toy_trainer_args(tmp_path, bf16=False),
    )
    before = trainer_generation_config(args, tok, model=model).to_dict()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=toy_answer_length,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": toy_prompts(4)}),
        processing_class=tok,
        rollout_func=lambda prompts, trainer: {},
    )
    assert before == trainer_generation_config(trainer, tok).to_dict()
    assert before["max_new_tokens"] == 5 and before["no_repeat_ngram_size"] == 3
    assert len(before["eos_token_id"]) == (2 if extra_eos else 1)
