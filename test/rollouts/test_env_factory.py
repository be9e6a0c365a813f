"""TorchRL environments inside TRL's own tool loop: ``as_trl_environment_factory``, ``as_trl_tools``.

Real ``GRPOTrainer(environment_factory=...).train()`` and ``GRPOTrainer(tools=...).train()`` runs
with a toy model fitted to call the calculator (``testing.toy_tool_caller``); the same episode
through ``as_trl_rollout_func``; ``PythonInterpreter``, ``ToolRegistry`` and a real stdio MCP
server as tools; the factory built in a spawned process; every documented error.
"""

from __future__ import annotations

import copy
import functools
import json
import multiprocessing
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from tensordict import set_list_to_stack
from tensordict.nn import TensorDictModuleBase
from torchrl.data.llm import History
from torchrl.envs import PendulumEnv, Transform
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms import (
    ExecuteToolsInOrder,
    JSONCallParser,
    MCPToolTransform,
    PythonInterpreter,
    SimpleToolTransform,
    ToolRegistry,
    XMLBlockParser,
)
from torchrl.modules.llm.policies import ChatHistory
from transformers.utils import get_json_schema

from torchrl_trl_interop import (
    as_trl_environment_factory,
    as_trl_rollout_func,
    as_trl_tools,
)
from torchrl_trl_interop.testing import (
    arithmetic_questions,
    calculator_tools,
    correct_answer,
    toy_add,
    toy_calculator_env,
    toy_causal_lm,
    toy_tokenizer,
    toy_tool_caller,
    toy_tool_grpo_args,
    toy_tool_reply,
    toy_tool_tokenizer,
    toy_trainer_args,
)
from torchrl_trl_interop.testing._tool_task import scripted_episode, tool_result_reward

pytestmark = pytest.mark.filterwarnings(
    "ignore:You are using 'environment_factory'", "ignore:You are using 'rollout_func'"
)

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
REPLY = "Tool add executed successfully:\n{}"


def call_message(name="add", **arguments):
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def calculator(**kwargs):
    """The calculator env rewarded by a reward that reads the tool's reply in its History."""
    return functools.partial(toy_calculator_env, rewards=[tool_result_reward], **kwargs)


def chat_env(*transforms, **kwargs):
    env = ChatEnv(batch_size=(1,), input_mode="history", **kwargs)
    for t in transforms:
        env = env.append_transform(t)
    return env


def documented(a: int) -> int:
    """A documented tool.

    Args:
        a: a number.
    """
    return a


def prompts_dataset(questions):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})


@pytest.fixture(scope="module")
def caller():
    """The toy tokenizer with TRL's Qwen2.5 template and a model fitted to call ``add``."""
    tokenizer = toy_tool_tokenizer()
    return tokenizer, toy_tool_caller(tokenizer)


def grpo(tmp_path, caller, **kwargs):
    from trl import GRPOConfig, GRPOTrainer

    tokenizer, model = caller
    return GRPOTrainer(
        model=model,
        args=GRPOConfig(**toy_tool_grpo_args(tmp_path)),
        train_dataset=prompts_dataset(arithmetic_questions(max_operand=4)[::3]),
        processing_class=tokenizer,
        **kwargs,
    )


class RewardRecorder:
    """Wraps the factory's reward function; keeps what TRL passed and what came back."""

    def __init__(self, reward_func):
        self.reward_func = reward_func
        self.__name__ = reward_func.__name__
        self.calls = []

    def __call__(self, prompts, completions, environments, **kwargs):
        rewards = self.reward_func(
            prompts=prompts, completions=completions, environments=environments, **kwargs
        )
        rows = zip(prompts, completions, environments, rewards)
        self.calls.append([(p, c, e.messages, r) for p, c, e, r in rows])
        return rewards


def read_calls(content):
    """The calls SimpleToolTransform reads in an assistant turn of the environment's History."""
    return [(n, json.loads(a)) for n, a in calculator_tools()._extract_tool_calls(content)]


