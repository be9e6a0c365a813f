"""Any agent that talks to an OpenAI-compatible endpoint as GRPO's rollout engine:
:func:`as_trl_agent_rollout_func`.

Each prompt TRL hands over becomes one episode: a session of the
:class:`~torchrl_trl_interop.OpenAIServer` (its own ``base_url``), the agent run with it, and
the session's recorded tokens turned into TRL's rollout row (``prompt_ids``, ``completion_ids``,
``logprobs``, ``env_mask``), never re-tokenized text.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._checks import boundary, check_positive_int, check_real, type_error
from .._keys import POLICY_VERSION_KEY
from ..rollouts._final_answer import FINAL_ANSWER, FINAL_ANSWER_IDS, final_answer_ids
from ..rollouts._policy_checks import check_same_tokenizer
from ..rollouts._ranks import Ranks
from ..rollouts._trainer import global_step, log_metrics, trainer_tokenizer
from ..weights._staleness import check_max_staleness, check_staleness
from ._server import OpenAIServer

__all__ = ["as_trl_agent_rollout_func"]

#: the metrics each call logs (means over its rows)
CALLS_METRIC = "agents/calls"
SEGMENTS_METRIC = "agents/segments"


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, default=str)


def _columns_by_prompt(dataset: Any) -> dict[str, dict[str, Any]]:
    """Each dataset row's columns but ``prompt``, by its prompt.

    Raises:
        TypeError: if ``dataset`` holds no rows with a ``prompt``.
        ValueError: if two rows share a prompt but not their other columns.
    """
    index: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(dataset):
        if not isinstance(row, Mapping) or "prompt" not in row:
            raise type_error(
                f"dataset[{i}]", "a row (a dict) with a 'prompt' column, as TRL reads it", row
            )
        key = _prompt_key(row["prompt"])
        columns = {k: v for k, v in row.items() if k != "prompt"}
        if index.setdefault(key, columns) != columns:
            raise ValueError(
                f"dataset[{i}] has the prompt of an earlier row ({row['prompt']!r:.100}) but "
                "other columns: the rollout function, which TRL gives prompts only, could not "
                "tell their columns apart. Make the prompts unique (or drop dataset=)."
            )
    return index


def _is_async(agent: Any) -> bool:
    return inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(agent.__call__)


class _AgentRolloutFunc:
    """The callable :func:`as_trl_agent_rollout_func` returns (see there)."""

    def __init__(
        self,
        agent: Callable[..., Any],
        server: OpenAIServer,
        columns: dict[str, dict[str, Any]] | None,
        max_concurrency: int | None,
        timeout_s: float,
        max_staleness: int | None,
        reward_key: str,
    ) -> None:
        self.agent = agent
        self.server = server
        self.columns = columns
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_staleness = max_staleness
        self.reward_key = reward_key
        self.__name__ = "torchrl_agent_rollout"
        self._checked_tokenizer = False

        def agent_reward(completions: list, **kwargs: Any) -> list[float | None]:
            values = kwargs[reward_key]
            return [None if v is None else float(v) for v in values]

        agent_reward.__name__ = reward_key
        #: a TRL reward function returning each row's reward from the agent
        self.reward_func = agent_reward

    def __repr__(self) -> str:
        name = getattr(self.agent, "__name__", type(self.agent).__name__)
        return f"as_trl_agent_rollout_func(agent={name}, server={self.server!r})"

    # -- running the episodes --------------------------------------------------------------------

    def _columns_of(self, prompt: Any, i: int) -> dict[str, Any]:
        if self.columns is None:
            return {}
        found = self.columns.get(_prompt_key(prompt))
        if found is None:
            raise KeyError(
                f"prompts[{i}] ({prompt!r:.100}) is not a prompt of the dataset given as "
                "dataset=; pass the trainer's train_dataset (its rows' other columns reach "
                "the agent as keyword arguments)."
            )
        return found

    def _run_sync(self, calls: list[tuple]) -> list[tuple[Any, BaseException | None]]:
        """Each call in its own daemon thread, at most ``max_concurrency`` at once."""
        results: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)
        limit = threading.Semaphore(self.max_concurrency or len(calls))

        def work(i: int, args: tuple, kwargs: dict) -> None:
            with limit:
                try:
                    value = self.agent(*args, **kwargs)
                    if inspect.isawaitable(value):
                        value = asyncio.run(_awaited(value))
                    results[i] = (value, None)
                except BaseException as err:  # reported with its row
                    results[i] = (None, err)

        threads = [
            threading.Thread(target=work, args=(i, *call), name=f"agent-episode-{i}", daemon=True)
            for i, call in enumerate(calls)
        ]
        for thread in threads:
            thread.start()
        self._join(threads)
        return results

    def _run_async(self, calls: list[tuple]) -> list[tuple[Any, BaseException | None]]:
        """Every call as a task of one event loop (in its own daemon thread), at most
        ``max_concurrency`` at once."""
        results: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)

        async def main() -> None:
            limit = asyncio.Semaphore(self.max_concurrency or len(calls))

            async def one(i: int, args: tuple, kwargs: dict) -> None:
                async with limit:
                    try:
                        results[i] = (await self.agent(*args, **kwargs), None)
                    except BaseException as err:  # reported with its row
                        results[i] = (None, err)

            await asyncio.gather(*(one(i, *call) for i, call in enumerate(calls)))

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        self._join([thread])
        return results

    def _join(self, threads: list[threading.Thread]) -> None:
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        running = sum(t.is_alive() for t in threads)
        if running:
            raise TimeoutError(
                f"{running} of the call's agent episodes did not finish within timeout_s="
                f"{self.timeout_s}; raise timeout_s, or bound the agent's own calls (an "
                "OpenAI client's timeout=, a harness's max_steps)."
            )

    # -- the rollout -----------------------------------------------------------------------------

    @boundary("as_trl_agent_rollout_func")
    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        server = self.server
        if not self._checked_tokenizer:
            check_same_tokenizer(server.tokenizer, trainer_tokenizer(trainer))
            self._checked_tokenizer = True
        run = uuid.uuid4().hex[:12]
        sessions = [f"{run}-{i}" for i in range(len(prompts))]
        calls = [
            ((prompt, server.session_url(session)), self._columns_of(prompt, i))
            for i, (prompt, session) in enumerate(zip(prompts, sessions))
        ]
        try:
            results = (self._run_async if _is_async(self.agent) else self._run_sync)(calls)
        finally:
            ended = [server.end_session(s) for s in sessions]
        rows = []
        for i, ((reward, error), (trajectory, count, segments)) in enumerate(zip(results, ended)):
            if error is not None:
                raise RuntimeError(
                    f"the agent failed on prompts[{i}] ({prompts[i]!r:.100}): "
                    f"{type(error).__name__}: {error}"
                ) from error
            if reward is not None and not isinstance(reward, (int, float)):
                raise type_error(
                    f"the agent's return value for prompts[{i}]", "a number or None", reward
                )
            if trajectory is None:
                raise RuntimeError(
                    f"the agent made no call to its base_url on prompts[{i}] "
                    f"({prompts[i]!r:.100}): there is nothing to train on. Every episode "
                    "must call the model through the base_url it is given."
                )
            rows.append((trajectory, reward, count, segments))
        out = self._rollout_dict(rows, trainer)
        out["agent_session"] = sessions
        return out

    def _rollout_dict(self, rows: list[tuple], trainer: Any) -> dict[str, list]:
        tokenizer = self.server.tokenizer
        completions = [list(t.completion_ids) for t, *_ in rows]
        masks = [list(t.env_mask) for t, *_ in rows]
        answer_ids = [final_answer_ids(c, m) for c, m in zip(completions, masks)]
        out: dict[str, list] = {
            "prompt_ids": [list(t.prompt_ids) for t, *_ in rows],
            "completion_ids": completions,
            "logprobs": [list(t.logprobs) for t, *_ in rows],
            "env_mask": masks,
            self.reward_key: [None if r is None else float(r) for _, r, *_ in rows],
            "history": [list(t.messages) for t, *_ in rows],
            FINAL_ANSWER: tokenizer.batch_decode(answer_ids, skip_special_tokens=True),
            FINAL_ANSWER_IDS: answer_ids,
            "agent_calls": [c for _, _, c, _ in rows],
            "agent_segments": [s for *_, s in rows],
        }
        log_metrics(
            trainer,
            {
                CALLS_METRIC: [float(c) for c in out["agent_calls"]],
                SEGMENTS_METRIC: [float(s) for s in out["agent_segments"]],
            },
        )
        versions = [t.policy_version for t, *_ in rows]
        every = Ranks.of(trainer).gather_versions(versions)
        if any(v is not None for v in every):
            out[POLICY_VERSION_KEY] = versions
            check_staleness(
                every,
                global_step(trainer),
                self.max_staleness,
                log=lambda values: log_metrics(trainer, values),
            )
        return out


async def _awaited(value: Any) -> Any:
    return await value


@boundary("as_trl_agent_rollout_func")
def as_trl_agent_rollout_func(
    agent: Callable[..., Any],
    server: OpenAIServer,
    *,
    dataset: Iterable[Mapping[str, Any]] | None = None,
    max_concurrency: int | None = None,
    timeout_s: float = 3600.0,
    max_staleness: int | None = None,
    reward_key: str = "agent_reward",
):
    """Turns an agent that calls an OpenAI-compatible endpoint into ``GRPOTrainer``'s
    ``rollout_func``.

    The agent is any function (or coroutine function) ``agent(prompt, base_url, **columns) ->
    reward or None`` that talks to ``base_url`` with any OpenAI client: the ``openai`` package,
    smolagents' ``OpenAIModel``, a harness. For each prompt of a call (TRL repeats each one
    ``num_generations`` times), the rollout function opens a session of ``server``
    (:meth:`~torchrl_trl_interop.OpenAIServer.session_url`) and runs the agent with it; the call's
    episodes run concurrently (threads for a function, one event loop for a coroutine function),
    at most ``max_concurrency`` at once, so their requests are batched into the policy's calls.
    Each episode becomes one row, from the tokens the server recorded (its session's last
    trajectory, see ``docs/agents.rst``):

    ==================== ========================================================================
    key                  value per row
    ==================== ========================================================================
    ``prompt_ids``       the ids the episode's first call (of its last segment) was prompted with
    ``completion_ids``   every later token: the answers as sampled, and between two calls what
                         the chat template added (tool results, user turns, chat markup)
    ``logprobs``         per completion token, the policy's log-prob (0.0 on added tokens)
    ``env_mask``         1 on the policy's tokens, 0 on the added ones (kept out of the loss)
    ``agent_reward``     the agent's return value (``None``: no reward; ``reward_key``)
    ``history``          the last call's messages and its answer (TRL messages)
    ``final_answer``     the last answer's text (special tokens skipped), ``final_answer_ids``
                         its ids
    ``agent_calls``      how many calls the episode made; ``agent_segments`` in how many
                         trajectories (a harness that rewrites its history starts a new one;
                         the row trains on the last)
    ``agent_session``    the episode's session id (its calls' records in ``server.buffer``)
    ``policy_version``   the oldest policy version of the row's calls, when the policy has
                         versions (pushed with :class:`~torchrl_trl_interop.WeightSyncCallback`
                         ``(server)``, or stamped by a :class:`~torchrl_trl_interop.RemotePolicy`)
    ==================== ========================================================================

    Every column reaches the reward functions as a keyword argument; the returned function's
    ``reward_func`` attribute is a TRL reward function giving back ``agent_reward``
    (``GRPOTrainer(reward_funcs=rollout_func.reward_func, ...)``). Each call logs
    ``agents/calls`` and ``agents/segments`` (and, with versions, the staleness metrics).

    Args:
        agent (callable): ``agent(prompt, base_url, **columns)``, sync or async, returning the
            episode's reward (a number) or ``None``.
        server (OpenAIServer): the endpoint serving the policy; start it before training (``with
            OpenAIServer(...) as server:``) and keep it up while the trainer runs.

    Keyword Args:
        dataset (iterable of dict, optional): the trainer's ``train_dataset``: each row's other
            columns reach the agent as keyword arguments (TRL gives a rollout function the
            prompts only; rows are found by their prompt, which must then be unique). Defaults
            to ``None`` (no columns).
        max_concurrency (int, optional): the most episodes running at once. Defaults to all of
            the call's.
        timeout_s (float, optional): the longest one call's episodes may run together. Defaults
            to ``3600``.
        max_staleness (int, optional): the most optimizer steps a row's weights may lag behind
            the trainer (:class:`~torchrl_trl_interop.StaleRolloutError` beyond). Defaults to
            ``None`` (recorded, not bounded).
        reward_key (str, optional): the column holding the agent's return value. Defaults to
            ``"agent_reward"``.

    Returns:
        a callable ``rollout_func(prompts, trainer) -> dict`` for
        ``GRPOTrainer(rollout_func=...)``, with a ``reward_func`` attribute. Calling it raises
        ``RuntimeError`` naming the row if an agent raised or made no call through its
        ``base_url``, ``TypeError`` if it returned neither a number nor ``None``,
        ``TimeoutError`` past ``timeout_s``, ``ValueError`` if the server's tokenizer is not
        the trainer's.

    Raises:
        TypeError: if ``agent`` is not callable, ``server`` not an :class:`OpenAIServer`, or a
            dataset row has no ``prompt``.
        ValueError: if two dataset rows share a prompt but not their columns, or an argument is
            out of range.

    Examples:
        >>> import openai
        >>> def agent(prompt, base_url):
        ...     client = openai.OpenAI(base_url=base_url, api_key="-")
        ...     messages = [{"role": "user", "content": prompt}]
        ...     reply = client.chat.completions.create(model="toy", messages=messages)
        ...     return float(len(reply.choices[0].message.content))
        >>> from transformers import GenerationConfig
        >>> from torchrl_trl_interop import OpenAIServer, TrainerModelPolicy
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> tok = toy_tokenizer()
        >>> config = GenerationConfig(max_new_tokens=4, do_sample=True, eos_token_id=2)
        >>> server = OpenAIServer(TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok, config,
        ...                                          1.0), tokenizer=tok, model_name="toy")
        >>> rollout_func = as_trl_agent_rollout_func(agent, server)
        >>> rollout_func.reward_func.__name__
        'agent_reward'
        >>> with server:  # doctest: +SKIP
        ...     trainer = GRPOTrainer(model, reward_funcs=rollout_func.reward_func,
        ...                           rollout_func=rollout_func, train_dataset=prompts,
        ...                           callbacks=[WeightSyncCallback(server)], args=...)
        ...     trainer.train()
    """
    if not callable(agent):
        raise type_error("agent", "a function agent(prompt, base_url, **columns)", agent)
    if not isinstance(server, OpenAIServer):
        raise type_error("server", "an OpenAIServer", server)
    check_positive_int(max_concurrency, "max_concurrency", allow_none=True)
    if check_real(timeout_s, "timeout_s") <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}.")
    check_max_staleness(max_staleness)
    if not isinstance(reward_key, str) or not reward_key:
        raise type_error("reward_key", "a column name (str)", reward_key)
    columns = None if dataset is None else _columns_by_prompt(dataset)
    return _AgentRolloutFunc(
        agent, server, columns, max_concurrency, float(timeout_s), max_staleness, reward_key
    )
