"""TRL's own GRPOTrainer tests of its tools, environment and rollout-function seams, run twice.

Ported from TRL's ``tests/test_grpo_trainer.py`` at huggingface/trl f2cd577 (1.10.0.dev0, the
newest stored snapshot: its v1.16.0 tag is not stored). The trainer code these tests exercise is
the installed trl 1.16.0's; it differs from that snapshot only in multimodal tool images and in
listing an environment's methods on its class (properties are not evaluated). Ported:
``test_train_with_tools`` (sync and async tool), ``test_train_with_malformed_tool_calls``,
``test_train_with_multiple_environments``, ``test_train_with_unknown_environment_raises``,
``test_train_with_environment_factory``, ``test_train_with_environment_owned_reward``,
``test_environment_owned_reward_coexists_with_reward_funcs``,
``test_environment_owned_reward_mixed_environments``,
``test_environment_owned_data_requires_max_steps``,
``test_multiple_environments_without_dataset_raises``,
``test_train_with_environment_owned_data``, and from ``TestGRPORolloutDispatch``
``test_generate_prefers_rollout_func`` and
``test_generate_rollout_func_raises_when_required_keys_are_missing`` (on a real trainer, not
TRL's stub).

Each runs with a TorchRL environment doing what TRL's test environment, tool or rollout function
does, through this package's adapters (``mode="torchrl"``), with TRL's assertions. TRL's own
pieces as TRL wrote them (``mode="trl"``) are the control arm: they show that this offline
harness (the toy tokenizer, TRL's scripted ``generate``) lets TRL pass its own assertions. The
control runs once in this file, in the test that exercises most of the harness
(``test_train_with_multiple_environments``); ``TORCHRL_TRL_CONTROL_ARMS=1`` runs it in every
test (after a TRL upgrade, say). Offline: the hub's tiny Qwen models
become the toy tool tokenizer (TRL's Qwen2.5 template) and a toy Llama; TRL's scripted
``generate`` writes the same texts, tokenized by the toy tokenizer; the hub reward model is a
reward function (``completion_length``); 2 steps instead of TRL's epochs.
"""

from __future__ import annotations

import functools
import os
from unittest.mock import patch

import pytest
import torch
from datasets import Dataset
from torchrl.envs.llm.transforms import SimpleToolTransform
from trl import GRPOConfig, GRPOTrainer

from torchrl_trl_interop import as_trl_environment_factory, as_trl_tools
from torchrl_trl_interop.testing import (
    toy_causal_lm,
    toy_prompts,
    toy_tool_grpo_args,
    toy_tool_tokenizer,
)
from torchrl_trl_interop.testing._envs import shout, toy_counter_env, toy_prompting_env

#: TRL's own pieces (the control arm) and ours; the control runs in one test unless asked for
CONTROL = ["trl", "torchrl"]
MODES = CONTROL if os.environ.get("TORCHRL_TRL_CONTROL_ARMS") == "1" else ["torchrl"]


@pytest.fixture(autouse=True)
def _silence_experimental(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def tok():
    return toy_tool_tokenizer()


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def completion_length(completions, **kwargs):
    """Stands in for TRL's hub reward model: any score that differs within a group."""
    return [float(len(str(c))) for c in completions]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def scripted_generate(tok, by_batch: dict[int, list[str]], seen: list | None = None):
    """TRL's ``fake_generate``: the completion texts for a batch of that many prompts, tokenized
    by the toy tokenizer and right-padded with its pad token."""

    def generate(input_ids=None, **kwargs):
        if seen is not None:
            seen.extend(tok.batch_decode(input_ids))
        texts = by_batch[input_ids.shape[0]]
        rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(r) for r in rows)
        rows = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=-1)

    return generate


def conversational(n: int = 6, **columns) -> Dataset:
    prompts = [[{"role": "user", "content": p}] for p in toy_prompts(n)]
    return Dataset.from_dict({"prompt": prompts, **columns})


