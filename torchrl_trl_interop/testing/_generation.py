"""A generator apart from the trainer: a policy built in another process, a toy GRPO step."""

from __future__ import annotations

from typing import Any

from ._data import toy_trainer_args
from ._envs import toy_primed_chat_env
from ._models import toy_causal_lm
from ._tokenizer import IM_START, toy_tokenizer


def toy_generator_policy(
    generation_config: Any = None,
    *,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 6,
    sample_seed: int | None = None,
    dtype: Any = None,
    model_sizes: dict[str, int] | None = None,
):
    """A toy generator: :func:`toy_causal_lm` as a ``TrainerModelPolicy``, built where it is called.

    Module-level (picklable through ``functools.partial``), so a
    :class:`~torchrl_trl_interop.RemotePolicy` can build it in its own process. Its weights are
    a fresh toy model's until the trainer's are pushed.

    Args:
        generation_config (GenerationConfig, optional): how to sample; for a trainer,
            ``trainer_generation_config(trainer, tokenizer)``. Defaults to
            ``max_new_tokens`` sampled tokens.

    Keyword Args:
        temperature (float): the log-probs' temperature. Defaults to ``1.0``.
        seed (int): the toy model's initialisation. Defaults to ``0``.
        max_new_tokens (int): without ``generation_config``. Defaults to ``6``.
        sample_seed (int, optional): seeds the sampling: torch's global generator in the process
            that builds the policy (torch seeds a fresh process at random). Defaults to ``None``
            (left as it is).
        dtype (torch.dtype, optional): the model's dtype (``torch.bfloat16``: a bf16 generator
            fed by an fp32 trainer). Defaults to ``None`` (fp32).
        model_sizes (dict, optional): :func:`toy_causal_lm`'s sizes (``hidden_size``,
            ``num_hidden_layers``...). Defaults to ``None`` (its own).

    Examples:
        >>> policy = toy_generator_policy()
        >>> type(policy).__name__, policy.model.config.num_hidden_layers
        ('TrainerModelPolicy', 1)
    """
    from transformers import GenerationConfig

    from ..rollouts._trainer_policy import TrainerModelPolicy

    tokenizer = toy_tokenizer(padding_side="left")
    if generation_config is None:
        generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            suppress_tokens=[tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids(IM_START)],
        )
    model = toy_causal_lm(tokenizer=tokenizer, seed=seed, **(model_sizes or {}))
    if dtype is not None:
        model = model.to(dtype)
    if sample_seed is not None:
        import torch

        torch.manual_seed(sample_seed)
    return TrainerModelPolicy(model, tokenizer, generation_config, temperature)


