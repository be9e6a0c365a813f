"""``rollouts/_trainer.py``, the one reader of a TRL trainer, on a real ``GRPOTrainer``.

Each function is checked against what ``GRPOTrainer`` itself holds (built from the toy fixtures,
one optimizer step run), and the private attributes' version gate both ways: on the TRL
version measured the private attributes are read, on another the public fallback is taken or a
clear error names the attribute.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from torchrl_trl_interop import as_trl_rollout_func
from torchrl_trl_interop.rollouts import _trainer
from torchrl_trl_interop.rollouts._trainer import (
    attach_vllm_generation,
    distributed_backend,
    global_step,
    group_size,
    is_training,
    log_metrics,
    process_slice,
    sampling_temperature,
    trainer_accelerator,
    trainer_generation_config,
    trainer_model,
    trainer_reward_funcs,
    trainer_tokenizer,
    training_args,
    unwrapped_model,
    vllm_backend,
)
from torchrl_trl_interop.testing import (
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_prompts,
    toy_tokenizer,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    prompts = [[{"role": "user", "content": p}] for p in toy_prompts(4)]
    args = GRPOConfig(
        **toy_grpo_args(
            str(tmp_path_factory.mktemp("grpo")),
            tokenizer=tok,
            num_generations_eval=4,
            max_steps=1,
            temperature=0.7,
        )
    )
    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=toy_answer_length,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        rollout_func=as_trl_rollout_func(toy_chat_env(tok, batch_size=2)),
    )
    trainer.train()
    return trainer


@pytest.fixture
def unmeasured(monkeypatch):
    """The installed TRL taken for one the private attributes were not measured on."""
    monkeypatch.setattr(_trainer, "TRL_MEASURED", ("trl", "99.0", "100.0"))


class TestPublicReads:
    def test_model_and_accelerator(self, trainer):
        assert trainer_model(trainer) is trainer.model
        assert trainer_model(trainer, wrapped=True) is trainer.model_wrapped
        assert unwrapped_model(trainer) is trainer.accelerator.unwrap_model(trainer.model)
        assert trainer_accelerator(trainer) is trainer.accelerator
        assert training_args(trainer) is trainer.args

    def test_group_size_follows_the_mode(self, trainer):
        assert trainer.args.num_generations == 2 and trainer.num_generations_eval == 4
        try:
            trainer.model.train()
            assert is_training(trainer) and group_size(trainer) == 2
            trainer.model.eval()
            assert not is_training(trainer) and group_size(trainer) == 4
        finally:
            trainer.model.train()

    def test_process_slice_is_trls(self, trainer):
        index = trainer.accelerator.process_index
        assert process_slice(trainer, 4) == slice(index * 4, (index + 1) * 4)

    def test_step_temperature_rewards(self, trainer):
        assert global_step(trainer) == trainer.state.global_step == 1
        assert sampling_temperature(trainer) == 0.7
        assert trainer_reward_funcs(trainer) == [toy_answer_length]

    def test_generation_config_is_the_trainers(self, trainer):
        tok = trainer_tokenizer(trainer)
        config = trainer_generation_config(trainer, tok)
        assert config is not trainer.generation_config  # a copy: the trainer's stays as it is
        assert config.max_new_tokens == trainer.generation_config.max_new_tokens
        assert config.suppress_tokens == sorted(
            {*trainer.generation_config.suppress_tokens, tok.pad_token_id}
        )

    def test_vllm_backend(self, trainer):
        assert vllm_backend(trainer) is None  # use_vllm=False
        stand_in = SimpleNamespace(use_vllm=True, vllm_generation="backend", vllm_mode="colocate")
        assert vllm_backend(stand_in) == ("backend", "colocate")


class TestPrivateReads:
    def test_tokenizer_is_the_trainers(self, trainer, unmeasured):
        assert trainer_tokenizer(trainer) is trainer.processing_class  # the public fallback

    def test_tokenizer_of_a_processor(self, trainer):
        processor = SimpleNamespace(tokenizer=trainer.processing_class)
        stand_in = SimpleNamespace(processing_class=processor)
        assert trainer_tokenizer(stand_in) is trainer.processing_class

    def test_distributed_backend(self, trainer, unmeasured):
        measured = trainer._dist
        built = distributed_backend(trainer)  # trl.distributed.DistributedBackend(accelerator)
        assert built is not measured
        assert (built.is_zero3, built.is_fsdp) == (measured.is_zero3, measured.is_fsdp)

    def test_the_measured_version_reads_them(self, trainer, monkeypatch):
        assert distributed_backend(trainer) is trainer._dist
        monkeypatch.setattr(trainer, "_tokenizer", toy_tokenizer())
        assert trainer_tokenizer(trainer) is trainer._tokenizer

    def test_metrics_reach_the_step_log(self, trainer):
        """The one way: TRL averages them over processes into the step's metrics."""
        before = dict(trainer._pending_metrics)
        try:
            log_metrics(trainer, {"rollout/x": [1.0, 3.0], "rollout/y": [torch.tensor(2.0)]})
            assert trainer._pending_metrics["rollout/x"] == [1.0, 3.0]
            assert trainer._pending_metrics["rollout/y"] == [2.0]
        finally:
            trainer._pending_metrics.clear()
            trainer._pending_metrics.update(before)

    def test_metrics_on_another_trl_warn_once_then_log(self, trainer, unmeasured, monkeypatch):
        """Another trl whose trainer still has ``_log_metric``: logged, with one warning."""
        monkeypatch.setattr(_trainer, "_WARNED_UNMEASURED", [])
        before = {k: list(v) for k, v in trainer._pending_metrics.items()}
        try:
            with pytest.warns(UserWarning, match=r"GRPOTrainer\._log_metric: .*'trl>=99.0,<100.0'"):
                log_metrics(trainer, {"rollout/x": [1.0]})
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                log_metrics(trainer, {"rollout/x": [2.0]})  # warned once
            assert trainer._pending_metrics["rollout/x"] == [1.0, 2.0]
        finally:
            trainer._pending_metrics.clear()
            trainer._pending_metrics.update(before)

    def test_metrics_without_log_metric_name_the_attribute(self, unmeasured):
        stand_in = SimpleNamespace()
        with pytest.raises(
            RuntimeError, match=r"SimpleNamespace\._log_metric: .*rollout/x.*'trl>=99.0,<100.0'"
        ):
            log_metrics(stand_in, {"rollout/x": [1.0]})
        log_metrics(stand_in, {"rollout/x": []})  # nothing to log: nothing read

    def test_attach_vllm_generation(self, unmeasured):
        stand_in = SimpleNamespace()
        with pytest.raises(RuntimeError, match="_last_loaded_step"):
            attach_vllm_generation(stand_in, "backend")

    def test_staleness_metrics_reach_the_real_trainer(self, trainer):
        """A policy that stamps versions: the rollout function's staleness goes the one way."""
        from torchrl_trl_interop.weights._staleness import check_staleness

        before = dict(trainer._pending_metrics)
        try:
            log = lambda metrics: log_metrics(trainer, metrics)  # noqa: E731
            assert check_staleness([1, 0], global_step(trainer), None, log=log) == [0, 1]
            assert trainer._pending_metrics["rollout/staleness_mean"] == [0.5]
            assert trainer._pending_metrics["rollout/staleness_max"] == [1.0]
        finally:
            trainer._pending_metrics.clear()
            trainer._pending_metrics.update(before)
