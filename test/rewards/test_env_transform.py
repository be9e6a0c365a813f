"""TRL rewards inside TorchRL environments: ``RewardTransform``.

The unit tests step a real ``ChatEnv`` with a written answer (a random toy model never writes
``<think>`` tags); the training-step test runs the real pipeline: ``LLMCollector`` rollouts
rewarded through the transform, ``MCAdvantage``, one ``GRPOLoss`` optimizer step.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors.llm import LLMCollector
from torchrl.data import LazyStackStorage, ReplayBuffer
from torchrl.envs import StepCounter, Transform
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer
from torchrl.modules.llm import TransformersWrapper
from torchrl.modules.llm.policies import ChatHistory
from torchrl.objectives.llm import GRPOLoss, MCAdvantage
from trl.rewards import think_format_reward

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    RewardTransform,
    TRLRewardFuncWrapper,
    history_to_messages,
    messages_to_history,
)
from torchrl_trl_interop.testing import toy_causal_lm, toy_prompts, toy_reward_model

THINKS = "<think>\nTwo and two.\n</think>\nFour."


def brevity(completions, **kwargs):
    """A TRL reward function: shorter last answers score higher."""
    return [-float(len(c[0]["content"])) for c in completions]


def chat(answer, question="2+2?"):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def step(env, conversations, td=None):
    """Resets ``env`` (unless ``td`` is given) and steps it as if the policy wrote ``conversations``."""
    if td is None:
        questions = [c[0]["content"] for c in conversations]
        td = env.reset(TensorDict({"query": questions}, batch_size=[len(conversations)]))
    td["history"] = ChatHistory(
        prompt=td["history"].prompt,
        full=messages_to_history(conversations),
        batch_size=[len(conversations)],
    )
    return env.step(td)


def chat_env(*transforms, batch_size=2):
    env = ChatEnv(batch_size=(batch_size,), input_mode="history")
    for t in transforms:
        env = env.append_transform(t)
    return env


class CountingModule(TRLRewardFuncWrapper):
    """A real TRLRewardFuncWrapper that counts the rows it scores."""

    rows_scored = 0

    def forward(self, tensordict):
        type(self).rows_scored += tensordict.numel()
        return super().forward(tensordict)


class TestRewardTransform:
    def test_trl_reward_function_scores_the_assistant_turn(self):
        env = chat_env(RewardTransform(think_format_reward))
        assert env.full_reward_spec["reward"].shape == (2, 1, 1)
        out = step(env, [chat(THINKS), chat("Four.")])
        assert out["next", "reward"].tolist() == [[[1.0]], [[0.0]]]

    def test_weights_and_several_functions(self):
        env = chat_env(RewardTransform([think_format_reward, brevity], weights=[10.0, 1.0]))
        out = step(env, [chat(THINKS), chat("Four.")])
        expected = [10.0 - len(THINKS), -float(len("Four."))]
        assert out["next", "reward"].reshape(-1).tolist() == expected

    def test_only_done_scores_the_last_step(self):
        module = TRLRewardFuncWrapper(brevity)
        env = chat_env(StepCounter(max_steps=2), RewardTransform(module, only_done=True))
        first = step(env, [chat("abc"), chat("abcdef")])
        assert first["next", "reward"].reshape(-1).tolist() == [0.0, 0.0]
        conversations = [chat("abc") + [{"role": "user", "content": "More?"}] for _ in range(2)]
        second_turn = [
            c + [{"role": "assistant", "content": a}] for c, a in zip(conversations, ["x", "yz"])
        ]
        second = step(env, second_turn, td=env.step_mdp(first))
        assert second["next", "done"].all()
        assert second["next", "reward"].reshape(-1).tolist() == [-1.0, -2.0]

    def test_rows_not_ending_with_an_assistant_turn_are_not_scored(self):
        CountingModule.rows_scored = 0
        env = chat_env(RewardTransform(CountingModule(brevity)))
        unanswered = chat("abc") + [{"role": "user", "content": "Again?"}]
        out = step(env, [chat("abcd"), unanswered])
        assert out["next", "reward"].reshape(-1).tolist() == [-4.0, 0.0]
        assert CountingModule.rows_scored == 1

    def test_hf_reward_model(self, tokenizer):
        rm = HFRewardModelWrapper(
            toy_reward_model(tokenizer=tokenizer),
            tokenizer=tokenizer,
            history_key=("history", "full"),
        )
        env = chat_env(RewardTransform(rm))
        conversations = [chat("Four."), chat("Five, I think.")]
        out = step(env, conversations)
        td = TensorDict({"history": {"full": messages_to_history(conversations)}}, batch_size=[2])
        expected = rm(td)["reward"]
        torch.testing.assert_close(out["next", "reward"].reshape(-1), expected.reshape(-1))

    def test_refuses_to_overwrite_a_reward(self):
        env = chat_env(RewardTransform(brevity), RewardTransform(think_format_reward))
        with pytest.raises(ValueError, match="already holds a reward.*accumulate=True"):
            step(env, [chat(THINKS), chat("Four.")])
        env = chat_env(
            RewardTransform(brevity), RewardTransform(think_format_reward, accumulate=True)
        )
        out = step(env, [chat(THINKS), chat("Four.")])
        assert out["next", "reward"].reshape(-1).tolist() == [1.0 - len(THINKS), -5.0]

    def test_missing_history(self):
        env = chat_env(RewardTransform(brevity))
        td = env.reset(TensorDict({"query": ["a", "b"]}, batch_size=[2]))
        td["history"] = ChatHistory(prompt=td["history"].prompt, batch_size=[2])
        with pytest.raises(KeyError, match="no conversation at history_key"):
            env.transform._step(td, td.empty())

    def test_bad_arguments(self):
        # RewardTransform(brevity) is no longer an error: it takes TRL reward functions directly
        with pytest.raises(TypeError, match="or a TensorDict module writing a reward"):
            RewardTransform(3)
        with pytest.raises(TypeError, match=r"\['weights'\], which RewardTransform does not take"):
            RewardTransform(TRLRewardFuncWrapper(brevity), weights=[1.0])


class TestTRLFunctionsDirectly:
    """``RewardTransform`` takes TRL reward functions itself (issue 19): one spelling."""

    def test_one_function(self):
        env = chat_env(RewardTransform(think_format_reward))
        out = step(env, [chat(THINKS), chat("Four.")])
        assert out["next", "reward"].tolist() == [[[1.0]], [[0.0]]]
        assert env.transform.module.reward_func_names == ["think_format_reward"]

    def test_several_weighted_functions_and_kwargs(self):
        def matches(completions, answer, **kwargs):
            return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

        transform = RewardTransform(
            [think_format_reward, brevity, matches],
            weights=[10.0, 1.0, 100.0],
            kwargs_keys={"answer": "query"},
        )
        env = chat_env(transform)
        out = step(env, [chat(THINKS, question="x"), chat("Four.", question="Four.")])
        expected = [10.0 - len(THINKS), -float(len("Four.")) + 100.0]
        assert out["next", "reward"].reshape(-1).tolist() == expected

    def test_text_mode_in_a_text_chat_env(self, tokenizer):
        from torchrl.modules.llm.policies import Text

        seen = []

        def length(prompts, completions, **kwargs):
            seen.append((prompts, completions))
            return [float(len(c)) for c in completions]

        env = ChatEnv(batch_size=(2,), input_mode="text", tokenizer=tokenizer)
        env = env.append_transform(RewardTransform(length, input_mode="text"))
        td = env.reset(TensorDict({"query": ["2+2?", "2+3?"]}, batch_size=[2]))
        prompts, answers = list(td["text"].prompt), ["4<|im_end|>", "five<|im_end|>"]
        full = [p + a for p, a in zip(prompts, answers)]
        td["text"] = Text(prompt=prompts, response=answers, full=full, batch_size=[2])
        out = env.step(td)
        assert out["next", "reward"].reshape(-1).tolist() == [11.0, 14.0]
        assert seen == [(prompts, answers)]

    def test_a_module_does_not_take_function_arguments(self):
        with pytest.raises(TypeError, match=r"got \['kwargs_keys', 'prompt_key'\], which"):
            RewardTransform(TRLRewardFuncWrapper(brevity), prompt_key="p", kwargs_keys={})
        with pytest.raises(TypeError, match="wrap a reward model with it"):
            RewardTransform(toy_reward_model())
        with pytest.raises(TypeError, match=r"^RewardTransform: reward_funcs\[0\] is the string"):
            RewardTransform("org/reward-model")


class TestErrorsNameTheCallMade:
    """Regression (issue 20, item 17): errors blamed TRLRewardFuncWrapper, never called."""

    def test_unknown_keyword(self):
        with pytest.raises(
            TypeError, match="RewardTransform.* unexpected keyword argument 'only_dne'"
        ):
            RewardTransform(brevity, only_dne=True)

    def test_argument_errors(self):
        check_argument_errors(RewardTransform)

    @pytest.mark.parametrize("stepper", ["env.step", "the online loop's step"])
    @pytest.mark.parametrize("written", ["reward", ("history", "score"), ("scores", "brevity")])
    def test_the_module_writes_into_its_own_tensordict(self, written, stepper):
        """The module reads whole entries (every row scored) or its keys selected (it writes
        under an entry it reads): either way its writes stay out of the step's input, also
        where the step does not copy that input first (``_upstream._env_step.step``)."""
        from torchrl_trl_interop._upstream._env_step import _plain_step
        from torchrl_trl_interop._upstream._env_step import step as loop_step

        module = TRLRewardFuncWrapper(brevity, reward_key=written, reward_per_func_key="per")
        env = chat_env(RewardTransform(module, module_reward_key=written))
        conversations = [chat("a"), chat("bb")]
        td = env.reset(TensorDict({"query": ["2+2?"] * 2}, batch_size=[2]))
        td["history"] = ChatHistory(
            prompt=td["history"].prompt, full=messages_to_history(conversations), batch_size=[2]
        )
        assert _plain_step(env)
        out = env.step(td) if stepper == "env.step" else loop_step(env, td)
        assert out["next", "reward"].flatten().tolist() == [-1.0, -2.0]
        assert written not in out.keys(True) and "per" not in out.keys(True)
        assert history_to_messages(out["history"].full) == conversations

    def test_step_errors(self):
        def short(completions, **kwargs):
            return [1.0]

        env = chat_env(RewardTransform(short))
        with pytest.raises(
            ValueError, match="^RewardTransform: reward function 'short' returned 1"
        ):
            step(env, [chat("a"), chat("b")])
        # a wrapper the user built keeps its own name
        env = chat_env(RewardTransform(TRLRewardFuncWrapper(short)))
        with pytest.raises(ValueError, match="^TRLRewardFuncWrapper: reward function 'short'"):
            step(env, [chat("a"), chat("b")])


class EndsAtOnce(Transform):
    """A transform that ends every episode (declares ``done`` in its ``out_keys``)."""

    def __init__(self):
        super().__init__(in_keys=[], out_keys=["done"])

    def _step(self, tensordict, next_tensordict):
        return next_tensordict.set("done", torch.ones_like(next_tensordict["done"]))


class TestOnlyDoneOrder:
    """Regression (issue 20, item 3): ``only_done=True`` before the transform that ends the
    episode scored 0.0 on every step: torchrl runs transforms in order."""

    def two_turns(self, env):
        first = step(env, [chat("abc"), chat("abcdef")])
        conversations = [chat("abc") + [{"role": "user", "content": "More?"}] for _ in range(2)]
        second_turn = [
            c + [{"role": "assistant", "content": a}] for c, a in zip(conversations, ["x", "yz"])
        ]
        return first, step(env, second_turn, td=env.step_mdp(first))

    def test_after_the_step_counter(self):
        env = chat_env(
            StepCounter(max_steps=2), RewardTransform(TRLRewardFuncWrapper(brevity), only_done=True)
        )
        first, second = self.two_turns(env)
        assert first["next", "reward"].reshape(-1).tolist() == [0.0, 0.0]
        assert second["next", "done"].all()
        assert second["next", "reward"].reshape(-1).tolist() == [-1.0, -2.0]

    def test_before_the_step_counter_is_refused(self):
        env = chat_env(
            RewardTransform(TRLRewardFuncWrapper(brevity), only_done=True), StepCounter(max_steps=2)
        )
        with pytest.raises(
            ValueError,
            match=r"RewardTransform\(only_done=True\) runs before \['StepCounter'\].*done "
            r"entries \['truncated'\].*Append the reward transform after the step limit",
        ):
            self.two_turns(env)

    def test_before_a_transform_writing_done(self):
        env = chat_env(RewardTransform(brevity, only_done=True), EndsAtOnce())
        with pytest.raises(
            ValueError, match=r"RewardTransform\(only_done=True\) runs before \['EndsAtOnce'\]"
        ):
            step(env, [chat("abc"), chat("abcdef")])
        env = chat_env(EndsAtOnce(), RewardTransform(brevity, only_done=True))
        out = step(env, [chat("abc"), chat("abcdef")])
        assert out["next", "reward"].reshape(-1).tolist() == [-3.0, -6.0]

    def test_order_does_not_matter_without_only_done(self):
        env = chat_env(RewardTransform(TRLRewardFuncWrapper(brevity)), StepCounter(max_steps=2))
        first, second = self.two_turns(env)
        assert first["next", "reward"].reshape(-1).tolist() == [-3.0, -6.0]
        assert second["next", "reward"].reshape(-1).tolist() == [-1.0, -2.0]


class TestTorchRLTrainingStep:
    def test_collector_mc_advantage_grpo_loss(self, left_tokenizer):
        """LLMCollector rollouts rewarded by TRL functions in the env, MCAdvantage, one GRPO step."""
        tok = left_tokenizer
        model = toy_causal_lm(tokenizer=tok)
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(
            [{"query": p} for p in toy_prompts(4)],
            batch_size=2,
            collate_fn=lambda rows: {"query": [r["query"] for r in rows]},
        )
        env = ChatEnv(batch_size=(2,), tokenizer=tok, input_mode="history")
        env = env.append_transform(DataLoadingPrimer(dataloader=loader, repeats=2, batch_size=(2,)))
        env = env.append_transform(StepCounter(max_steps=1))
        env = env.append_transform(RewardTransform([think_format_reward, brevity]))
        policy = TransformersWrapper(
            model,
            tokenizer=tok,
            input_mode="history",
            generate=True,
            generate_kwargs={"max_new_tokens": 6, "do_sample": True},
            pad_output=False,
        )
        rb = ReplayBuffer(storage=LazyStackStorage(16), transform=MCAdvantage(grpo_size=2))
        collector = LLMCollector(
            env, policy=policy, dialog_turns_per_batch=2, total_dialog_turns=8, replay_buffer=rb
        )
        for _ in collector:
            pass
        collector.shutdown()
        batch = rb[:]
        assert len(batch) == 8

        # the env's reward is the TRL functions' score of each rollout's answer
        conversations = history_to_messages(batch["history", "full"])
        completions = [c[-1:] for c in conversations]
        expected = [a + b for a, b in zip(think_format_reward(completions), brevity(completions))]
        assert batch["next", "reward"].reshape(-1).tolist() == expected
        # MCAdvantage normalised it within each prompt's group of 2
        advantage = batch["advantage"].reshape(-1)
        queries = list(batch["query"])
        for q in set(queries):
            group = torch.tensor([a for a, qq in zip(advantage.tolist(), queries) if qq == q])
            assert len(group) == 2 and abs(group.sum().item()) < 1e-5
        assert advantage.abs().sum() > 0

        # one GRPO step on the real model: old log-probs from the same weights (on-policy)
        actor = TransformersWrapper(
            model,
            tokenizer=tok,
            input_mode="tokens",
            generate=False,
            return_log_probs=True,
            pad_output=False,
        )
        with torch.no_grad():
            old = actor(batch.copy()).get(("log_probs", "full"), as_list=True)
        for row, log_probs in zip(batch.unbind(0), old):
            row.set(("log_probs", "full"), log_probs)
        loss_fn = GRPOLoss(actor_network=actor, masking_strategy="sft", entropy_bonus=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        before = [p.detach().clone() for p in model.parameters()]
        loss = loss_fn(batch).loss_objective
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def check_argument_errors(call):
    """The argument errors of ``call`` (``RewardTransform`` or its deprecated alias), each
    opening with the name of the call made."""
    name = call.__name__
    with pytest.raises(TypeError, match=rf"^{name}: weights\[0\] must be a real number"):
        call(brevity, weights=["a"])
    with pytest.raises(ValueError, match=rf"^{name}: got 2 weights for 1 reward functions"):
        call(brevity, weights=[1.0, 2.0])
    with pytest.raises(TypeError, match=rf"^{name}: reward_funcs\[1\] is a int"):
        call([brevity, 3])
    with pytest.raises(TypeError, match=rf"^{name}: only_done must be a bool"):
        call(brevity, only_done="no")


def test_as_reward_transform_is_deprecated_for_reward_transform():
    """The deprecated alias warns (naming its replacement and the version that removes it),
    builds the same transform, and its errors name the call made, at build and at step time."""
    from torchrl_trl_interop import as_reward_transform

    warned = r"as_reward_transform.*removed in 0\.3\.0.*use RewardTransform\(module, \*\*kwargs\)"
    with pytest.warns(DeprecationWarning, match=warned):
        transform = as_reward_transform([think_format_reward, brevity], weights=[10.0, 1.0])
        check_argument_errors(as_reward_transform)
        with pytest.raises(
            TypeError,
            match=r"as_reward_transform\(\) got an unexpected keyword argument 'only_dne' "
            r"\(did you mean 'only_done'\?\)\. It takes: \['accumulate', .*'weights'\]",
        ):
            as_reward_transform(brevity, only_dne=True)
        short = as_reward_transform(lambda completions, **kwargs: [1.0])
    assert type(transform) is RewardTransform and transform.module.weights == [10.0, 1.0]
    with pytest.raises(ValueError, match=r"^as_reward_transform: reward function '<lambda>' "):
        step(chat_env(short), [chat("a"), chat("b")])
