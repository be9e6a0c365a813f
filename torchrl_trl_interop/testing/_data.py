"""Toy conversations, prompts, replay buffers and trainer settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._checks import require
from .._padding import position_mask
from ._models import toy_causal_lm
from ._tokenizer import TOY_CORPUS, toy_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def toy_chats(n: int = 4, *, seed: int = 0) -> list[list[dict[str, str]]]:
    """Returns ``n`` small conversations in TRL's conversational format, with ragged turn counts.

    Examples:
        >>> chats = toy_chats(3)
        >>> [len(c) for c in chats]
        [2, 3, 4]
        >>> chats[0][0]["role"]
        'system'
    """
    import random

    rng = random.Random(seed)
    words = " ".join(TOY_CORPUS).split()
    chats = []
    for i in range(n):
        chat = [{"role": "system", "content": "You are a helpful assistant."}]
        roles = ["user", "assistant"]
        for t in range(1 + i % 3):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
            chat.append({"role": roles[t % 2], "content": text})
        chats.append(chat)
    return chats


def toy_padded(
    rows: Sequence[torch.Tensor],
    padding_side: str = "right",
    *,
    width: int | None = None,
    padding_value: int = 0,
    mask_dtype: torch.dtype = torch.bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pads 1-d token rows into a dense ``[B, width]`` batch and its attention mask.

    The dense layout ``pad_output=True`` wrappers and HF collators produce: the tests compare it
    with the ragged rows it pads.

    Examples:
        >>> import torch
        >>> ids, mask = toy_padded([torch.tensor([5, 6]), torch.tensor([7])], "left", width=3)
        >>> ids
        tensor([[0, 5, 6],
                [0, 0, 7]])
        >>> mask.int()
        tensor([[0, 1, 1],
                [0, 0, 1]], dtype=torch.int32)
    """
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max()) if width is None else width
    mask = position_mask(lengths, width, padding_side)
    ids = torch.full((len(rows), width), padding_value, dtype=torch.long)
    ids[mask] = torch.cat([torch.as_tensor(r, dtype=torch.long) for r in rows])
    return ids, mask.to(mask_dtype)


def toy_buffer(n: int = 8, *, storage: Any = None, **buffer_kwargs: Any):
    """A ``ReplayBuffer`` holding ``n`` rows with one column ``"x" = arange(n)``, for examples.

    Keyword Args:
        storage (Storage, optional): defaults to ``LazyTensorStorage(max(n, 1))``.
        **buffer_kwargs: passed to ``ReplayBuffer`` (``writer=``, ``batch_size=``, ...).

    Examples:
        >>> rb = toy_buffer(4)
        >>> len(rb), rb[:]["x"].tolist()
        (4, [0, 1, 2, 3])
    """
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    storage = storage if storage is not None else LazyTensorStorage(max(n, 1))
    rb = ReplayBuffer(storage=storage, **buffer_kwargs)
    if n:
        rb.extend(TensorDict({"x": torch.arange(n)}, batch_size=[n]))
    return rb


def toy_prompts(n: int = 8) -> list[str]:
    """``n`` short user questions for toy rollouts.

    Examples:
        >>> toy_prompts(2)
        ['What is 0 plus 0?', 'What is 1 plus 2?']
    """
    return [f"What is {i} plus {2 * i}?" for i in range(n)]


