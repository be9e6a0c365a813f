"""Regression tests of issue 33's "Why": where our adapters differed from TRL 1.16's own seams.

One test (or class) per finding: env-owned reward, env-owned data, async tools, the tool schema,
tool failures, plain-text prompts and the parity claim's scope, empty message lists. (Upstream's
error wording is ``test/test_upstream_contract.py``.) Each failed on the code before the fix.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import warnings

import pytest
from test_trl_grpo_contract import multiply_tool  # TRL's own test tool
from torchrl.envs.llm.transforms import SimpleToolTransform
from transformers.utils import get_json_schema

from torchrl_trl_interop import as_trl_environment_factory, as_trl_rollout_func, as_trl_tools
from torchrl_trl_interop.rollouts._tool_outcome import ToolFailed
from torchrl_trl_interop.rollouts._trl_prompts import PlainTextPromptWarning
from torchrl_trl_interop.testing import (
    toy_calculator_env,
    toy_causal_lm,
    toy_chat_env,
    toy_grpo_args,
    toy_prompts,
    toy_tokenizer,
)
from torchrl_trl_interop.testing._envs import toy_prompting_env

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
COMPLETION = [
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "Tool add executed successfully:\n5"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
]


@pytest.fixture(autouse=True)
def _silence_experimental(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's "experimental" warning


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    await asyncio.sleep(0)
    return a * b


def failing_tool(a: int) -> int:
    """
    Always fails.

    Args:
        a: Ignored.

    Returns:
        Nothing, ever.
    """
    raise ValueError(f"cannot use {a}")


def factory_of(name, func):
    def make_env():
        from torchrl.envs.llm import ChatEnv

        env = ChatEnv(batch_size=(1,), input_mode="history")
        return env.append_transform(SimpleToolTransform(tools={name: func}))

    return as_trl_environment_factory(make_env, name="tools")


class TestEnvOwnedReward:
    def test_instances_define_get_reward_when_the_env_writes_one(self):
        env = as_trl_environment_factory(toy_calculator_env)()
        assert "get_reward" in dict(inspect.getmembers(type(env), inspect.isfunction))
        no_reward = functools.partial(toy_calculator_env, rewards=())
        assert not hasattr(as_trl_environment_factory(no_reward)(), "get_reward")

    @pytest.mark.parametrize("order", ["reward_func first (TRL's order)", "get_reward first"])
    def test_no_reward_is_counted_twice(self, order):
        factory = as_trl_environment_factory(toy_calculator_env)
        env = factory()
        env.reset(prompt=QUESTION)
        env.add(a=2, b=3)

        def reward_func():
            return factory.reward_func(completions=[COMPLETION], environments=[env])[0]

        if order.startswith("reward_func"):
            scores = [reward_func(), env.get_reward()]
        else:
            scores = [env.get_reward(), reward_func()]
        assert sum(s for s in scores if s is not None) == 1.0  # the answer's reward, once
        assert env.reward == 1.0

    def test_get_reward_never_sees_the_final_answer(self):
        env = as_trl_environment_factory(toy_calculator_env)()
        env.reset(prompt=QUESTION)
        env.add(a=2, b=3)
        assert env.get_reward() == 0.0  # the env scores answers; TRL gave it none


class TestEnvOwnedData:
    def test_an_env_with_its_own_prompts_is_accepted_and_serves_them(self):
        make = functools.partial(toy_prompting_env, "Guess the word.")
        env = as_trl_environment_factory(make, name="word")()
        # TRL's dataset-less row ({"prompt": [empty user turn]}) and a routing-only row
        assert env.reset(prompt=[{"role": "user", "content": ""}]) == "Guess the word."
        assert env.reset() == "Guess the word."
        assert env.messages == [{"role": "user", "content": "Guess the word."}]

    def test_a_row_without_prompt_starts_from_trls_empty_user_turn(self):
        env = as_trl_environment_factory(toy_calculator_env)()
        assert env.reset(level=1) is None
        assert env.messages == [{"role": "user", "content": ""}]


class TestAsyncTools:
    def test_as_trl_tools_keeps_a_coroutine_function(self):
        [tool] = as_trl_tools(SimpleToolTransform(tools={"multiply": async_multiply_tool}))
        assert inspect.iscoroutinefunction(tool)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "coroutine ... was never awaited" would raise
            reply = asyncio.run(tool(a=3, b=4))
        assert reply == "Tool multiply executed successfully:\n12"

    def test_environment_factory_awaits_it_and_records_the_turn(self):
        env = factory_of("multiply", async_multiply_tool)()
        env.reset(prompt=QUESTION)
        assert inspect.iscoroutinefunction(type(env).multiply)
        reply = asyncio.run(env.multiply(a=3, b=4))
        assert reply == "Tool multiply executed successfully:\n12"
        assert env.messages[-1] == {"role": "tool", "content": reply}


class TestSchema:
    @pytest.mark.parametrize("func", [multiply_tool, async_multiply_tool])
    def test_get_json_schema_is_the_plain_functions(self, func):
        name = func.__name__
        [tool] = as_trl_tools(SimpleToolTransform(tools={name: func}))
        assert get_json_schema(tool) == get_json_schema(func)
        assert get_json_schema(tool)["function"]["return"] == {
            "type": "integer",
            "description": "The product of the two integers.",
        }
        env = factory_of(name, func)()
        assert get_json_schema(getattr(env, name)) == get_json_schema(func)


class TestToolFailures:
    def test_as_trl_tools_raises_the_failure(self):
        [tool] = as_trl_tools(SimpleToolTransform(tools={"failing_tool": failing_tool}))
        with pytest.raises(ToolFailed, match="cannot use 3"):
            tool(a=3)

    def test_environment_factory_raises_and_the_env_records_the_turn(self):
        env = factory_of("failing_tool", failing_tool)()
        env.reset(prompt=QUESTION)
        with pytest.raises(ToolFailed, match="cannot use 3") as failure:
            env.failing_tool(a=3)
        assert env.messages[-1] == {"role": "tool", "content": str(failure.value)}
        assert str(failure.value).startswith("Tool failing_tool failed:")

    def test_a_registry_service_that_raises_is_a_failure(self):
        from torchrl.envs.llm import ChatEnv
        from torchrl.envs.llm.transforms import ExecuteToolsInOrder, ToolRegistry
        from torchrl.envs.llm.transforms.tools import XMLBlockParser

        class Divide:
            """Divides two whole numbers."""

            name = "divide"
            schema_in = {"a": int, "b": int}

            def __call__(self, a, b, **kwargs):
                return {"result": a // b}

        def make_env():
            env = ChatEnv(batch_size=(1,), input_mode="history")
            tools = ExecuteToolsInOrder(ToolRegistry([Divide()]), XMLBlockParser())
            return env.append_transform(tools)

        env = as_trl_environment_factory(make_env, name="divider")()
        env.reset(prompt=QUESTION)
        assert "succeeded" in env.divide(a=4, b=2)
        with pytest.raises(ToolFailed, match="by zero"):
            env.divide(a=1, b=0)
        assert "failed" in env.messages[-1]["content"]

    def test_async_failure_raises_too(self):
        async def failing(a: int) -> int:
            """Fails.

            Args:
                a: Ignored.
            """
            raise ValueError("async failure")

        [tool] = as_trl_tools(SimpleToolTransform(tools={"failing": failing}))
        with pytest.raises(ToolFailed, match="async failure"):
            asyncio.run(tool(a=1))


def rollout_trainer(tmp_path, tok, dataset):
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(**toy_grpo_args(str(tmp_path), tokenizer=tok)),
        train_dataset=dataset,
        processing_class=tok,
        rollout_func=as_trl_rollout_func(toy_chat_env(tok, batch_size=4)),
    )


class TestPromptKinds:
    """The parity claim's scope: conversational prompts are TRL's tokens; plain text is not."""

    @pytest.fixture(scope="class")
    @classmethod
    def tok(cls):
        return toy_tokenizer(padding_side="left")

    def test_conversational_prompts_are_trls_tokens(self, tmp_path, tok):
        from datasets import Dataset

        prompts = [[{"role": "user", "content": p}] for p in toy_prompts(2) for _ in range(2)]
        trainer = rollout_trainer(tmp_path, tok, Dataset.from_dict({"prompt": prompts}))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PlainTextPromptWarning)
            out = trainer.rollout_func(prompts, trainer)
        assert out["prompt_ids"] == trainer._tokenize_prompts(prompts)[0]

    def test_plain_text_prompts_warn_and_go_through_the_chat_template(self, tmp_path, tok):
        from datasets import Dataset

        prompts = [p for p in toy_prompts(2) for _ in range(2)]
        trainer = rollout_trainer(tmp_path, tok, Dataset.from_dict({"prompt": prompts}))
        with pytest.warns(PlainTextPromptWarning, match="no chat template around it"):
            out = trainer.rollout_func(prompts, trainer)
        as_turns = [[{"role": "user", "content": p}] for p in prompts]
        assert out["prompt_ids"] == trainer._tokenize_prompts(as_turns)[0]
        assert out["prompt_ids"] != trainer._tokenize_prompts(prompts)[0]  # TRL's raw text
        with warnings.catch_warnings():
            warnings.simplefilter("error", PlainTextPromptWarning)  # once per rollout function
            trainer.rollout_func(prompts, trainer)

    def test_empty_message_lists_are_named(self, tmp_path, tok):
        from datasets import Dataset

        prompts = [QUESTION, QUESTION, [], []]
        trainer = rollout_trainer(tmp_path, tok, Dataset.from_dict({"prompt": [QUESTION] * 4}))
        with pytest.raises(ValueError, match=r"prompts\[2\] is an empty message list"):
            trainer.rollout_func(prompts, trainer)
