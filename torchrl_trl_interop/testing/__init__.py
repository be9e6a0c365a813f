"""Offline toy fixtures: a byte-level BPE tokenizer with a ChatML template and tiny models.

Everything here is built locally from configs, with random weights and no download, so tests,
the tutorial and the benchmarks all run offline on CPU from the same objects: the tokenizer and
its chat template (and the same vocabulary with any real model's chat template, its markup as
single tokens), tiny reward models and causal LMs, conversations, prompts, buffers and trainer
settings, chat environments, a scripted chat policy, a generator apart from the trainer, the
tutorial's toy task (small additions, a sloppy teacher, a checkable reward), weight-sync
fixtures, and a toy that calls tools (TRL's Qwen2.5 template, a calculator environment, a caller
model).

This package is the one import path of what the tutorial, the benchmarks and the docs use:
``from torchrl_trl_interop.testing import ...``; it is public API, under the package's
deprecation policy (``CHANGELOG.md``). Helpers only the package's own test suite needs stay in
their private modules; those this face exported before (``free_port``, ``scripted_episode``,
...) are still served here, deprecated (each warns, naming its replacement and the version that
removes it).

Examples:
    >>> from torchrl_trl_interop.testing import toy_tokenizer, toy_reward_model
    >>> tok = toy_tokenizer()
    >>> tok.decode(tok("Hello world!")["input_ids"])
    'Hello world!'
    >>> model = toy_reward_model("llama", tokenizer=tok)
    >>> model.config.num_labels
    1
"""

from .._deprecation import deprecated_getattr
from ._data import (
    toy_buffer,
    toy_chats,
    toy_collected_buffer,
    toy_padded,
    toy_prompts,
    toy_trainer_args,
)
from ._envs import (
    toy_add,
    toy_chat_env,
    toy_primed_chat_env,
    toy_tool_call,
    toy_tool_env,
    toy_tool_reply,
)
from ._generation import (
    ToyGenerator,
    toy_answer_length,
    toy_generator_policy,
    toy_grpo_args,
    toy_grpo_step,
)
from ._models import toy_causal_lm, toy_reward_model
from ._scripted import ScriptedChatPolicy
from ._stubs import count_host_syncs, stub_reward_model
from ._tokenizer import (
    IM_END,
    IM_START,
    TOY_CORPUS,
    template_markers,
    toy_template_tokenizer,
    toy_tokenizer,
)
from ._tool_task import (
    calculator_answer,
    calculator_chats,
    calculator_tools,
    toy_calculator_env,
    toy_tool_caller,
    toy_tool_grpo_args,
    toy_tool_tokenizer,
)
from ._toy_task import (
    arithmetic_chats,
    arithmetic_questions,
    correct_answer,
    demo_setup,
    parse_question,
    printable_share,
    worked_answer,
)
from ._weights import peak_memory_growth, toy_big_llama, toy_lora_model

__all__ = [
    "IM_END",
    "IM_START",
    "TOY_CORPUS",
    "ScriptedChatPolicy",
    "ToyGenerator",
    "arithmetic_chats",
    "arithmetic_questions",
    "calculator_answer",
    "calculator_chats",
    "calculator_tools",
    "correct_answer",
    "demo_setup",
    "parse_question",
    "peak_memory_growth",
    "printable_share",
    "worked_answer",
    "count_host_syncs",
    "stub_reward_model",
    "template_markers",
    "toy_add",
    "toy_answer_length",
    "toy_big_llama",
    "toy_buffer",
    "toy_causal_lm",
    "toy_chat_env",
    "toy_chats",
    "toy_collected_buffer",
    "toy_generator_policy",
    "toy_lora_model",
    "toy_padded",
    "toy_grpo_args",
    "toy_grpo_step",
    "toy_primed_chat_env",
    "toy_prompts",
    "toy_reward_model",
    "toy_template_tokenizer",
    "toy_tokenizer",
    "toy_tool_call",
    "toy_tool_env",
    "toy_calculator_env",
    "toy_tool_caller",
    "toy_tool_grpo_args",
    "toy_tool_reply",
    "toy_tool_tokenizer",
    "toy_trainer_args",
]

#: the names this face exported before and dropped without notice, served again with a warning
__getattr__ = deprecated_getattr(__name__)