def toy_collected_buffer(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    policy_model: PreTrainedModel | None = None,
    prompts: list[str] | None = None,
    repeats: int = 2,
    env_batch_size: int = 2,
    total_dialog_turns: int = 8,
    max_new_tokens: int = 6,
    storage_size: int = 1000,
    seed: int = 0,
):
    """Runs TorchRL's real LLM pipeline offline and returns the filled replay buffer.

    Each rollout is one turn (system, user, assistant): a ``StepCounter(max_steps=1)`` ends the
    episode so the next reset serves the next prompt. A toy causal LM wrapped by ``TransformersWrapper(input_mode="history", pad_output=False)``
    answers prompts served by a ``ChatEnv`` (with a ``DataLoadingPrimer``); an ``LLMCollector``
    writes the rollouts into a ``ReplayBuffer(LazyStackStorage)``: ragged ``("tokens", "full")``,
    ``("masks", "all_attention_mask")`` and ``("history", "full")`` rows, exactly as a real run.

    Keyword Args:
        tokenizer: a left-padding tokenizer; defaults to ``toy_tokenizer(padding_side="left")``.
        policy_model: defaults to :func:`toy_causal_lm`.
        prompts (list of str): defaults to :func:`toy_prompts`.
        repeats (int): completions per prompt (``DataLoadingPrimer(repeats=...)``).
        env_batch_size (int): rollouts per environment step.
        total_dialog_turns (int): rows collected in total.
        max_new_tokens (int): generation length.
        storage_size (int): ``LazyStackStorage`` capacity.
        seed (int): seeds sampling.
    """
    require("transformers", "toy_collected_buffer")
    import torch
    from torchrl.collectors.llm import LLMCollector
    from torchrl.data import LazyStackStorage, ReplayBuffer
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer
    from torchrl.modules.llm import TransformersWrapper

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    model = policy_model if policy_model is not None else toy_causal_lm(tokenizer=tokenizer)
    prompts = prompts if prompts is not None else toy_prompts()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dataloader = torch.utils.data.DataLoader(
            [{"query": p} for p in prompts],
            batch_size=env_batch_size,
            shuffle=False,
            collate_fn=lambda rows: {"query": [r["query"] for r in rows]},
        )
        primer = DataLoadingPrimer(
            dataloader=dataloader, repeats=repeats, batch_size=(env_batch_size,)
        )
        env = ChatEnv(
            batch_size=(env_batch_size,),
            tokenizer=tokenizer,
            input_mode="history",
            system_prompt="You are a helpful assistant.",
        )
        env = env.append_transform(primer).append_transform(StepCounter(max_steps=1))
        policy = TransformersWrapper(
            model,
            tokenizer=tokenizer,
            input_mode="history",
            generate=True,
            generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": True},
            pad_output=False,
        )
        rb = ReplayBuffer(storage=LazyStackStorage(storage_size))
        collector = LLMCollector(
            env,
            policy=policy,
            dialog_turns_per_batch=env_batch_size,
            total_dialog_turns=total_dialog_turns,
            replay_buffer=rb,
        )
        for _ in collector:
            pass
        collector.shutdown()
    return rb


def toy_trainer_args(output_dir: str, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for a TRL/transformers ``*Config`` that trains a toy model for 2 steps on CPU.

    Offline, no checkpoint, no report, one row logged per step; ``overrides`` win. The precision
    is the caller's to state: the dict holds no ``bf16`` or ``fp16`` unless ``overrides`` put
    one in, so a caller's own ``GRPOConfig(bf16=False, **toy_trainer_args(...))`` is no
    duplicate keyword. State it: TRL's configs default to ``bf16=True`` when ``fp16`` is not
    set, and a CPU with native bf16 (AMX, AVX512-BF16) then trains under bf16 autocast, so a toy
    run's numbers would depend on the machine. :func:`~torchrl_trl_interop.testing.toy_grpo_args`
    and :func:`~torchrl_trl_interop.testing.toy_tool_grpo_args` state fp32 themselves.

    Examples:
        >>> args = toy_trainer_args("/tmp/run", max_steps=4)
        >>> args["max_steps"], args["use_cpu"], args["report_to"]
        (4, True, 'none')
        >>> "bf16" in args, toy_trainer_args("/tmp/run", bf16=False)["bf16"]
        (False, False)
    """
    args: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": 2,
        "per_device_train_batch_size": 2,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": 0,
    }
    args.update(overrides)
    return args
