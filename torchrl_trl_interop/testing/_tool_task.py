"""A toy that calls tools, offline: TRL's Qwen2.5 template, a calculator env, a caller model.

TRL's tool loop needs a chat template that renders tool calls and that TRL knows how to parse
(``trl/chat_templates/qwen2_5.jinja``, recognised by equality), and a model that writes
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``. Here:

* :func:`toy_tool_tokenizer`: a byte-level BPE tokenizer with that template and the tool tokens;
* :func:`toy_calculator_env`: a TorchRL ``ChatEnv`` with a ``SimpleToolTransform`` offering
  :func:`toy_add` (as ``"add"``) and a reward transform, one rollout per env (``batch_size=(1,)``),
  module-level so that ``functools.partial`` of it pickles;
* :func:`calculator_chats`: conversations of a teacher that calls ``add`` (or answers directly);
* :func:`toy_tool_caller`: a two-layer Llama fitted on those conversations, with the tool's
  schema rendered in the prompt as TRL renders it (fitted without it, a model never calls).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._data import toy_trainer_args
from ._envs import toy_add
from ._models import toy_causal_lm
from ._tokenizer import TOY_CORPUS, _fast_tokenizer, _toy_tokenizer_json
from ._toy_task import arithmetic_chats, correct_answer, parse_question, worked_answer

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "TOOL_TOKENS",
    "calculator_answer",
    "calculator_chats",
    "calculator_tools",
    "scripted_episode",
    "tool_result_reward",
    "toy_add",
    "toy_calculator_env",
    "toy_tool_caller",
    "toy_tool_grpo_args",
    "toy_tool_tokenizer",
]

#: The tokens Qwen2.5's template writes around tool calls and tool replies.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_NUMBER = re.compile(r"\d+")


def calculator_tools() -> Any:
    """The calculator's TorchRL tool transform: a ``SimpleToolTransform`` offering ``"add"``.

    Examples:
        >>> list(calculator_tools().tools)
        ['add']
    """
    from torchrl.envs.llm.transforms import SimpleToolTransform

    return SimpleToolTransform(tools={"add": toy_add})


def _tool_schemas() -> list[dict]:
    """The calculator's tools as TRL renders them into the prompt (``get_json_schema``)."""
    from transformers.utils import get_json_schema

    from ..rollouts._trl_tools import as_trl_tools

    return [get_json_schema(t) for t in as_trl_tools(calculator_tools())]


def toy_tool_tokenizer(*, padding_side: str = "left") -> PreTrainedTokenizerFast:
    """The toy byte-level BPE tokenizer with TRL's Qwen2.5 chat template and tool tokens.

    The template is ``trl.chat_template_utils.qwen2_5_chat_template``, so TRL's
    ``supports_tool_calling`` passes and ``add_response_schema`` recognises it. The BPE merges
    are learnt on calculator conversations rendered by that template, and may span words (digits
    stay single tokens), so the template's long tool preamble takes a few tokens: a prompt is
    about 45 tokens instead of 200, which keeps the toy fast.

    Examples:
        >>> from trl.chat_template_utils import supports_tool_calling
        >>> tok = toy_tool_tokenizer()
        >>> supports_tool_calling(tok), tok.convert_ids_to_tokens(tok("<tool_call>")["input_ids"])
        (True, ['<tool_call>'])
        >>> chat = [{"role": "user", "content": "What is 3 plus 4?"}]
        >>> ids = tok.apply_chat_template(chat, tools=_tool_schemas(), add_generation_prompt=True)
        >>> len(ids) < 60, tok.decode(ids).endswith("What is 3 plus 4?<|im_end|>\\n<|im_start|>assistant\\n")
        (True, True)
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    draft = _fast_tokenizer(_toy_tokenizer_json(384), padding_side)  # only renders the corpus
    draft.chat_template = qwen2_5_chat_template
    tools = _tool_schemas()
    chats = calculator_chats(24, tool_share=0.5, seed=0)
    rendered = tuple(draft.apply_chat_template(c, tools=tools, tokenize=False) for c in chats)
    json = _toy_tokenizer_json(1024, (*TOY_CORPUS, *rendered), across_words=True)
    tokenizer = _fast_tokenizer(json, padding_side)
    tokenizer.add_tokens(list(TOOL_TOKENS))
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def tool_result_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """A TRL reward function that needs the tool's reply: ``1.0`` when a tool turn before the
    final answer ends with the question's sum.

    Examples:
        >>> chat = [{"role": "user", "content": "What is 2 plus 3?"},
        ...         {"role": "tool", "content": "Tool add executed successfully:\\n5"}]
        >>> tool_result_reward([chat, chat[:1]], [[], []])
        [1.0, 0.0]
    """
    rewards = []
    for prompt in prompts:
        question = next(m["content"] for m in prompt if m["role"] == "user")
        a, b = parse_question(question)
        replies = [_NUMBER.findall(m["content"]) for m in prompt if m["role"] == "tool"]
        rewards.append(float(any(r and r[-1] == str(a + b) for r in replies)))
    return rewards


def calculator_answer(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """:func:`~torchrl_trl_interop.testing.correct_answer` for answers only: a turn that calls
    the calculator (``<tool>...</tool>``, as the environment holds calls) scores ``0.0``, so a
    call whose last argument happens to be the sum earns nothing.

    Examples:
        >>> question = [{"role": "user", "content": "What is 0 plus 4?"}]
        >>> call = [{"role": "assistant", "content": '<tool>add\\n{"a": 0, "b": 4}</tool>'}]
        >>> answer = [{"role": "assistant", "content": "0 plus 4 is 4."}]
        >>> calculator_answer([question, question], [call, answer])
        [0.0, 1.0]
    """
    rewards = correct_answer(prompts, completions)
    return [0.0 if "<tool>" in c[-1]["content"] else r for c, r in zip(completions, rewards)]


def toy_calculator_env(*, rewards: Sequence[Callable] = (calculator_answer,), max_steps: int = 4):
    """A TorchRL calculator environment for one rollout: ``ChatEnv`` + ``add`` tool + reward.

    Built for ``as_trl_environment_factory``: history mode, ``batch_size=(1,)``, no system
    prompt. Its transforms are :func:`calculator_tools`, a ``StepCounter(max_steps)`` (the
    episode ends after that many assistant turns) and, when ``rewards`` is not empty, a
    :class:`~torchrl_trl_interop.RewardTransform` running those TRL reward functions on every
    assistant turn.

    Keyword Args:
        rewards (sequence of callables): TRL reward functions, run inside the environment.
            Defaults to :func:`calculator_answer` (the sum, in an answer that calls no tool).
        max_steps (int): assistant turns per episode. Defaults to ``4``.

    Examples:
        >>> from tensordict import TensorDict
        >>> env = toy_calculator_env()
        >>> env.batch_size
        torch.Size([1])
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv

    from ..rewards._env_transform import RewardTransform

    env = ChatEnv(batch_size=(1,), input_mode="history")
    env = env.append_transform(calculator_tools())
    env = env.append_transform(StepCounter(max_steps=max_steps))
    if rewards:
        env = env.append_transform(RewardTransform(list(rewards)))
    return env


