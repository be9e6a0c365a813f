"""Fixtures of the endpoint's tests: a served toy policy, and a toy model fitted on exactly the
prompts smolagents sends."""

from __future__ import annotations

import pytest
import torch
from _agents_helpers import MODEL, QUESTIONS, client_of, fit, smolagents_requests, toy_policy


@pytest.fixture(scope="module")
def served():
    """A started server over a toy policy (ChatML toy tokenizer), its client and its model."""
    from torchrl_trl_interop import OpenAIServer
    from torchrl_trl_interop.testing import toy_tokenizer

    tok = toy_tokenizer()
    policy = toy_policy(tok)
    with OpenAIServer(policy, tokenizer=tok, model_name=MODEL) as server:
        yield server, client_of(server.base_url), policy.model


@pytest.fixture(scope="session")
def smol_caller():
    """The toy tool tokenizer (TRL's Qwen2.5 template) and a toy model fitted to answer
    smolagents' own prompts (its system prompt, tools and messages, as the endpoint renders
    them) with a call of ``add``, then of ``final_answer``: the tool-call ids the endpoint
    draws at random vary, so the second prompt is fitted with several."""
    import uuid

    from torchrl_trl_interop._chat_format import ChatFormat
    from torchrl_trl_interop.agents._requests import template_message
    from torchrl_trl_interop.testing import toy_causal_lm, toy_tool_tokenizer

    tok = toy_tool_tokenizer()
    chat = ChatFormat.of(tok)
    pairs = []
    for a, b in QUESTIONS:
        for _ in range(6):
            requests, calls = smolagents_requests(a, b, f"call_{uuid.uuid4().hex[:24]}")
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        fit(model, tok, pairs, steps=80)
    return tok, model
