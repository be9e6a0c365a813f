"""A torchrl LLM policy called on token rows, as the endpoint samples: one call per batch.

:class:`PolicyCaller` gives the policy each row's prompt tokens (left-padded, with the mask that
tells the real ones, as the rollout function gives them from a rollout's second turn), reads its
output as real token rows (:func:`~torchrl_trl_interop.rollouts._policy_output.read_policy_rows`)
and checks that the policy continued from exactly those tokens. :func:`read_policy_sampling`
reads what the policy samples with (temperature, ``top_p``, its answer limit, its stop ids),
where the policy says it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack

from .._chat_format import answer_turn
from .._keys import POLICY_VERSION_KEY
from .._padding import pad_rows, position_mask
from ..rollouts._policy_output import PolicyKeys, read_policy_rows

__all__ = ["PolicyCaller", "PolicyOutput", "PolicySampling", "read_policy_sampling"]


@dataclass(frozen=True)
class PolicySampling:
    """What a policy samples with, where it says it (``None``: not known)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    eos_ids: tuple[int, ...] = ()


def _read(source: Any, name: str) -> Any:
    return source.get(name) if isinstance(source, dict) else getattr(source, name, None)


def read_policy_sampling(policy: Any) -> PolicySampling:
    """The temperature, ``top_p``, answer limit and eos ids a torchrl LLM policy samples with:
    a :class:`~torchrl_trl_interop.TrainerModelPolicy`'s ``temperature`` and
    ``GenerationConfig``, a ``TransformersWrapper``'s ``generate_kwargs`` (the model's own
    generation config for the eos ids); ``None`` for what the policy does not say (a
    :class:`~torchrl_trl_interop.RemotePolicy` runs elsewhere).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> tok = toy_tokenizer()
        >>> policy = TransformersWrapper(toy_causal_lm(tokenizer=tok), tokenizer=tok,
        ...     input_mode="history", generate_kwargs={"max_new_tokens": 8, "temperature": 0.7})
        >>> read_policy_sampling(policy)
        PolicySampling(temperature=0.7, top_p=1.0, max_tokens=8, eos_ids=(2,))
    """
    kwargs = getattr(policy, "generate_kwargs", None)
    if not isinstance(kwargs, dict):
        return PolicySampling()
    config = kwargs.get("generation_config", kwargs)
    temperature = getattr(policy, "temperature", None)
    if temperature is None:
        temperature = _read(config, "temperature")
        temperature = 1.0 if temperature is None else temperature
    top_p = _read(config, "top_p")
    model_config = getattr(getattr(policy, "model", None), "generation_config", None)
    eos = _read(config, "eos_token_id")
    eos = _read(model_config, "eos_token_id") if eos is None else eos
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    max_tokens = _read(config, "max_new_tokens")
    return PolicySampling(
        temperature=float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        max_tokens=None if max_tokens is None else int(max_tokens),
        eos_ids=tuple(int(i) for i in eos),
    )


def _takes_generation_kwargs(policy: Any) -> bool:
    """Whether ``policy(td, max_new_tokens=...)`` reaches its generation (torchrl's LLM
    wrappers take generation arguments at call time; a :class:`RemotePolicy` does not)."""
    try:
        parameters = inspect.signature(policy.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@dataclass
class PolicyOutput:
    """Per row: the sampled ids, their log-probs, and the policy version (``None``: not stamped)."""

    responses: list[list[int]]
    log_probs: list[list[float]]
    versions: list[int | None]


class PolicyCaller:
    """Calls ``policy`` on prompt token rows; the only caller of the policy (one thread).

    Args:
        policy (TensorDictModuleBase): a torchrl LLM policy that continues from the
            ``("tokens", "prompt")`` it is given (``prefer_tokens=True``) and writes log-probs.
        tokenizer: its tokenizer (the pad id when the policy names none).
    """

    def __init__(self, policy: Any, tokenizer: Any) -> None:
        self.policy = policy
        self.keys = PolicyKeys.of(policy)
        pad = getattr(policy, "padding_value", None)
        self.pad_id = int(tokenizer.pad_token_id if pad is None else pad)
        self.takes_kwargs = _takes_generation_kwargs(policy)
        model = getattr(policy, "model", None)
        #: the policy samples in this process, with torch's random generator (seeds honoured)
        self.in_process = isinstance(model, torch.nn.Module)
        self.device = next(model.parameters()).device if self.in_process else None

    def _input(self, prompts: Sequence[Sequence[int]]) -> TensorDict:
        """The policy's input: the prompt tokens left-padded with their mask, and a one-turn
        History per row (history-mode wrappers read one; its text is the rendered prompt)."""
        rows = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
        lengths = [len(p) for p in prompts]
        td = TensorDict(batch_size=[len(rows)])
        td.set(self.keys.prompt_tokens, pad_rows(rows, self.pad_id, padding_side="left"))
        td.set(self.keys.attention_mask, position_mask(lengths, max(lengths), "left"))
        td.set(self.keys.prompt_history, lazy_stack([answer_turn("", True, "user") for _ in rows]))
        return td

    def __call__(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> PolicyOutput:
        """Samples one answer per prompt row.

        ``max_new_tokens`` reaches the policy's generation where it takes call-time arguments
        (else the answers are cut afterwards); ``seed`` seeds torch's generator for this call
        alone (a policy in this process).

        Raises:
            RuntimeError: if the policy did not continue from the given tokens, or wrote no
                log-probs.
        """
        kwargs = {}
        if max_new_tokens is not None and self.takes_kwargs:
            kwargs["max_new_tokens"] = int(max_new_tokens)
        with set_list_to_stack(True), torch.no_grad():
            td = self._input(prompts)
            if seed is None:
                out = self.policy(td, **kwargs)
            else:
                cuda = (
                    [self.device] if self.device is not None and self.device.type == "cuda" else []
                )
                with torch.random.fork_rng(devices=cuda):
                    torch.manual_seed(seed)
                    out = self.policy(td, **kwargs)
        rows = read_policy_rows(out, self.keys, log_probs=True, required=False)
        if rows.log_probs is None:
            raise RuntimeError(
                f"the policy {type(self.policy).__name__} wrote no log-probs at "
                f"{self.keys.response_log_probs!r}; the endpoint returns and records each "
                "sampled token's log-prob: build it with return_log_probs=True."
            )
        for i, (given, read) in enumerate(zip(prompts, rows.prompts)):
            if list(given) != read:
                raise RuntimeError(
                    f"the policy {type(self.policy).__name__} conditioned row {i} on "
                    f"{len(read)} tokens, not on the {len(given)} prompt tokens it was given: "
                    "the endpoint needs a token-first policy that continues from the "
                    f"{self.keys.prompt_tokens!r} it is given (prefer_tokens=True; a "
                    "TrainerModelPolicy does)."
                )
        versions = out.get(POLICY_VERSION_KEY, None)
        if isinstance(versions, torch.Tensor):
            versions = [int(v) for v in versions.reshape(len(prompts), -1)[:, 0].tolist()]
        else:
            versions = [None] * len(prompts)
        return PolicyOutput(rows.responses, rows.log_probs, versions)