def trainer_for(tok, tmp_path, *, reward_funcs=completion_length, **kwargs) -> GRPOTrainer:
    args = kwargs.pop("args", {})
    config = GRPOConfig(**toy_tool_grpo_args(str(tmp_path), **{"learning_rate": 0.1, **args}))
    if reward_funcs is not None:
        kwargs["reward_funcs"] = reward_funcs
    return GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok), args=config, processing_class=tok, **kwargs
    )


def train_scripted(trainer, generate):
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    with patch.object(trainer.model, "generate", side_effect=generate):
        trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for n, param in before.items():  # TRL: "Check that the params have changed"
        assert not torch.equal(param, trainer.model.get_parameter(n)), n


def metrics(trainer) -> dict:
    """The last step's logged metrics (the last entry of the log is the run's summary)."""
    return [h for h in trainer.state.log_history if "loss" in h][-1]


# the TorchRL twins of TRL's test environments ------------------------------------------------


class DummyEnvironment:  # TRL's, from test_train_with_environment_factory / ..._owned_reward
    def reset(self, **kwargs):
        self._counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self._counter += step
        return self._counter

    def get_reward(self) -> float:
        return float(self._counter)


class CounterOnly(DummyEnvironment):  # TRL's DummyEnvironment without get_reward
    get_reward = None


def counter_factory(mode: str, *, owned_reward: bool = True):
    if mode == "trl":
        return DummyEnvironment if owned_reward else CounterOnly
    return as_trl_environment_factory(toy_counter_env)


def counter_value(env) -> int:
    if isinstance(env, DummyEnvironment):
        return env._counter
    return int(env.reward or 0)  # the TorchRL counter's reward is its growth per step


WORD = "Guess the 5-letter word."


class GuessTheWordEnvironment:  # TRL's
    def reset(self, **kwargs):
        return WORD