class TestGRPOEnvironmentFactory:
    def test_trains_with_a_torchrl_tool(self, tmp_path, caller):
        """TRL generates and parses the calls; the TorchRL env runs them, and its reward (which
        reads the tool's reply in its History) is GRPO's reward column."""
        factory = as_trl_environment_factory(calculator(), processing_class=caller[0])
        recorder = RewardRecorder(factory.reward_func)
        trainer = grpo(tmp_path, caller, environment_factory=factory, reward_funcs=recorder)
        trainer.train()

        logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
        assert len(logs) == len(recorder.calls) == 2
        assert any(log["tools/call_frequency"] > 0 for log in logs)
        assert all(log["tools/failure_frequency"] == 0 for log in logs)
        name = factory.reward_func.__name__
        for log, step in zip(logs, recorder.calls):
            rewards = [row[-1] for row in step]
            assert log[f"rewards/{name}/mean"] == pytest.approx(sum(rewards) / len(rewards))

        n_calls = 0
        for prompt, completion, messages, reward in (
            row for step in recorder.calls for row in step
        ):
            assert messages[: len(prompt)] == prompt
            trl_calls = [c["function"] for m in completion for c in m.get("tool_calls") or []]
            replies = [m["content"] for m in completion if m["role"] == "tool"]
            env_calls = [
                c for m in messages if m["role"] == "assistant" for c in read_calls(m["content"])
            ]
            env_replies = [m["content"] for m in messages if m["role"] == "tool"]
            # the TorchRL tool ran with the model's arguments, and its reply is what TRL got
            assert env_calls == [(c["name"], c["arguments"]) for c in trl_calls][: len(env_calls)]
            assert env_replies == replies
            for (_, args), reply in zip(env_calls, env_replies):
                assert reply == REPLY.format(toy_add(**args))
            n_calls += len(env_calls)
            # the environment's own reward, which reads the tool's reply in its History
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            assert reward == sum(tool_result_reward([messages[:i]], [[]])[0] for i in turns)
        assert n_calls > 0

    def test_plain_tools(self, tmp_path, caller):
        """``GRPOTrainer(tools=as_trl_tools(...))``: the same tool, stateless, in TRL's loop."""
        seen = []

        def answered(completions, **kwargs):
            seen.extend(completions)
            return [float(any(m["role"] == "tool" for m in c)) for c in completions]

        tools = as_trl_tools(calculator_tools(), processing_class=caller[0])
        trainer = grpo(tmp_path, caller, tools=tools, reward_funcs=answered)
        trainer.train()
        logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
        assert any(log["tools/call_frequency"] > 0 for log in logs)
        assert all(log["tools/failure_frequency"] == 0 for log in logs)
        for completion in seen:
            for call, reply in zip(
                [c["function"] for m in completion for c in m.get("tool_calls") or []],
                [m for m in completion if m["role"] == "tool"],
            ):
                assert reply["content"] == REPLY.format(toy_add(**call["arguments"]))


@pytest.mark.slow
def test_the_docs_example_runs(doc_pages):
    """The code block of docs/online.rst's section on environment_factory, as the page's run
    (once per session: ``test/_doc_pages.py``) left it: the trainer trained, calling tools."""
    text = (Path(__file__).parents[2] / "docs" / "online.rst").read_text()
    heading = text.split("TorchRL environments in TRL's own tool loop\n", 1)[0].count("\n") + 1
    namespace = doc_pages.run("online.rst").after(heading)
    logs = namespace["trainer"].state.log_history
    assert namespace["trainer"].state.global_step == 2
    assert any(log.get("tools/call_frequency", 0) > 0 for log in logs)


