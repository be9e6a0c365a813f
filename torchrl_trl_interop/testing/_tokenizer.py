"""The toy tokenizer: byte-level BPE trained on a few sentences, with a ChatML template."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .._checks import require

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast


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
def _toy_tokenizer_json(
    vocab_size: int,
    corpus: tuple[str, ...] = TOY_CORPUS,
    *,
    across_words: bool = False,
    split_digits: bool = False,
) -> str:
    """A byte-level BPE trained on ``corpus``; ``across_words`` lets merges span words (digits
    stay single tokens), so that text repeated verbatim, such as a template's tool preamble,
    becomes a few tokens; ``split_digits`` keeps word merges and makes every digit a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
    if across_words:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok.to_str()


def toy_tokenizer(
    *,
    padding_side: str = "right",
    vocab_size: int = 384,
    pad_token: str = PAD_TOKEN,
    split_digits: bool = False,
) -> PreTrainedTokenizerFast:
    """Builds a byte-level BPE tokenizer with ChatML special tokens, offline.

    Pad is ``<|endoftext|>`` (id 0), eos is ``<|im_end|>`` (id 2); the chat template is ChatML.
    Any text round-trips through ``encode``/``decode`` (byte-level), which TorchRL's
    ``TransformersWrapper(input_mode="history")`` needs to parse generations back into History.

    Keyword Args:
        padding_side (str, optional): ``"right"`` or ``"left"``. Defaults to ``"right"``.
        vocab_size (int, optional): target vocabulary size. Defaults to ``384``.
        pad_token (str, optional): the pad token. ``IM_END`` makes it the eos token, as GPT-2,
            Llama-3 and Mistral tokenizers ship. Defaults to ``"<|endoftext|>"``.
        split_digits (bool, optional): every digit its own token, as Llama and Qwen tokenizers
            split numbers, so ``"12"`` is ``"1"``, ``"2"`` (the default BPE merges some numbers
            into one token: ``" 12"``). Defaults to ``False``.

    Examples:
        >>> tok = toy_tokenizer(padding_side="left")
        >>> tok.pad_token, tok.eos_token, tok.pad_token_id, tok.eos_token_id
        ('<|endoftext|>', '<|im_end|>', 0, 2)
        >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
        '<|im_start|>user\\nHi<|im_end|>\\n'
        >>> toy_tokenizer(pad_token=IM_END).pad_token_id  # pad == eos
        2
        >>> digits = toy_tokenizer(split_digits=True)
        >>> [digits.decode([i]) for i in digits("is 12.")["input_ids"]]
        ['is', ' ', '1', '2', '.']
    """
    require("transformers", "toy_tokenizer")
    tokenizer = _fast_tokenizer(
        _toy_tokenizer_json(vocab_size, split_digits=split_digits), padding_side, pad_token
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _fast_tokenizer(
    tokenizer_json: str, padding_side: str, pad_token: str = PAD_TOKEN
) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` around a trained toy BPE: pad, eos and ``<|im_start|>``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        pad_token=pad_token,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        padding_side=padding_side,
    )


#: Sizes of the toy configs: one layer, width 32, 4 heads, 1024 positions.
