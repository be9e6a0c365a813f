"""Offline toy fixtures: a byte-level BPE tokenizer with a ChatML template and tiny models.

Everything here is built locally from configs, with random weights and no download, so tests,
the tutorial and the benchmarks all run offline on CPU from the same objects:

* the tokenizer and its chat template (``_tokenizer.py``);
* tiny reward models and causal LMs (``_models.py``);
* conversations, prompts, buffers, trainer settings (``_data.py``);
* chat environments for the online loop, the toy tool task (``_envs.py``);
* a scripted chat policy, for episodes that must agree (``_scripted.py``);
* a generator apart from the trainer (``_generation.py``);
* stand-ins for measuring the reward wrapper (``_stubs.py``);
* the tutorial's toy task: small additions, a sloppy teacher, a checkable reward
  (``_toy_task.py``);
* weight-sync fixtures: a toy Llama with many parameters, a LoRA model, a peak-memory probe
  (``_weights.py``);
* running a script on several local ranks under ``torchrun`` (``_torchrun.py``);
* a toy that calls tools: TRL's Qwen2.5 template, a calculator environment, a caller model
  (``_tool_task.py``).

This package is the one import path of all of them: ``from torchrl_trl_interop.testing import ...``.

Examples:
    >>> from torchrl_trl_interop.testing import toy_tokenizer, toy_reward_model
    >>> tok = toy_tokenizer()
    >>> tok.decode(tok("Hello world!")["input_ids"])
    'Hello world!'
    >>> model = toy_reward_model("llama", tokenizer=tok)
    >>> model.config.num_labels
    1
"""

from ._data import (
    toy_buffer,
    toy_chats,
    toy_collected_buffer,
    toy_padded,
    toy_prompts,
    toy_trainer_args,
)
from ._envs import (
    shout,
    toy_add,
    toy_chat_env,
    toy_counter_env,
    toy_primed_chat_env,
    toy_prompting_env,
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
from ._tokenizer import CHATML_TEMPLATE, IM_END, IM_START, PAD_TOKEN, TOY_CORPUS, toy_tokenizer
from ._tool_task import (
    TOOL_TOKENS,
    calculator_answer,
    calculator_chats,
    calculator_tools,
    scripted_episode,
    tool_result_reward,
    toy_calculator_env,
    toy_tool_caller,
    toy_tool_grpo_args,
    toy_tool_tokenizer,
)
from ._torchrun import free_port, run_torchrun
from ._toy_task import (
    DEMO_WARNING_FILTERS,
    arithmetic_chats,
    arithmetic_questions,
    correct_answer,
    demo_setup,
    parse_question,
    printable_share,
    worked_answer,
)
from ._weights import BIG_LLAMA_SIZES, peak_memory_growth, toy_big_llama, toy_lora_model

__all__ = [
    "BIG_LLAMA_SIZES",
    "CHATML_TEMPLATE",
    "DEMO_WARNING_FILTERS",
    "IM_END",
    "IM_START",
    "PAD_TOKEN",
    "TOOL_TOKENS",
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
    "free_port",
    "peak_memory_growth",
    "printable_share",
    "run_torchrun",
    "scripted_episode",
    "shout",
    "toy_counter_env",
    "toy_prompting_env",
    "worked_answer",
    "count_host_syncs",
    "stub_reward_model",
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
    "toy_tokenizer",
    "toy_tool_call",
    "toy_tool_env",
    "tool_result_reward",
    "toy_calculator_env",
    "toy_tool_caller",
    "toy_tool_grpo_args",
    "toy_tool_reply",
    "toy_tool_tokenizer",
    "toy_trainer_args",
]