class ScriptedPolicy(TensorDictModuleBase):
    """A TorchRL LLM policy answering from a script, as ``TransformersWrapper`` writes its output
    (token-first from the second turn): the other side of the parity test."""

    def __init__(self, tokenizer, answers):
        super().__init__()
        self.tokenizer, self.answers = tokenizer, answers
        self.in_keys, self.out_keys = [("history", "prompt")], [("history", "full")]

    def forward(self, td):
        tok = self.tokenizer
        with set_list_to_stack(True):
            prompt = td.get(("history", "prompt"))
            turn = sum(m["role"] == "assistant" for m in prompt[0].tolist())
            given = td.get(("tokens", "prompt"), None)
            if turn == 0:
                text = prompt.apply_chat_template(tokenizer=tok, add_generation_prompt=True)[0]
                ids = tok(text, add_special_tokens=False)["input_ids"]
            else:  # continue from exactly the tokens given, left padding dropped
                ids = given[0][given[0] != tok.pad_token_id].tolist()
            answer = self.answers[turn]
            response = tok(answer + tok.eos_token, add_special_tokens=False)["input_ids"]
            message = History(role="assistant", content=answer, is_complete=True).view(1, 1)
            full = prompt.extend(message, dim=-1, inplace=False)
            td.set(
                "history", ChatHistory(prompt=prompt, response=message, full=full, batch_size=[1])
            )
            td.set(("tokens", "prompt"), torch.tensor([ids]))
            td.set(("tokens", "response"), torch.tensor([response]))
            td.set(("log_probs", "response"), torch.zeros(1, len(response)))
        return td


class TestSameEpisode:
    def test_as_rollout_func_and_as_environment_factory(self, tmp_path):
        """One TorchRL env, the same answers: the same conversation and reward through both seams."""
        from trl import GRPOConfig, GRPOTrainer

        make_env = functools.partial(
            toy_calculator_env, rewards=[tool_result_reward, correct_answer]
        )
        factory = as_trl_environment_factory(make_env)
        [tool] = factory()._tools.values()
        call_text, final = tool.render({"a": 2, "b": 3}), "2 plus 3 is 5."

        tok = toy_tokenizer(padding_side="left")
        rollout_func = as_trl_rollout_func(
            make_env(), policy=ScriptedPolicy(tok, [call_text, final]), max_turns=2
        )
        trainer = GRPOTrainer(
            model=toy_causal_lm(tokenizer=tok),
            reward_funcs=correct_answer,
            args=GRPOConfig(num_generations=2, **toy_trainer_args(tmp_path, bf16=False)),
            train_dataset=prompts_dataset(["What is 2 plus 3?"]),
            processing_class=tok,
            rollout_func=rollout_func,
        )
        through_rollout_func = rollout_func([QUESTION, QUESTION], trainer)

        answers = [call_message(a=2, b=3), {"role": "assistant", "content": final}]
        through_factory = scripted_episode(factory, QUESTION, answers)

        messages = through_factory["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[1]["content"] == call_text and messages[-1]["content"] == final
        assert (
            messages[2]["content"] == REPLY.format(5) == through_factory["completion"][1]["content"]
        )
        for history, reward in zip(
            through_rollout_func["history"], through_rollout_func["env_reward"]
        ):
            assert history == messages
            assert reward == through_factory["reward"] == 2.0  # the reply holds 5; the answer is 5


def python_env():
    return chat_env(PythonInterpreter())


class Add:
    name = "add"
    schema_in = {"a": int, "b": int}
    schema_out = {"result": int}

    def __call__(self, a, b, **kwargs):
        return {"result": a + b}


class Echo:
    """Says a text back."""

    name = "echo"
    schema_in = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "what to say"}},
        "required": ["text"],
    }
    schema_out = {"text": str}

    def __call__(self, text, **kwargs):
        return {"text": text}


def registry_env(parser):
    return chat_env(ExecuteToolsInOrder(ToolRegistry([Add(), Echo()]), parser))


