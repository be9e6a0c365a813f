"""The online loop on several ranks: ``as_trl_rollout_func`` under ``torchrun`` (gloo, CPU).

Two ranks train ``GRPOTrainer`` (DDP) with a group split over them, and one rank replays their
global batch: the same rewards, KL, loss and weights. FSDP2 (``fully_shard``) generation with
multi-turn episodes that end at different turns on the two ranks: no hang, the completions of
the unsharded model. Layout B on 2 ranks: one shared pool of 2 Ray replicas, a 2-turn
environment, delta pushes into bf16 generators. Layout C on 2 ranks: TRL's vLLM generation in
server mode (the stand-in client), ``max_turns=3``, the ranks' turns in lockstep. All in one
``torchrun`` launch. The rank logic itself (slices, the guard, agreement between ranks, the
staleness metrics, the vLLM lockstep's counts) is checked in one process with stand-ins for the
other rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import _ranks_worker as worker
import pytest
import torch
from _background import background

from torchrl_trl_interop import as_trl_rollout_func
from torchrl_trl_interop.rollouts._ranks import (
    Ranks,
    check_prompt_slice,
    check_same_calls,
    generation_guard,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

WORKER = Path(__file__).with_name("_ranks_worker.py")
TOL = 1e-5


def mask_runs(mask: list[int]) -> list[int]:
    """``[1, 1, 0, 1]`` -> ``[1, 0, 1]``: the values of the runs."""
    return [v for i, v in enumerate(mask) if i == 0 or mask[i - 1] != v]


@background(timeout_s=540)  # ~16 s alone; a hang fails the tests that read it
def ranks_launch(job):
    """Every scenario on 2 ranks in one ``torchrun`` launch (the start-up is most of its time):
    the output folder, and each scenario's JSON of each rank, in rank order."""
    scenarios = "train,fsdp2,ray,vllm"
    job.torchrun(WORKER, job.folder, scenarios, 2)
    return job.folder, {
        name: [json.loads((job.folder / f"{name}.rank{r}.json").read_text()) for r in range(2)]
        for name in scenarios.split(",")
    }


@pytest.fixture
def two_ranks(ranks_launch):
    out_dir, scenarios = ranks_launch
    return out_dir, scenarios["train"]


