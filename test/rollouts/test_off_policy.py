"""Off-policy rollouts at the seam: the behaviour policy's log-probs, and TRL's OPSM reading them.

A :class:`RemotePolicy` samples in another process with weights that lag behind the trainer's.
The rollout function returns, per token, the log-probs of the weights that sampled that token
(per turn: weights may change between two turns), and ``GRPOTrainer`` without vLLM reads them
only through off-policy sequence masking (``GRPOConfig(off_policy_mask_threshold=...)``): it masks
a stale, diverged rollout with a negative advantage and keeps a fresh one, on a real step.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from tensordict.nn import TensorDictModuleBase

from torchrl_trl_interop import (
    RemotePolicy,
    RewardTransform,
    WeightSyncCallback,
    as_trl_rollout_func,
    trainer_generation_config,
)
from torchrl_trl_interop.testing import (
    arithmetic_questions,
    toy_answer_length,
    toy_causal_lm,
    toy_chat_env,
    toy_generator_policy,
    toy_grpo_args,
    toy_tokenizer,
)

TOL = 1e-4
DELTA = 0.05  # OPSM's threshold on a sequence's mean log(pi_old / pi_theta)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")]


def grpo_args(tmp_path, **overrides):
    from trl import GRPOConfig

    return GRPOConfig(**toy_grpo_args(tmp_path, **overrides))


@pytest.fixture
def remote(tmp_path_factory):
    """A generator in another process, sampling as a GRPOTrainer of ``grpo_args`` would (one
    per test, its sampling seeded: a fresh process samples the same tokens for the same calls)."""
    tok = toy_tokenizer()
    args = grpo_args(tmp_path_factory.mktemp("args"))
    config = trainer_generation_config(args, tok, model=toy_causal_lm(tokenizer=tok))
    policy = RemotePolicy(
        partial(toy_generator_policy, config, temperature=args.temperature, seed=1, sample_seed=0),
        num_threads=1,
        timeout=120,
    )
    yield policy
    policy.close()


def own_logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n = len(prompt_ids)
    return logits[n - 1 : -1].log_softmax(-1).gather(-1, ids[0, n:, None]).squeeze(-1)


class PushAfterFirstTurn(TensorDictModuleBase):
    """The remote policy; after its first call, the generator gets other weights (version 1)."""

    def __init__(self, remote, weights):
        super().__init__()
        self.remote, self.weights, self.calls = remote, weights, 0
        self.in_keys, self.out_keys = [], []

    def forward(self, td):
        out = self.remote(td)
        if self.calls == 0:
            self.remote.update_policy_weights_(self.weights, policy_version=1)
        self.calls += 1
        return out


def turns(mask):
    """The ``(start, stop)`` of each run of policy tokens (1s) in an env mask."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_logprobs_are_the_sampling_weights_per_turn(remote):
    """Two turns sampled by two versions of the weights, through dynamic sampling: each turn's
    log-probs are those of the weights that sampled it."""
    tok = toy_tokenizer()
    first, second = toy_causal_lm(tokenizer=tok, seed=2), toy_causal_lm(tokenizer=tok, seed=3)
    remote.update_policy_weights_(first, policy_version=0)
    scored = [RewardTransform(toy_answer_length)]
    env = toy_chat_env(tok, batch_size=8, reply=True, max_steps=2, transforms=scored)
    policy = PushAfterFirstTurn(remote, second)
    rollout_func = as_trl_rollout_func(env, policy=policy, max_turns=2, candidate_group_size=4)
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=1),
        processing_class=tok,
        num_generations=2,
        model=SimpleNamespace(training=True),
    )
    prompts = [
        [{"role": "user", "content": p}] for p in arithmetic_questions()[:2] for _ in range(2)
    ]
    out = rollout_func(prompts, trainer)

    assert policy.calls == 2 and out["policy_version"] == [0] * 4  # the oldest turn's version
    for i in range(4):
        (a0, b0), (a1, b1) = turns(out["env_mask"][i])
        logprobs = torch.tensor(out["logprobs"][i])
        for (start, stop), model, other in (((a0, b0), first, second), ((a1, b1), second, first)):
            own = own_logprobs(model, out["prompt_ids"][i], out["completion_ids"][i])
            torch.testing.assert_close(logprobs[start:stop], own[start:stop], atol=TOL, rtol=0)
            theirs = own_logprobs(other, out["prompt_ids"][i], out["completion_ids"][i])
            # and not the other version's: off by far more than the tolerance
            assert (logprobs[start:stop] - theirs[start:stop]).abs().max() > 100 * TOL


