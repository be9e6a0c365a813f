"""Offline toy fixtures: a byte-level BPE tokenizer with a ChatML template and tiny models.

Everything here is built locally from configs, with random weights and no download, so tests,
the tutorial and the benchmarks all run offline on CPU from the same objects:

* :mod:`~torchrl_trl_interop.testing.tokenizer`: the tokenizer and its chat template;
* :mod:`~torchrl_trl_interop.testing.models`: tiny reward models and causal LMs;
* :mod:`~torchrl_trl_interop.testing.data`: conversations, prompts, buffers, trainer settings;
* :mod:`~torchrl_trl_interop.testing.envs`: chat environments for the online loop;
* :mod:`~torchrl_trl_interop.testing.generation`: a generator apart from the trainer;
* :mod:`~torchrl_trl_interop.testing.stubs`: stand-ins for measuring the reward wrapper.

Examples:
    >>> from torchrl_trl_interop.testing import toy_tokenizer, toy_reward_model
    >>> tok = toy_tokenizer()
    >>> tok.decode(tok("Hello world!")["input_ids"])
    'Hello world!'
    >>> model = toy_reward_model("llama", tokenizer=tok)
    >>> model.config.num_labels
    1
"""

from .data import toy_buffer, toy_chats, toy_collected_buffer, toy_prompts, toy_trainer_args
from .envs import toy_chat_env, toy_primed_chat_env, toy_tool_reply
from .generation import ToyGenerator, toy_answer_length, toy_generator_policy, toy_grpo_step
from .models import toy_causal_lm, toy_reward_model
from .stubs import count_host_syncs, stub_reward_model
from .tokenizer import CHATML_TEMPLATE, IM_END, IM_START, PAD_TOKEN, TOY_CORPUS, toy_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "IM_END",
    "IM_START",
    "PAD_TOKEN",
    "TOY_CORPUS",
    "ToyGenerator",
    "count_host_syncs",
    "stub_reward_model",
    "toy_answer_length",
    "toy_buffer",
    "toy_causal_lm",
    "toy_chat_env",
    "toy_chats",
    "toy_collected_buffer",
    "toy_generator_policy",
    "toy_grpo_step",
    "toy_primed_chat_env",
    "toy_prompts",
    "toy_reward_model",
    "toy_tokenizer",
    "toy_tool_reply",
    "toy_trainer_args",
]