@pytest.mark.slow
class TestTwoRanks:
    def test_a_group_split_over_ranks_trains(self, two_ranks):
        out_dir, ranks = two_ranks
        assert [r["global_step"] for r in ranks] == [2, 2]
        weights = [torch.load(out_dir / f"weights.rank{r}.pt") for r in (0, 1)]
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
        for step in range(2):
            (a, b), (ra, rb) = ([r[k][step] for r in ranks] for k in ("rollouts", "rewards"))
            # one prompt x num_generations=4, half of it on each rank, one row per prompt
            assert len(a["prompts"]) == len(b["prompts"]) == 2
            assert all(p == a["prompts"][0] for p in a["prompts"] + b["prompts"])
            for out in (a, b):
                assert {k: len(v) for k, v in out.items()} == dict.fromkeys(out, 2)
                assert all(h[:1] == out["prompts"][0] for h in out["history"])
            # each rank scored exactly its own slice, in order
            for out, scored in ((a, ra), (b, rb)):
                assert scored["prompts"] == out["prompts"]
                assert scored["completion_ids"] == out["completion_ids"]
            # TRL seeds each rank differently: the two halves of a group are not copies
            assert not set(map(tuple, a["completion_ids"])) & set(map(tuple, b["completion_ids"]))
        assert ranks[0]["logs"] == ranks[1]["logs"]  # rewards are gathered before logging

    def test_each_rank_seeds_its_own_environment(self, two_ranks):
        _, ranks = two_ranks
        # once, before the first reset, env_seed + rank (as TRL seeds torch: device_specific)
        assert [r["env_seeds"] for r in ranks] == [[worker.ENV_SEED], [worker.ENV_SEED + 1]]

    def test_ranks_wait_for_each_other_at_a_checkpoint(self, two_ranks):
        from torchrl_trl_interop import last_complete_checkpoint

        out_dir, ranks = two_ranks
        # rank 0 saves the buffer; neither rank goes on before that save is whole
        assert [r["buffer_saved_before_on"] for r in ranks] == [[True], [True]]
        checkpoint = out_dir / "run" / "checkpoint-2"
        assert last_complete_checkpoint(out_dir / "run") == str(checkpoint)
        # each rank's own random state (torch, numpy, python) is in it: transformers saves it
        assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {
            "rng_state_0.pth",
            "rng_state_1.pth",
        }

    def test_one_rank_computes_the_same_on_the_same_global_batch(self, two_ranks, tmp_path):
        out_dir, ranks = two_ranks
        calls = [
            {k: a[k] + b[k] for k in a} for a, b in zip(ranks[0]["rollouts"], ranks[1]["rollouts"])
        ]
        seen = []

        def replay(prompts, trainer):  # the two ranks' rows, concatenated in rank order
            call = calls[len(seen)]
            seen.append(prompts)
            assert prompts == call["prompts"]  # the same global batch, in the same order
            return {k: v for k, v in call.items() if k != "prompts"}

        trainer = worker.grpo_trainer(
            tmp_path, replay, worker.EnvReward(), world=1, steps=2, model=out_dir / "model"
        )
        trainer.train()
        assert len(seen) == 2
        logs = [h for h in trainer.state.log_history if "loss" in h]
        for one, two in zip(logs, ranks[0]["logs"]):
            assert one["reward"] == two["reward"]
            for key in ("kl", "loss", "grad_norm"):
                assert one[key] == pytest.approx(two[key], rel=1e-4, abs=1e-7), key
        two_rank_weights = torch.load(out_dir / "weights.rank0.pt")
        for name, value in trainer.model.state_dict().items():
            torch.testing.assert_close(value, two_rank_weights[name], atol=TOL, rtol=0)

    def test_fsdp2_multi_turn_lockstep(self, ranks_launch):
        ranks = ranks_launch[1]["fsdp2"]
        # every forward is a collective: both ranks ran the same forwards and generate calls
        assert ranks[0]["forwards"] == ranks[1]["forwards"] > 0
        assert ranks[0]["generates"] == ranks[1]["generates"] == 3  # rank 0: 1 turn + 2 idle
        for rank, turns in ((0, [1]), (1, [1, 0, 1, 0, 1])):
            out = ranks[rank]
            assert ranks[rank]["shard_rows"][0] * 2 == ranks[rank]["shard_rows"][1]
            sharded, plain = out["sharded"], out["plain"]
            for mask in sharded["env_mask"]:
                assert mask_runs(mask) == turns  # rank 0's episodes end after 1 turn, 1's after 3
            # the guarded sharded model samples what the unsharded one does, same seed
            assert sharded["completion_ids"] == plain["completion_ids"]
            assert sharded["env_mask"] == plain["env_mask"]
            for a, b in zip(sharded["logprobs"], plain["logprobs"]):
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=TOL, rtol=0)
            # dynamic sampling: a rank's part of a group samples its candidates in lockstep
            dynamic = out["dynamic"]
            assert {k: len(v) for k, v in dynamic.items()} == dict.fromkeys(dynamic, 2)
            for mask in dynamic["env_mask"]:
                assert mask_runs(mask) == turns
        # 2 env batches of candidates x 3 turns on both ranks (rank 0: 1 turn + 2 idle each)
        assert ranks[0]["dynamic_generates"] == ranks[1]["dynamic_generates"] == 6

    def test_layout_b_two_ranks_share_one_ray_pool(self, ranks_launch):
        ranks = ranks_launch[1]["ray"]
        assert [r["global_step"] for r in ranks] == [2, 2]
        # both ranks end with the same weights, and every replica with them (in bf16, exactly)
        assert ranks[0]["trainer"] == ranks[1]["trainer"]
        final = ranks[0]["trainer_bf16"]
        assert ranks[0]["replicas"] == ranks[1]["replicas"] == [[2, final], [2, final]]
        # rank 0 started the actors and owns them; rank 1 found them by name
        assert [r["owner"] for r in ranks] == [True, False]
        for out in ranks:
            # every row of every rank carries the exact version: the step it was generated at
            assert out["versions"] == [[0, 0], [1, 1]]
            assert out["staleness_max"] == [0.0, 0.0]  # never negative (max_staleness=0 held)
            for call in out["env_masks"]:
                assert [mask_runs(m) for m in call] == [[1, 0, 1]] * 2  # 2 turns each
        # one push per sync, from rank 0: whole, a delta at lr 1e-6 (a tenth of it), whole again
        pushes = ranks[0]["pushes"]
        assert [p["version"] for p in pushes] == [0, 1, 2] and not ranks[1]["pushes"]
        assert [p["delta"] for p in pushes] == [False, True, False]
        assert pushes[1]["bytes"] <= pushes[0]["bytes"] / 10 and pushes[0]["bytes"] > 0
        assert ranks[0]["logged_bytes"] == [
            (pushes[0]["bytes"] + pushes[1]["bytes"]) / 2,
            pushes[2]["bytes"],
        ]

    def test_layout_c_two_ranks_multi_turn_on_a_shared_vllm_server(self, ranks_launch):
        ranks = ranks_launch[1]["vllm"]
        assert [r["global_step"] for r in ranks] == [2, 2]
        assert ranks[0]["trainer"] == ranks[1]["trainer"]
        # the server held the weights each step generated with (TRL syncs before the rollouts)
        assert ranks[0]["synced_checksums"] == ranks[0]["step_checksums"]
        assert ranks[1]["step_checksums"] == ranks[0]["step_checksums"]
        # episodes end after 1 turn on rank 0, 3 on rank 1: per step 3 generate calls, each
        # with both ranks' 2 prompts (rank 0 idles through 2 of them with fillers)
        assert ranks[0]["generated"] == [4] * 6
        assert [r["idle_calls"] for r in ranks] == [4, 0]
        for rank, turns in ((0, [1]), (1, [1, 0, 1, 0, 1])):
            for call in ranks[rank]["env_masks"]:
                assert [mask_runs(m) for m in call] == [turns] * 2


