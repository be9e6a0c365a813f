"""TRL's AsyncGRPO seams over TorchRL: ``TorchRLRolloutWorker`` and ``TorchRLWeightTransfer``.

``AsyncGRPOTrainer`` itself cannot run here (it needs a vLLM server and loads an FA3 kernel from
the Hub for its tree attention), so these tests drive the two objects the way it does
(``_TrainBeginCallback``, ``_sync_weight_merged``: pause, send, resume, version + 1,
``update_model_version``) and read the queue with TRL's own ``RolloutQueueDataset``.
"""

from __future__ import annotations

import inspect
import queue
import time
from collections import defaultdict

import numpy as np
import pytest
import torch

from torchrl_trl_interop import RewardTransform, TorchRLRolloutWorker, TorchRLWeightTransfer
from torchrl_trl_interop.testing import (
    IM_START,
    toy_buffer,
    toy_causal_lm,
    toy_primed_chat_env,
    toy_template_tokenizer,
    toy_tokenizer,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are importing from 'trl.experimental'")

TOL = 1e-4


def answer_length(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


def own_logprobs(model, input_ids, mask):
    ids = torch.as_tensor(input_ids)[None]
    with torch.no_grad():
        scores = model(input_ids=ids).logits[0].float().log_softmax(-1)
    mask = torch.as_tensor(mask, dtype=torch.bool)
    out = torch.zeros(len(input_ids))
    out[1:] = scores[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
    return out.masked_fill(~mask, 0.0)


def trl_named_params(model):
    """What AsyncGRPOTrainer streams: trainable parameters by their HF names."""
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    return ((name, p.detach()) for name, p in _iter_vllm_named_params(model))


def snapshot(model):
    copy = toy_causal_lm(tokenizer=toy_tokenizer())
    copy.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return copy


@pytest.fixture
def collector_setup():
    from torchrl.collectors.llm import LLMCollector
    from torchrl.modules.llm import TransformersWrapper

    tok = toy_tokenizer(padding_side="left")
    env = toy_primed_chat_env(
        tok, repeats=2, batch_size=2, transforms=[RewardTransform(answer_length)]
    )
    # torchrl's own wrapper: its first response log-prob is 0.0, the worker rescores
    policy = TransformersWrapper(
        toy_causal_lm(tokenizer=tok, seed=1),
        tokenizer=tok,
        input_mode="history",
        generate=True,
        generate_kwargs={"max_new_tokens": 4, "do_sample": True},
        pad_output=False,
    )
    collector = LLMCollector(
        env, policy=policy, dialog_turns_per_batch=4, track_policy_version=True
    )
    yield collector, policy
    collector.shutdown()


def sync(transfer, worker, trainer_model, trainer_version):
    """``AsyncGRPOTrainer._sync_weight_merged`` on rank 0, without the vLLM client."""
    transfer.pause()
    transfer.send_weights(trl_named_params(trainer_model))
    transfer.resume()
    worker.update_model_version(trainer_version + 1)
    return trainer_version + 1


def take_samples(worker, n, timeout=120):
    """``n`` RolloutSamples from the worker's queue, checking its health when the queue is empty
    (as ``AsyncGRPOTrainer``'s ``RolloutQueueDataset`` does)."""
    samples, deadline = [], time.monotonic() + timeout
    while len(samples) < n and time.monotonic() < deadline:
        try:
            samples.append(worker.rollout_buffer.get(timeout=1))
        except queue.Empty:
            worker.check_health(stale_after_s=timeout)
    assert len(samples) == n
    return samples


def test_protocols_are_implemented():
    from trl.experimental.async_grpo.async_grpo_trainer import (
        RolloutWorkerProtocol,
        WeightTransferProtocol,
    )

    for protocol, cls in (
        (RolloutWorkerProtocol, TorchRLRolloutWorker),
        (WeightTransferProtocol, TorchRLWeightTransfer),
    ):
        for name, member in vars(protocol).items():
            if callable(member) and not name.startswith("_"):
                ours = inspect.signature(getattr(cls, name))
                assert list(ours.parameters) == list(inspect.signature(member).parameters), name
    worker = TorchRLRolloutWorker(toy_buffer(0), num_generations=2)
    assert {"rollout_buffer", "metrics_queue"} <= set(vars(worker))


def test_worker_over_a_collector(collector_setup):
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    collector, policy = collector_setup
    trainer_model = toy_causal_lm(tokenizer=toy_tokenizer())  # seed 0: not the policy's weights
    # a bounded queue: after a transfer at most 4 queued samples + the rows the thread holds (one
    # batch of 4 here: groups never span batches) come from older weights. Unbounded, the thread
    # may queue any number of version-1 samples before the second transfer takes its lock.
    worker = TorchRLRolloutWorker(collector, num_generations=2, queue_maxsize=4)
    transfer = TorchRLWeightTransfer(collector, worker=worker)

    # _TrainBeginCallback: init, cold sync (version 0 -> 1), start
    transfer.init_weight_transfer()
    version = sync(transfer, worker, trainer_model, 0)
    assert version == worker.model_version == transfer.version == 1
    assert collector.policy_version == 1
    assert set(transfer.sent_names) == {n for n, _ in trainer_model.named_parameters()}
    snapshots = {1: snapshot(trainer_model)}
    worker.start()

    first = take_samples(worker, 4)
    # one optimizer step on the trainer's model, then the second sync (version 2)
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    version = sync(transfer, worker, trainer_model, version)
    snapshots[2] = snapshot(trainer_model)
    later = take_samples(worker, 12)  # at most 8 of version 1, then version 2 only
    worker.stop()
    assert worker.metrics_queue.get_nowait() == {"rollout/groups_total": 1.0}

    samples = first + later
    assert all(isinstance(s, RolloutSample) for s in samples)
    assert {s.model_version for s in first} == {1}
    # the versions advanced after the push, within the queue's bound
    versions = [s.model_version for s in later]
    assert versions == sorted(versions) and versions.count(1) <= 4 + 4 and versions[-1] == 2
    groups = defaultdict(list)
    for s in samples:
        groups[s.group_id].append(s)
        mask = s.completion_mask
        assert s.input_ids.dtype == np.int64 and mask.dtype == np.int64
        assert s.old_log_probs.dtype == np.float32 and len(s.old_log_probs) == len(s.input_ids)
        n_prompt = int((mask == 0).sum())
        assert mask.tolist() == [0] * n_prompt + [1] * (len(mask) - n_prompt)
        assert s.prompt[-1]["role"] == "user" and s.completion[-1]["role"] == "assistant"
        assert s.metrics["reward"] == float(len(s.completion[-1]["content"]))
        # old log-probs are the behaviour policy's at that version, the first token included
        own = own_logprobs(snapshots[s.model_version], s.input_ids, mask)
        torch.testing.assert_close(torch.from_numpy(s.old_log_probs), own, atol=TOL, rtol=0)
        assert s.old_log_probs[n_prompt] != 0.0
    assert sorted(groups) == list(range(len(groups)))
    for group in groups.values():
        assert len(group) == 2
        assert len({tuple(s.input_ids[(s.completion_mask == 0)]) for s in group}) == 1
        rewards = np.array([s.metrics["reward"] for s in group])
        expected = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        np.testing.assert_allclose([s.advantage for s in group], expected, atol=1e-6)

    # TRL's consumer reads such a queue; at trainer version 2 with max_staleness=0 it drops v1
    replay = queue.Queue()
    for s in samples:
        replay.put(s)
    from accelerate import PartialState

    PartialState()  # TRL's dataset logs through accelerate, as inside its trainer
    metrics = defaultdict(list)
    dataset = RolloutQueueDataset(replay, lambda: 2, lambda _: None, 60, metrics, max_staleness=0)
    fresh = [s for s in samples if s.model_version == 2]
    stream = iter(dataset)
    read = [next(stream) for _ in fresh]
    assert [r["group_id"] for r in read] == [s.group_id for s in fresh]
    assert all(np.array_equal(r["old_log_probs"], s.old_log_probs) for r, s in zip(read, fresh))
    assert len(metrics["sample/dropped_stale_total"]) == len(samples) - len(fresh)


def test_check_health_reports_a_failed_thread():
    class Broken:
        policy = None
        update_policy_weights_ = None

        def __iter__(self):
            raise ValueError("the environment broke")

    worker = TorchRLRolloutWorker(Broken(), num_generations=2, score_model=False)
    with pytest.raises(RuntimeError, match="not running"):
        worker.check_health(10)
    worker.start()
    worker._thread.join(timeout=10)
    with pytest.raises(RuntimeError, match="rollout thread failed") as info:
        worker.check_health(10)
    assert "the environment broke" in str(info.value.__cause__)
    with pytest.raises(TypeError, match="holds no module"):
        TorchRLWeightTransfer("a policy")
    with pytest.raises(ValueError, match="num_generations must be a positive int"):
        TorchRLRolloutWorker(Broken(), num_generations=0)


def test_worker_over_a_padded_policy():
    """A ``pad_output=True`` policy: the padding of prompts and answers is cut by its masks."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.modules.llm import TransformersWrapper

    tok = toy_tokenizer(padding_side="left")
    # two prompts per batch (different lengths: left padding), answers that stop early
    prompts = ["Hi", "What is two plus two?", "Hello world!", "The quick brown fox jumps."]
    env = toy_primed_chat_env(tok, prompts=prompts, repeats=2, batch_size=4)
    banned = [[tok.pad_token_id], [tok.convert_tokens_to_ids(IM_START)]]
    model = toy_causal_lm(tokenizer=tok, seed=1, eos_bias=4.0)
    policy = TransformersWrapper(
        model,
        tokenizer=tok,
        input_mode="history",
        generate=True,
        pad_output=True,
        return_log_probs=True,
        generate_kwargs={"max_new_tokens": 6, "do_sample": True, "bad_words_ids": banned},
    )
    collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8)
    worker = TorchRLRolloutWorker(collector, num_generations=2)
    worker.start()
    try:
        samples = take_samples(worker, 8)
    finally:
        worker.stop()
        collector.shutdown()

    prompt_lengths, stopped = set(), 0
    for s in samples:
        n_prompt = int((s.completion_mask == 0).sum())
        prompt, completion = s.input_ids[:n_prompt].tolist(), s.input_ids[n_prompt:].tolist()
        rendered = tok.apply_chat_template(s.prompt, add_generation_prompt=True)
        assert prompt == list(rendered["input_ids"])  # no left padding
        assert tok.pad_token_id not in completion and tok.eos_token_id not in completion[:-1]
        own = own_logprobs(model, s.input_ids, s.completion_mask)  # rescored, padding cut
        torch.testing.assert_close(torch.from_numpy(s.old_log_probs), own, atol=TOL, rtol=0)
        prompt_lengths.add(n_prompt)
        stopped += completion[-1] == tok.eos_token_id and len(completion) < 6
    assert len(prompt_lengths) > 1 and stopped  # padding on both sides was cut


def test_check_health_says_why_the_thread_ended():
    from torchrl.collectors.llm import LLMCollector

    from torchrl_trl_interop.testing import toy_generator_policy

    collector = LLMCollector(
        toy_primed_chat_env(),
        policy=toy_generator_policy(),
        dialog_turns_per_batch=2,
        total_dialog_turns=4,
    )
    worker = TorchRLRolloutWorker(collector, num_generations=2)
    worker.start()
    worker._thread.join(timeout=120)
    with pytest.raises(RuntimeError, match=r"finished after 2 batches \(its total_dialog_turns=4"):
        worker.check_health(10)
    assert worker.rollout_buffer.qsize() == 4  # every rollout reached the queue first
    collector.shutdown()

    waiting = TorchRLRolloutWorker(toy_buffer(0), num_generations=2)  # a buffer: waits for rows
    waiting.start()
    waiting.check_health(10)
    waiting.stop()
    with pytest.raises(RuntimeError, match=r"stop\(\) was called"):
        waiting.check_health(10)


def spread_reward(prompts, completions, **kwargs):
    """Answer length parity, but a constant for two of the toy prompts: their groups never spread."""
    flat = ("What is 0 plus 0?", "What is 2 plus 4?")
    return [
        0.0 if p[-1]["content"] in flat else float(len(c[-1]["content"]) % 2)
        for p, c in zip(prompts, completions)
    ]


def drain(q):
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class TestWorkerDynamicSampling:
    def test_no_zero_std_group_is_queued(self):
        from torchrl.collectors.llm import LLMCollector

        from torchrl_trl_interop.testing import toy_generator_policy

        # K = 4 candidates per prompt (the primer's repeats), num_generations = 2 kept
        env = toy_primed_chat_env(
            repeats=4, batch_size=4, transforms=[RewardTransform(spread_reward)]
        )
        collector = LLMCollector(env, policy=toy_generator_policy(), dialog_turns_per_batch=4)
        worker = TorchRLRolloutWorker(
            collector, num_generations=2, candidate_group_size=4, drop_zero_std=True
        )
        worker.start()
        try:
            samples = take_samples(worker, 8)
        finally:
            worker.stop()
            collector.shutdown()
        samples += drain(worker.rollout_buffer)
        metrics = drain(worker.metrics_queue)

        groups = defaultdict(list)
        for s in samples:
            groups[s.group_id].append(s)
            assert s.prompt[-1]["content"] not in ("What is 0 plus 0?", "What is 2 plus 4?")
        for group in groups.values():
            rewards = [s.metrics["reward"] for s in group]
            assert len(group) == 2 and len(set(rewards)) == 2  # spread, whole
            assert group[0].metrics["reward_std"] > 0 and {s.advantage > 0 for s in group} == {
                True,
                False,
            }
        selected = [m for m in metrics if "rollout/candidates" in m]
        dropped = [m for m in selected if "rollout/dropped_zero_std_total" in m]
        queued = sum(m.get("rollout/groups_total", 0.0) for m in metrics)
        assert all(m["rollout/candidates"] == 4.0 for m in selected)
        # every candidate's reward, kept or not: (sum, count) of the 4
        assert all(m["rollout/candidate_reward_mean"][1] == 4.0 for m in selected)
        assert {m["rollout/candidate_reward_mean"][0] for m in dropped} <= {0.0, 4.0}
        assert len(selected) == len(dropped) + queued and queued == len(groups)
        assert dropped and all(m["rollout/dropped_zero_std_total"] == 2.0 for m in dropped)
        # the rates: a group is flat after selection only if it was before, and then dropped
        for m in selected:
            (before, one), (after, _) = (
                m["rollout/zero_std_groups_before"],
                m["rollout/zero_std_groups_after"],
            )
            assert one == 1.0 and after <= before and (after == 1.0) == (m in dropped)

    def test_groups_are_queued_whole(self):
        """A bounded queue with room for half a group: the group waits, and is not queued at stop."""
        from torchrl.collectors.llm import LLMCollector

        from torchrl_trl_interop.testing import toy_generator_policy

        collector = LLMCollector(
            toy_primed_chat_env(), policy=toy_generator_policy(), dialog_turns_per_batch=2
        )
        worker = TorchRLRolloutWorker(collector, num_generations=2, queue_maxsize=3)
        worker.start()
        deadline = time.monotonic() + 120
        while worker._batches < 2 and time.monotonic() < deadline:  # the 2nd group is waiting
            worker.check_health(120)
            time.sleep(0.05)
        worker.stop()
        collector.shutdown()
        queued = drain(worker.rollout_buffer)
        assert len(queued) == 2 and queued[0].group_id == queued[1].group_id == 0

    def test_errors(self):
        from torchrl.collectors.llm import LLMCollector

        from torchrl_trl_interop.testing import toy_generator_policy

        source = toy_buffer(0)
        with pytest.raises(
            ValueError, match="candidate_group_size=3 is smaller than num_generations=4"
        ):
            TorchRLRolloutWorker(source, num_generations=4, candidate_group_size=3)
        with pytest.raises(ValueError, match="queue_maxsize=1 cannot hold a whole group"):
            TorchRLRolloutWorker(source, num_generations=2, queue_maxsize=1)
        with pytest.raises(TypeError, match="drop_zero_std must be a bool"):
            TorchRLRolloutWorker(source, num_generations=2, drop_zero_std="yes")
        # no reward to select by: the thread fails, check_health says why
        collector = LLMCollector(
            toy_primed_chat_env(), policy=toy_generator_policy(), dialog_turns_per_batch=2
        )
        worker = TorchRLRolloutWorker(collector, num_generations=2, drop_zero_std=True)
        worker.start()
        worker._thread.join(timeout=120)
        collector.shutdown()
        with pytest.raises(RuntimeError, match="rollout thread failed") as info:
            worker.check_health(10)
        assert "select groups by their reward at ('next', 'reward')" in info.value.__cause__.args[0]


class TestChatFormats:
    """The worker's rows are the tokenizer's own chat format (issue 53)."""

    @staticmethod
    def collector(tok, policy):
        from torchrl.collectors.llm import LLMCollector

        env = toy_primed_chat_env(tok, repeats=2, batch_size=2)
        return LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8)

    def test_a_policy_prompting_in_another_format_is_refused(self):
        from torchrl.modules.llm import TransformersWrapper
        from trl.chat_template_utils import llama3_1_chat_template

        tok = toy_template_tokenizer(llama3_1_chat_template)
        policy = TransformersWrapper(
            toy_causal_lm(tokenizer=tok), tokenizer=tok, input_mode="history", generate=True
        )
        collector = self.collector(tok, policy)
        try:
            with pytest.raises(ValueError, match=r"torchrl's template pick.*llama3_1\.jinja"):
                TorchRLRolloutWorker(collector, num_generations=2)
            # named, it passes: the policy renders what the tokenizer renders
            policy.chat_template = tok.chat_template
            TorchRLRolloutWorker(collector, num_generations=2)
        finally:
            collector.shutdown()

    def test_trainer_model_policy_rows_are_the_templates_tokens(self):
        from transformers import GenerationConfig
        from trl.chat_template_utils import llama3_1_chat_template

        from torchrl_trl_interop import TrainerModelPolicy

        tok = toy_template_tokenizer(llama3_1_chat_template, adds_bos=True)
        config = GenerationConfig(
            max_new_tokens=4,
            do_sample=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok, seed=1), tok, config, 1.0)
        collector = self.collector(tok, policy)
        worker = TorchRLRolloutWorker(collector, num_generations=2)
        worker.start()
        try:
            samples = take_samples(worker, 4)
        finally:
            worker.stop()
            collector.shutdown()
        for s in samples:
            n_prompt = int((s.completion_mask == 0).sum())
            prompt, completion = s.input_ids[:n_prompt].tolist(), s.input_ids[n_prompt:].tolist()
            rendered = tok.apply_chat_template(s.prompt, add_generation_prompt=True)
            assert prompt == list(rendered["input_ids"])  # Llama 3.1's format, bos once
            assert prompt.count(tok.bos_token_id) == 1
            ended = completion[-1] == tok.eos_token_id
            text = tok.decode(completion[:-1] if ended else completion, skip_special_tokens=False)
            assert s.completion[-1]["content"] == text  # read with the template's stop token


def test_source_must_be_a_collector_or_a_buffer():
    with pytest.raises(TypeError, match=r"'not a collector'.*LLMCollector"):
        TorchRLRolloutWorker("not a collector", num_generations=2)
