"""The online loop's renders and answer parsing give torchrl's text and History, in fewer steps.

``rollouts._render.render`` must equal torchrl 0.14.1's ``History.apply_chat_template`` on every
shape the loop renders (placeholder turns, ragged rows, tool calls, system messages, a
``chat_template_name``); ``TrainerModelPolicy`` parses each answer from its response alone and
must write the History torchrl's parse of the whole conversation gives.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack
from transformers import GenerationConfig

from torchrl_trl_interop import TrainerModelPolicy, history_to_messages, messages_to_history
from torchrl_trl_interop.rollouts._episodes import _same_length
from torchrl_trl_interop.rollouts._render import generation_prompt, render
from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer

#: every test runs on both branches of the _upstream speed paths (fast and plain upstream)
pytestmark = pytest.mark.usefixtures("upstream_branch")

CALL = {"name": "add", "arguments": {"a": 2, "b": 2}}
CHATS = [
    [{"role": "user", "content": "What is 2 plus 2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "tool", "content": "4"},
    ],
]


def _histories():
    """The shapes the loop renders: placeholder-filled dense rows and ragged lazy rows."""
    filled = messages_to_history(_same_length(CHATS))
    with set_list_to_stack(True):
        ragged = lazy_stack([messages_to_history(chat) for chat in CHATS])
        from torchrl.data.llm import History

        def turn(role, content, calls):
            return History(role=role, content=content, tool_calls=calls)

        calls = lazy_stack(
            [
                lazy_stack([turn("user", "2+2?", []), turn("assistant", "", [CALL])]),
                lazy_stack([turn("user", "3+3?", []), turn("assistant", "6", [])]),
            ]
        )
    return {"filled": filled, "ragged": ragged, "tool calls": calls}


class _Policy:
    """What ``render`` reads of a policy: its tokenizer and template choice."""

    def __init__(self, tokenizer, chat_template_name=None):
        self.tokenizer = tokenizer
        self.chat_template_name = chat_template_name
        self.chat_template = None


@pytest.mark.parametrize("name", ["filled", "ragged", "tool calls"])
@pytest.mark.parametrize("template", [None, "qwen"])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_is_torchrls_text(name, template, add_generation_prompt):
    tok = toy_tokenizer()
    history = _histories()[name]
    policy = _Policy(tok, template)
    kwargs = {} if template is None else {"chat_template_name": template}
    with set_list_to_stack(True):
        try:
            expected = history.apply_chat_template(
                tokenizer=tok, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except Exception as error:  # torchrl cannot render it (qwen's template, these calls)
            with pytest.raises(type(error)):
                render(history, policy, None, add_generation_prompt=add_generation_prompt)
            return
        got = render(history, policy, None, add_generation_prompt=add_generation_prompt)
    assert got == expected
    assert all(isinstance(text, str) and text for text in got)


def test_render_follows_a_changed_tokenizer_template():
    tok = toy_tokenizer()
    history = _histories()["filled"]
    before = render(history, None, tok, add_generation_prompt=True)
    # torchrl renders with a tokenizer's own template when it marks the generation
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] "
        "{% generation %}{{ m['content'] }}{% endgeneration %}\n{% endfor %}"
    )
    after = render(history, None, tok, add_generation_prompt=True)
    assert after != before
    assert after == history.apply_chat_template(tokenizer=tok, add_generation_prompt=True)


def _policy_output(policy, chats):
    td = TensorDict({"history": {"prompt": messages_to_history(_same_length(chats))}}, [2])
    with set_list_to_stack(True), torch.no_grad():
        out = policy(td)
    return out.get(("history", "response")), out.get(("history", "full"))


def test_answers_are_torchrls_parse_of_the_whole_text():
    tok = toy_tokenizer()
    config = GenerationConfig(max_new_tokens=6, do_sample=True, pad_token_id=0, eos_token_id=2)
    policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, temperature=1.0)
    assert policy._generation_prompt == generation_prompt(policy, tok) == "<|im_start|>assistant\n"
    torch.manual_seed(0)
    fast = _policy_output(policy, CHATS)
    policy._generation_prompt = None  # no generation prompt known: every row parsed whole
    torch.manual_seed(0)
    whole = _policy_output(policy, CHATS)
    assert history_to_messages(fast[0]) == history_to_messages(whole[0])
    assert history_to_messages(fast[1]) == history_to_messages(whole[1])
    full = history_to_messages(fast[1])
    assert [m["role"] for m in full[1]][-1] == "assistant"
    assert full[1][:4] == CHATS[1]


def test_the_response_parse_is_checked_once_per_template():
    """Row 0's whole parse checks the template on its first call only; a template that failed
    the check parses every row whole, in every call."""
    tok = toy_tokenizer()
    config = GenerationConfig(max_new_tokens=6, do_sample=True, pad_token_id=0, eos_token_id=2)
    policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, temperature=1.0)
    parse, parsed = policy._parse, []
    policy._parse = lambda texts: parsed.append(texts) or parse(texts)
    for _ in range(2):
        _policy_output(policy, CHATS)
    header = "<|im_start|>assistant\n"
    assert [len(texts) for texts in parsed] == [2, 1, 2]  # responses, row 0 whole, responses
    assert all(t.startswith(header) for t in parsed[0] + parsed[2])
    assert parsed[1][0].startswith("<|im_start|>user")
    (template,) = policy._response_parse_agrees
    assert policy._response_parse_agrees[template] is True

    policy._response_parse_agrees[template] = False  # as if row 0 had disagreed
    parsed.clear()
    _, full = _policy_output(policy, CHATS)
    assert [len(texts) for texts in parsed] == [2] and parsed[0][0].startswith("<|im_start|>user")
    assert history_to_messages(full)[1][:4] == CHATS[1]