# -- the rank logic, in one process --------------------------------------------------------------


def two_rank_accelerator(other_rank_values=None):
    """A stand-in for the accelerator of rank 0 of 2; the other rank gives ``other_rank_values``
    (by default, the same values as this rank)."""

    def gather(tensor):
        other = tensor if other_rank_values is None else torch.tensor(other_rank_values)
        return torch.cat([tensor, other])

    return SimpleNamespace(num_processes=2, process_index=0, device="cpu", gather=gather)


class TestSlices:
    def test_a_rank_may_hold_part_of_a_group(self):
        # 12 prompts (3 groups of 4) over 2 ranks: rank 1 holds the end of group 1 and group 2
        check_prompt_slice(list("AAAABB"), 4, Ranks(index=0, count=2))
        check_prompt_slice(list("BBCCCC"), 4, Ranks(index=1, count=2))

    def test_the_groups_are_checked_at_their_global_positions(self):
        with pytest.raises(ValueError, match=r"prompts 0\.\.1 of this rank \(positions 6\.\.7"):
            check_prompt_slice(list("BCCCCC"), 4, Ranks(index=1, count=2))

    def test_the_global_count_must_divide_num_generations(self):
        with pytest.raises(ValueError, match=r"3 prompts on each of 2 ranks \(6 in all\)"):
            check_prompt_slice(list("AAA"), 4, Ranks(index=0, count=2))

    def test_one_process(self, tmp_path):
        assert Ranks.of(SimpleNamespace()) == Ranks()
        with pytest.raises(TypeError, match="non-empty list of prompts"):
            check_prompt_slice([], 2, Ranks())


