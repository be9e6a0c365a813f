"""The toy tokenizer: byte-level BPE trained on a few sentences, with a ChatML template, and the
same vocabulary with a real model's chat template and its markup as single tokens."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

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


# -- real models' chat formats on the toy vocabulary -------------------------------------------

#: The markup of chat templates: ``<|...|>``, ``<｜...｜>``, ``<|x>``/``<x|>`` (Gemma 4),
#: ``<word>``/``</word>``, ``[INST]``-style brackets, ``[gMASK]``.
_MARKER = re.compile(
    r"<\|[^<>|\s]+\|>|<｜[^<>｜]+｜>|<\|[A-Za-z_\"]+>|<[A-Za-z_]+\|>"
    r"|</?[A-Za-z_][A-Za-z0-9_]*>|\[/?[A-Za-z_]+\]"
)
#: Markup a real tokenizer holds as a special token (the rest, ``<think>``, ``<tool_call>``...,
#: as added tokens, as Qwen's tokenizers hold them).
_SPECIAL_MARKER = re.compile(r"\||｜|turn|utterance|^<sop>$|gMASK|INST|^<bos>$|^<eos>$|^<s>$")


def template_markers(chat_template: str) -> list[str]:
    """The markup tokens of a chat template: read from its text and from a rendered probe
    conversation (templates build some, e.g. ``'<|' + role + '|>'``), in order of appearance.

    Examples:
        >>> template_markers(CHATML_TEMPLATE)
        ['<|im_start|>', '<|im_end|>']
    """
    from transformers import PreTrainedTokenizerFast

    probe = PreTrainedTokenizerFast(
        tokenizer_object=_backend(_toy_tokenizer_json(384)), bos_token="<bos>", eos_token="<eos>"
    )
    probe.chat_template = chat_template
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "V"},
    ]
    rendered = ""
    try:
        rendered = probe.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses a system turn: the text alone
        pass
    found = _MARKER.findall(chat_template) + _MARKER.findall(rendered)
    return [m for m in dict.fromkeys(found) if m not in ("<bos>", "<eos>")]


def _backend(tokenizer_json: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def toy_template_tokenizer(
    chat_template: str,
    *,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_token: str = PAD_TOKEN,
    adds_bos: bool = False,
    padding_side: str = "left",
) -> PreTrainedTokenizerFast:
    """The toy vocabulary with a real model's chat template and its markup as single tokens.

    Every markup token of ``chat_template`` (:func:`template_markers`) becomes one id: turn
    markers (``<|eot_id|>``, ``<start_of_turn>``, ``<|im_end|>``...) as special tokens, tags
    (``<think>``, ``<tool_call>``...) as added tokens, as the real tokenizers hold them. The
    layout is a real one: eos is the token closing an assistant turn (``<|eot_id|>`` for Llama
    3, ``<end_of_turn>`` for Gemma, as users set it), pad is another token, and a template that
    writes ``bos_token`` gets one.

    Args:
        chat_template (str): the template's text (e.g. ``trl.chat_template_utils.llama3_1_chat_template``).

    Keyword Args:
        eos_token (str, optional): the eos token. Defaults to the first markup token of the
            template's closing of an assistant turn, or ``"<|endoftext|>"`` if it has none
            (pad then becomes ``"<|pad|>"``).
        bos_token (str, optional): the bos token. Defaults to one when the template writes
            ``bos_token`` (``"<|begin_of_text|>"`` for Llama's header markup, else ``"<bos>"``).
        pad_token (str, optional): the pad token. Defaults to ``"<|endoftext|>"``.
        adds_bos (bool, optional): the tokenizer itself also puts bos first when it adds special
            tokens (a ``TemplateProcessing`` post-processor), as Llama's tokenizers do.
            Defaults to ``False``.
        padding_side (str, optional): Defaults to ``"left"``.

    Examples:
        >>> from trl.chat_template_utils import llama3_1_chat_template
        >>> tok = toy_template_tokenizer(llama3_1_chat_template, adds_bos=True)
        >>> tok.bos_token, tok.eos_token, tok.pad_token
        ('<|begin_of_text|>', '<|eot_id|>', '<|endoftext|>')
        >>> len(tok("<|eot_id|>", add_special_tokens=False)["input_ids"])  # one id
        1
        >>> chat = [{"role": "user", "content": "Hi"}]
        >>> ids = tok.apply_chat_template(chat, tokenize=True, return_dict=False)
        >>> ids.count(tok.bos_token_id)  # written by the template, not added twice
        1
    """
    require("transformers", "toy_template_tokenizer")
    from tokenizers import processors

    markers = template_markers(chat_template)
    tokenizer = _fast_tokenizer(_toy_tokenizer_json(384), padding_side, PAD_TOKEN)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [m for m in markers if _SPECIAL_MARKER.search(m)]},
        replace_extra_special_tokens=False,
    )
    tokenizer.add_tokens([m for m in markers if not _SPECIAL_MARKER.search(m)])
    if bos_token is None and "bos_token" in chat_template:
        bos_token = "<|begin_of_text|>" if "<|start_header_id|>" in markers else "<bos>"
    if eos_token is None:
        tokenizer.chat_template = chat_template
        eos_token = _closing_marker(tokenizer, markers) or PAD_TOKEN
        if eos_token == pad_token:
            pad_token = "<|pad|>"
    special = {"eos_token": eos_token, "pad_token": pad_token}
    if bos_token is not None:
        special["bos_token"] = bos_token
    tokenizer.add_special_tokens(special, replace_extra_special_tokens=False)
    tokenizer.chat_template = chat_template
    if adds_bos:
        if bos_token is None:
            raise ValueError("toy_template_tokenizer: adds_bos=True needs a bos token.")
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A",
            pair=f"{bos_token} $A {bos_token} $B",
            special_tokens=[(bos_token, tokenizer.convert_tokens_to_ids(bos_token))],
        )
    return tokenizer


def _closing_marker(tokenizer: Any, markers: list[str]) -> str | None:
    """The first markup token of the template's closing of an assistant turn, if any."""
    probe = "\x00probe\x00"
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": probe}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that needs more: no closing marker
        return None
    closing = text.split(probe, 1)[1] if probe in text else ""
    return next((m for m in sorted(markers, key=len, reverse=True) if closing.startswith(m)), None)