class TestToolKinds:
    def test_python_interpreter(self):
        env = as_trl_environment_factory(python_env)()
        schema = get_json_schema(env.python)["function"]
        assert schema["name"] == "python"
        assert schema["parameters"]["properties"]["code"]["type"] == "string"
        assert schema["parameters"]["required"] == ["code"]
        env.reset(prompt=QUESTION)
        reply = env.python(code="print(2 + 3)")
        assert reply == env.messages[-1]["content"] == "Code block 1 executed successfully:\n5\n"
        assert env.messages[1]["content"] == "```python\nprint(2 + 3)\n```"

    @pytest.mark.parametrize("parser", [XMLBlockParser, JSONCallParser])
    def test_tool_registry(self, parser):
        env = as_trl_environment_factory(functools.partial(registry_env, parser()))()
        add, echo = get_json_schema(env.add)["function"], get_json_schema(env.echo)["function"]
        assert add["parameters"]["properties"] == {
            "a": {"type": "integer", "description": "The a argument."},
            "b": {"type": "integer", "description": "The b argument."},
        }
        assert echo["description"] == "Says a text back."
        assert echo["parameters"]["properties"]["text"] == {
            "type": "string",
            "description": "what to say",
        }
        env.reset(prompt=QUESTION)
        reply = env.add(a=2, b=3)
        assert reply == env.messages[-1]["content"]
        assert reply.startswith("<tool_results>") and '"result": 5' in reply
        assert "hello there" in env.echo(text="hello there")

    def test_as_trl_tools(self):
        [add] = as_trl_tools(calculator_tools())
        env = as_trl_environment_factory(toy_calculator_env)()
        assert get_json_schema(add) == get_json_schema(env.add)  # what TRL renders
        env.reset(prompt=QUESTION)
        assert add(a=2, b=3) == env.add(a=2, b=3) == REPLY.format(5)
        assert pickle.loads(pickle.dumps(add))(a=1, b=1) == REPLY.format(2)
        with pytest.raises(TypeError, match="b"):
            add(a=2)
        [registry_add, _] = as_trl_tools(ToolRegistry([Add(), Echo()]), rename={"add": "plus"})
        assert registry_add.__name__ == "plus" and registry_add(a=2, b=3) == {"result": 5}

    @pytest.mark.slow
    def test_mcp_server(self):
        """A real stdio MCP server, listed and called through MCPToolTransform."""
        server = str(Path(__file__).with_name("_mcp_calculator.py"))
        make_env = functools.partial(mcp_env, server)
        env = as_trl_environment_factory(make_env)()
        try:
            schema = get_json_schema(env.add)["function"]
            assert schema["description"] == "Adds two whole numbers."
            assert schema["parameters"]["required"] == ["a", "b"]
            assert schema["parameters"]["properties"]["a"]["type"] == "integer"
            env.reset(prompt=QUESTION)
            reply = env.add(a=2, b=3)
            assert reply == env.messages[-1]["content"]
            assert reply.startswith("Tool calc.add executed successfully") and "5" in reply
            assert env.messages[1]["content"] == '<tool>calc.add\n{"a": 2, "b": 3}</tool>'
        finally:
            env.env.transform.close()  # stops the MCP thread, which ends the server process


class InitializedMCPToolTransform(MCPToolTransform):
    """torchrl 0.14.1's MCPToolTransform lists tools without the MCP handshake
    (``session.initialize()``), which a compliant server refuses; this one shakes hands first."""

    async def _connect_servers(self):
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        for name, config in self.server_configs.items():
            params = StdioServerParameters(command=config["command"], args=config["args"])
            stdio = stdio_client(params)
            read, write = await stdio.__aenter__()
            session = ClientSession(read, write)
            await session.__aenter__()
            await session.initialize()
            self._sessions[name] = {"session": session, "stdio": stdio}
            self._tools_cache[name] = {t.name: t for t in (await session.list_tools()).tools}


def mcp_env(server):
    tools = InitializedMCPToolTransform({"calc": {"command": sys.executable, "args": [server]}})
    return chat_env(tools)


