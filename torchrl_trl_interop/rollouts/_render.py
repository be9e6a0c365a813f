"""Conversations rendered with a torchrl LLM policy's chat template: the text torchrl renders, faster.

torchrl 0.14.1's ``History.apply_chat_template`` renders a ``[B, T]`` History row by row, each row
indexed, viewed and turned into message dicts on its own (``tolist``): ~0.6 ms a row on CPU,
3-4x the template render itself. :func:`render` turns the whole batch into message dicts in one
``tolist`` and calls the tokenizer's ``apply_chat_template`` on every row with the very arguments
torchrl passes (the template torchrl picks for the policy and tokenizer, recorded once), so its
text is torchrl's, character for character.

:func:`generation_prompt` and :func:`turn_closing` are the template's text around an assistant
turn, found by rendering a probe conversation.

The fast render reads no private attribute, but it relies on what torchrl's
``History.apply_chat_template`` passes to the tokenizer, recorded once: it runs on the torchrl
versions it was measured on (:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`); on any
other, :func:`render` is ``history.apply_chat_template(...)``. The upstream fix that would retire
it: ``History.apply_chat_template`` turning the batch into message dicts in one ``tolist``.
"""

from __future__ import annotations

import weakref
from typing import Any

from .._keys import without_placeholders
from .._upstream import TORCHRL_MEASURED, use_fast
from .._upstream._history_fields import history_messages

__all__ = ["generation_prompt", "render", "turn_closing"]

_PROBE = "\x00torchrl_trl_interop\x00"
#: per tokenizer: {(what, chat_template_name, chat_template, tokenizer template): value}, the
#: keyword arguments torchrl gives the tokenizer's apply_chat_template and the probe renders
_RECORDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Recorder:
    """Stands for a tokenizer in ``History.apply_chat_template``: keeps the arguments it gets."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.kwargs: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, conversation: Any = None, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return ""


def _chosen_template(policy: Any) -> dict[str, Any]:
    """The policy's ``chat_template_name`` / ``chat_template``, those that are set."""
    names = ("chat_template_name", "chat_template")
    return {n: getattr(policy, n) for n in names if getattr(policy, n, None) is not None}


def _cached(policy: Any, tokenizer: Any, what: Any, compute: Any) -> Any:
    """``compute()``, once per tokenizer, policy template and tokenizer template (``what`` names
    the value: a probe render's text or the arguments torchrl passes)."""
    kwargs = _chosen_template(policy)
    key = (
        what,
        kwargs.get("chat_template_name"),
        kwargs.get("chat_template"),
        getattr(tokenizer, "chat_template", None),
    )
    try:
        cache = _RECORDED.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: compute every time
        return compute()
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def _template_kwargs(policy: Any, tokenizer: Any, add_generation_prompt: bool) -> dict | None:
    """What torchrl passes to ``tokenizer.apply_chat_template`` for ``policy``, or ``None``."""
    from torchrl.data.llm import History

    def record() -> dict | None:
        recorder = _Recorder(tokenizer)
        probe = History.from_chats([[{"role": "user", "content": _PROBE}]])[0]
        probe.apply_chat_template(
            tokenizer=recorder,
            add_generation_prompt=add_generation_prompt,
            **_chosen_template(policy),
        )
        return recorder.kwargs

    return _cached(policy, tokenizer, ("arguments", add_generation_prompt), record)


def render(history: Any, policy: Any, tokenizer: Any, *, add_generation_prompt: bool) -> list:
    """``history`` (``[B, T]``) rendered with the policy's chat template, as the policy does.

    The policy's own ``tokenizer`` wins over ``tokenizer``; its ``chat_template_name`` or
    ``chat_template`` are used when set. The text equals ``history.apply_chat_template(...)``'s.

    Examples:
        >>> from torchrl.data.llm import History
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> chats = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Ho"}]]
        >>> render(History.from_chats(chats), None, toy_tokenizer(), add_generation_prompt=True)[1]
        '<|im_start|>user\\nHo<|im_end|>\\n<|im_start|>assistant\\n'
    """
    tokenizer = getattr(policy, "tokenizer", None) or tokenizer
    fast = use_fast(TORCHRL_MEASURED)
    kwargs = _template_kwargs(policy, tokenizer, add_generation_prompt) if fast else None
    if kwargs is None or kwargs.get("tokenize"):  # not a text render: torchrl's own path
        return history.apply_chat_template(
            tokenizer=tokenizer,
            add_generation_prompt=add_generation_prompt,
            **_chosen_template(policy),
        )
    rows = history_messages(history)  # tolist's dicts, read from the payloads
    return [
        tokenizer.apply_chat_template(conversation=without_placeholders(row), **kwargs)
        for row in rows
    ]


def _probe_render(policy: Any, tokenizer: Any, chat: list, add_generation_prompt: bool) -> str:
    from torchrl.data.llm import History

    return render(
        History.from_chats([chat]), policy, tokenizer, add_generation_prompt=add_generation_prompt
    )[0]


def turn_closing(policy: Any, tokenizer: Any) -> str:
    """The text the template writes after an assistant turn's content (ChatML ``<|im_end|>\\n``).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> turn_closing(None, toy_tokenizer())
        '<|im_end|>\\n'
    """

    def closing() -> str:
        chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}]
        text = _probe_render(policy, tokenizer, chat, False)
        return text.split(_PROBE, 1)[1] if _PROBE in text else ""

    tokenizer = getattr(policy, "tokenizer", None) or tokenizer
    return _cached(policy, tokenizer, "turn closing", closing)


def generation_prompt(policy: Any, tokenizer: Any) -> str | None:
    """The text the template adds for ``add_generation_prompt=True`` (ChatML: the assistant header).

    ``None`` when the render with it does not extend the render without it.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> generation_prompt(None, toy_tokenizer())
        '<|im_start|>assistant\\n'
    """
    chat = [{"role": "user", "content": _PROBE}]
    bare = _probe_render(policy, tokenizer, chat, False)
    text = _probe_render(policy, tokenizer, chat, True)
    return text[len(bare) :] if text.startswith(bare) and len(text) > len(bare) else None
