"""A TorchRL LLM policy served as an OpenAI-compatible endpoint: :class:`OpenAIServer`.

The HTTP side is Starlette's app run by uvicorn in a background thread (the ``agents`` extra); the sampling side is one worker thread
(:class:`~torchrl_trl_interop.agents._batching.Batcher`) that batches the waiting requests into
the policy's calls, renders prompts with the tokenizer's own chat template
(:class:`~torchrl_trl_interop._chat_format.ChatFormat`), reads the answers back
(``_answers``) and records every call under its session (``_sessions``). Weights pushed to the
server (:class:`~torchrl_trl_interop.WeightSyncCallback` ``(server)``) reach the policy between
two of its calls.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from .._chat_format import ChatFormat
from .._checks import (
    boundary,
    check_int,
    check_positive_int,
    check_real,
    check_tokenizer,
    require,
    type_error,
)
from .._sockets import bound_socket
from ..rollouts._policy_checks import check_pad_is_not_eos, is_torchrl_transformers_wrapper
from ..weights._adapters import TargetScheme
from ..weights._push import push
from ._answers import Answer, read_answer, tool_parser
from ._batching import Batcher, Job
from ._policy_calls import PolicyCaller, read_policy_sampling
from ._requests import (
    ChatRequest,
    ClientError,
    PolicyLimits,
    message_key,
    read_chat,
    read_completion,
    template_message,
)
from ._responses import (
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    returned_message,
)
from ._sessions import Plan, Sessions, Trajectory

__all__ = ["OpenAIServer"]

#: a session id as it appears in a session URL
_SESSION_ID = re.compile(r"^[A-Za-z0-9._~-]{1,128}$")
_STOP_TIMEOUT_S = 10.0


def _push_between_calls(
    server: OpenAIServer, weights: Any, version: int, *, partial: bool, timeout: Any = None
) -> Any:
    """The server's weight route: into its policy, between two of its calls; what it sent."""
    return server.update_policy_weights_(
        weights, policy_version=version, partial=partial, timeout=timeout
    )


def _check_policy(policy: Any) -> None:
    from tensordict.nn import TensorDictModuleBase

    if not isinstance(policy, TensorDictModuleBase):
        raise type_error(
            "policy",
            "a torchrl LLM policy (a TensorDictModuleBase: TrainerModelPolicy, RemotePolicy, "
            "RayRemotePolicy, TransformersWrapper, vLLMWrapper)",
            policy,
        )
    if getattr(policy, "return_log_probs", True) is False:
        raise ValueError(
            f"the policy {type(policy).__name__} returns no log-probs (return_log_probs="
            "False); the endpoint returns and records each sampled token's log-prob. Build "
            "it with return_log_probs=True."
        )
    if getattr(policy, "prefer_tokens", True) is False:
        raise ValueError(
            f"the policy {type(policy).__name__} has prefer_tokens=False: it would render "
            "the conversation itself instead of continuing from the tokens the endpoint "
            "gives it (a session's trajectory). Build it with prefer_tokens=True."
        )
    if getattr(policy, "num_samples", None) not in (None, 1):
        raise ValueError(
            f"the policy samples num_samples={policy.num_samples} answers per prompt; the "
            "endpoint asks for n choices itself. Build it with num_samples=None."
        )
    if is_torchrl_transformers_wrapper(policy):
        check_pad_is_not_eos(policy)


