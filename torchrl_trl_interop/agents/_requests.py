"""What an OpenAI client sends: chat and completion requests read, checked, or refused clearly.

:func:`read_chat` and :func:`read_completion` turn a request's JSON body into what the server
samples with, or raise a :class:`ClientError` (answered with OpenAI's error shape and a 4xx)
naming the field, what was sent, what the endpoint can do and what to send instead. Every field
is either honoured or refused: none is dropped without a word.

* **Honoured**: ``messages`` (``system``, ``developer`` as ``system``, ``user``, ``assistant``
  with ``tool_calls``, ``tool``; text content, a list of text parts joined by newlines),
  ``tools`` and ``tool_choice="auto"`` (``"none"``: rendered, not parsed), ``max_tokens`` /
  ``max_completion_tokens`` (up to the policy's own limit), ``n``, ``stop``, ``seed`` (a policy
  sampling in this process), ``logprobs``, ``stream`` (the finished answer as server-sent
  events), ``return_token_ids`` (vLLM's field); ``temperature`` and ``top_p`` when they are the
  policy's own; ``user``, ``metadata`` and ``store`` (bookkeeping only).
* **Refused**: another ``temperature`` or ``top_p`` than the policy samples with (the log-probs
  are the policy's own sampling), ``top_logprobs > 0`` (the policy scores the sampled token
  only), penalties, ``logit_bias``, ``response_format`` other than text, ``tool_choice``
  ``"required"`` or a named function unless the server samples them freely
  (``required_tool_choice="sample"``), ``parallel_tool_calls=False``, non-text content, and any
  field not listed here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChatRequest",
    "ClientError",
    "CompletionRequest",
    "PolicyLimits",
    "Sampling",
    "message_key",
    "read_chat",
    "read_completion",
    "template_message",
]

#: the most choices one request may ask for
MAX_N = 128

_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "logprobs",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "user",
        "return_token_ids",
    }
)
#: the fields of a chat request this endpoint reads (any other is refused)
CHAT_FIELDS = _COMMON | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "metadata",
    "store",
}
#: the fields of a completion request this endpoint reads
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}


class ClientError(Exception):
    """A request the endpoint refuses, answered as OpenAI answers one: ``{"error": {"message",
    "type", "param", "code"}}`` with a 4xx (a 5xx for the server's own failures).

    Examples:
        >>> ClientError("n must be >= 1, got 0.", param="n").body()["error"]["type"]
        'invalid_request_error'
    """

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    @property
    def kind(self) -> str:
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param}
        return {"error": {**error, "code": self.code}}


@dataclass(frozen=True)
class PolicyLimits:
    """What the served policy samples with, which requests are checked against.

    ``temperature`` / ``top_p`` / ``max_tokens``: the policy's own (``None``: not known, so a
    request naming one is refused); ``seeds``: a seed can be honoured (the policy samples with
    this process's random generator); ``required_tool_choice``: ``"refuse"`` or ``"sample"``.
    """

    model: str
    vocab_size: int
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seeds: bool = False
    required_tool_choice: str = "refuse"


@dataclass(frozen=True)
class Sampling:
    """How one request samples: ``n`` choices of at most ``max_tokens`` tokens each (``None``:
    the policy's own limit), cut at ``stop`` strings, seeded or not, and what it gets back."""

    n: int = 1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    return_token_ids: bool = False
    stream: bool = False
    include_usage: bool = False


@dataclass
class ChatRequest:
    """A chat request: the messages as the chat template renders them, one comparison key per
    message (:func:`message_key`), the tools and whether the answer's tool calls are parsed."""

    messages: list[dict[str, Any]]
    keys: list[str]
    sampling: Sampling
    tools: list[dict[str, Any]] | None = None
    tools_key: str = "null"
    parse_tools: bool = False


@dataclass
class CompletionRequest:
    """A completion request: each prompt as text or token ids."""

    prompts: list[str | list[int]]
    sampling: Sampling = field(default_factory=Sampling)


# -- field checks ---------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping, name: str, minimum: int, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or value < minimum:
        raise ClientError(f"{name} must be an integer >= {minimum}, got {value!r}.", param=name)
    return value


def _number(body: Mapping, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ClientError(f"{name} must be a number, got {value!r}.", param=name)
    return float(value)


def _bool(body: Mapping, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ClientError(f"{name} must be true or false, got {value!r}.", param=name)
    return value


def _check_fields(body: Any, accepted: frozenset, what: str) -> None:
    if not isinstance(body, dict):
        raise ClientError(f"the request body must be a JSON object, got {type(body).__name__}.")
    unknown = sorted(set(body) - accepted)
    if unknown:
        raise ClientError(
            f"unrecognized request argument(s) {unknown} for {what}: this endpoint honours "
            f"{sorted(accepted)} and refuses anything else rather than ignore it.",
            param=unknown[0],
        )


def _check_model(body: Mapping, limits: PolicyLimits) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ClientError("model is required: the name of the served model.", param="model")
    if model != limits.model:
        raise ClientError(
            f"The model {model!r} does not exist: this endpoint serves {limits.model!r} "
            "(GET /v1/models lists it).",
            status=404,
            param="model",
            code="model_not_found",
        )


def _check_policy_value(body: Mapping, name: str, served: float | None, neutral: float) -> None:
    """``temperature`` / ``top_p``: absent, or the policy's own value."""
    value = _number(body, name)
    if value is None:
        return
    own = neutral if served is None and name == "top_p" else served
    if own is None:
        raise ClientError(
            f"{name}={value} cannot be honoured: the server does not know the {name} the served "
            f"policy samples with. Leave {name} out, or start the server with "
            f"OpenAIServer(..., {name}=<the policy's {name}>).",
            param=name,
        )
    if abs(value - own) > 1e-6:
        raise ClientError(
            f"{name}={value}: this endpoint samples with the policy's own {name}={own}, so that "
            "the log-probs it returns (and trains on) are those of the tokens' sampling. Send "
            f"{name}={own} or leave it out.",
            param=name,
        )


def _check_zero(body: Mapping, name: str) -> None:
    value = _number(body, name)
    if value:
        raise ClientError(
            f"{name}={value} is not supported: the policy samples from its own distribution "
            f"(a penalty would change the tokens' log-probs). Leave {name} out or send 0.",
            param=name,
        )


def _stop(body: Mapping) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ClientError(
            f"stop must be a non-empty string or a list of them, got {stop!r}.", param="stop"
        )
    return tuple(stops)


def _sampling(body: Mapping, limits: PolicyLimits, logprobs: bool, default_max: int | None):
    _check_policy_value(body, "temperature", limits.temperature, 1.0)
    _check_policy_value(body, "top_p", limits.top_p, 1.0)
    for name in ("presence_penalty", "frequency_penalty"):
        _check_zero(body, name)
    bias = body.get("logit_bias")
    if bias:
        raise ClientError(
            "logit_bias is not supported: it would change the tokens' log-probs. Leave it out.",
            param="logit_bias",
        )
    n = _int(body, "n", 1, 1)
    if n > MAX_N:
        raise ClientError(f"n={n} is above this endpoint's limit of {MAX_N}.", param="n")
    seed = _int(body, "seed", -(2**63))
    if seed is not None and not limits.seeds:
        raise ClientError(
            f"seed={seed} cannot be honoured: the served policy samples in another process "
            "(or engine), whose random generator this server does not drive. Leave seed out.",
            param="seed",
        )
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ClientError(
                "stream_options is only allowed with stream=true.", param="stream_options"
            )
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise ClientError(
                f"stream_options must be {{'include_usage': bool}}, got {options!r}.",
                param="stream_options",
            )
        include_usage = _bool(options, "include_usage")
    max_tokens = _int(body, "max_tokens", 1, default_max)
    if max_tokens is not None and limits.max_tokens is not None:
        max_tokens = min(max_tokens, limits.max_tokens)
    return Sampling(
        n=n,
        max_tokens=max_tokens,
        stop=_stop(body),
        seed=seed,
        logprobs=logprobs,
        return_token_ids=_bool(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage,
    )


# -- messages -------------------------------------------------------------------------------------

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_ROLES["tool"] = "tool"


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, ``None`` (``""``), or a list of text parts joined
    by newlines (as vLLM joins them)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ClientError(
                    f"{where}.content[{j}] is a {kind or type(part).__name__!r} part: this "
                    "endpoint serves a text policy and reads text parts only "
                    "({'type': 'text', 'text': ...}).",
                    param=f"{where}.content",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ClientError(
        f"{where}.content must be a string or a list of text parts, got {type(content).__name__}.",
        param=f"{where}.content",
    )


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates read them: arguments as a dict
    where they are a JSON object (OpenAI sends a JSON string), else as sent."""
    if not isinstance(calls, list):
        raise ClientError(f"{where}.tool_calls must be a list.", param=f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ClientError(
                f"{where}.tool_calls[{j}] must be {{'type': 'function', 'function': {{'name': "
                f"..., 'arguments': ...}}}}, got {call!r:.200}.",
                param=f"{where}.tool_calls",
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def template_message(message: Any, where: str = "messages[0]") -> dict[str, Any]:
    """One OpenAI message as the chat template renders it: role (``developer`` as ``system``),
    content as text, and ``tool_calls``, ``tool_call_id``, ``name`` where given.

    Raises:
        ClientError: naming the message, for an unknown role or non-text content.

    Examples:
        >>> template_message({"role": "user", "content": [{"type": "text", "text": "Hi"}]})
        {'role': 'user', 'content': 'Hi'}
        >>> call = {"id": "c1", "type": "function",
        ...         "function": {"name": "add", "arguments": '{"a": 1}'}}
        >>> template_message({"role": "assistant", "content": None, "tool_calls": [call]})
        {'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'add', 'arguments': {'a': 1}}, 'id': 'c1'}]}
    """
    if not isinstance(message, dict):
        raise ClientError(f"{where} must be an object, got {type(message).__name__}.", param=where)
    role = _ROLES.get(message.get("role"))
    if role is None:
        raise ClientError(
            f"{where}.role={message.get('role')!r} is not one of {sorted(_ROLES)}.",
            param=f"{where}.role",
        )
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = _tool_calls(message["tool_calls"], where)
    for name in ("tool_call_id", "name"):
        if isinstance(message.get(name), str):
            out[name] = message[name]
    return out


def message_key(message: Mapping[str, Any]) -> str:
    """What a message is, for the recording rule: its template form without tool-call ids (a
    harness may rename them), as canonical JSON.

    Examples:
        >>> message_key({"role": "assistant", "content": "4"}) == message_key(
        ...     {"content": "4", "role": "assistant"})
        True
    """
    entry = dict(message)
    if "tool_calls" in entry:
        entry["tool_calls"] = [{"function": c["function"]} for c in entry["tool_calls"]]
    return json.dumps(entry, sort_keys=True, default=str)


def _tools(body: Mapping, limits: PolicyLimits) -> tuple[list | None, bool]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ClientError(f"tool_choice={choice!r} needs tools.", param="tool_choice")
        return None, False
    if not isinstance(tools, list):
        raise ClientError("tools must be a list of function tools.", param="tools")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise ClientError(
                f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., "
                f"'parameters': ...}}}}, got {tool!r:.200}.",
                param="tools",
            )
    if body.get("parallel_tool_calls") is False:
        raise ClientError(
            "parallel_tool_calls=false cannot be honoured: the policy may write several calls in "
            "one answer and this endpoint samples freely. Leave it out.",
            param="parallel_tool_calls",
        )
    if choice in (None, "auto"):
        return tools, True
    if choice == "none":
        return tools, False
    if choice == "required" or isinstance(choice, dict):
        if limits.required_tool_choice == "sample":
            return tools, True
        raise ClientError(
            f"tool_choice={choice!r} cannot be enforced: the policy samples freely (no "
            "constrained decoding), so an answer may call no tool. Send tool_choice='auto', or "
            "start the server with OpenAIServer(..., required_tool_choice='sample') to sample "
            "such requests as 'auto' (the answer is the policy's own; smolagents sends "
            "'required').",
            param="tool_choice",
        )
    raise ClientError(
        f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}.",
        param="tool_choice",
    )


# -- the two requests -----------------------------------------------------------------------------


def read_chat(body: Any, limits: PolicyLimits) -> ChatRequest:
    """A ``/v1/chat/completions`` body, checked (see the module's docstring).

    Raises:
        ClientError: naming the field, for anything the endpoint cannot honour.

    Examples:
        >>> limits = PolicyLimits(model="toy", vocab_size=10, temperature=1.0)
        >>> request = read_chat({"model": "toy", "messages": [{"role": "user", "content": "Hi"}],
        ...                      "max_tokens": 4, "return_token_ids": True}, limits)
        >>> request.messages, request.sampling.max_tokens, request.sampling.return_token_ids
        ([{'role': 'user', 'content': 'Hi'}], 4, True)
        >>> read_chat({"model": "toy", "messages": [{"role": "user", "content": "Hi"}],
        ...            "temperature": 0.0}, limits)
        Traceback (most recent call last):
        ...
        torchrl_trl_interop.agents._requests.ClientError: temperature=0.0: this endpoint samples with the policy's own temperature=1.0, ...
    """
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    _check_model(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClientError("messages must be a non-empty list of messages.", param="messages")
    rendered = [template_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    top = _int(body, "top_logprobs", 0)
    logprobs = _bool(body, "logprobs")
    if top is not None and not logprobs:
        raise ClientError("top_logprobs needs logprobs=true.", param="top_logprobs")
    if top:
        raise ClientError(
            f"top_logprobs={top} is not supported: the policy scores the tokens it samples, "
            "not the alternatives. Send logprobs=true with top_logprobs=0 (or none).",
            param="top_logprobs",
        )
    form = body.get("response_format")
    if form is not None and form != {"type": "text"}:
        raise ClientError(
            f"response_format={form!r:.100} is not supported: the policy samples freely (no "
            "constrained decoding). Leave it out, or ask for JSON in the messages.",
            param="response_format",
        )
    if body.get("max_completion_tokens") is not None:
        given = _int(body, "max_completion_tokens", 1)
        if body.get("max_tokens") not in (None, given):
            raise ClientError(
                "max_tokens and max_completion_tokens differ; send one of them.",
                param="max_completion_tokens",
            )
        body = {**body, "max_tokens": given}
    tools, parse_tools = _tools(body, limits)
    return ChatRequest(
        messages=rendered,
        keys=[message_key(m) for m in rendered],
        sampling=_sampling(body, limits, logprobs, None),
        tools=tools,
        tools_key=json.dumps(tools, sort_keys=True),
        parse_tools=parse_tools,
    )


def _prompts(prompt: Any, vocab_size: int) -> list[str | list[int]]:
    """A completion's ``prompt``: a string, a list of strings, a list of token ids, or a list of
    lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        rows = [prompt] if all(_is_int(i) for i in prompt) else prompt
        if all(isinstance(r, list) and r and all(_is_int(i) for i in r) for r in rows):
            bad = [i for r in rows for i in r if not 0 <= i < vocab_size]
            if bad:
                raise ClientError(
                    f"prompt holds token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}.",
                    param="prompt",
                )
            return [list(r) for r in rows]
    raise ClientError(
        "prompt must be a string, a list of strings, a list of token ids or a list of lists of "
        f"token ids, got {prompt!r:.100}.",
        param="prompt",
    )


def read_completion(body: Any, limits: PolicyLimits) -> CompletionRequest:
    """A ``/v1/completions`` body, checked. ``max_tokens`` defaults to 16, as OpenAI's.

    Raises:
        ClientError: naming the field, for anything the endpoint cannot honour.

    Examples:
        >>> limits = PolicyLimits(model="toy", vocab_size=10)
        >>> read_completion({"model": "toy", "prompt": [1, 2, 3]}, limits).prompts
        [[1, 2, 3]]
    """
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    _check_model(body, limits)
    prompts = _prompts(body.get("prompt"), limits.vocab_size)
    if _bool(body, "echo"):
        raise ClientError(
            "echo=true is not supported: the prompt's log-probs are not computed. The prompt's "
            "token ids come back with return_token_ids=true.",
            param="echo",
        )
    if body.get("suffix"):
        raise ClientError("suffix is not supported (no insertion mode).", param="suffix")
    logprobs = _int(body, "logprobs", 0)
    if logprobs:
        raise ClientError(
            f"logprobs={logprobs} is not supported: the policy scores the tokens it samples, "
            "not the alternatives. Send logprobs=0 for the sampled tokens' log-probs.",
            param="logprobs",
        )
    sampling = _sampling(body, limits, logprobs is not None, 16)
    best_of = _int(body, "best_of", 1)
    if best_of is not None and best_of != sampling.n:
        raise ClientError(
            f"best_of={best_of} is not supported (n={sampling.n}): every sample is returned. "
            "Leave it out.",
            param="best_of",
        )
    return CompletionRequest(prompts=prompts, sampling=sampling)
