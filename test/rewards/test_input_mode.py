"""``input_mode=`` on every reward call (issue 19): one rule, shown as two tables.

* the mode each call settles on: ``input_mode`` itself, else the mode of the old key argument
  given (a key equal to its default is no choice), else the call's default (upstream's for the
  drop-in ``HFRewardModelWrapper``);
* the conflicting arguments: each a ``ValueError`` naming the call, the argument and the fix.

What each mode reads or writes is tested with the call's own behaviour (``test_reward_model``,
``test_reward_funcs``, ``test_env_transform``).
"""

from __future__ import annotations

import functools

import pytest

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    RewardTransform,
    TRLRewardFuncWrapper,
    as_trl_reward_func,
)
from torchrl_trl_interop.testing import toy_reward_model, toy_tokenizer

TOK = object()  # stands for the toy tokenizer in the tables (built once, in the test)


def brevity(completions, **kwargs):
    return [-float(len(c[0]["content"])) for c in completions]


@functools.cache
def model():
    return toy_reward_model("llama")


# the calls, each with a TRL reward function or a module to read
def rm(**kwargs):
    return HFRewardModelWrapper(model(), **kwargs)


def funcs(**kwargs):
    return TRLRewardFuncWrapper(brevity, **kwargs)


def func(**kwargs):
    return as_trl_reward_func(TRLRewardFuncWrapper(brevity), **kwargs)


def transform(**kwargs):
    return RewardTransform(brevity, **kwargs)


def module_transform(**kwargs):
    return RewardTransform(TRLRewardFuncWrapper(brevity), **kwargs)


def build(call, kwargs):
    kwargs = {k: toy_tokenizer() if v is TOK else v for k, v in kwargs.items()}
    return call(**kwargs)


# fmt: off
MODES = [  # (call, arguments, the mode it reads)
    (rm, {}, "tokens"),  # upstream's default
    (rm, {"input_mode": "text", "tokenizer": TOK}, "text"),
    (rm, {"text_key": "t", "tokenizer": TOK}, "text"),
    (rm, {"history_key": ("history", "full"), "tokenizer": TOK}, "history"),
    (rm, {"text_key": "t", "attention_mask_key": None, "tokenizer": TOK}, "text"),
    (funcs, {}, "history"),
    (funcs, {"input_mode": "text"}, "text"),
    (funcs, {"prompt_key": "p", "completion_key": "c"}, "text"),
    (funcs, {"history_key": ("history", "full"), "prompt_key": "p", "completion_key": "c"}, "text"),
    (func, {}, "history"),
    (func, {"text_key": "t"}, "text"),
    (func, {"token_key": "t", "processing_class": TOK}, "tokens"),
    (func, {"history_key": ("history", "full")}, "history"),
    (transform, {}, "history"),  # as ChatEnv
    (transform, {"prompt_key": "p", "completion_key": "c"}, "text"),
    (module_transform, {}, "history"),
    (module_transform, {"input_mode": "text"}, "text"),
]

CONFLICTS = [  # (call, arguments, what the error says)
    (rm, {"input_mode": "tokens", "text_key": "t"}, "^HFRewardModelWrapper: text_key='t' is the key of input_mode='text', but input_mode='tokens': it would be ignored. Drop text_key=, or pass input_mode='text'"),
    (rm, {"input_mode": "text", "history_key": "h"}, "history_key='h' is the key of input_mode='history'"),
    (rm, {"input_mode": "history", "token_key": "ids"}, "token_key='ids' is the key of input_mode='tokens'"),
    (rm, {"input_mode": "text", "attention_mask_key": "m"}, "attention_mask_key='m' is the key of input_mode='tokens'"),
    (rm, {"input_mode": "chat"}, r"input_mode='chat'; expected one of \['history', 'text', 'tokens'\]"),
    (rm, {"text_key": "t", "history_key": "h"}, "got both text_key='t' and history_key='h', which select two different inputs"),
    (rm, {"input_mode": "text"}, r"input_mode='text' \(text_key=\('text', 'full'\)\) needs the reward model's tokenizer"),
    (rm, {"input_mode": "tokens", "tokenizer": TOK}, "tokenizer= is only used with text_key= or history_key="),
    (rm, {"input_mode": "text", "tokenizer": TOK, "chat_template_kwargs": {}}, "chat_template_kwargs= is only used with history_key="),
    (funcs, {"input_mode": "history", "prompt_key": "p"}, "^TRLRewardFuncWrapper: prompt_key='p' is the key of input_mode='text', but input_mode='history'"),
    (funcs, {"input_mode": "text", "history_key": "h"}, "history_key='h' is the key of input_mode='history', but input_mode='text'"),
    (funcs, {"input_mode": "tokens"}, r"input_mode='tokens'; expected one of \['history', 'text'\]"),
    (funcs, {"input_mode": "history", "history_key": None}, "history_key=None needs prompt_key="),
    (func, {"input_mode": "history", "text_key": "t"}, "^as_trl_reward_func: text_key='t' is the key of input_mode='text', but input_mode='history'"),
    (func, {"input_mode": "text", "attention_mask_key": "m"}, "attention_mask_key='m' is the key of input_mode='tokens'"),
    (func, {"text_key": "t", "token_key": "ids", "processing_class": TOK}, "got both text_key='t' and token_key='ids', which select two different inputs"),
    (func, {"history_key": "h", "text_key": "t"}, "got both history_key='h' and text_key='t'"),
    (func, {"input_mode": "tokens"}, r"token_key=\('tokens', 'full'\) \(input_mode='tokens'\) needs processing_class="),
    (transform, {"input_mode": "text", "history_key": "h"}, "^RewardTransform: history_key='h' is the key of input_mode='history', but input_mode='text'"),
    (module_transform, {"input_mode": "tokens"}, r"^RewardTransform: input_mode='tokens'; expected one of \['history', 'text'\]"),
]
# fmt: on


@pytest.mark.parametrize(("call", "kwargs", "mode"), MODES)
def test_mode(call, kwargs, mode):
    assert build(call, kwargs).input_mode == mode


@pytest.mark.parametrize(("call", "kwargs", "match"), CONFLICTS)
def test_conflicting_arguments(call, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build(call, kwargs)


def test_a_key_argument_must_be_a_key():
    with pytest.raises(TypeError, match="text_key must be a key: .*, got 3 of type int"):
        rm(text_key=3, tokenizer=toy_tokenizer())
