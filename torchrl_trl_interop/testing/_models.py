"""Tiny transformers models built from configs (random weights, nothing downloaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._checks import require
from ._tokenizer import toy_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


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


def _toy_config(
    arch: str, tokenizer: PreTrainedTokenizerFast, pad_token_id: int | None, **overrides: Any
):
    """A toy config of ``arch``: the tokenizer's vocabulary size and eos id, ``pad_token_id``."""
    from transformers import BertConfig, GPT2Config, LlamaConfig

    classes = {"llama": LlamaConfig, "gpt2": GPT2Config, "bert": BertConfig}
    if arch not in classes:
        raise ValueError(f"Unknown toy architecture {arch!r}; expected one of {tuple(classes)}.")
    # the special ids go in with the sizes: GPT2Config's defaults (50256) lie outside the toy
    # vocabulary, and transformers warns about them when the config is built
    cfg = classes[arch](
        vocab_size=len(tokenizer),
        pad_token_id=pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        **_TOY_SIZES[arch],
    )
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
        tokenizer (PreTrainedTokenizerFast, optional): sets the vocabulary size and the eos id;
            defaults to :func:`toy_tokenizer`.
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
    cfg = _toy_config(arch, tokenizer, pad_token_id, **{"num_labels": 1, **config_overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(cfg)
    return model.eval()


def toy_causal_lm(
    arch: str = "llama",
    *,
    tokenizer: PreTrainedTokenizerFast | None = None,
    seed: int = 0,
    eos_bias: float = 0.0,
    **config_overrides: Any,
) -> PreTrainedModel:
    """Builds a tiny ``AutoModelForCausalLM`` from a config (a toy policy).

    Keyword Args:
        tokenizer (PreTrainedTokenizerFast, optional): sets the vocabulary and the pad and eos
            ids; defaults to :func:`toy_tokenizer`.
        seed (int, optional): seed for the random initialisation. Defaults to ``0``.
        eos_bias (float, optional): added to the eos token's logit by a forward hook on the
            output layer, so that the random model stops early (``4.0``: about one token in eight
            is eos). Defaults to ``0.0`` (no hook).
        **config_overrides: set on the config before the model is built.

    Examples:
        >>> model = toy_causal_lm()
        >>> model.config.num_hidden_layers
        1
        >>> import torch
        >>> stopping = toy_causal_lm(eos_bias=100.0)
        >>> int(stopping(input_ids=torch.tensor([[5, 6]])).logits[0, -1].argmax())  # eos
        2
    """
    require("transformers", "toy_causal_lm")
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer if tokenizer is not None else toy_tokenizer()
    cfg = _toy_config(arch, tokenizer, tokenizer.pad_token_id, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if eos_bias:
        eos = tokenizer.eos_token_id

        def add_eos_bias(module: Any, args: Any, logits: torch.Tensor) -> torch.Tensor:
            bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
            return logits + bias.index_fill_(0, torch.tensor([eos], device=bias.device), eos_bias)

        model.get_output_embeddings().register_forward_hook(add_eos_bias)
    return model.eval()