def calculator_chats(
    n: int,
    *,
    max_operand: int = 4,
    tool_share: float = 1.0,
    accuracy: float = 0.5,
    seed: int = 0,
) -> list[list[dict[str, Any]]]:
    """``n`` conversations of a teacher with a calculator: it calls ``add`` with the question's
    operands (share ``tool_share``), gets the tool's reply and copies the sum into a worked
    answer; otherwise it answers directly, as the sloppy teacher of
    :func:`~torchrl_trl_interop.testing.arithmetic_chats` does (the same questions, seed for
    seed): right with probability ``accuracy``, else ``"3 plus 4 is 34."``.

    The tool's reply is the one the calculator environment writes (``"Tool add executed
    successfully:\\n7"``).

    Examples:
        >>> chat = calculator_chats(1)[0]
        >>> [m["role"] for m in chat], chat[2]["content"], chat[3]["content"]
        (['user', 'assistant', 'tool', 'assistant'], 'Tool add executed successfully:\\n4', '2 plus 2 is 4.')
    """
    from ..rollouts._trl_tools import as_trl_tools

    [add] = as_trl_tools(calculator_tools())
    rng = random.Random(seed)
    chats = []
    for chat in arithmetic_chats(n, max_operand=max_operand, accuracy=accuracy, seed=seed):
        if rng.random() < tool_share:
            a, b = parse_question(chat[0]["content"])
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
            chat = [
                chat[0],
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": add(a=a, b=b)},
                {"role": "assistant", "content": worked_answer(a, b)},
            ]
        chats.append(chat)
    return chats


def _prompt_completion_ids(tokenizer: Any, chat: list[dict], tools: list[dict]) -> tuple:
    """The ids of the chat's first turn rendered as TRL prompts it, and of the rest."""
    prompt = tokenizer.apply_chat_template(
        chat[:1], tools=tools, add_generation_prompt=True, tokenize=False
    )
    full = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("toy_tool_caller: the chat template does not preserve the prompt.")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rest = tokenizer(full[len(prompt) :].rstrip("\n"), add_special_tokens=False)["input_ids"]
    return ids, rest


