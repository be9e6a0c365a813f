"""Generation in another process: ``GRPOTrainer`` with a :class:`RemotePolicy` and weight sync.

The trainer process runs ``GRPOTrainer.train()`` on a toy model with
``as_trl_rollout_func(env, policy=RemotePolicy(...))``; the policy samples in a spawned process
and ``WeightSyncCallback`` pushes the trainer's weights there through torchrl's
``MultiProcessWeightSyncScheme``.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from torchrl_trl_interop import (
    RemotePolicy,
    StaleRolloutError,
    WeightSyncCallback,
    as_trl_rollout_func,
    trainer_generation_config,
    weights_checksum,
)
from torchrl_trl_interop.testing import (
    toy_causal_lm,
    toy_chat_env,
    toy_generator_policy,
    toy_grpo_args,
    toy_prompts,
    toy_tokenizer,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")]

TOL = 1e-4


def own_logprobs(model, prompt_ids, completion_ids, temperature):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    targets = torch.tensor(completion_ids)[:, None]
    p = len(prompt_ids)
    return logits[p - 1 : -1].log_softmax(-1).gather(-1, targets).squeeze(-1)


class Recorder:
    """The rollout function (set once the trainer exists), recording each call with its step."""

    rollout_func = None

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        self.calls.append((trainer.state.global_step, out))
        return out


class SyncChecker:
    """After each push: the generator's checksum equals the trainer's; keeps the pushed weights."""

    def __init__(self, sync, remote):
        self.sync, self.remote, self.snapshots, self.checked = sync, remote, {}, []

    def check(self, model):
        version, remote_sum = self.remote.weights_checksum()
        assert version == self.sync.version
        assert remote_sum == weights_checksum(model)
        snapshot = toy_causal_lm(tokenizer=toy_tokenizer())  # the weights pushed, by value
        snapshot.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.snapshots[version] = snapshot
        self.checked.append(version)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.check(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.sync.version == state.global_step:
            self.check(model)

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def version_reward(completions, policy_version, **kwargs):
    version_reward.seen.extend(policy_version)
    return [float(len(c[-1]["content"])) for c in completions]


version_reward.seen = []


def test_grpo_trains_with_a_generator_in_another_process(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    recorder = Recorder()
    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=version_reward,
        args=GRPOConfig(**toy_grpo_args(tmp_path, tokenizer=tok, max_steps=4)),
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": p}] for p in toy_prompts(16)]}
        ),
        processing_class=tok,
        rollout_func=recorder,
    )
    factory = partial(
        toy_generator_policy,
        trainer_generation_config(trainer, tok),
        temperature=trainer.temperature,
        seed=1,  # other initial weights than the trainer's: only the sync makes them equal
    )
    remote = RemotePolicy(factory, num_threads=1, timeout=120)
    try:
        recorder.rollout_func = as_trl_rollout_func(
            toy_chat_env(tok, batch_size=4), policy=remote, max_staleness=1
        )
        sync = WeightSyncCallback(remote, every_n_steps=2)
        checker = SyncChecker(sync, remote)
        trainer.add_callback(sync)
        trainer.add_callback(checker)
        before = weights_checksum(trainer.model)
        trainer.train()

        assert trainer.state.global_step == 4
        assert weights_checksum(trainer.model) != before
        assert checker.checked == [0, 2, 4]  # a push at train begin, then every 2 steps
        assert sync.version == 4 and len(sync.sync_seconds) == 3
        steps = [step for step, _ in recorder.calls]
        assert steps == [0, 1, 2, 3]
        staleness = []
        for step, out in recorder.calls:
            assert len(out["policy_version"]) == len(out["prompt_ids"]) == 4
            for i, version in enumerate(out["policy_version"]):
                assert version == step - step % 2  # the last push
                staleness.append(step - version)
                # log-probs are those of the weights that sampled: the trainer's at that version
                own = own_logprobs(
                    checker.snapshots[version],
                    out["prompt_ids"][i],
                    out["completion_ids"][i],
                    trainer.temperature,
                )
                torch.testing.assert_close(torch.tensor(out["logprobs"][i]), own, atol=TOL, rtol=0)
        assert max(staleness) == 1 and min(staleness) == 0
        # the reward function received every row's version
        assert version_reward.seen == [
            v for _, out in recorder.calls for v in out["policy_version"]
        ]
        logged = [h for h in trainer.state.log_history if "rollout/staleness_max" in h]
        assert [h["rollout/staleness_max"] for h in logged] == [0.0, 1.0, 0.0, 1.0]
    finally:
        remote.close()


def test_rows_older_than_max_staleness_are_refused(tmp_path):
    """A generator pushed every 3 steps with max_staleness=1: the third rollout is refused."""
    tok = toy_tokenizer()
    remote = RemotePolicy(partial(toy_generator_policy, temperature=1.0), num_threads=1)
    try:
        remote.update_policy_weights_(toy_causal_lm(tokenizer=tok), policy_version=0)
        rollout_func = as_trl_rollout_func(
            toy_chat_env(tok, batch_size=2), policy=remote, max_staleness=1
        )
        logged = []
        trainer = SimpleNamespace(
            state=SimpleNamespace(global_step=1),
            processing_class=tok,
            num_generations=2,
            model=SimpleNamespace(training=True),
            _log_metric=lambda name, value: logged.append((name, value)),
        )
        prompts = [[{"role": "user", "content": "Hi"}]] * 2
        out = rollout_func(prompts, trainer)
        assert out["policy_version"] == [0, 0]
        assert ("rollout/staleness_max", 1.0) in logged
        trainer.state.global_step = 2
        with pytest.raises(StaleRolloutError, match=r"2 steps behind .* max_staleness=1"):
            rollout_func(prompts, trainer)
    finally:
        remote.close()


def test_remote_policy_errors():
    remote = RemotePolicy(partial(toy_generator_policy))
    with pytest.raises(RuntimeError, match="not started.*update_policy_weights_"):
        remote.weights_checksum()
    with pytest.raises(TypeError, match="policy_factory must be a callable"):
        RemotePolicy("a policy")
    with pytest.raises(TypeError, match="cannot receive weights"):
        WeightSyncCallback("somewhere")
    with pytest.raises(ValueError, match="every_n_steps must be a positive int"):
        WeightSyncCallback(torch.nn.Linear(2, 2), every_n_steps=0)
    with pytest.raises(ValueError, match="max_staleness must be None or an int >= 0"):
        as_trl_rollout_func(toy_chat_env(), max_staleness=-1)


def _receive_into_linear(scheme, requests, replies):
    """A receiver process: a model that torchrl's scheme updates; reports its checksum."""
    model = torch.nn.Linear(4, 4)
    scheme.init_on_receiver(model_id="policy", model=model, worker_idx=0)
    scheme.connect(worker_idx=0)
    replies.put(weights_checksum(model))
    requests.get()  # wait while the sender pushes (the scheme's receiver thread applies)
    replies.put(weights_checksum(model))


def test_callback_sends_through_a_torchrl_scheme():
    """WeightSyncCallback(scheme): a MultiProcessWeightSyncScheme set up by the caller."""
    from torch import multiprocessing as mp
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    from torchrl_trl_interop.weights._tensors import model_weights

    trainer_model = torch.nn.Linear(4, 4)
    scheme = MultiProcessWeightSyncScheme()
    scheme.init_on_sender(weights=model_weights(trainer_model).clone(), devices=["cpu"])
    ctx = mp.get_context("spawn")
    requests, replies = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(
        target=_receive_into_linear, args=(scheme, requests, replies), daemon=True
    )
    receiver.start()
    try:
        scheme.connect()
        assert replies.get(timeout=60) == weights_checksum(trainer_model)
        with torch.no_grad():
            trainer_model.weight.add_(1.0)
        callback = WeightSyncCallback(scheme)
        callback.push(trainer_model, 3)  # blocks until the receiver acknowledged
        requests.put("check")
        assert replies.get(timeout=60) == weights_checksum(trainer_model)
        assert callback.version == 3
    finally:
        receiver.join(timeout=30)
        scheme.shutdown()