@pytest.mark.slow
def test_factory_builds_environments_in_a_spawned_process():
    """What AsyncGRPOTrainer does: the factory (and its reward function) pickled to a spawned
    process, where the environments are built and run."""
    factory = as_trl_environment_factory(calculator())
    answers = [call_message(a=2, b=3), {"role": "assistant", "content": "2 plus 3 is 5."}]
    here = scripted_episode(factory, QUESTION, answers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        there = pool.submit(scripted_episode, factory, QUESTION, answers).result(timeout=300)
    assert there == here and there["reward"] == 1.0
    assert pickle.loads(pickle.dumps(factory.reward_func)).__name__ == factory.reward_func.__name__


class AppendToPrompt(Transform):
    """Appends a text to the last prompt message at reset (what reset() returns to TRL)."""

    def _reset(self, tensordict, tensordict_reset):
        with set_list_to_stack(True):
            history = tensordict_reset.get(("history", "prompt"))
            chats = history.tolist()
            chats[0][-1]["content"] += " Use the calculator."
            tensordict_reset.set(("history", "prompt"), History.from_chats(chats))
        return tensordict_reset


class TestEpisode:
    def test_reset_returns_what_the_env_appended(self):
        make_env = functools.partial(chat_env, AppendToPrompt(), calculator_tools())
        env = as_trl_environment_factory(make_env)()
        assert env.reset(prompt=QUESTION) == " Use the calculator."
        assert as_trl_environment_factory(toy_calculator_env)().reset(prompt=QUESTION) is None

    def test_row_columns_reach_the_env(self):
        env = as_trl_environment_factory(toy_calculator_env)()
        env.reset(prompt="What is 2 plus 3?", answer="5", level=3)
        assert env.messages == QUESTION  # a text prompt is one user turn
        assert env._td.get("answer").tolist() == ["5"]
        assert env._td["level"].tolist() == [3]

    def test_a_turn_with_two_calls_is_stepped_once_per_call(self):
        factory = as_trl_environment_factory(toy_calculator_env)
        two = call_message(a=1, b=1)
        two["tool_calls"] += call_message(a=2, b=2)["tool_calls"]
        out = scripted_episode(factory, QUESTION, [two, {"role": "assistant", "content": "5"}])
        roles = [m["role"] for m in out["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert [m["content"] for m in out["completion"] if m["role"] == "tool"] == [
            REPLY.format(2),
            REPLY.format(4),
        ]

    def test_calls_left_unrun_by_trls_iteration_cap_are_scored_not_refused(self):
        """TRL stops at ``max_tool_calling_iterations`` and leaves the last turn's calls in the
        completion, never run: the episode is scored (no final answer: nothing stepped), and a
        completion whose calls differ from the ones the environment ran is still refused."""
        factory = as_trl_environment_factory(toy_calculator_env)
        env = factory()
        env.reset(prompt=QUESTION)
        env.add(a=2, b=3)
        completion = [
            call_message(a=2, b=3),
            {"role": "tool", "name": "add", "content": REPLY.format(5)},
            call_message(a=1, b=1),  # TRL's loop stopped here: this call never ran
        ]
        assert factory.reward_func(
            prompts=[QUESTION], completions=[completion], environments=[env]
        ) == [0.0]
        other = factory()
        other.reset(prompt=QUESTION)
        other.add(a=2, b=3)
        with pytest.raises(ValueError, match="do not match one to one"):
            factory.reward_func(
                prompts=[QUESTION], completions=[[call_message(a=4, b=4)]], environments=[other]
            )

    def test_errors_become_tool_results_and_the_env_is_not_stepped(self):
        env = as_trl_environment_factory(toy_calculator_env)()
        env.reset(prompt=QUESTION)
        with pytest.raises(TypeError, match="'b'"):
            env.add(a=2)
        assert len(env.messages) == 1

    def test_no_call_after_the_episode_ended(self):
        factory = as_trl_environment_factory(functools.partial(toy_calculator_env, max_steps=1))
        out = scripted_episode(factory, QUESTION, [call_message(a=2, b=3), call_message(a=1, b=1)])
        assert "episode is over" in out["completion"][-1]["content"]
        assert len(out["messages"]) == 3  # the final answer was not stepped either


class TestErrors:
    def test_nothing_to_bridge(self):
        with pytest.raises(ValueError, match="nothing to bridge"):
            as_trl_environment_factory(chat_env)

    def test_schema_that_cannot_be_a_signature(self):
        schema = {"parameters": {"type": "object", "properties": {"where": {"$ref": "#/$defs/P"}}}}
        tools = SimpleToolTransform(tools={"lookup": documented}, tool_schemas={"lookup": schema})
        with pytest.raises(ValueError, match=r"tool 'lookup', argument 'where'.*\$ref"):
            as_trl_environment_factory(functools.partial(chat_env, tools))
        conditional = {"type": "object", "properties": {}, "allOf": [{"required": ["x"]}]}
        tools = SimpleToolTransform(
            tools={"lookup": documented}, tool_schemas={"lookup": conditional}
        )
        with pytest.raises(ValueError, match="'lookup' uses.*allOf"):
            as_trl_tools(tools)

    @pytest.mark.parametrize(
        "name, match",
        [("reset", "taken"), ("get_reward", "taken"), ("messages", "taken"), ("class", "keyword")],
    )
    def test_tool_names(self, name, match):
        make_env = functools.partial(chat_env, SimpleToolTransform(tools={name: documented}))
        with pytest.raises(ValueError, match=f"tool '{name}'.*{match}"):
            as_trl_environment_factory(make_env)
        renamed = as_trl_environment_factory(make_env, rename={name: "lookup"})()
        renamed.reset(prompt=QUESTION)
        assert renamed.lookup(a=4) == f"Tool {name} executed successfully:\n4"

    def test_tool_functions(self):
        def bare(a):
            return a

        def undocumented(a: int):
            return a

        for func, error, match in [
            (bare, TypeError, "no type hint"),
            (undocumented, ValueError, "no docstring"),
        ]:
            with pytest.raises(error, match=match):
                as_trl_tools(SimpleToolTransform(tools={"t": func}))

    def test_chat_template_that_cannot_call_tools(self, caller):
        with pytest.raises(ValueError, match="trl/chat_templates"):
            as_trl_environment_factory(toy_calculator_env, processing_class=toy_tokenizer())
        # renders tool calls, but TRL has no parser for it
        tok = toy_tool_tokenizer()
        tok.chat_template = tok.chat_template.replace("<|im_start|>", "<|im_start|> ")
        with pytest.raises(ValueError, match="add_response_schema"):
            as_trl_tools(calculator_tools(), processing_class=tok)
        as_trl_tools(calculator_tools(), processing_class=caller[0])

    @pytest.mark.parametrize(
        "make_env, error, match",
        [
            (PendulumEnv, TypeError, "ChatEnv"),
            (functools.partial(ChatEnv, batch_size=(2,)), ValueError, "batch_size"),
            (functools.partial(ChatEnv, batch_size=(1,), input_mode="text"), ValueError, "history"),
            (functools.partial(chat_env, toy_tool_reply()), TypeError, "cannot be listed"),
            (
                functools.partial(
                    chat_env, SimpleToolTransform({"t": documented}, tool_call_pattern=r"C\[(.*)\]")
                ),
                ValueError,
                "syntax",
            ),
        ],
    )
    def test_environments(self, make_env, error, match):
        with pytest.raises(error, match=match):
            as_trl_environment_factory(make_env)

    def test_arguments(self):
        with pytest.raises(TypeError, match="make_env is an environment"):
            as_trl_environment_factory(toy_calculator_env())
        with pytest.raises(TypeError, match="zero-argument callable"):
            as_trl_environment_factory("toy_calculator_env")
        with pytest.raises(ValueError, match="not tools of the environment"):
            as_trl_environment_factory(toy_calculator_env, rename={"sub": "minus"})
        with pytest.raises(ValueError, match="row_keys"):
            as_trl_environment_factory(toy_calculator_env, row_keys=["prompt"])

    def test_reset(self):
        with_system = functools.partial(chat_env, calculator_tools(), system_prompt="Be brief.")
        with pytest.raises(ValueError, match="system prompt"):
            as_trl_environment_factory(with_system)().reset(prompt=QUESTION)
        env = as_trl_environment_factory(toy_calculator_env)()
        # no prompt column: TRL prompts with its empty user turn, so the env starts from it too
        assert env.reset(question="What is 2 plus 3?") is None
        assert env.messages == [{"role": "user", "content": ""}]
        with pytest.raises(ValueError, match=r"\['history'\]"):
            env.reset(prompt=QUESTION, history="x")
        with pytest.raises(KeyError, match="answer"):
            as_trl_environment_factory(toy_calculator_env, row_keys=["answer"])().reset(prompt="Hi")

    def test_reward_func(self):
        factory = as_trl_environment_factory(toy_calculator_env)
        with pytest.raises(TypeError, match="environments="):
            factory.reward_func(prompts=[QUESTION], completions=[[]])
        env = factory()
        with pytest.raises(ValueError, match="one environment per completion"):
            factory.reward_func(prompts=[QUESTION], completions=[[], []], environments=[env])
        env.reset(prompt=QUESTION)
        env.add(a=2, b=3)
        with pytest.raises(ValueError, match="do not match"):
            factory.reward_func(
                prompts=[QUESTION], completions=[[call_message(a=9, b=9)]], environments=[env]
            )
        other = as_trl_environment_factory(toy_calculator_env)
        assert other.reward_func(prompts=[QUESTION], completions=[[]], environments=[env]) == [None]


# -- every instance as the first (issue 53) -----------------------------------------------------


async def async_add(a: int, b: int) -> int:
    """Adds two whole numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b  # the schema of toy_add, which the fitted caller was prompted with


def failing_add(a: int, b: int) -> int:
    """Adds two whole numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    raise RuntimeError("the adder is broken")


def calculator_with(add):
    """A calculator environment whose ``add`` tool is ``add`` (module level: it pickles)."""
    from torchrl.envs import StepCounter

    env = ChatEnv(batch_size=(1,), input_mode="history")
    env = env.append_transform(SimpleToolTransform(tools={"add": add}))
    return env.append_transform(StepCounter(max_steps=4))


class TestEveryInstance:
    """TRL builds one instance per rollout (4 here, from one factory): async and failing tools
    behave on every instance as on the first, in real ``GRPOTrainer`` runs."""

    @staticmethod
    def train(tmp_path, caller, add):
        seen = []

        def replies(completions, environments, **kwargs):
            seen.append([(c, e) for c, e in zip(completions, environments)])
            return [0.0] * len(completions)

        from trl import GRPOConfig, GRPOTrainer

        factory = as_trl_environment_factory(functools.partial(calculator_with, add), name="calc")
        tokenizer, model = caller
        trainer = GRPOTrainer(  # a low temperature: the fitted caller writes whole calls
            model=copy.deepcopy(model),
            args=GRPOConfig(**toy_tool_grpo_args(tmp_path, temperature=0.3)),
            train_dataset=prompts_dataset(arithmetic_questions(max_operand=4)[::3]),
            processing_class=tokenizer,
            environment_factory=factory,
            reward_funcs=replies,
        )
        trainer.train()
        rows = [row for step in seen for row in step]
        assert len({id(env) for _, env in rows}) >= 3  # several instances
        logs = [log for log in trainer.state.log_history if "tools/call_frequency" in log]
        return rows, logs

    def test_async_tools_are_awaited_on_every_instance(self, tmp_path, caller):
        rows, _ = self.train(tmp_path, caller, async_add)
        called = set()
        for completion, env in rows:
            calls = [
                c["function"]["arguments"] for m in completion for c in m.get("tool_calls") or []
            ]
            replies = [m["content"] for m in completion if m["role"] == "tool"]
            for arguments, reply in zip(calls, replies):
                assert "coroutine" not in reply, reply
                if set(arguments) == {"a", "b"}:  # a well-formed call: the tool's sum
                    assert reply == REPLY.format(toy_add(**arguments)), reply
                    called.add(id(env))
        assert len(called) >= 3  # the calls ran on several instances, each awaited

    def test_failing_tools_count_on_every_instance(self, tmp_path, caller):
        rows, logs = self.train(tmp_path, caller, failing_add)
        failed = set()
        for completion, env in rows:
            calls = [c for m in completion for c in m.get("tool_calls") or []]
            if not calls:
                continue
            # the environment ran the call: its History holds TorchRL's failure reply
            replies = [m["content"] for m in env.messages if m["role"] == "tool"]
            assert replies and all("the adder is broken" in r for r in replies), replies
            failed.add(id(env))
        assert len(failed) >= 3
        for log in logs:  # every call failed and TRL counted it, on whichever instance
            assert log["tools/call_frequency"] > 0
            assert log["tools/failure_frequency"] == pytest.approx(1.0), log


def one_per_step(completions, **kwargs):
    """A TRL reward function run in the environment: 1.0 for every step."""
    return [1.0] * len(completions)


class TestRewardCountedOnce:
    """TRL's own OpenEnv examples read ``env.reward`` in their reward function; the instances
    also carry ``get_reward``, which TRL adds as a second reward source."""

    @staticmethod
    def env_reward(environments, **kwargs):  # as TRL's examples write it
        return [env.reward for env in environments]

    def run(self, tmp_path, caller, **factory_kwargs):
        make_env = functools.partial(toy_calculator_env, rewards=[one_per_step])
        factory = as_trl_environment_factory(make_env, name="calc", **factory_kwargs)
        rewards = []

        def read(environments, **kwargs):
            out = self.env_reward(environments)
            rewards.extend(out)
            return out

        read.__name__ = "env_reward"
        trainer = grpo(tmp_path, caller, environment_factory=factory, reward_funcs=read)
        trainer.train()
        logs = [log for log in trainer.state.log_history if "reward" in log]
        return rewards, logs

    def test_trls_example_logs_trls_total(self, tmp_path, caller):
        rewards, logs = self.run(tmp_path, caller)
        assert any(r for r in rewards)  # the tool reward was written and read
        for log in logs:  # the logged total is the reward the function read, counted once
            assert log["reward"] == pytest.approx(log["rewards/env_reward/mean"]), log
            assert log["rewards/Calc/mean"] is None  # get_reward stood aside for every row

    def test_get_reward_can_be_left_out(self, tmp_path, caller):
        _, logs = self.run(tmp_path, caller, get_reward=False)
        assert not any(key.startswith("rewards/CalculatorEnv") for log in logs for key in log)
        assert not hasattr(
            as_trl_environment_factory(calculator(), get_reward=False)(), "get_reward"
        )

    def test_get_reward_alone_still_counts(self):
        factory = as_trl_environment_factory(calculator())
        env = factory()
        env.reset(prompt=QUESTION)
        env.add(a=2, b=3)
        assert env.get_reward() is not None  # nothing read env.reward: get_reward reports


def test_reward_func_refuses_completions_of_other_environments():
    """A fresh environment (no call run) scored with a completion whose calls got replies: they
    do not belong together (the calls would have run)."""
    factory = as_trl_environment_factory(toy_calculator_env)
    envs = [factory(), factory()]
    for env in envs:
        env.reset(prompt=QUESTION)
    completion = [call_message(a=2, b=3), {"role": "tool", "name": "add", "content": "5"}]
    completion.append({"role": "assistant", "content": "5"})
    with pytest.raises(ValueError, match="do not match"):
        factory.reward_func(prompts=[QUESTION] * 2, completions=[completion] * 2, environments=envs)
