"""Offline toy fixtures: a byte-level BPE tokenizer with a ChatML template and tiny models.

Everything here is built locally from configs, with random weights and no download, so tests,
the tutorial and the benchmarks all run offline on CPU from the same objects.

Examples:
    >>> from torchrl_trl_interop.testing import toy_tokenizer, toy_reward_model
    >>> tok = toy_tokenizer()
    >>> tok.decode(tok("Hello world!")["input_ids"])
    'Hello world!'
    >>> model = toy_reward_model("llama", tokenizer=tok)
    >>> model.config.num_labels
    1
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ._utils import require

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "CHATML_TEMPLATE",
    "TOY_CORPUS",
    "toy_causal_lm",
    "toy_buffer",
    "toy_chats",
    "toy_collected_buffer",
    "toy_prompts",
    "toy_reward_model",
    "toy_tokenizer",
    "toy_trainer_args",
]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

#: ChatML, as Qwen-style tokenizers write it; ``add_generation_prompt`` opens an assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: The sentences the toy BPE merges are learnt from (any text still round-trips: byte-level).
TOY_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today?",
    "What is two plus two? Two plus two is four.",
    "Reinforcement learning from human feedback trains a reward model on preference pairs.",
    "The assistant answers the user politely and briefly.",
    "system user assistant tool",
    "0 1 2 3 4 5 6 7 8 9 10 11 12",
)


@functools.lru_cache(maxsize=4)
def _toy_tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(TOY_CORPUS), trainer=trainer)
    return tok.to_str()


def toy_tokenizer(*, padding_side: str = "right", vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """Builds a byte-level BPE tokenizer with ChatML special tokens, offline.

    Pad is ``<|endoftext|>`` (id 0), eos is ``<|im_end|>`` (id 2); the chat template is ChatML.
    Any text round-trips through ``encode``/``decode`` (byte-level), which TorchRL's
    ``TransformersWrapper(input_mode="history")`` needs to parse generations back into History.

    Keyword Args:
        padding_side (str, optional): ``"right"`` or ``"left"``. Defaults to ``"right"``.
        vocab_size (int, optional): target vocabulary size. Defaults to ``384``.

    Examples:
        >>> tok = toy_tokenizer(padding_side="left")
        >>> tok.pad_token, tok.eos_token, tok.pad_token_id, tok.eos_token_id
        ('<|endoftext|>', '<|im_end|>', 0, 2)
        >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
        '<|im_start|>user\\nHi<|im_end|>\\n'
    """
    require("transformers", "toy_tokenizer")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_toy_tokenizer_json(vocab_size)),
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        padding_side=padding_side,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


#: Sizes of the toy configs: one layer, width 32, 4 heads, 1024 positions.
_LLAMA_SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
_TOY_SIZES = {
    "llama": _LLAMA_SIZES,
    "gpt2": {"n_embd": 32, "n_layer": 1, "n_head": 4, "n_positions": 1024},
    "bert": {k: v for k, v in _LLAMA_SIZES.items() if k != "num_key_value_heads"},
}


def _toy_config(arch: str, vocab_size: int, pad_token_id: int | None, **overrides: Any):
    from transformers import BertConfig, GPT2Config, LlamaConfig

    classes = {"llama": LlamaConfig, "gpt2": GPT2Config, "bert": BertConfig}
    if arch not in classes:
        raise ValueError(f"Unknown toy architecture {arch!r}; expected one of {tuple(classes)}.")
    cfg = classes[arch](vocab_size=vocab_size, **_TOY_SIZES[arch])
    cfg.pad_token_id = pad_token_id
    cfg.bos_token_id = None
    cfg.eos_token_id = 2  # <|im_end|>
    for name, value in overrides.items():
        setattr(cfg, name, value)
    return cfg


def toy_reward_model(
    arch: str = "llama",
    *,
    tokenizer: PreTrainedTokenizerFast | None = None,
    pad_token_id: int | None | str = "tokenizer",
    seed: int = 0,
    **config_overrides: Any,
) -> PreTrainedModel:
    """Builds a tiny ``AutoModelForSequenceClassification`` (``num_labels=1``) from a config.

    Args:
        arch (str, optional): ``"llama"`` (rotary positions), ``"gpt2"`` (absolute positions) or
            ``"bert"`` (encoder). Defaults to ``"llama"``.

    Keyword Args:
        tokenizer (PreTrainedTokenizerFast, optional): sets the vocabulary size; defaults to
            :func:`toy_tokenizer`.
        pad_token_id (int, None or ``"tokenizer"``): written to ``config.pad_token_id``.
            ``"tokenizer"`` (default) takes the tokenizer's pad id.
        seed (int, optional): seed for the random initialisation. Defaults to ``0``.
        **config_overrides: set on the config before the model is built.

    Examples:
        >>> import torch
        >>> model = toy_reward_model("gpt2")
        >>> model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape
        torch.Size([1, 1])
    """
    require("transformers", "toy_reward_model")
    import torch
    from transformers import AutoModelForSequenceClassification

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer()
    if pad_token_id == "tokenizer":
        pad_token_id = tokenizer.pad_token_id
    cfg = _toy_config(arch, len(tokenizer), pad_token_id, **{"num_labels": 1, **config_overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(cfg)
    return model.eval()


def toy_causal_lm(
    arch: str = "llama",
    *,
    tokenizer: PreTrainedTokenizerFast | None = None,
    seed: int = 0,
    **config_overrides: Any,
) -> PreTrainedModel:
    """Builds a tiny ``AutoModelForCausalLM`` from a config (a toy policy).

    Examples:
        >>> model = toy_causal_lm()
        >>> model.config.num_hidden_layers
        1
    """
    require("transformers", "toy_causal_lm")
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer()
    cfg = _toy_config(arch, len(tokenizer), tokenizer.pad_token_id, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


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

    Offline, no checkpoint, no report, one row logged per step; ``overrides`` win.

    Examples:
        >>> args = toy_trainer_args("/tmp/run", max_steps=4)
        >>> args["max_steps"], args["use_cpu"], args["report_to"]
        (4, True, 'none')
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


# ---------------------------------------------------------------------------------------------
# Online loop fixtures (issue 12): chat environments that take TRL's prompts at reset, and an
# environment that contributes a turn of its own between two assistant turns.
# ---------------------------------------------------------------------------------------------

__all__ += ["toy_chat_env", "toy_tool_reply"]


def toy_tool_reply(template: str = "{n} characters"):
    """A torchrl tool transform that answers every assistant turn with a ``tool`` message.

    It is a real :class:`~torchrl.envs.llm.transforms.ToolTransformBase` (the base of torchrl's
    ``PythonInterpreter``, ``SimpleToolTransform``, ``MCPToolTransform``): after each step it
    appends ``template.format(n=len(answer))`` as a ``tool`` turn to the next prompt, so the
    environment adds tokens between two assistant turns whatever a random toy model says.

    Examples:
        >>> t = toy_tool_reply()
        >>> t.tool_role, t._process_batch_item("Hello", 0)
        ('tool', ['5 characters'])
    """
    from torchrl.envs.llm.transforms.tools import ToolTransformBase

    class ToyToolReply(ToolTransformBase):
        tool_role = "tool"

        def _process_batch_item(self, content: str, index: int) -> list[str]:
            return [template.format(n=len(content))]

    return ToyToolReply()


def toy_chat_env(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    batch_size: int = 2,
    reply: bool = False,
    max_steps: int | None = None,
    transforms: list | None = None,
):
    """A ``ChatEnv`` in history mode that takes its prompts at reset (no ``DataLoadingPrimer``).

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.
        batch_size (int): rollouts per reset.
        reply (bool): append :func:`toy_tool_reply` (an environment turn after every answer).
        max_steps (int, optional): a ``StepCounter`` ends the episode after that many turns.
        transforms (list, optional): more transforms, appended last (e.g. a reward transform).

    Examples:
        >>> from tensordict import TensorDict
        >>> env = toy_chat_env(batch_size=2, reply=True, max_steps=2)
        >>> td = env.reset(TensorDict({"query": ["Hi", "Hello"]}, batch_size=[2]))
        >>> from torchrl_trl_interop.conversation import history_to_messages
        >>> history_to_messages(td["history", "prompt"])
        [[{'role': 'user', 'content': 'Hi'}], [{'role': 'user', 'content': 'Hello'}]]
    """
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    env = ChatEnv(batch_size=(batch_size,), tokenizer=tokenizer, input_mode="history")
    if reply:
        env = env.append_transform(toy_tool_reply())
    if max_steps is not None:
        env = env.append_transform(StepCounter(max_steps=max_steps))
    for transform in transforms or []:
        env = env.append_transform(transform)
    return env


# ---------------------------------------------------------------------------------------------
# Generation apart from training (issue 13): a generator policy built in another process.
# ---------------------------------------------------------------------------------------------

__all__ += [
    "ToyGenerator",
    "toy_answer_length",
    "toy_generator_policy",
    "toy_grpo_step",
    "toy_primed_chat_env",
]


def _query_rows(rows: list[dict]) -> dict[str, list[str]]:
    return {"query": [r["query"] for r in rows]}


def toy_primed_chat_env(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    prompts: list[str] | None = None,
    repeats: int = 2,
    batch_size: int = 2,
    transforms: list | None = None,
):
    """A single-turn ``ChatEnv`` that serves its own prompts (a ``DataLoadingPrimer``), endlessly.

    Each reset takes the next prompt batch (every prompt ``repeats`` times in a row, cycling over
    ``prompts``); a ``StepCounter(max_steps=1)`` ends each episode after one answer. What a
    collector needs to run on its own, apart from a trainer.

    Keyword Args:
        tokenizer: defaults to ``toy_tokenizer(padding_side="left")``.
        prompts (list of str): defaults to :func:`toy_prompts`.
        repeats (int): rows per prompt (GRPO's group size).
        batch_size (int): the env's batch size.
        transforms (list, optional): appended last (e.g. a reward transform).

    Examples:
        >>> env = toy_primed_chat_env(prompts=["Hi"], repeats=2)
        >>> from torchrl_trl_interop.conversation import history_to_messages
        >>> history_to_messages(env.reset()["history", "prompt"])[1]
        [{'role': 'user', 'content': 'Hi'}]
    """
    import torch
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms.dataloading import DataLoadingPrimer

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer(padding_side="left")
    prompts = prompts if prompts is not None else toy_prompts()
    dataloader = torch.utils.data.DataLoader(
        [{"query": p} for p in prompts],
        batch_size=max(batch_size // repeats, 1),
        shuffle=False,
        collate_fn=_query_rows,
    )
    env = ChatEnv(batch_size=(batch_size,), tokenizer=tokenizer, input_mode="history")
    env = env.append_transform(
        DataLoadingPrimer(dataloader=dataloader, repeats=repeats, batch_size=(batch_size,))
    )
    env = env.append_transform(StepCounter(max_steps=1))
    for transform in transforms or []:
        env = env.append_transform(transform)
    return env


def toy_generator_policy(
    generation_config: Any = None,
    *,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 6,
):
    """A toy generator: :func:`toy_causal_lm` as a ``TrainerModelPolicy``, built where it is called.

    Module-level (picklable through ``functools.partial``), so a
    :class:`~torchrl_trl_interop.RemotePolicy` can build it in its own process. Its weights are
    a fresh toy model's until the trainer's are pushed.

    Args:
        generation_config (GenerationConfig, optional): how to sample; for a trainer,
            ``trainer_policy.trainer_generation_config(trainer, tokenizer)``. Defaults to
            ``max_new_tokens`` sampled tokens.

    Keyword Args:
        temperature (float): the log-probs' temperature. Defaults to ``1.0``.
        seed (int): the toy model's initialisation. Defaults to ``0``.
        max_new_tokens (int): without ``generation_config``. Defaults to ``6``.

    Examples:
        >>> policy = toy_generator_policy()
        >>> type(policy).__name__, policy.model.config.num_hidden_layers
        ('TrainerModelPolicy', 1)
    """
    from transformers import GenerationConfig

    from .trainer_policy import TrainerModelPolicy

    tokenizer = toy_tokenizer(padding_side="left")
    if generation_config is None:
        generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            suppress_tokens=[tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids(IM_START)],
        )
    model = toy_causal_lm(tokenizer=tokenizer, seed=seed)
    return TrainerModelPolicy(model, tokenizer, generation_config, temperature)


def toy_answer_length(completions, **kwargs):
    """A TRL-style reward function: the length of the last answer."""
    return [float(len(c[-1]["content"])) for c in completions]


class ToyGenerator:
    """A generator apart from the trainer: a torchrl ``LLMCollector`` writing into a buffer.

    Meant as a Ray actor (``ray.remote(max_concurrency=3)(ToyGenerator).remote(rb.client())``):
    :meth:`run` collects from :func:`toy_primed_chat_env` with :func:`toy_generator_policy`
    (rewarded by :func:`toy_answer_length`, versions stamped), :meth:`update_weights` pushes the
    trainer's weights between two batches through :class:`~torchrl_trl_interop.WeightSyncCallback`.
    """

    def __init__(self, buffer_client, *, max_new_tokens: int = 6):
        import threading

        import torch
        from torchrl.collectors.llm import LLMCollector

        from .reward_transform import as_reward_transform

        torch.set_num_threads(1)
        env = toy_primed_chat_env(transforms=[as_reward_transform(toy_answer_length)])
        self.policy = toy_generator_policy(seed=1, max_new_tokens=max_new_tokens)
        self.collector = LLMCollector(
            env,
            policy=self.policy,
            dialog_turns_per_batch=4,
            replay_buffer=buffer_client,
            track_policy_version=True,
        )
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.pending = None

    def run(self, max_batches: int) -> int:
        """Collects up to ``max_batches`` batches (until :meth:`stop`); staged weights go live
        between two batches."""
        batches = iter(self.collector)
        for done in range(max_batches):
            if self.stopped.is_set():
                return done
            self._apply_pending()
            next(batches)
        return max_batches

    def stop(self) -> None:
        self.stopped.set()

    def update_weights(self, weights, version: int) -> int:
        """Stages ``weights`` as ``version``; they go live before the next batch (no waiting for
        the batch in flight)."""
        with self.lock:
            self.pending = (weights, version)
        return version

    def _apply_pending(self) -> None:
        from .weight_sync import WeightSyncCallback

        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            WeightSyncCallback(self.collector).push(*pending)

    def checksum(self) -> tuple:
        """``(policy_version, weights checksum)`` of the live policy, staged weights applied."""
        from .weight_sync import weights_checksum

        self._apply_pending()
        return self.collector.policy_version, weights_checksum(self.policy.model)


def toy_grpo_step(model, optimizer, samples) -> float:
    """One clipped-ratio GRPO step on ``RolloutSample``\\ s (old log-probs, advantages); the loss."""
    import torch

    losses = []
    for s in samples:
        ids = torch.as_tensor(s.input_ids)[None]
        mask = torch.as_tensor(s.completion_mask[1:], dtype=torch.bool)
        logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        logps = logps.gather(-1, ids[0, 1:, None]).squeeze(-1)[mask]
        ratio = (logps - torch.as_tensor(s.old_log_probs[1:])[mask]).exp()
        clipped = ratio.clamp(0.8, 1.2)
        losses.append(-torch.min(ratio * s.advantage, clipped * s.advantage).mean())
    loss = torch.stack(losses).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


__all__ += ["count_host_syncs"]


def count_host_syncs() -> Any:
    """A context whose ``.count`` is the number of tensor reads back to the host inside it.

    Counts every call that must wait for a tensor's values (on a GPU, a device sync):
    ``item``, ``tolist``, ``bool``/``int``/``float``/index conversions, ``torch.equal``,
    ``nonzero`` and the other ops whose output size depends on the values. ``.calls`` names them.

    Examples:
        >>> import torch
        >>> x = torch.tensor([1, 2, 3])
        >>> with count_host_syncs() as syncs:
        ...     y = x * 2
        ...     total = int(y.sum())
        >>> syncs.count, syncs.calls
        (1, ['__int__'])
    """
    from torch.overrides import TorchFunctionMode

    reads = {
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "equal",
        "allclose",
        "nonzero",
        "masked_select",
        "unique",
        "numpy",
    }

    class HostSyncCounter(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        @property
        def count(self) -> int:
            return len(self.calls)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in reads:
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    return HostSyncCounter()


__all__ += ["stub_reward_model"]


def stub_reward_model(
    vocab_size: int = 384, *, pad_token_id: int | None = 0, eos_token_id: int | None = 2
) -> Any:
    """A reward "model" that costs next to nothing, to measure what a wrapper adds around it.

    Pools as HF sequence classifiers do (the rightmost token whose id is not
    ``config.pad_token_id``) and returns that token's learned score, ``[N, 1]``; it reads no
    value back to the host.

    Examples:
        >>> import torch
        >>> model = stub_reward_model()
        >>> model(input_ids=torch.tensor([[5, 6, 0], [7, 8, 9]])).shape
        torch.Size([2, 1])
    """
    from types import SimpleNamespace

    import torch
    from torch import nn

    class StubRewardModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(
                pad_token_id=pad_token_id, eos_token_id=eos_token_id, num_labels=1
            )
            self.score = nn.Embedding(vocab_size, 1)

        def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
            pad = self.config.pad_token_id
            real = input_ids != pad if pad is not None else torch.ones_like(input_ids).bool()
            last = (positions * real).argmax(-1)
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            return self.score(input_ids[rows, last])

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return StubRewardModel().eval()