class TestEnvSeed:
    def test_env_seed_must_be_an_int(self):
        from torchrl_trl_interop.testing import toy_chat_env

        with pytest.raises(TypeError, match=r"env_seed must be None or an int.*got env_seed='7'"):
            as_trl_rollout_func(toy_chat_env(), env_seed="7")


class TestAgreement:
    def test_ranks_that_would_run_different_calls_all_raise(self):
        ranks = Ranks(0, 2, collective=True, accelerator=two_rank_accelerator([4, 2]))
        with pytest.raises(ValueError, match="rank 0: prompts=4, env batch size=4; rank 1: "):
            check_same_calls(ranks, {"prompts": 4, "env batch size": 4})
        check_same_calls(ranks, {"prompts": 4, "env batch size": 2})  # they agree

    def test_staleness_is_measured_over_every_rank(self):
        from torchrl_trl_interop.weights._staleness import check_staleness

        ranks = Ranks(0, 2, accelerator=two_rank_accelerator([3, -1]))
        assert ranks.gather_versions([5, 5]) == [5, 5, 3, None]  # -1: a row without a version
        ranks = Ranks(0, 2, accelerator=two_rank_accelerator([3, 3]))
        metrics = {}
        every = ranks.gather_versions([5, 4])
        assert check_staleness(every, 5, None, log=metrics.update) == [0, 1, 2, 2]
        assert metrics["rollout/staleness_max"] == [2.0]  # the other rank's rows


class TestGuard:
    def test_generates_as_grpo_trainer_does(self, monkeypatch, tmp_path):
        """ZeRO-3 cannot run here (no DeepSpeed): the guard is checked to be TRL's own."""
        import contextlib

        import trl.models

        from torchrl_trl_interop.testing import toy_causal_lm

        entered = {}

        @contextlib.contextmanager
        def unwrap(model, accelerator, **kwargs):
            entered.update(kwargs, model=model)
            yield model

        monkeypatch.setattr(trl.models, "unwrap_model_for_generation", unwrap)
        model = toy_causal_lm()
        backend = SimpleNamespace(
            summon_full_params=lambda module, **kw: contextlib.nullcontext(),
            is_zero3=True,
            is_fsdp=False,
        )
        trainer = SimpleNamespace(
            model=model,
            model_wrapped=model,
            accelerator=two_rank_accelerator(),
            args=SimpleNamespace(ds3_gather_for_generation=False, gradient_checkpointing_kwargs={}),
            _dist=backend,
        )
        with generation_guard(trainer) as guarded:
            assert guarded is model and not torch.is_grad_enabled()
        assert entered == {
            "model": model,
            "gather_deepspeed3_params": False,
            "gradient_checkpointing_kwargs": {},
        }
        assert Ranks.of(trainer).collective  # ZeRO-3 on 2 ranks: every forward is a collective

    def test_a_user_policy_on_the_sharded_trainer_model_is_refused(self, tmp_path):
        from transformers import GenerationConfig

        from torchrl_trl_interop import TrainerModelPolicy
        from torchrl_trl_interop.testing import toy_causal_lm, toy_chat_env, toy_tokenizer

        tok = toy_tokenizer()
        model = toy_causal_lm(tokenizer=tok)
        policy = TrainerModelPolicy(model, tok, GenerationConfig(max_new_tokens=2), 1.0)
        accelerator = two_rank_accelerator()
        accelerator.unwrap_model = lambda m: m
        trainer = SimpleNamespace(
            model=model,
            accelerator=accelerator,
            processing_class=tok,
            num_generations=2,
            _dist=SimpleNamespace(is_zero3=False, is_fsdp=True),
        )
        rollout_func = as_trl_rollout_func(
            toy_chat_env(tok), policy=policy, recompute_logprobs=False
        )
        with pytest.raises(ValueError, match="sharded over 2 ranks.*Leave policy=None"):
            rollout_func([[{"role": "user", "content": "Hi"}]] * 2, trainer)