def toy_tool_caller(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    chats: list[list[dict[str, Any]]] | None = None,
    steps: int = 150,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> PreTrainedModel:
    """A two-layer Llama (width 64) fitted to answer like ``chats`` (calls to the calculator).

    Each conversation's first turn is rendered as TRL prompts it, with the calculator's tool
    schema; the loss is on the rest (the call, the tool's reply, the answer). ``steps`` AdamW
    steps on random batches, seeded; a few seconds on CPU.

    Keyword Args:
        tokenizer: defaults to :func:`toy_tool_tokenizer`.
        chats: defaults to ``calculator_chats(200)`` (always calls the tool).
        steps, learning_rate, batch_size, seed: the fit.

    Examples:
        >>> model = toy_tool_caller(steps=2)
        >>> model.config.num_hidden_layers, model.training
        (2, False)
    """

    tokenizer = tokenizer if tokenizer is not None else toy_tool_tokenizer()
    chats = chats if chats is not None else calculator_chats(200, seed=seed)
    tools = _tool_schemas()
    data = [_prompt_completion_ids(tokenizer, chat, tools) for chat in chats]
    model = toy_causal_lm(
        tokenizer=tokenizer, hidden_size=64, intermediate_size=128, num_hidden_layers=2, seed=seed
    )
    return fit_completions(
        model,
        tokenizer,
        data,
        steps=steps,
        learning_rate=learning_rate,
        batch_size=batch_size,
        seed=seed,
    )


def fit_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> PreTrainedModel:
    """``model`` fitted by ``steps`` AdamW steps on random batches of ``(prompt ids, completion
    ids)`` pairs, the loss on the completions; seeded (torch's global generator left as it was).
    Returns it in eval mode."""
    import torch

    rng = random.Random(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
        model.train()
        for _ in range(steps):
            batch = rng.sample(pairs, min(batch_size, len(pairs)))
            width = max(len(p) + len(c) for p, c in batch)
            ids = torch.full((len(batch), width), tokenizer.pad_token_id)
            labels = torch.full((len(batch), width), -100)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (p, c) in enumerate(batch):
                ids[i, : len(p) + len(c)] = torch.tensor(p + c)
                labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
                mask[i, : len(p) + len(c)] = 1
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def toy_tool_grpo_args(output_dir: str, **overrides: Any) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments for TRL's tool loop with the toy tool caller, on CPU.

    :func:`~torchrl_trl_interop.testing.toy_trainer_args` (2 steps, offline, seeded) with 2
    generations per prompt, 64 completion tokens (a call, the tool's reply and an answer), one
    round of tool calls, learning rate ``1e-3``, fp32; ``overrides`` win.

    Examples:
        >>> args = toy_tool_grpo_args("/tmp/run", max_steps=4)
        >>> args["max_tool_calling_iterations"], args["max_steps"], args["bf16"]
        (1, 4, False)
    """
    args: dict[str, Any] = {
        "num_generations": 2,
        "max_completion_length": 64,
        "max_tool_calling_iterations": 1,
        "learning_rate": 1e-3,
        **toy_trainer_args(output_dir, per_device_train_batch_size=4, bf16=False, fp16=False),
    }
    args.update(overrides)
    return args


def scripted_episode(factory: Callable, prompt: Any, answers: Sequence[dict]) -> dict[str, Any]:
    """Runs one episode of an ``environment_factory`` the way ``GRPOTrainer``'s tool loop does,
    with scripted assistant turns instead of a model.

    One instance from ``factory()``, ``reset(prompt=prompt)``, then for each answer (a TRL
    assistant message): each of its ``tool_calls`` calls the instance's method of that name
    (an error becomes ``{"error": ...}``, as TRL feeds it back) and adds a ``tool`` message;
    finally ``factory.reward_func`` scores the completion. Plain data comes back, so it also runs
    in another process.

    Returns:
        ``{"completion": [...], "messages": the environment's conversation, "reward": ...}``.

    Examples:
        >>> from torchrl_trl_interop import as_trl_environment_factory
        >>> factory = as_trl_environment_factory(toy_calculator_env)
        >>> call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
        >>> out = scripted_episode(factory, [{"role": "user", "content": "What is 2 plus 3?"}],
        ...                        [{"role": "assistant", "content": "", "tool_calls": [call]},
        ...                         {"role": "assistant", "content": "2 plus 3 is 5."}])
        >>> out["completion"][1]["content"], out["reward"]
        ('Tool add executed successfully:\\n5', 1.0)
    """
    env = factory()
    env.reset(prompt=prompt)
    completion: list[dict[str, Any]] = []
    for answer in answers:
        completion.append(dict(answer))
        for call in answer.get("tool_calls") or []:
            function = call["function"]
            try:
                result = getattr(env, function["name"])(**function["arguments"])
            except Exception as err:  # TRL's tool loop: the error is the tool's result
                result = {"error": str(err)}
            completion.append({"role": "tool", "name": function["name"], "content": str(result)})
    [reward] = factory.reward_func(prompts=[prompt], completions=[completion], environments=[env])
    return {"completion": completion, "messages": env.messages, "reward": reward}
