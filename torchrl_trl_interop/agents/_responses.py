"""What the endpoint answers: OpenAI's chat completion and completion objects, streamed or not,
with the token fields of vLLM's convention.

With ``return_token_ids`` a response also carries ``prompt_token_ids`` (the ids the policy was
prompted with: the chat template's rendering, or the session's trajectory when the call
continues it), each choice's ``token_ids`` (the ids sampled, the stop token included) with one
log-prob per id in OpenAI's ``logprobs.content``, and the ``policy_version`` that sampled them.
A stream (``stream=true``) sends each finished choice as server-sent events: a chunk with its
content and tool calls, a chunk with its finish reason (and its token ids), the usage when
asked (``stream_options.include_usage``), then ``[DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ._answers import Answer, openai_tool_calls
from ._requests import Sampling

__all__ = [
    "chat_chunks",
    "chat_response",
    "completion_chunks",
    "completion_response",
    "returned_message",
]


def _token_logprobs(tokenizer: Any, answer: Answer) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content``: one entry per sampled id (no alternatives)."""
    out = []
    for token_id, logprob in zip(answer.ids, answer.logprobs):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        out.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return out


def returned_message(answer: Answer) -> dict[str, Any]:
    """The assistant message a chat choice returns (content ``None`` beside tool calls, as
    OpenAI returns it).

    Examples:
        >>> returned_message(Answer([5], [-0.1], "stop", "Hi"))
        {'role': 'assistant', 'content': 'Hi'}
    """
    calls = openai_tool_calls(answer.tool_calls)
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if calls:
        message["content"] = answer.content or None
        message["tool_calls"] = calls
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    return message


def _usage(prompts: Sequence[Sequence[int]], answers: Sequence[Answer]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(a.ids) for a in answers)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_response(
    tokenizer: Any,
    model: str,
    prompt_ids: Sequence[int],
    answers: Sequence[Answer],
    sampling: Sampling,
    version: int | None,
) -> dict[str, Any]:
    """A ``chat.completion`` object (see the module's docstring for the token fields)."""
    choices = []
    for index, answer in enumerate(answers):
        choice: dict[str, Any] = {
            "index": index,
            "message": returned_message(answer),
            "finish_reason": answer.finish_reason,
            "logprobs": None,
        }
        if sampling.logprobs or sampling.return_token_ids:
            choice["logprobs"] = {"content": _token_logprobs(tokenizer, answer), "refusal": None}
        if sampling.return_token_ids:
            choice["token_ids"] = list(answer.ids)
        choices.append(choice)
    out: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage([prompt_ids], answers),
        "system_fingerprint": None,
    }
    if sampling.return_token_ids:
        out["prompt_token_ids"] = list(prompt_ids)
        out["policy_version"] = version
    return out


def completion_response(
    tokenizer: Any,
    model: str,
    prompt_ids: Sequence[Sequence[int]],
    answers: Sequence[Answer],
    sampling: Sampling,
    version: int | None,
) -> dict[str, Any]:
    """A ``text_completion`` object: ``n`` choices per prompt, in order; with
    ``return_token_ids`` each choice has its prompt's ``prompt_token_ids`` too."""
    choices = []
    for index, answer in enumerate(answers):
        choice: dict[str, Any] = {
            "index": index,
            "text": answer.content,
            "finish_reason": answer.finish_reason,
            "logprobs": None,
        }
        if sampling.logprobs or sampling.return_token_ids:
            entries = _token_logprobs(tokenizer, answer)
            offsets, at = [], 0
            for entry in entries:
                offsets.append(at)
                at += len(entry["token"])
            choice["logprobs"] = {
                "tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": None,
                "text_offset": offsets,
            }
        if sampling.return_token_ids:
            choice["prompt_token_ids"] = list(prompt_ids[index // sampling.n])
            choice["token_ids"] = list(answer.ids)
        choices.append(choice)
    out: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage([prompt_ids[i // sampling.n] for i in range(len(answers))], answers),
        "system_fingerprint": None,
    }
    if sampling.return_token_ids:
        out["policy_version"] = version
    return out


def _event(data: Any) -> str:
    return f"data: {json.dumps(data)}\n\n"


def chat_chunks(response: dict[str, Any], sampling: Sampling) -> Iterator[str]:
    """A finished ``chat.completion`` as ``chat.completion.chunk`` server-sent events."""
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"
    first = True
    for choice in response["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        chunk: dict[str, Any] = {
            **head,
            "choices": [
                {"index": choice["index"], "delta": delta, "finish_reason": None, "logprobs": None}
            ],
        }
        if first and "prompt_token_ids" in response:
            chunk["prompt_token_ids"] = response["prompt_token_ids"]
            chunk["policy_version"] = response["policy_version"]
        first = False
        yield _event(chunk)
        end = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        end["logprobs"] = choice["logprobs"]
        if "token_ids" in choice:
            end["token_ids"] = choice["token_ids"]
        yield _event({**head, "choices": [end]})
    if sampling.include_usage:
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"


def completion_chunks(response: dict[str, Any], sampling: Sampling) -> Iterator[str]:
    """A finished ``text_completion`` as server-sent events (the text, then the finish)."""
    head = {k: response[k] for k in ("id", "created", "model", "object", "system_fingerprint")}
    for choice in response["choices"]:
        yield _event(
            {
                **head,
                "choices": [
                    {
                        "index": choice["index"],
                        "text": choice["text"],
                        "finish_reason": None,
                        "logprobs": None,
                    }
                ],
            }
        )
        end = {key: value for key, value in choice.items() if key != "text"}
        yield _event({**head, "choices": [{**end, "text": ""}]})
    if sampling.include_usage:
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"
