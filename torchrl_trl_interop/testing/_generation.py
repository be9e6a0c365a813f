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
        sample_seed (int, optional): seeds the sampling: torch's global generator in the process
            that builds the policy (torch seeds a fresh process at random). Defaults to ``None``
            (left as it is).

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
    model = toy_causal_lm(tokenizer=tokenizer, seed=seed)
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
        **toy_trainer_args(output_dir, per_device_train_batch_size=4),
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

        from ..rewards._env_transform import as_reward_transform

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
        from ..weights._push import push

        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            push(self.collector, *pending, owner="ToyGenerator")

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
