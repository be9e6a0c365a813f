"""Helpers of the endpoint's tests: a toy policy and a server over it, an OpenAI client, a
model's own log-probs, smolagents' own requests, and a toy model fitted on exactly the prompts
smolagents sends. (No ``conftest.py`` here: with ``--doctest-modules`` a second ``conftest``
module collected before ``test/conftest.py`` clashes with it; each test module declares its
fixtures over these helpers.)"""

from __future__ import annotations

import functools
import random

import torch

MODEL = "toy"


def toy_policy(tokenizer, model=None, *, max_new_tokens=6, temperature=1.0):
    """A TrainerModelPolicy over a toy causal LM, sampling as GRPO does."""
    from transformers import GenerationConfig

    from torchrl_trl_interop import TrainerModelPolicy
    from torchrl_trl_interop.testing import toy_causal_lm

    model = model if model is not None else toy_causal_lm(tokenizer=tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return TrainerModelPolicy(model, tokenizer, config, temperature)


def client_of(url):
    import openai

    return openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=120)


def own_logprobs(model, prompt_ids, completion_ids, temperature=1.0):
    """The model's own log-probs of ``completion_ids`` after ``prompt_ids``: one plain forward."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    p = len(prompt_ids)
    targets = torch.tensor(list(completion_ids))[:, None]
    return logits[p - 1 : -1].log_softmax(-1).gather(-1, targets).squeeze(-1)


# -- smolagents ------------------------------------------------------------------------------------

SYSTEM = "You add numbers with the tool add."
QUESTIONS = [(2, 3), (1, 4)]
#: the tool-call ids the toy model is fitted with (as the endpoint draws them: 24 hex digits)
CALL_IDS = [f"call_{random.Random(k).getrandbits(96):024x}" for k in range(6)]


def served_call_id(monkeypatch, call_id: str) -> None:
    """The endpoint names every tool call ``call_id`` (instead of a random id): an episode's
    second prompt is then one the toy model was fitted on, whatever the run."""
    import types

    from torchrl_trl_interop.agents import _answers

    hex_digits = call_id.removeprefix("call_") + "0" * 8
    drawn = types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=hex_digits))
    monkeypatch.setattr(_answers, "uuid", drawn)


def question(a, b):
    return f"What is {a} plus {b}?"


def smol_tool():
    from smolagents import tool

    @tool
    def add(a: int, b: int) -> int:
        """Adds two numbers.

        Args:
            a: the first number.
            b: the second number.
        """
        return a + b

    return add


def smol_agent(model, max_steps=2):
    from smolagents import ToolCallingAgent

    agent = ToolCallingAgent(
        tools=[smol_tool()], model=model, max_steps=max_steps, verbosity_level=-1
    )
    agent.prompt_templates["system_prompt"] = SYSTEM
    return agent


def smolagents_requests(a, b, call_id):
    """What smolagents' OpenAIModel sends for a two-step episode (a call of ``add``, then of
    ``final_answer``), captured from smolagents itself with scripted answers."""
    from smolagents import ChatMessage, Model
    from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction

    calls = [("add", {"a": a, "b": b}), ("final_answer", {"answer": str(a + b)})]

    class Scripted(Model):
        def __init__(self):
            super().__init__(model_id=MODEL)
            self.seen = []

        def generate(
            self,
            messages,
            stop_sequences=None,
            response_format=None,
            tools_to_call_from=None,
            **kwargs,
        ):
            sent = self._prepare_completion_kwargs(
                messages=messages,
                stop_sequences=stop_sequences,
                tools_to_call_from=tools_to_call_from,
                convert_images_to_image_urls=True,
            )
            self.seen.append(sent)
            name, arguments = calls[len(self.seen) - 1]
            function = ChatMessageToolCallFunction(name=name, arguments=arguments)
            call = ChatMessageToolCall(id=call_id, type="function", function=function)
            return ChatMessage(role="assistant", content=None, tool_calls=[call])

    scripted = Scripted()
    smol_agent(scripted).run(question(a, b))
    return [(sent["messages"], sent["tools"]) for sent in scripted.seen], calls


def serve_toy():
    """A started server over a toy policy (ChatML toy tokenizer), its client and its model,
    for a ``yield from`` fixture."""
    from torchrl_trl_interop import OpenAIServer
    from torchrl_trl_interop.testing import toy_tokenizer

    tok = toy_tokenizer()
    policy = toy_policy(tok)
    with OpenAIServer(policy, tokenizer=tok, model_name=MODEL) as server:
        yield server, client_of(server.base_url), policy.model


@functools.cache
def fitted_smol_caller():
    """The toy tool tokenizer (TRL's Qwen2.5 template) and a toy model fitted to answer
    smolagents' own prompts (its system prompt, tools and messages, as the endpoint renders
    them) with a call of ``add``, then of ``final_answer``: the tool-call ids the endpoint
    draws at random vary, so the second prompt is fitted with several (``CALL_IDS``)."""
    from torchrl_trl_interop._chat_format import ChatFormat
    from torchrl_trl_interop.agents._requests import template_message
    from torchrl_trl_interop.testing import toy_causal_lm, toy_tool_tokenizer
    from torchrl_trl_interop.testing._tool_task import fit_completions

    tok = toy_tool_tokenizer()
    chat = ChatFormat.of(tok)
    pairs = []
    for a, b in QUESTIONS:
        for call_id in CALL_IDS:
            requests, calls = smolagents_requests(a, b, call_id)
            for (messages, tools), (name, arguments) in zip(requests, calls):
                rendered = [template_message(m) for m in messages]
                prompt = chat.prompt_ids([rendered], tools=tools)[0]
                call = {"type": "function", "function": {"name": name, "arguments": arguments}}
                answer = {"role": "assistant", "content": "", "tool_calls": [call]}
                full = chat.render([rendered + [answer]], add_generation_prompt=False, tools=tools)
                text = chat.render([rendered], add_generation_prompt=True, tools=tools)[0]
                completion = full[0][len(text) :].rstrip("\n")
                pairs.append((prompt, chat.encode([completion])[0]))
    model = toy_causal_lm(
        tokenizer=tok, hidden_size=64, intermediate_size=128, num_hidden_layers=2, seed=0
    )
    return tok, fit_completions(model, tok, pairs, steps=80)