def test_opsm_masks_a_stale_diverged_rollout_and_keeps_a_fresh_one(remote, tmp_path):
    """Weights pushed once, when training begins: step 0 samples with the trainer's weights,
    step 1 with weights a large step behind. OPSM (no vLLM) reads our log-probs."""
    from datasets import Dataset
    from trl import GRPOTrainer

    tok = toy_tokenizer()
    env = toy_chat_env(tok, batch_size=4, transforms=[RewardTransform(toy_answer_length)])
    rollouts = []

    def rollout_func(prompts, trainer):
        out = inner(prompts, trainer)
        rollouts.append(out)
        return out

    inner = as_trl_rollout_func(env, policy=remote)

    def one_of_each_pair(completions, **kwargs):  # every group of 2: one above, one below
        return [float(i % 2) for i in range(len(completions))]

    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=one_of_each_pair,
        args=grpo_args(tmp_path, max_steps=2, learning_rate=0.3, off_policy_mask_threshold=DELTA),
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": p}] for p in arithmetic_questions()[:8]]}
        ),
        processing_class=tok,
        rollout_func=rollout_func,
    )
    masks, pushed = [], {}
    opsm = trainer.get_off_policy_mask

    def recorded(**kwargs):
        keep = opsm(**kwargs)
        kl = (kwargs["sampling_per_token_logps"] - kwargs["per_token_logps"].detach()) * kwargs[
            "mask"
        ]
        kl = kl.sum(1) / kwargs["mask"].sum(1).clamp(min=1)
        masks.append(
            (trainer.state.global_step, kwargs["advantages"].flatten(), kl, keep.flatten())
        )
        return keep

    trainer.get_off_policy_mask = recorded

    class Snapshot(WeightSyncCallback):  # the weights the generator got, by value
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            super().on_train_begin(args, state, control, model=model, **kwargs)
            pushed[0] = toy_causal_lm(tokenizer=tok)
            pushed[0].load_state_dict({k: v.clone() for k, v in model.state_dict().items()})

    trainer.add_callback(Snapshot(remote, every_n_steps=100))  # version 0 only
    trainer.train()

    assert [out["policy_version"] for out in rollouts] == [[0] * 4, [0] * 4]
    # the returned log-probs are version 0's, also at step 1 (one step stale)
    for out in rollouts:
        for p, c, lp in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]):
            torch.testing.assert_close(
                torch.tensor(lp), own_logprobs(pushed[0], p, c), atol=TOL, rtol=0
            )
    (step0, adv0, kl0, keep0), (step1, adv1, kl1, keep1) = masks
    assert (step0, step1) == (0, 1)
    assert kl0.abs().max() < 1e-3 and keep0.all()  # fresh: kept, whatever the advantage
    assert (adv0 < 0).sum() == 2 and (adv1 < 0).sum() == 2
    # stale: most sequences far off-policy (a large step, lr=0.3); exactly the diverged
    # negative-advantage ones are masked, every other kept
    diverged = (kl1 > DELTA) & (adv1 < 0)
    assert diverged.any() and (kl1 > DELTA).float().mean() >= 0.5
    assert torch.equal(keep1.bool(), ~diverged)
