"""Dynamic sampling at the seam: ``as_trl_rollout_func(env, candidate_group_size=K)``.

Real ``GRPOTrainer.train()`` runs on a toy model with a sparse environment reward (most groups
of plain sampling have no reward spread), the selection rule on its own (hypothesis), groups
split across processes (a stand-in rollout), and the kept rows checked against the candidates
they came from.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl_trl_interop import RewardTransform, as_trl_rollout_func
from torchrl_trl_interop.rollouts._dynamic_sampling import (
    group_runs,
    has_spread,
    sample_candidates,
    select_candidates,
)
from torchrl_trl_interop.testing import (
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_prompts,
    toy_tokenizer,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

K = 8  # candidates per group of num_generations = 2


def sparse_reward(completions, **kwargs):
    """An environment reward that is 1.0 for about a quarter of the toy model's answers."""
    return [float(len(c[-1]["content"]) % 4 == 0) for c in completions]


def env_reward(completions, env_reward, **kwargs):
    return list(env_reward)


class Recorder:
    """The rollout function, recording each call's prompts and output."""

    def __init__(self, rollout_func):
        self.rollout_func, self.calls = rollout_func, []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        self.calls.append((list(prompts), out))
        return out


def grpo(tmp_path, rollout_func, *, steps=3, **overrides):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = toy_tokenizer()
    args = toy_grpo_args(
        tmp_path,
        tokenizer=tok,
        max_completion_length=4,
        max_steps=steps,
        per_device_train_batch_size=8,
        **overrides,
    )
    data = [[{"role": "user", "content": p}] for p in toy_prompts(16)]
    return GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=env_reward,
        args=GRPOConfig(**args),
        train_dataset=Dataset.from_dict({"prompt": data}),
        processing_class=tok,
        rollout_func=rollout_func,
    )


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A constructed (not trained) GRPOTrainer, num_generations=2."""
    return grpo(tmp_path_factory.mktemp("grpo"), None)


def sparse_env(batch_size=8, **kwargs):
    transforms = [RewardTransform(sparse_reward)]
    return toy_chat_env(toy_tokenizer(), batch_size=batch_size, transforms=transforms, **kwargs)


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if "loss" in h]


class TestSelection:
    @settings(max_examples=200, deadline=None)
    @given(
        rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0, math.nan]), min_size=2, max_size=12),
        data=st.data(),
    )
    def test_keeps_the_extremes(self, rewards, data):
        keep = data.draw(st.integers(2, len(rewards)))
        kept = select_candidates(rewards, keep)
        assert kept == sorted(set(kept)) and len(kept) == keep
        assert all(0 <= i < len(rewards) for i in kept)
        scored = [r for r in rewards if not math.isnan(r)]
        if has_spread(rewards):
            chosen = [rewards[i] for i in kept]
            assert max(scored) in chosen and min(scored) in chosen  # NaN is never an extreme
            assert has_spread(chosen)
        else:
            assert kept == list(range(keep))

    def test_the_rest_is_drawn_at_random(self):
        torch.manual_seed(0)
        rewards = [0.0, 0.5, 0.5, 1.0, 0.5, 0.5]
        thirds = [next(i for i in select_candidates(rewards, 3) if i not in (0, 3))]
        thirds += [
            next(i for i in select_candidates(rewards, 3) if i not in (0, 3)) for _ in range(199)
        ]
        counts = [thirds.count(i) for i in (1, 2, 4, 5)]
        assert sum(counts) == 200 and min(counts) > 25  # each of the 4 about 50 times

    def test_one_row_of_a_split_group(self):
        rewards = [0.0, 1.0, 0.5]
        assert [select_candidates(rewards, 1, position=p, group_size=4) for p in range(4)] == [
            [1],
            [1],
            [0],
            [0],
        ]
        assert select_candidates([0.5, 0.5], 1, position=3, group_size=4) == [0]

    @given(n=st.integers(1, 40), group=st.integers(1, 9), rank=st.integers(0, 5))
    def test_group_runs_follow_trls_layout(self, n, group, rank):
        offset = rank * n
        runs = group_runs(n, group, offset)
        assert runs[0][0] == 0 and runs[-1][1] == n
        for (start, stop, position), following in zip(runs, runs[1:] + [None]):
            assert 0 < stop - start <= group - position
            ids = {(offset + i) // group for i in range(start, stop)}
            assert len(ids) == 1 and (offset + start) % group == position
            if following is not None:
                assert following[0] == stop and following[2] == 0


class TestSplitGroups:
    """A process holding part of a group (TRL spreads groups over processes): a stand-in rollout
    whose candidates score 0.0, 1.0, 2.0, ... in order, on process 1 of a batch in groups of 4."""

    def test_rows_per_run(self):
        metrics = []
        trainer = SimpleNamespace(
            num_generations=4,
            model=SimpleNamespace(training=True),
            accelerator=SimpleNamespace(process_index=1),
            _log_metric=lambda name, value: metrics.append((name, value)),
        )
        seen = []

        def rollout(prompts, trainer):
            seen.append(prompts)
            return {
                "row": list(range(len(prompts))),
                "env_reward": [float(i) for i in range(len(prompts))],
            }

        prompts = ["a", "b", "b"]  # rows 3 | 4, 5 of the batch: the end of "a", the start of "b"
        out = sample_candidates(rollout, prompts, trainer, candidate_group_size=8, env_batch_size=2)
        # "a": 1 row at position 3 of 4 -> ceil(8 / 4) = 2 candidates, the worst kept;
        # "b": 2 rows -> ceil(2 * 8 / 4) = 4 candidates, its best and worst kept
        assert seen == [["a", "a", "b", "b", "b", "b"]]
        assert out == {"row": [0, 2, 5], "env_reward": [0.0, 2.0, 5.0]}
        assert metrics == [
            ("rollout/candidates", 2.0),
            ("rollout/candidates", 4.0),
            ("rollout/zero_std_groups_before", 1.0),  # one row: no spread of its own
            ("rollout/zero_std_groups_before", 0.0),
            ("rollout/zero_std_groups_after", 1.0),
            ("rollout/zero_std_groups_after", 0.0),
            ("rollout/candidate_reward_mean", 0.5),  # every candidate: 0.0, 1.0
            ("rollout/candidate_reward_mean", 3.5),  # 2.0 ... 5.0
        ]
        with pytest.raises(ValueError, match=r"makes 6 candidate rollouts .* batch_size \(4,\)"):
            sample_candidates(rollout, prompts, trainer, candidate_group_size=8, env_batch_size=4)


class TestGRPO:
    def test_sparse_reward_groups_get_their_spread(self, tmp_path):
        runs = {}
        # the same seed; the K x 4 candidates of a step go through the environment in one batch
        for name, candidates, env in (
            ("plain", None, sparse_env(8)),
            ("dynamic", K, sparse_env(32)),
        ):
            recorder = Recorder(as_trl_rollout_func(env, candidate_group_size=candidates))
            trainer = grpo(tmp_path / name, recorder)
            trainer.train()
            assert trainer.state.global_step == 3
            runs[name] = (trainer, recorder)
            for prompts, out in recorder.calls:  # TRL's rows: one per prompt entry, in order
                assert {len(v) for v in out.values()} == {len(prompts)} == {8}
                for i, prompt in enumerate(prompts):
                    assert prompt == prompts[i - i % 2]  # groups of 2, intact
                    assert out["history"][i][:1] == prompt

        plain = logged(runs["plain"][0], "frac_reward_zero_std")
        dynamic = logged(runs["dynamic"][0], "frac_reward_zero_std")
        assert sum(plain) / 3 >= 0.5  # the sparse reward leaves most groups without spread
        assert sum(dynamic) <= sum(plain) / 2
        # our count of flat groups is TRL's, step by step; the candidates are K per group
        assert logged(runs["dynamic"][0], "rollout/zero_std_groups_after") == dynamic
        assert logged(runs["dynamic"][0], "rollout/candidates") == [float(K)] * 3
        before = logged(runs["dynamic"][0], "rollout/zero_std_groups_before")
        assert all(b >= a for b, a in zip(before, dynamic)) and sum(before) > sum(dynamic)

    def test_kept_rows_are_their_candidates(self, trainer):
        """Multi-turn (an environment reply between two turns): every kept row is one of its
        group's candidates as sampled, every column of it."""
        rollout_func = as_trl_rollout_func(
            sparse_env(reply=True, max_steps=2), max_turns=2, candidate_group_size=K
        )
        candidates = []
        sample = rollout_func._rollout

        def spy(prompts, trainer):
            out = sample(prompts, trainer)
            candidates.append(out)
            return out

        rollout_func._rollout = spy
        prompts = [[{"role": "user", "content": p}] for p in toy_prompts(4)[:2] for _ in range(2)]
        trainer._pending_metrics.clear()
        out = rollout_func(prompts, trainer)

        (cand,) = candidates
        assert {len(v) for v in cand.values()} == {2 * K} and {len(v) for v in out.values()} == {4}
        model = trainer.accelerator.unwrap_model(trainer.model)
        for group in range(2):
            pool = range(group * K, (group + 1) * K)
            kept = []
            for row in (2 * group, 2 * group + 1):
                match = [j for j in pool if all(out[k][row] == cand[k][j] for k in out)]
                assert match, f"row {row} is none of its group's candidates"
                kept.append(match[0])
                assert out["history"][row][: len(prompts[row])] == prompts[row]
                assert 0 in out["env_mask"][row]  # the environment's reply, masked
                # the log-probs are the sampling model's own (the policy's tokens)
                ids = torch.tensor([out["prompt_ids"][row] + out["completion_ids"][row]])
                with torch.no_grad():
                    scores = model(input_ids=ids).logits[0].log_softmax(-1)
                n = len(out["prompt_ids"][row])
                own = scores[n - 1 : -1].gather(-1, ids[0, n:, None]).squeeze(-1)
                mask = torch.tensor(out["env_mask"][row], dtype=torch.bool)
                torch.testing.assert_close(
                    torch.tensor(out["logprobs"][row])[mask], own[mask], atol=1e-4, rtol=0
                )
            assert len(set(kept)) == 2
            rewards = [cand["env_reward"][j] for j in pool]
            if has_spread(rewards):
                assert sorted(cand["env_reward"][j] for j in kept) == [min(rewards), max(rewards)]
        assert trainer._pending_metrics["rollout/candidates"] == [float(K)] * 2
        means = [sum(cand["env_reward"][g * K : (g + 1) * K]) / K for g in range(2)]
        assert trainer._pending_metrics["rollout/candidate_reward_mean"] == pytest.approx(means)

    def test_errors(self, trainer):
        prompts = [[{"role": "user", "content": "Hi"}]] * 2
        with pytest.raises(ValueError, match="candidate_group_size must be None or an int >= 2"):
            as_trl_rollout_func(sparse_env(), candidate_group_size=1)
        with pytest.raises(ValueError, match="candidate_group_size must be None or an int >= 2"):
            as_trl_rollout_func(sparse_env(), candidate_group_size="8")
        grouping_by_4 = SimpleNamespace(num_generations=4, model=SimpleNamespace(training=True))
        with pytest.raises(ValueError, match="candidate_group_size=3 is smaller than num_gen"):
            as_trl_rollout_func(sparse_env(), candidate_group_size=3)(prompts * 2, grouping_by_4)
        with pytest.raises(ValueError, match=r"makes 3 candidate rollouts .* batch_size \(8,\)"):
            as_trl_rollout_func(sparse_env(), candidate_group_size=3)(prompts, trainer)
        no_reward = toy_chat_env(toy_tokenizer(), batch_size=4)
        with pytest.raises(ValueError, match=r"environment wrote none for candidates \[0, 1"):
            as_trl_rollout_func(no_reward, candidate_group_size=4)(prompts, trainer)