# tools= ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tool", [multiply_tool, async_multiply_tool])
def test_train_with_tools(tok, tmp_path, mode, tool):
    name = tool.__name__
    tools = [tool] if mode == "trl" else as_trl_tools(SimpleToolTransform(tools={name: tool}))
    trainer = trainer_for(
        tok,
        tmp_path,
        train_dataset=conversational(),
        tools=tools,
        args={"per_device_train_batch_size": 3, "num_generations": 3, "max_completion_length": 128},
    )
    generate = scripted_generate(
        tok,
        {
            3: [
                call(name, '{"a": 3, "b": 4}'),
                call(name, '{"a": 3, "c": 4}'),  # a wrong argument name: fails
                "I don't know any tool<|im_end|>",
            ],
            2: ["Done!<|im_end|>"] * 2,
        },
    )
    train_scripted(trainer, generate)
    log = metrics(trainer)
    assert log["tools/call_frequency"] == pytest.approx(2 / 3)
    assert log["tools/failure_frequency"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("mode", MODES)
def test_train_with_malformed_tool_calls(tok, tmp_path, mode):
    tools = (
        [multiply_tool]
        if mode == "trl"
        else as_trl_tools(SimpleToolTransform(tools={"multiply_tool": multiply_tool}))
    )
    trainer = trainer_for(
        tok,
        tmp_path,
        train_dataset=conversational(),
        tools=tools,
        args={"per_device_train_batch_size": 3, "num_generations": 3, "max_completion_length": 128},
    )
    # a second generation call (batch < 3) would mean a malformed call was run: no entry for it
    generate = scripted_generate(
        tok,
        {
            3: [
                '<tool_call>\n{"arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
                '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>',
                '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>',
            ]
        },
    )
    train_scripted(trainer, generate)


# environment_factory --------------------------------------------------------------------------


def multi_env_factories(mode: str, reset_seen: dict, calls: dict):
    if mode == "trl":

        class CounterEnvironment:
            def reset(self, **kwargs):
                return "Count."

            def increment(self, step: int) -> int:
                """
                Increment the internal counter.

                Args:
                    step: Value to add to the counter.

                Returns:
                    The updated counter value.
                """
                calls["increment"].append(step)
                return step

        class EchoEnvironment:
            def reset(self, **kwargs):
                return "Echo."

            def shout(self, text: str) -> str:
                """
                Shout the given text.

                Args:
                    text: Text to shout.

                Returns:
                    The text in upper case.
                """
                calls["shout"].append(text)
                return text.upper()

        return {"counter": CounterEnvironment, "echo": EchoEnvironment}
    return {
        "counter": as_trl_environment_factory(functools.partial(toy_counter_env, prompt="Count.")),
        "echo": as_trl_environment_factory(
            functools.partial(toy_prompting_env, "Echo.", tools={"shout": shout}), name="echo"
        ),
    }


def record_resets(trainer, reset_seen: dict):
    """Wraps each environment class's reset (after TRL probed it) to record its keywords."""
    for name, pool in trainer._environment_pool.items():
        cls = type(pool[0])
        reset = cls.reset

        def recording(self, _reset=reset, _name=name, **kwargs):
            reset_seen[_name].append(kwargs)
            return _reset(self, **kwargs)

        cls.reset = recording


@pytest.mark.parametrize("mode", CONTROL)  # the file's control arm: TRL's own environments
def test_train_with_multiple_environments(tok, tmp_path, mode):
    dataset = Dataset.from_dict({"environment": ["counter", "echo"] * 8})
    reset_seen, calls = {"counter": [], "echo": []}, {"increment": [], "shout": []}
    prompts: list[str] = []
    trainer = trainer_for(
        tok,
        tmp_path,
        train_dataset=dataset,
        environment_factory=multi_env_factories(mode, reset_seen, calls),
        args={"per_device_train_batch_size": 4, "num_generations": 2, "shuffle_dataset": False},
    )
    assert [t.__name__ for t in trainer._env_tools["counter"]] == ["increment"]
    assert [t.__name__ for t in trainer._env_tools["echo"]] == ["shout"]
    assert len(trainer._environment_pool["counter"]) == 1
    assert len(trainer._environment_pool["echo"]) == 1
    record_resets(trainer, reset_seen)
    generate = scripted_generate(
        tok,
        {
            4: [
                call("increment", '{"step": 1}'),
                "I won't<|im_end|>",
                call("shout", '{"text": "hi"}'),
                "Done!<|im_end|>",
            ],
            2: ["Done!<|im_end|>"] * 2,
        },
        prompts,
    )
    train_scripted(trainer, generate)
    if mode == "torchrl":  # each TorchRL environment ran its own tool
        for name, env in zip(["increment", "shout"], trainer.environments[::2]):
            calls[name] = [c for c in env._calls if c[0] == name]
    assert calls["increment"] and calls["shout"]
    log = metrics(trainer)
    assert log["tools/call_frequency"] == pytest.approx(2 / 4)
    assert log["tools/failure_frequency"] == pytest.approx(0.0)
    assert reset_seen["counter"] and reset_seen["echo"]
    assert all("environment" not in k for k in reset_seen["counter"] + reset_seen["echo"])
    # the model was prompted with what each environment's reset returned
    assert any("Count." in p for p in prompts) and any("Echo." in p for p in prompts)


@pytest.mark.parametrize("mode", MODES)
def test_train_with_unknown_environment_raises(tok, tmp_path, mode):
    dataset = conversational(environment=["unknown"] * 6)
    trainer = trainer_for(
        tok,
        tmp_path,
        train_dataset=dataset,
        environment_factory={"counter": counter_factory(mode, owned_reward=False)},
        args={"per_device_train_batch_size": 3, "num_generations": 3},
    )
    with pytest.raises(ValueError, match="not among the environments"):
        trainer.train()


COUNTER_COMPLETIONS = {
    3: [
        call("increment", '{"step": 1}'),
        call("decrement", '{"step": 2}'),  # a tool that does not exist: fails
        "I won't increment<|im_end|>",
    ],
    2: ["Done!<|im_end|>"] * 2,
}


@pytest.mark.parametrize("mode", MODES)
def test_train_with_environment_factory(tok, tmp_path, mode):
    trainer = trainer_for(
        tok,
        tmp_path,
        environment_factory=counter_factory(mode, owned_reward=False),
        args={"per_device_train_batch_size": 3, "num_generations": 3, "max_steps": 2},
    )
    train_scripted(trainer, scripted_generate(tok, COUNTER_COMPLETIONS))
    log = metrics(trainer)
    assert log["tools/call_frequency"] == pytest.approx(2 / 3)
    assert log["tools/failure_frequency"] == pytest.approx(1 / 2)
    assert [counter_value(env) for env in trainer.environments] == [1, 0, 0]


@pytest.mark.parametrize("mode", MODES)
def test_train_with_environment_owned_reward(tok, tmp_path, mode):
    factory = counter_factory(mode)
    trainer = trainer_for(
        tok,
        tmp_path,
        reward_funcs=None,  # the environment owns the reward
        environment_factory=factory,
        args={"per_device_train_batch_size": 3, "num_generations": 3, "max_steps": 2},
    )
    env_class = type(trainer._environment_pool[None][0]).__name__
    assert trainer.reward_func_names == [env_class]
    assert trainer.reward_weights.tolist() == [1.0]
    tool_names = [t.__name__ for t in trainer.tools]
    assert "increment" in tool_names
    assert "get_reward" not in tool_names and "reset" not in tool_names
    train_scripted(trainer, scripted_generate(tok, COUNTER_COMPLETIONS))
    assert metrics(trainer)[f"rewards/{env_class}/mean"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", MODES)
def test_environment_owned_reward_coexists_with_reward_funcs(tok, tmp_path, mode):
    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = trainer_for(
        tok,
        tmp_path,
        reward_funcs=format_reward,
        environment_factory=counter_factory(mode),
        args={
            "per_device_train_batch_size": 3,
            "num_generations": 3,
            "max_steps": 5,
            "reward_weights": [0.5],  # applies to the trainer-owned reward function only
        },
    )
    env_class = type(trainer._environment_pool[None][0]).__name__
    assert trainer.reward_func_names == ["format_reward", env_class]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert len(trainer.reward_funcs) == 2
    tool_names = [t.__name__ for t in trainer.tools]
    assert "increment" in tool_names and "get_reward" not in tool_names


@pytest.mark.parametrize("mode", MODES)
def test_environment_owned_reward_mixed_environments(tok, tmp_path, mode):
    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    def play(x: int) -> int:
        """
        Play.

        Args:
            x: A value.

        Returns:
            The value.
        """
        return x

    if mode == "trl":
        scored, plain = DummyEnvironment, CounterOnly
    else:
        scored = counter_factory(mode)
        plain = as_trl_environment_factory(
            functools.partial(toy_prompting_env, "Play.", tools={"play": play}), name="plain"
        )
    dataset = Dataset.from_dict({"environment": ["scored", "scored2", "plain"]})
    trainer = trainer_for(
        tok,
        tmp_path,
        reward_funcs=format_reward,
        train_dataset=dataset,
        environment_factory={"scored": scored, "scored2": scored, "plain": plain},
        args={"per_device_train_batch_size": 3, "num_generations": 3},
    )
    env_class = type(trainer._environment_pool["scored"][0]).__name__
    assert trainer.reward_func_names == ["format_reward", env_class]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    one, other = scored(), plain()
    one.reset(prompt=[{"role": "user", "content": ""}])
    one.increment(step=1)
    assert trainer.reward_funcs[-1](environments=[one, other]) == [1.0, None]


@pytest.mark.parametrize("mode", MODES)
def test_environment_owned_data_requires_max_steps(tok, tmp_path, mode):
    factory = (
        GuessTheWordEnvironment
        if mode == "trl"
        else as_trl_environment_factory(functools.partial(toy_prompting_env, WORD))
    )
    with pytest.raises(ValueError, match="max_steps"):
        trainer_for(tok, tmp_path, environment_factory=factory, args={"max_steps": -1})


@pytest.mark.parametrize("mode", MODES)
def test_multiple_environments_without_dataset_raises(tok, tmp_path, mode):
    factory = counter_factory(mode)
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        trainer_for(tok, tmp_path, environment_factory={"a": factory, "b": factory})


@pytest.mark.parametrize("mode", MODES)
def test_train_with_environment_owned_data(tok, tmp_path, mode):
    factory = (
        GuessTheWordEnvironment
        if mode == "trl"
        else as_trl_environment_factory(functools.partial(toy_prompting_env, WORD), name="word")
    )

    def reward_len(completions, **kwargs):
        return [float(len(completion[-1]["content"])) for completion in completions]

    trainer = trainer_for(
        tok,
        tmp_path,
        reward_funcs=reward_len,
        environment_factory=factory,
        args={
            "per_device_train_batch_size": 3,
            "num_generations": 3,
            "max_steps": 2,
            "max_completion_length": 8,
        },
    )
    prompts: list[str] = []
    done = ["Done!<|im_end|>", "DoneDone!<|im_end|>", "DoneDoneDone!<|im_end|>"]
    train_scripted(trainer, scripted_generate(tok, {3: done}, prompts))
    # the model was prompted with the environment's own prompt, as TRL's environment gives it
    assert prompts and all(WORD in p for p in prompts)


# rollout_func (TRL's TestGRPORolloutDispatch, on a real trainer instead of a stub) ---------------


def rollout_dispatch_trainer(tmp_path, mode: str, returned: dict, drop: str | None = None):
    from unittest.mock import MagicMock

    from torchrl_trl_interop import as_trl_rollout_func
    from torchrl_trl_interop.testing import toy_chat_env, toy_grpo_args, toy_tokenizer

    tok = toy_tokenizer(padding_side="left")
    if mode == "trl":  # TRL's: a rollout function returning fixed rows
        rollout_func = MagicMock(return_value=returned)
    else:  # ours, its returns recorded (``drop``: a key left out)
        ours, returns = as_trl_rollout_func(toy_chat_env(tok, batch_size=2)), []

        def run(prompts, trainer):
            returns.append({k: v for k, v in ours(prompts, trainer).items() if k != drop})
            return returns[-1]

        rollout_func = MagicMock(side_effect=run)
        rollout_func.returns = returns
    trainer = GRPOTrainer(
        model=toy_causal_lm(tokenizer=tok),
        reward_funcs=completion_length,
        args=GRPOConfig(**toy_grpo_args(str(tmp_path), tokenizer=tok)),
        train_dataset=conversational(4),
        processing_class=tok,
        rollout_func=rollout_func,
    )
    trainer.rollout_func = rollout_func  # TRL keeps the function it was given
    return trainer, rollout_func


@pytest.mark.parametrize("mode", MODES)
def test_generate_prefers_rollout_func(tmp_path, mode):
    returned = {
        "prompt_ids": [[1]],
        "completion_ids": [[2]],
        "logprobs": [[-0.1]],
        "env_mask": [[1]],
    }
    trainer, rollout_func = rollout_dispatch_trainer(tmp_path, mode, returned)
    prompts = ["prompt"] if mode == "trl" else [[{"role": "user", "content": "Hi"}]] * 2
    result = trainer._generate(prompts)
    rollout_func.assert_called_once_with(prompts, trainer)
    out = returned if mode == "trl" else rollout_func.returns[0]
    assert result[0] == out["prompt_ids"]
    assert result[1] == out["completion_ids"]
    assert result[2] == out["env_mask"]  # the tool mask, from env_mask


@pytest.mark.parametrize("mode", MODES)
def test_generate_rollout_func_raises_when_required_keys_are_missing(tmp_path, mode):
    returned = {"prompt_ids": [[1]], "completion_ids": [[2]]}
    # ours: its rows without their log-probs
    trainer, _ = rollout_dispatch_trainer(tmp_path, mode, returned, drop="logprobs")
    prompts = ["prompt"] if mode == "trl" else [[{"role": "user", "content": "Hi"}]] * 2
    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer._generate(prompts)
