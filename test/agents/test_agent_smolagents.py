"""Tool calls through the endpoint, offline, on the toy tokenizer with TRL's Qwen2.5 template and
a toy model fitted on smolagents' own prompts: the ``openai`` client gets the answer's
``<tool_call>`` as ``tool_calls`` and its tool reply continues the trajectory, masked;
smolagents, an agent framework users run, drives tool-calling episodes (a ``ToolCallingAgent``
whose ``OpenAIModel`` points at the server calls ``add`` and answers with ``final_answer``), and
a real ``GRPOTrainer`` trains on such episodes."""

from __future__ import annotations

import json

import pytest
from _agents_helpers import (
    CALL_IDS,
    MODEL,
    QUESTIONS,
    client_of,
    fitted_smol_caller,
    question,
    served_call_id,
    smol_agent,
    smolagents_requests,
    toy_policy,
)

from torchrl_trl_interop import (
    OpenAIServer,
    WeightSyncCallback,
    as_trl_agent_rollout_func,
    history_to_messages,
    weights_checksum,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")


def rendered_ids(tok, messages, tools=None):
    """The tokenizer's own rendering of a prompt, tokenized as TRL tokenizes it."""
    text = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def records(server, session):
    rows = [server.buffer[i] for i in range(len(server.buffer))]
    return [r for r in rows if r["session"] == session]


def tool_calls(record):
    return [
        c["function"]
        for c in history_to_messages(record["history", "full"])[-1].get("tool_calls", [])
    ]


@pytest.fixture(scope="module")
def smol_caller():
    return fitted_smol_caller()  # fitted once per session


class TestToolCallingEpisode:
    def test_smolagents_calls_a_tool_through_the_endpoint(self, smol_caller, monkeypatch):
        from smolagents import OpenAIModel

        served_call_id(monkeypatch, CALL_IDS[0])  # a fitted id: the episode is the same each run

        tok, model = smol_caller
        policy = toy_policy(tok, model, max_new_tokens=40)
        # smolagents asks for tool_choice="required", which free sampling serves as "auto"
        with OpenAIServer(
            policy, tokenizer=tok, model_name=MODEL, required_tool_choice="sample"
        ) as server:
            url = server.session_url("smol")
            agent = smol_agent(OpenAIModel(model_id=MODEL, api_base=url, api_key="-", seed=0))
            answer = agent.run(question(2, 3))
            steps = [s for s in agent.memory.steps if getattr(s, "tool_calls", None)]
            trajectory, calls, segments = server.end_session("smol")
        assert [c.name for s in steps for c in s.tool_calls] == ["add", "final_answer"]
        arguments = steps[0].tool_calls[0].arguments
        assert steps[0].observations == str(arguments["a"] + arguments["b"])  # the tool ran
        assert str(answer) == str(steps[1].tool_calls[0].arguments["answer"])
        first, second = records(server, "smol")
        assert tool_calls(first)[0]["name"] == "add"
        assert first["finish_reason"] == "tool_calls"
        assert tool_calls(second)[0]["name"] == "final_answer"
        # smolagents rewrites its history (the call as "Calling tools: [...]" text, the tool's
        # result as a user turn): its second call starts a new segment, the row trains on it
        assert (calls, segments, trajectory.segment) == (2, 2, 1)
        assert list(trajectory.completion_ids) == second["tokens", "response"].tolist()
        assert tok.decode(trajectory.completion_ids).startswith('<tool_call>\n{"name": "final')


class TestGRPO:
    def test_trains_on_a_smolagents_agent_that_calls_a_tool(self, smol_caller, tmp_path):
        import copy

        from datasets import Dataset
        from smolagents import OpenAIModel
        from trl import GRPOConfig, GRPOTrainer

        from torchrl_trl_interop.testing import toy_tool_grpo_args

        tok, fitted = smol_caller
        used = []

        def agent(prompt, base_url):
            model = OpenAIModel(model_id=MODEL, api_base=base_url, api_key="-")
            steps = smol_agent(model)
            answer = steps.run(prompt)
            used.extend(
                c.name for s in steps.memory.steps for c in getattr(s, "tool_calls", None) or []
            )
            a, b = (int(w) for w in prompt.rstrip("?").split() if w.isdigit())
            return float(str(answer).strip() == str(a + b))

        policy = toy_policy(tok, copy.deepcopy(fitted), max_new_tokens=40)
        prompts = [question(a, b) for a, b in QUESTIONS]
        with OpenAIServer(
            policy, tokenizer=tok, model_name=MODEL, required_tool_choice="sample"
        ) as server:
            rollout_func = as_trl_agent_rollout_func(agent, server)
            outputs = []

            def recorded(prompts, trainer):
                outputs.append(rollout_func(prompts, trainer))
                return outputs[-1]

            args = toy_tool_grpo_args(tmp_path, max_steps=2, learning_rate=1e-4)
            trainer = GRPOTrainer(
                model=copy.deepcopy(fitted),
                reward_funcs=rollout_func.reward_func,
                args=GRPOConfig(**args),
                train_dataset=Dataset.from_dict({"prompt": prompts}),
                processing_class=tok,
                rollout_func=recorded,
                callbacks=[WeightSyncCallback(server)],
            )
            before = weights_checksum(trainer.model)
            trainer.train()
            assert weights_checksum(policy.model) == weights_checksum(trainer.model) != before
        assert trainer.state.global_step == 2
        assert "add" in used  # the episodes called the tool
        rows = [(o, i) for o in outputs for i in range(len(o["prompt_ids"]))]
        assert rows
        # smolagents rewrites its history after a tool call: the row is its last segment
        assert any(out["agent_segments"][i] >= 2 for out, i in rows)
        for out, i in rows:
            answer = out["history"][i][-1]
            assert 1 <= out["agent_segments"][i] <= out["agent_calls"][i]
            assert out["env_mask"][i][-1] == 1  # the row ends with the model's last answer
            assert out["agent_reward"][i] in (0.0, 1.0)
            calls = answer.get("tool_calls") or []
            if calls:  # the last call answered with a tool call, parsed from its tokens
                text = tok.decode(out["completion_ids"][i])
                assert json.dumps(calls[0]["function"]["name"]) in text


class TestTools:
    def test_tool_calls_parsed_and_the_tool_reply_masked(self, smol_caller):
        """TRL's Qwen2.5 template: the answer's ``<tool_call>`` comes back as ``tool_calls``;
        the harness's tool reply continues the session's trajectory, its tokens masked."""
        tok, model = smol_caller
        [(messages, tools), _], _ = smolagents_requests(2, 3, "call_x")
        messages = [
            {"role": getattr(m["role"], "value", m["role"]), "content": m["content"][0]["text"]}
            for m in messages
        ]
        policy = toy_policy(tok, model, max_new_tokens=40)
        with OpenAIServer(policy, tokenizer=tok, model_name=MODEL) as server:
            client = client_of(server.session_url("tools"))
            first = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=tools,
                seed=0,
                extra_body={"return_token_ids": True},
            )
            call = first.choices[0].message.tool_calls[0]
            assert first.choices[0].finish_reason == "tool_calls"
            assert call.function.name == "add"
            assert set(json.loads(call.function.arguments)) == {"a", "b"}
            assert first.model_dump()["prompt_token_ids"] == rendered_ids(tok, messages, tools)
            echoed = first.choices[0].message.model_dump(exclude_none=True)
            reply = {"role": "tool", "tool_call_id": call.id, "content": "5"}
            second = client.chat.completions.create(
                model=MODEL,
                messages=[*messages, echoed, reply],
                tools=tools,
                extra_body={"return_token_ids": True},
            ).model_dump()
            trajectory = server.trajectory("tools")
        assert trajectory.calls == 2 and trajectory.segment == 0
        first_ids = first.model_dump()["choices"][0]["token_ids"]
        n = len(first_ids)
        assert list(trajectory.completion_ids[:n]) == first_ids
        masked = [i for i, m in zip(trajectory.completion_ids, trajectory.env_mask) if m == 0]
        assert tok.decode(masked) == (
            "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        assert second["prompt_token_ids"] == list(trajectory.prompt_ids) + list(
            trajectory.completion_ids[: n + len(masked)]
        )