class OpenAIServer:
    """Serves a TorchRL LLM policy as an OpenAI-compatible endpoint, token for token.

    Any OpenAI client (the ``openai`` package, smolagents' ``OpenAIModel``, an agent harness)
    talks to it at :attr:`base_url` (``http://HOST:PORT/v1``): ``/v1/chat/completions``,
    ``/v1/completions`` and ``/v1/models``, streamed or not. Prompts are rendered with the
    tokenizer's own chat template (``tools=`` included; the template's tool calls are parsed back
    into ``tool_calls`` with TRL's parser for it), and every field of a request is honoured or
    refused with OpenAI's error shape and a 4xx (``docs/agents.rst`` lists them): ``max_tokens``
    (up to the policy's own limit), ``n``, ``stop``, ``seed`` (a policy sampling in this
    process), ``logprobs``; ``temperature`` and ``top_p`` only as the policy samples them, since
    the log-probs are those of the policy's own sampling.

    With ``extra_body={"return_token_ids": True}`` (vLLM's convention) a response carries the
    prompt's token ids (``prompt_token_ids``), each choice's sampled ids (``token_ids``, the stop
    token included), one log-prob per id (``logprobs.content``) and the ``policy_version`` that
    sampled them.

    Requests that arrive together are batched into one policy call (at most ``max_batch_size``
    rows; the others wait in order, none is dropped). One thread calls the policy, so a
    :class:`~torchrl_trl_interop.RemotePolicy` is never called twice at once, and weights pushed
    to the server (``WeightSyncCallback(server)``, or :meth:`update_policy_weights_`) reach the
    policy between two calls.

    **Sessions.** Each episode calls through its own URL, :meth:`session_url` (``.../sessions/
    <id>/v1``); every call is recorded in :attr:`buffer` (a torchrl ``ReplayBuffer``) under its
    session, and the calls of a session that continue one another become one token trajectory
    (:meth:`trajectory`; the rule is in ``docs/agents.rst``). Calls to :attr:`base_url` itself
    belong to the session ``""``.

    Start it with a ``with`` block (or :meth:`start` / :meth:`close`): the HTTP server and the
    worker stop when it ends, whatever happens in it.

    Args:
        policy (TensorDictModuleBase): a torchrl LLM policy that continues from the
            ``("tokens", "prompt")`` it is given and writes log-probs: a
            :class:`~torchrl_trl_interop.TrainerModelPolicy`, a
            :class:`~torchrl_trl_interop.RemotePolicy` or
            :class:`~torchrl_trl_interop.RayRemotePolicy` around one, a ``TransformersWrapper``
            with ``prefer_tokens=True``.

    Keyword Args:
        tokenizer (PreTrainedTokenizerBase): the policy's tokenizer (its chat template renders
            the prompts).
        host (str, optional): the address to listen on. Defaults to ``"127.0.0.1"``.
        port (int, optional): ``0`` takes a free port. Defaults to ``0``.
        model_name (str, optional): the model's name in requests and ``/v1/models``. Defaults
            to the tokenizer's ``name_or_path``, else ``"torchrl-policy"``.
        chat_template (str, optional): the template to render with. Defaults to the one the
            policy names (a ``TrainerModelPolicy``'s), else the tokenizer's own.
        chat_template_kwargs (dict, optional): more arguments for every render (e.g.
            ``{"enable_thinking": False}``).
        temperature, top_p (float, optional): what the policy samples with, when the server
            cannot read it from the policy (a ``RemotePolicy``); a request naming another value
            is refused. Defaults to the policy's own.
        max_tokens (int, optional): the most tokens an answer may have. Defaults to the
            policy's own limit.
        stop_token_ids (list of int, optional): more ids that end an answer (besides the
            tokenizer's eos, the template's end of turn and the policy's eos ids).
        required_tool_choice (str, optional): ``"refuse"`` (a 400 for ``tool_choice="required"``
            or a named function, which free sampling cannot enforce) or ``"sample"`` (served as
            ``"auto"``: the answer is the policy's own). Defaults to ``"refuse"``.
        buffer (ReplayBuffer, optional): where every call is recorded. Defaults to a
            ``ReplayBuffer(storage=LazyStackStorage(100_000))``.
        max_batch_size (int, optional): the most rows (choices) one policy call serves.
            Defaults to ``64``.
        batch_wait_s (float, optional): how long a batch waits for more requests once it has
            one. Defaults to ``0.002``.
        request_timeout_s (float, optional): the longest a request waits for its answer (then a
            504). Defaults to ``600``.
        startup_timeout_s (float, optional): the longest wait for the HTTP server to listen.
            Defaults to ``30``.
        log_level (str, optional): uvicorn's log level. Defaults to ``"warning"``.

    Attributes:
        buffer (ReplayBuffer): every call, recorded (see ``docs/agents.rst``).
        chat_format (ChatFormat): how prompts are rendered and answers read.
        policy_version (int or None): the version of the last weights pushed through the server.

    Raises:
        TypeError: if ``policy`` is not a TensorDict module or ``tokenizer`` not a tokenizer.
        ValueError: if the policy writes no log-probs, re-renders conversations
            (``prefer_tokens=False``), samples several answers per prompt, or an argument is out
            of range.
        ImportError: if ``uvicorn`` or ``starlette`` is missing (the ``agents`` extra).

    Examples:
        >>> import openai
        >>> from transformers import GenerationConfig
        >>> from torchrl_trl_interop import TrainerModelPolicy
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> tok = toy_tokenizer()
        >>> config = GenerationConfig(max_new_tokens=4, do_sample=True, eos_token_id=2)
        >>> policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config, 1.0)
        >>> with OpenAIServer(policy, tokenizer=tok, model_name="toy") as server:
        ...     client = openai.OpenAI(base_url=server.base_url, api_key="-")
        ...     reply = client.chat.completions.create(
        ...         model="toy", messages=[{"role": "user", "content": "Hi"}],
        ...         extra_body={"return_token_ids": True})
        >>> fields = reply.model_dump()
        >>> tok.decode(fields["prompt_token_ids"])
        '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
        >>> choice = fields["choices"][0]
        >>> len(choice["token_ids"]) == len(choice["logprobs"]["content"]) <= 4
        True
    """

    @boundary("OpenAIServer")
    def __init__(
        self,
        policy: Any,
        *,
        tokenizer: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        required_tool_choice: str = "refuse",
        buffer: Any = None,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.002,
        request_timeout_s: float = 600.0,
        startup_timeout_s: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        require("uvicorn", "OpenAIServer")
        require("starlette", "OpenAIServer")
        _check_policy(policy)
        check_tokenizer(tokenizer, "tokenizer")
        if tokenizer is None:
            raise type_error("tokenizer", "the policy's tokenizer", tokenizer)
        if not isinstance(host, str) or not host:
            raise type_error("host", "an address (str), e.g. '127.0.0.1'", host)
        check_int(port, "port")
        if not 0 <= port < 65536:
            raise ValueError(f"port must be in [0, 65535] (0: a free one), got {port}.")
        check_positive_int(max_batch_size, "max_batch_size")
        check_positive_int(max_tokens, "max_tokens", allow_none=True)
        for name, value in (
            ("batch_wait_s", batch_wait_s),
            ("request_timeout_s", request_timeout_s),
            ("startup_timeout_s", startup_timeout_s),
        ):
            if check_real(value, name) < 0 or (name != "batch_wait_s" and value == 0):
                raise ValueError(f"{name} must be > 0, got {value!r}.")
        if required_tool_choice not in ("refuse", "sample"):
            raise ValueError(
                f"required_tool_choice must be 'refuse' or 'sample', got {required_tool_choice!r}."
            )
        self.policy = policy
        self.tokenizer = tokenizer
        self.host = host
        self.port = port
        if chat_template is None and getattr(policy, "chat_format", None) is not None:
            chat_template = policy.chat_format.template  # a TrainerModelPolicy's own
        self.chat_format = ChatFormat.of(
            tokenizer, chat_template=chat_template, template_kwargs=chat_template_kwargs
        )
        sampling = read_policy_sampling(policy)
        own_max = sampling.max_tokens if max_tokens is None else max_tokens
        self.limits = PolicyLimits(
            model=model_name or getattr(tokenizer, "name_or_path", "") or "torchrl-policy",
            vocab_size=len(tokenizer),
            temperature=sampling.temperature if temperature is None else float(temperature),
            top_p=sampling.top_p if top_p is None else float(top_p),
            max_tokens=own_max,
            seeds=isinstance(getattr(policy, "model", None), torch.nn.Module),
            required_tool_choice=required_tool_choice,
        )
        self.stop_ids = self.chat_format.stop_ids([*sampling.eos_ids, *(stop_token_ids or [])])
        if buffer is None:
            from torchrl.data import LazyStackStorage, ReplayBuffer

            buffer = ReplayBuffer(storage=LazyStackStorage(max_size=100_000))
        self.buffer = buffer
        self.sessions = Sessions(buffer)
        self.request_timeout_s = float(request_timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.log_level = log_level
        self.policy_version: int | None = None
        self._caller = PolicyCaller(policy, tokenizer)
        self._parser: Any = None
        self._lock = threading.Lock()  # the policy's: calls and weight pushes, one at a time
        self._batcher = Batcher(self._serve_batch, max_rows=max_batch_size, wait_s=batch_wait_s)
        self._scheme: TargetScheme | None = None
        self._http: Any = None
        self._thread: threading.Thread | None = None
        self._sock: Any = None
        self._bound_port: int | None = None

    def __repr__(self) -> str:
        where = self.base_url if self.started else "not started"
        return (
            f"OpenAIServer(policy={type(self.policy).__name__}, model={self.limits.model!r}, "
            f"{where}, policy_version={self.policy_version})"
        )

    # -- addresses -------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def model_name(self) -> str:
        """The model's name, as requests give it."""
        return self.limits.model

    def _root(self) -> str:
        if not self.started:
            raise RuntimeError(
                "the server is not serving: use it in a with block (with OpenAIServer(...) "
                "as server: ...) or call server.start() first."
            )
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._bound_port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what OpenAI clients take as ``base_url``."""
        return f"{self._root()}/v1"

    @boundary("OpenAIServer")
    def session_url(self, session_id: str | None = None) -> str:
        """The base URL of one session (an episode): ``http://HOST:PORT/sessions/<id>/v1``.

        Args:
            session_id (str, optional): letters, digits and ``._~-`` (at most 128). Defaults to
                a new random id.

        Raises:
            ValueError: if ``session_id`` is not a valid id.
        """
        session_id = uuid.uuid4().hex if session_id is None else session_id
        if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
            raise ValueError(
                f"session_id must be 1 to 128 letters, digits or '._~-', got {session_id!r}."
            )
        return f"{self._root()}/sessions/{session_id}/v1"

    @staticmethod
    def session_of(url: str) -> str:
        """The session id of a URL :meth:`session_url` gave (``""`` for :attr:`base_url`).

        Examples:
            >>> OpenAIServer.session_of("http://127.0.0.1:8000/sessions/ep-1/v1")
            'ep-1'
        """
        found = re.search(r"/sessions/([^/]+)/v1/?$", url)
        return found.group(1) if found else ""

    # -- sessions --------------------------------------------------------------------------------

    def trajectory(self, session_id: str) -> Trajectory | None:
        """The session's last trajectory (``None`` before its first call): its prompt ids,
        completion ids, log-probs, ``env_mask``, messages and policy versions."""
        return self.sessions.last(session_id)[0]

    def end_session(self, session_id: str) -> tuple[Trajectory | None, int, int]:
        """Forgets a session (its calls stay in :attr:`buffer`): its last trajectory, and how
        many calls and segments it had."""
        return self.sessions.end(session_id)

    # -- weights ---------------------------------------------------------------------------------

    @property
    def weight_sync_scheme(self) -> TargetScheme:
        """The scheme a push into the server sends through
        (:class:`~torchrl_trl_interop.WeightSyncCallback` finds it): into the policy, between
        two of its calls."""
        if self._scheme is None:
            self._scheme = TargetScheme(self, _push_between_calls)
        return self._scheme

    @boundary("OpenAIServer")
    def update_policy_weights_(
        self,
        weights: torch.nn.Module | TensorDictBase,
        *,
        policy_version: int,
        partial: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Pushes ``weights`` into the policy as ``policy_version``, between two of its calls
        (the package's one weight push: a module copied in place, a
        :class:`~torchrl_trl_interop.RemotePolicy` through its scheme), waiting at most
        ``timeout`` seconds on another process (``None``: the push's default); returns the
        bytes sent when the push says.

        Raises:
            KeyError, ValueError: if the weights do not fit the policy's model.
        """
        bounded = {} if timeout is None else {"timeout": timeout}
        with self._lock:
            pushed = push(self.policy, weights, policy_version, partial=partial, **bounded)
            self.policy_version = int(policy_version)
        return getattr(pushed, "bytes", None)

    # -- serving ---------------------------------------------------------------------------------

    def _parser_for(self, request: ChatRequest) -> Any:
        if not request.parse_tools:
            return None
        if self._parser is None:
            self._parser = tool_parser(self.chat_format) or False
        if self._parser is False:
            raise ClientError(
                f"tools cannot be served with {self.chat_format.name}: TRL has no parser for "
                "its tool calls (trl.chat_template_utils.add_response_schema knows Qwen2.5/3, "
                "Llama 3.1/3.2, GLM-4 MoE, gpt-oss, ...). Serve a template TRL parses, or send "
                "tool_choice='none' to get the answer as text.",
                param="tools",
            )
        return self._parser

    def _plans(self, session: str, request: Any) -> list[Plan]:
        """Each prompt's plan (the recording rule decides the ids), in the worker thread."""
        try:
            if isinstance(request, ChatRequest):
                self._parser_for(request)
                plan = self.sessions.plan_chat(
                    session,
                    request.messages,
                    request.keys,
                    request.tools,
                    request.tools_key,
                    self.chat_format,
                    self.stop_ids,
                )
                return [plan]
            plans = []
            for prompt in request.prompts:
                ids = prompt if isinstance(prompt, list) else self.tokenizer(prompt)["input_ids"]
                plans.append(self.sessions.plan_tokens(session, list(ids)))
            return plans
        except ValueError as err:  # the chat template refuses the conversation
            raise ClientError(str(err)) from err

    def _serve_batch(self, jobs: list[Job]) -> None:
        """The worker's batch: plans, one policy call, answers, records, responses."""
        planned = []
        for job in jobs:
            try:
                planned.append((job, self._plans(*job.payload)))
            except ClientError as err:
                job.future.set_exception(err)
        if not planned:
            return
        prompts = [
            p.prompt_ids
            for job, plans in planned
            for p in plans
            for _ in range(job.payload[1].sampling.n)
        ]
        limits = [job.payload[1].sampling.max_tokens for job, _ in planned]
        max_new = None if None in limits else max(limits)
        with self._lock:
            out = self._caller(prompts, max_new_tokens=max_new, seed=planned[0][0].seed)
            pushed = self.policy_version
        row = 0
        for job, plans in planned:
            try:
                job.future.set_result(self._answer(job, plans, out, row, pushed))
            except ClientError as err:
                job.future.set_exception(err)
            row += len(plans) * job.payload[1].sampling.n

    def _answer(self, job: Job, plans: list[Plan], out: Any, row: int, pushed: Any) -> dict:
        """One request's response, its calls recorded."""
        session, request = job.payload
        sampling = request.sampling
        chat = isinstance(request, ChatRequest)
        parser = self._parser_for(request) if chat else None
        all_answers: list[Answer] = []
        version = None
        for plan in plans:
            answers, versions, keys = [], [], []
            for _ in range(sampling.n):
                version = out.versions[row] if out.versions[row] is not None else pushed
                answer = read_answer(
                    self.chat_format,
                    plan.prompt_ids,
                    out.responses[row],
                    out.log_probs[row],
                    stop_ids=self.stop_ids,
                    max_tokens=sampling.max_tokens,
                    stop=sampling.stop,
                    parser=parser,
                    tools=request.tools if chat else None,
                )
                answers.append(answer)
                versions.append(version)
                keys.append(message_key(template_message(returned_message(answer))))
                row += 1
            text = None if chat else self.tokenizer.decode(plan.prompt_ids)
            self.sessions.record(plan, answers, keys, versions, prompt_text=text)
            all_answers.extend(answers)
        if chat:
            return chat_response(
                self.tokenizer,
                self.model_name,
                plans[0].prompt_ids,
                all_answers,
                sampling,
                version,
            )
        return completion_response(
            self.tokenizer,
            self.model_name,
            [p.prompt_ids for p in plans],
            all_answers,
            sampling,
            version,
        )

    # -- the HTTP side ----------------------------------------------------------------------------

    async def _respond(self, http_request: Any, read: Any) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse

        session = http_request.path_params.get("session", "")
        try:
            if session and not _SESSION_ID.match(session):
                raise ClientError(f"no session {session!r}: not a valid session id.", status=404)
            try:
                body = await http_request.json()
            except ValueError as err:
                raise ClientError(f"the request body is not valid JSON ({err}).") from err
            request = read(body, self.limits)
            job = Job((session, request), rows=request.sampling.n, seed=request.sampling.seed)
            future = self._batcher.submit(job)
            try:
                response = await asyncio.wait_for(
                    asyncio.wrap_future(future), timeout=self.request_timeout_s
                )
            except asyncio.TimeoutError:
                future.cancel()
                raise ClientError(
                    f"no answer within request_timeout_s={self.request_timeout_s} (the policy "
                    "is busy or stuck); the request was not served.",
                    status=504,
                ) from None
        except ClientError as err:
            return JSONResponse(err.body(), status_code=err.status)
        except Exception as err:  # the policy or the server failed: a 500, said as OpenAI says
            failure = ClientError(
                f"the server failed to serve the request: {type(err).__name__}: {err}", status=500
            )
            return JSONResponse(failure.body(), status_code=500)
        if request.sampling.stream:
            chunks = chat_chunks if isinstance(request, ChatRequest) else completion_chunks
            return StreamingResponse(
                chunks(response, request.sampling), media_type="text/event-stream"
            )
        return JSONResponse(response)

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def chat(request):
            return await self._respond(request, read_chat)

        async def completions(request):
            return await self._respond(request, read_completion)

        async def models(request):
            entry = {"id": self.model_name, "object": "model", "owned_by": "torchrl"}
            entry["created"] = 0
            return JSONResponse({"object": "list", "data": [entry]})

        async def health(request):
            return JSONResponse({"status": "ok", "policy_version": self.policy_version})

        async def http_error(request, exc):
            error = ClientError(
                f"{request.method} {request.url.path}: {exc.detail}. This endpoint serves POST "
                "/v1/chat/completions, POST /v1/completions and GET /v1/models (also under "
                "/sessions/<id>/v1).",
                status=exc.status_code,
            )
            return JSONResponse(error.body(), status_code=exc.status_code)

        routes = []
        for root in ("/v1", "/sessions/{session}/v1"):
            routes += [
                Route(f"{root}/chat/completions", chat, methods=["POST"]),
                Route(f"{root}/completions", completions, methods=["POST"]),
                Route(f"{root}/models", models, methods=["GET"]),
            ]
        routes.append(Route("/health", health, methods=["GET"]))
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

    @boundary("OpenAIServer")
    def start(self) -> OpenAIServer:
        """Starts the worker and the HTTP server (returns once it listens).

        Raises:
            OSError: if the port cannot be bound.
            TimeoutError: if the server does not listen within ``startup_timeout_s``.
            RuntimeError: if it is already serving, or its thread died while starting.
        """
        if self.started:
            raise RuntimeError("the server is already serving.")
        import uvicorn

        self._sock = bound_socket(self.host, self.port)
        self._bound_port = self._sock.getsockname()[1]
        self._batcher.start()
        config = uvicorn.Config(
            self._app(), log_level=self.log_level, timeout_graceful_shutdown=_STOP_TIMEOUT_S
        )
        self._http = uvicorn.Server(config)  # in a thread: it leaves the signals to the main one
        self._thread = threading.Thread(
            target=self._http.run,
            kwargs={"sockets": [self._sock]},
            name="openai-server",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._http.started:
            if not self._thread.is_alive():
                self.close()
                raise RuntimeError(f"the server on {self.host}:{self.port} failed to start.")
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the server did not listen within {self.startup_timeout_s} s.")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stops the HTTP server and the worker (each wait bounded); requests still waiting
        get a 503. The sessions and the buffer stay readable."""
        if self._http is not None:
            self._http.should_exit = True
        if self._thread is not None:
            self._thread.join(_STOP_TIMEOUT_S)
            if self._thread.is_alive():  # connections that would not close
                self._http.force_exit = True
                self._thread.join(_STOP_TIMEOUT_S)
        self._batcher.stop(self.request_timeout_s)
        if self._sock is not None:
            self._sock.close()
        self._http = self._thread = self._sock = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