def toy_grpo_args(output_dir: str, *, tokenizer: Any = None, **overrides: Any) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments for a toy chat policy's GRPO run on CPU.

    :func:`~torchrl_trl_interop.testing.toy_trainer_args` (2 steps, offline, seeded) with 4 rows
    per device, 2 generations per prompt, 6 completion tokens, learning rate ``1e-2``, fp32, and
    the chat template's ``<|im_start|>`` suppressed in generation (a random toy model samples it,
    and torchrl parses it as a new turn); ``overrides`` win, ``generation_kwargs`` included.

    Keyword Args:
        tokenizer (PreTrainedTokenizerFast, optional): whose ``<|im_start|>`` id is suppressed.
            Defaults to :func:`toy_tokenizer`.

    Examples:
        >>> from torchrl_trl_interop.testing import IM_START, toy_tokenizer
        >>> args = toy_grpo_args("/tmp/run", max_steps=4)
        >>> args["num_generations"], args["max_steps"], args["bf16"]
        (2, 4, False)
        >>> args["generation_kwargs"]["suppress_tokens"] == [
        ...     toy_tokenizer().convert_tokens_to_ids(IM_START)]
        True
    """
    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer()
    args: dict[str, Any] = {
        "num_generations": 2,
        "max_completion_length": 6,
        "learning_rate": 1e-2,
        "generation_kwargs": {"suppress_tokens": [tokenizer.convert_tokens_to_ids(IM_START)]},
        **toy_trainer_args(output_dir, per_device_train_batch_size=4, bf16=False, fp16=False),
    }
    args.update(overrides)
    return args


def toy_answer_length(completions, **kwargs):
    """A TRL-style reward function: the length of the last answer."""
    return [float(len(c[-1]["content"])) for c in completions]


class ToyGenerator:
    """A generator apart from the trainer: a torchrl ``LLMCollector`` writing into a buffer.

    Meant as a Ray actor (``ray.remote(max_concurrency=3)(ToyGenerator).remote(rb.client())``):
    :meth:`run` collects from :func:`toy_primed_chat_env` with :func:`toy_generator_policy`
    (rewarded by :func:`toy_answer_length`, versions stamped), :meth:`update_weights` pushes the
    trainer's weights between two batches through the package's one weight push.
    """

    def __init__(self, buffer_client, *, max_new_tokens: int = 6):
        import threading

        import torch
        from torchrl.collectors.llm import LLMCollector

        from ..rewards._env_transform import RewardTransform

        torch.set_num_threads(1)
        env = toy_primed_chat_env(transforms=[RewardTransform(toy_answer_length)])
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
        from .._checks import speaking_for
        from ..weights._push import push

        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            with speaking_for("ToyGenerator"):
                push(self.collector, *pending)

    def checksum(self) -> tuple:
        """``(policy_version, weights checksum)`` of the live policy, staged weights applied."""
        from ..weights._tensors import weights_checksum

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


class ToyVLLMClient:
    """A stand-in for TRL's ``VLLMClient`` (a ``trl vllm-serve`` server) where vLLM cannot run.

    The "server" is a toy model in this process: :meth:`update_named_params` loads the weights
    TRL's ``VLLMGeneration.sync_weights`` streams, :meth:`generate` samples ``n`` completions
    per prompt with the trainer's sampling arguments (the pad token suppressed, as the toy
    chat format needs) and returns vLLM's output layout with each sampled token's log-prob
    (``logits / temperature``, as vLLM's ``processed_logprobs``). It records every call.

    Args:
        model (PreTrainedModel): the server's model (its weights are replaced by the syncs).
        tokenizer (PreTrainedTokenizerBase): for the eos and pad ids.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> client = ToyVLLMClient(toy_causal_lm(), toy_tokenizer())
        >>> out = client.generate(prompts=[[5, 6]], n=2, max_tokens=3)
        >>> len(out["completion_ids"]), len(out["logprobs"][0]) == len(out["completion_ids"][0])
        (2, True)
    """

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.generated: list[int] = []  # completions per generate call
        self.synced = 0
        self.synced_checksums: list[str] = []  # the model's checksum after each sync

    def update_named_params(self, metadata: list, params: Any) -> None:
        import torch

        live = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in params:
                live[name].copy_(tensor)
        self.synced += 1
        from ..weights._tensors import weights_checksum

        self.synced_checksums.append(weights_checksum(self.model))

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts: list, n: int = 1, **sampling: Any) -> dict[str, list]:
        import torch

        from ..rollouts._trainer_policy import completion_lengths, score_tokens

        tok = self.tokenizer
        temperature = sampling.get("temperature") or 1.0
        suppress = list((sampling.get("generation_kwargs") or {}).get("suppress_tokens", []))
        prompt_ids, completion_ids, logprobs = [], [], []
        for prompt in prompts:
            ids = torch.tensor([prompt] * n)
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=temperature,
                    top_k=sampling.get("top_k") or None,
                    top_p=sampling.get("top_p") or 1.0,
                    max_new_tokens=sampling.get("max_tokens", 16),
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                    suppress_tokens=suppress + [tok.pad_token_id],
                )
            new = out[:, len(prompt) :]
            ends = completion_lengths(new, tok.eos_token_id).tolist()
            rows = [row[:end].tolist() for row, end in zip(new, ends)]
            scores = score_tokens(
                self.model, [prompt + r for r in rows], [len(prompt)] * n, temperature=temperature
            )
            prompt_ids.append(list(prompt))
            completion_ids.extend(rows)
            logprobs.extend([[v] for v in s.tolist()] for s in scores)
        self.generated.append(len(completion_ids))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def attach_toy_vllm(trainer: Any, server_model: Any) -> ToyVLLMClient:
    """Makes a built ``GRPOTrainer`` run as with ``use_vllm=True, vllm_mode="server"``, TRL's own
    ``VLLMGeneration`` talking to a :class:`ToyVLLMClient` (vLLM itself is not installed).

    What ``GRPOTrainer.__init__`` does under ``use_vllm``, with TRL's ``VLLMGeneration`` built by
    its own constructor except ``_init_vllm`` (which needs vLLM and a server): the trainer then
    syncs weights before each step's rollout call and applies its importance-sampling
    correction as with a real server. Returns the client.
    """
    from unittest import mock

    from trl.generation.vllm_generation import VLLMGeneration

    from ..rollouts._trainer import attach_vllm_generation

    args = trainer.args
    with mock.patch.object(VLLMGeneration, "_init_vllm", lambda self: None):
        generation = VLLMGeneration(
            model=trainer.model,
            accelerator=trainer.accelerator,
            processing_class=trainer.processing_class,
            mode="server",
            repetition_penalty=trainer.repetition_penalty,
            temperature=trainer.temperature,
            top_p=trainer.top_p,
            top_k=trainer.top_k,
            min_p=trainer.min_p,
            max_completion_length=trainer.max_completion_length,
            logprobs=0,
            generation_kwargs=args.generation_kwargs,
        )
    generation.vllm_client = ToyVLLMClient(server_model, trainer.processing_class)
    attach_vllm_generation(trainer, generation, mode="server")
    return generation.vllm_client
