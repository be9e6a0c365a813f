"""A sampled answer read back: the tokens kept, their text, and the tool calls in it.

The policy samples up to its own limit; :func:`read_answer` keeps what the request asked for,
token for token: up to the first stop token (the tokenizer's eos, the template's end of turn,
the policy's eos ids), at most ``max_tokens``, and up to the token that completes a ``stop``
string. The tokens kept, and their log-probs, are exactly what the policy sampled (an answer
cut short is still the policy's own sample, as one cut by the length limit is); the returned
text is the answer's content (:meth:`~torchrl_trl_interop._chat_format.ChatFormat.answer`),
without the stop string, and with ``tools`` its tool calls are parsed with TRL's own parser for
the template (``trl.chat_template_utils.add_response_schema`` + ``parse_response``).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._chat_format import ChatFormat

__all__ = ["Answer", "openai_tool_calls", "read_answer", "tool_parser"]


@dataclass
class Answer:
    """One choice: the kept ids and log-probs, why it ended, and the message it returns.

    ``finish_reason`` is OpenAI's: ``"stop"`` (a stop token or string), ``"length"`` (the
    token limit) or ``"tool_calls"``; ``tool_calls`` are in the template's form (arguments as
    parsed), ``None`` when none was parsed.
    """

    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None

    def message(self) -> dict[str, Any]:
        """The answer as the conversation's next turn (template form, for the recording)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def tool_parser(chat: ChatFormat) -> Any:
    """A view of the chat format's tokenizer that parses its template's tool calls with TRL's
    parser, or ``None`` if TRL has none for the template (``add_response_schema`` refuses it).
    The user's tokenizer is not changed (a shallow copy carries the parser)."""
    try:
        from trl.chat_template_utils import add_response_schema
    except ImportError:  # pragma: no cover - TRL is in the hf extra
        return None
    view = copy.copy(chat.tokenizer)
    view.chat_template = chat.template
    try:
        return add_response_schema(view)
    except ValueError:
        return None


def _first_stop(ids: Sequence[int], stop_ids: set[int]) -> int:
    """The length kept by the first stop token (included), or ``len(ids)``."""
    return next((k + 1 for k, i in enumerate(ids) if int(i) in stop_ids), len(ids))


def _cut_at_strings(
    chat: ChatFormat, ids: list[int], prompt: Sequence[int], stops: Sequence[str], stop_ids: list
) -> tuple[int, str] | None:
    """Where the first ``stop`` string appears in the answer's content: the ids kept (up to the
    token completing it) and the content before it; ``None`` if none appears."""
    content = chat.answer(ids, stop_ids, prompt_ids=prompt)[0]
    opening = len(chat.answer([], stop_ids, prompt_ids=prompt)[0])
    found = [(content.find(s, opening), s) for s in stops]
    found = [(at, s) for at, s in found if at >= 0]
    if not found:
        return None
    at, stop = min(found)
    low, high = 1, len(ids)  # the fewest ids whose content holds the stop string
    while low < high:
        mid = (low + high) // 2
        if chat.answer(ids[:mid], stop_ids, prompt_ids=prompt)[0].find(stop, opening) >= 0:
            high = mid
        else:
            low = mid + 1
    return low, content[:at]


def _parse_tools(parser: Any, ids: list[int], prompt: Sequence[int], tools: list) -> dict:
    from trl.chat_template_utils import parse_response

    parsed = parse_response(parser, list(ids), prefix=list(prompt), tools=tools)
    calls = []
    for call in parsed.get("tool_calls") or []:
        function = call.get("function", call)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": function["name"], "arguments": function.get("arguments")},
            }
        )
    return {
        "content": parsed.get("content") or "",
        "tool_calls": calls or None,
        "reasoning": parsed.get("reasoning_content"),
    }


def read_answer(
    chat: ChatFormat,
    prompt: Sequence[int],
    ids: Sequence[int],
    logprobs: Sequence[float],
    *,
    stop_ids: Sequence[int],
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    parser: Any = None,
    tools: list | None = None,
) -> Answer:
    """One sampled answer as the request asked for it (see the module's docstring).

    Args:
        chat (ChatFormat): the format the prompt was rendered with.
        prompt (list of int): the ids the policy continued.
        ids, logprobs: what it sampled.

    Keyword Args:
        stop_ids: ids that end an answer besides the tokenizer's eos and the template's end of
            turn (the policy's eos ids).
        max_tokens (int, optional): the most tokens kept.
        stop (list of str): stop strings: the answer ends at the first, which its text leaves out.
        parser: :func:`tool_parser`'s view, to parse tool calls (``None``: not parsed).
        tools (list, optional): the request's tools (typed arguments where TRL's parser can).

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> chat = ChatFormat.of(toy_tokenizer())
        >>> ids = chat.encode(["4 and 5<|im_end|>"])[0]
        >>> answer = read_answer(chat, [], ids, [0.0] * len(ids), stop_ids=[], stop=[" and"])
        >>> answer.content, answer.finish_reason, chat.tokenizer.decode(answer.ids)
        ('4', 'stop', '4 and')
    """
    ids, logprobs = [int(i) for i in ids], [float(v) for v in logprobs]
    stops = set(chat.stop_ids(stop_ids))
    keep = _first_stop(ids, stops)
    if max_tokens is not None:
        keep = min(keep, max_tokens)
    ids, logprobs = ids[:keep], logprobs[:keep]
    ended = bool(ids) and ids[-1] in stops
    cut = _cut_at_strings(chat, ids, prompt, stop, list(stops)) if stop else None
    if cut is not None:
        keep, content = cut
        ids, logprobs, ended = ids[:keep], logprobs[:keep], True
    else:
        content = chat.answer(ids, list(stops), prompt_ids=prompt)[0]
    answer = Answer(ids, logprobs, "stop" if ended else "length", content)
    if parser is not None:
        parsed = _parse_tools(parser, ids, prompt, tools or [])
        if cut is not None:  # the parser reads the kept ids, the stop string included
            text = parsed["content"]
            at = min((text.find(s) for s in stop if s in text), default=-1)
            parsed["content"] = text if at < 0 else text[:at]
        answer.content, answer.tool_calls = parsed["content"], parsed["tool_calls"]
        answer.reasoning = parsed["reasoning"]
        if answer.tool_calls:
            answer.finish_reason = "tool_calls"
    return answer


def openai_tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tool calls as OpenAI returns them: arguments as a JSON string.

    Examples:
        >>> openai_tool_calls([{"id": "c", "type": "function",
        ...                     "function": {"name": "add", "arguments": {"a": 1}}}])
        [{'id': 'c', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1}'}}]
    """
    if not calls:
        return None
    out = []
    for call in calls:
        arguments = call["function"]["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps({} if arguments is None else arguments)
        out.append({**call, "function": {"name": call["function"]["name"], "arguments": arguments}})
    return out
