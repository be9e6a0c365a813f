"""TorchRL collectors behind TRL's ``AsyncGRPOTrainer``: its rollout-worker seam.

TRL 1.16's ``trl.experimental.async_grpo.AsyncGRPOTrainer(rollout_worker=, weight_transfer=)``
trains from a queue of ``RolloutSample``\\ s that a worker fills. :class:`TorchRLRolloutWorker`
implements ``RolloutWorkerProtocol`` over a TorchRL ``LLMCollector`` (or a replay buffer that
collectors fill, e.g. a ``RayReplayBuffer``); its weight-transfer counterpart is
:class:`~torchrl_trl_interop.TorchRLWeightTransfer` (``_weight_transfer``).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any

import torch
from tensordict import TensorDictBase, set_list_to_stack
from tensordict.utils import NestedKey

from .._checks import boundary, check_bool, check_int, check_positive_int
from .._conversation import history_to_messages
from .._keys import NEXT_POLICY_VERSION_KEY, NEXT_REWARD_KEY, POLICY_VERSION_KEY, as_nested_key
from ..weights._staleness import check_max_staleness
from ._dynamic_sampling import check_candidate_group_size, select_group
from ._policy_checks import check_policy_format
from ._policy_output import PolicyKeys, read_policy_rows
from ._trainer_policy import TrainerModelPolicy, score_tokens

__all__ = ["TorchRLRolloutWorker", "group_advantages"]


def _rollout_sample_cls():
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample


def group_advantages(rewards: list[float]) -> list[float]:
    """TRL's ``AsyncRolloutWorker`` advantages: ``(r - mean) / (std + 1e-8)`` over the group.

    The std is the population std (``numpy.std``); rows whose reward is NaN get 0 and are left
    out of the mean and std.

    Examples:
        >>> [round(a, 4) for a in group_advantages([1.0, 3.0])]
        [-1.0, 1.0]
        >>> group_advantages([2.0, float("nan")])
        [0.0, 0.0]
    """
    scored = [r for r in rewards if not math.isnan(r)]
    if not scored:
        return [0.0] * len(rewards)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    return [0.0 if math.isnan(r) else (r - mean) / (std + 1e-8) for r in rewards]


class _BufferReader:
    """Reads each row a buffer receives exactly once, in write order (a cursor on its writes)."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.cursor = 0

    def next_rows(self) -> tuple[TensorDictBase | None, int]:
        """The rows written since the last call (``None`` if none), and the first one's rank."""
        written = getattr(self.buffer, "write_count", None)
        size = len(self.buffer)
        written = size if written is None else int(written)
        if written <= self.cursor:
            return None, self.cursor
        if written - self.cursor > size:
            raise RuntimeError(
                f"the buffer overwrote {written - self.cursor - size} rows before they were "
                f"read (capacity {size}); give it a larger storage."
            )
        start, self.cursor = self.cursor, written
        return self.buffer[torch.arange(start, written) % size], start


class TorchRLRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` over a TorchRL collector, or a buffer collectors fill.

    A thread drains ``source``: each collected row is one rollout (a single-turn step, or the
    last step of a trajectory): its ``("tokens", "prompt")`` and ``("tokens", "response")``,
    the response's ``("log_probs", "response")``, its reward at ``reward_key``, and the
    ``("next", "policy_version")`` the collector stamped (``track_policy_version=True``). Rows are grouped by
    prompt tokens; once a prompt has ``num_generations`` rows the group becomes
    ``RolloutSample``\\ s on :attr:`rollout_buffer`, with TRL's default worker's advantages
    (:func:`group_advantages`), ``model_version`` from the row's policy version (or the version
    live when it was collected) and ``old_log_probs`` (0.0 on prompt tokens).

    **Log-probs.** torchrl 0.14.1's ``TransformersWrapper`` writes 0.0 for the first response
    token. With a collector whose policy is such a wrapper (not a
    :class:`~torchrl_trl_interop.TrainerModelPolicy`), every batch is rescored by
    the policy's own model right after it is collected, under the lock weight transfers take,
    so with the very weights that sampled it. Pass ``score_model=`` to rescore with another
    model (e.g. for a buffer source), or ``score_model=False`` to keep the collector's values.

    **Dynamic sampling.** With ``candidate_group_size=K`` a group is complete at ``K`` rows (the
    collector's ``DataLoadingPrimer(repeats=K)``) and keeps ``num_generations`` of them, chosen
    for reward spread as :func:`~torchrl_trl_interop.as_trl_rollout_func` chooses them; with
    ``drop_zero_std=True`` a group left without spread is dropped, not queued (its advantages
    would all be 0). This changes the sampling distribution (as DAPO does). Metrics per group:
    ``rollout/candidates``, the rates ``rollout/zero_std_groups_before`` and ``_after``,
    ``rollout/candidate_reward_mean`` (every candidate's, kept or not) and
    ``rollout/dropped_zero_std_total`` (samples dropped).

    **The queue.** A group is queued whole or not at all (the worker, the queue's only producer,
    waits for room for all of it; at :meth:`stop` a waiting group is not queued). With
    ``queue_maxsize=N``, once a weight transfer resumes, at most ``N`` queued samples
    plus the rows the thread holds (the batch a weight transfer waited for, groups not yet
    complete) come from older weights; unbounded (``0``), every sample collected before.

    Args:
        source: a torchrl collector (``LLMCollector``: iterated) or a replay buffer written by
            collectors elsewhere (``ReplayBuffer``, ``RayReplayBuffer``: each row read once, by
            a cursor on its writes; the storage must not wrap before rows are read).

    Keyword Args:
        num_generations (int): rows per prompt (the collector's ``DataLoadingPrimer(repeats=)``).
        reward_key (NestedKey, optional): Defaults to ``("next", "reward")``.
        max_staleness (int, optional): groups older than this many versions behind the live one
            are dropped by the worker (TRL's trainer also drops them). Defaults to ``None``.
        score_model (nn.Module, False or None, optional): see above. Defaults to ``None``.
        temperature (float, optional): of the rescoring. Defaults to the policy's
            ``generate_kwargs["temperature"]`` or ``1.0``.
        queue_maxsize (int, optional): bound of :attr:`rollout_buffer` (0: unbounded; a full
            queue makes the worker wait), at least ``num_generations``. Defaults to ``0``.
        candidate_group_size (int, optional): rows collected per prompt, of which
            ``num_generations`` are queued (see above). Defaults to ``None``
            (``num_generations``).
        drop_zero_std (bool, optional): drop groups without reward spread. Defaults to ``False``.

    Attributes:
        rollout_buffer (queue.Queue): ``RolloutSample``\\ s for the trainer.
        metrics_queue (queue.Queue): ``{name: value}`` dicts (``rollout/groups_total``,
            ``rollout/dropped_stale_total`` and the dynamic-sampling metrics above), a value or
            a ``(numerator, denominator)`` rate, as ``AsyncGRPOTrainer`` reduces them.
        model_version (int): the version live in the policy (set by
            :meth:`update_model_version`).
        lock (threading.Lock): held while a batch is collected and scored;
            :class:`TorchRLWeightTransfer` holds it between ``pause`` and ``resume``.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_buffer
        >>> worker = TorchRLRolloutWorker(toy_buffer(0), num_generations=2)
        >>> worker.model_version, worker.rollout_buffer.qsize()
        (0, 0)
        >>> worker.update_model_version(3)
        >>> worker.model_version
        3
    """

    @boundary("TorchRLRolloutWorker")
    def __init__(
        self,
        source: Any,
        *,
        num_generations: int,
        reward_key: NestedKey = NEXT_REWARD_KEY,
        max_staleness: int | None = None,
        score_model: Any = None,
        temperature: float | None = None,
        queue_maxsize: int = 0,
        candidate_group_size: int | None = None,
        drop_zero_std: bool = False,
    ) -> None:
        check_positive_int(num_generations, "num_generations")
        check_max_staleness(max_staleness)
        check_candidate_group_size(candidate_group_size, group_size=num_generations)
        check_bool(drop_zero_std, "drop_zero_std")
        check_int(queue_maxsize, "queue_maxsize")
        if queue_maxsize < 0 or 0 < queue_maxsize < num_generations:
            raise ValueError(
                f"queue_maxsize={queue_maxsize} cannot hold a whole group of "
                f"num_generations={num_generations} samples, and groups are queued whole: pass "
                f"0 (unbounded) or at least {num_generations}."
            )
        self.source = source
        self.num_generations = num_generations
        self.candidate_group_size = candidate_group_size or num_generations
        self.drop_zero_std = drop_zero_std
        self.reward_key = as_nested_key(reward_key, "reward_key")
        self.max_staleness = max_staleness
        self.is_collector = hasattr(source, "update_policy_weights_") and hasattr(
            source, "__iter__"
        )
        if not self.is_collector and not all(
            hasattr(source, name) for name in ("sample", "extend", "__getitem__", "__len__")
        ):
            raise TypeError(
                f"source is {source!r:.100} of type {type(source).__name__}; expected a torchrl "
                "LLM collector (LLMCollector, RayLLMCollector: it has update_policy_weights_ "
                "and yields batches) or the replay buffer a collector writes into."
            )
        policy = getattr(source, "policy", None) if self.is_collector else None
        if policy is not None:
            check_policy_format(policy)
        self.keys = PolicyKeys.of(policy)
        if (
            score_model is None
            and policy is not None
            and not isinstance(policy, TrainerModelPolicy)
        ):
            from ..weights._tensors import policy_model

            model = policy_model(policy)
            score_model = model if model is not policy else None
        self.score_model = None if score_model is False else score_model  # False: keep theirs
        if temperature is None:
            kwargs = getattr(policy, "generate_kwargs", None) or {}
            temperature = kwargs.get("temperature", 1.0) if isinstance(kwargs, dict) else 1.0
        self.temperature = float(temperature or 1.0)
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._batches = 0  # batches drained
        self._ended: str | None = None  # why the thread ended without an error
        self._pending: dict[tuple, list[dict]] = {}
        self._group_id = 0

    def __repr__(self) -> str:
        return (
            f"TorchRLRolloutWorker(source={type(self.source).__name__}, num_generations="
            f"{self.num_generations}, model_version={self.model_version}, "
            f"queued={self.rollout_buffer.qsize()})"
        )

    # -- RolloutWorkerProtocol ------------------------------------------------------------------

    def start(self) -> None:
        """Starts the draining thread (once; later calls do nothing)."""
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._thread = threading.Thread(
            target=self._run, name="torchrl-rollout-worker", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread after its current batch (the source itself is left to its owner)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._ended = self._ended or "stop() was called; build a new worker to collect more."
        self._thread = None

    def _collector_finished(self) -> str:
        """Why a collector's iteration ended, and what to do."""
        total = getattr(self.source, "total_dialog_turns", None)
        reached = (
            f"its total_dialog_turns={total} was reached"
            if isinstance(total, int) and total > 0
            else "its iteration ended"
        )
        return (
            f"the collector finished after {self._batches} batches ({reached}); no more rollouts "
            "will come. Build it with a larger total_dialog_turns (-1: no end) for a longer run, "
            "or stop training at that many rollouts (max_steps)."
        )

    def update_model_version(self, model_version: int) -> None:
        """Records the live version and stamps it on the collector's ``PolicyVersion``."""
        self.model_version = int(model_version)
        tracker = getattr(self.source, "policy_version_tracker", None)
        if tracker is not None and getattr(tracker, "version_type", None) in (int, "int"):
            tracker.version = self.model_version

    @boundary("TorchRLRolloutWorker")
    def check_health(self, stale_after_s: float) -> None:
        """Raises if the thread failed or ended, or produced nothing for ``stale_after_s`` seconds.

        ``AsyncGRPOTrainer`` calls it when :attr:`rollout_buffer` is empty; rollouts queued before
        the thread ended stay there to be read.
        """
        if self._error is not None:
            raise RuntimeError("the rollout thread failed.") from self._error
        if self._ended is not None:
            raise RuntimeError(f"the rollout thread ended: {self._ended}")
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the rollout thread is not running (start() it).")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(f"no rollout for {age:.0f}s > stale_after_s={stale_after_s:.0f}s.")

    # -- the thread -----------------------------------------------------------------------------

    @boundary("TorchRLRolloutWorker")  # the thread's errors, read by check_health
    def _run(self) -> None:
        try:
            reader = None if self.is_collector else _BufferReader(self.source)
            batches = iter(self.source) if self.is_collector else None
            while not self._stop.is_set():
                with self.lock:
                    version = self.model_version
                    if batches is not None:
                        batch, start = next(batches, None), None
                    else:
                        batch, start = reader.next_rows()
                    rows = [] if batch is None else self._rows(batch, version, start)
                if batch is None:
                    if batches is not None:  # the collector is exhausted
                        self._ended = self._collector_finished()
                        return
                    time.sleep(0.01)
                    continue
                self._batches += 1
                for row in rows:
                    self._add(row)
                self._heartbeat = time.time()
        except BaseException as error:  # noqa: BLE001 - reported by check_health
            self._error = error

    def _rows(self, batch: TensorDictBase, version: int, start: int | None) -> list[dict]:
        """One dict per collected row; rescored by ``score_model`` (under the lock)."""
        batch = batch.reshape(-1)
        with set_list_to_stack(True):
            # real tokens only: a pad_output=True policy's padding is cut by its masks
            tokens = read_policy_rows(batch, self.keys, log_probs=self.score_model is None)
            prompts, responses = tokens.prompts, tokens.responses
            history = batch.get(self.keys.prompt_history, None)
            reward = batch.get(self.reward_key, None)
            # stamped after the step, so after the action (the root one dates from the reset,
            # which a collector may have run before the last weight update)
            versions = batch.get(NEXT_POLICY_VERSION_KEY, batch.get(POLICY_VERSION_KEY, None))
        if reward is None and self._selects:
            raise KeyError(
                "candidate_group_size/drop_zero_std select groups by their reward at "
                f"{self.reward_key!r}, which the collected batch does not hold (keys: "
                f"{sorted(map(str, batch.keys(True, True)))}). Give the collector's "
                "environment a reward transform (e.g. RewardTransform(reward_func)) or pass "
                "reward_key=."
            )
        logprobs = tokens.log_probs
        if self.score_model is not None:
            scores = score_tokens(
                self.score_model,
                [p + r for p, r in zip(prompts, responses)],
                [len(p) for p in prompts],
                temperature=self.temperature,
            )
            logprobs = [s.tolist() for s in scores]
        rewards = (
            [float("nan")] * len(prompts)
            if reward is None
            else reward.reshape(len(prompts), -1).sum(-1).tolist()
        )
        versions = (
            [version] * len(prompts)
            if versions is None
            else versions.reshape(len(prompts), -1)[:, 0].tolist()
        )
        messages = history_to_messages(history) if history is not None else [[]] * len(prompts)
        full = batch.get(self.keys.full_history, None)
        full = history_to_messages(full) if full is not None else [[]] * len(prompts)
        return [
            {
                "prompt_ids": prompts[i],
                "completion_ids": responses[i],
                "logprobs": logprobs[i],
                "reward": rewards[i],
                "version": int(versions[i]),
                "prompt": messages[i],
                "completion": full[i][len(messages[i]) :],
                "index": None if start is None else start + i,
            }
            for i in range(len(prompts))
        ]

    @property
    def _selects(self) -> bool:
        return self.candidate_group_size > self.num_generations or self.drop_zero_std

    def _add(self, row: dict) -> None:
        group = self._pending.setdefault(tuple(row["prompt_ids"]), [])
        group.append(row)
        if len(group) < self.candidate_group_size:
            return
        del self._pending[tuple(row["prompt_ids"])]
        oldest = min(r["version"] for r in group)
        if self.max_staleness is not None and self.model_version - oldest > self.max_staleness:
            self.metrics_queue.put({"rollout/dropped_stale_total": float(len(group))})
            return
        if self._selects:
            rewards = [r["reward"] for r in group]
            kept, metrics = select_group(rewards, self.num_generations, self.drop_zero_std)
            self.metrics_queue.put(metrics)
            group = [group[i] for i in kept]
        if group:
            self._emit(group)

    def _emit(self, group: list[dict]) -> None:
        import numpy as np

        sample_cls = _rollout_sample_cls()
        rewards = [r["reward"] for r in group]
        advantages = group_advantages(rewards)
        scored = [r for r in rewards if not math.isnan(r)]
        std = float(np.std(scored)) if scored else float("nan")
        group_id, self._group_id = self._group_id, self._group_id + 1
        samples = []
        for row, advantage in zip(group, advantages):
            n_prompt, n_completion = len(row["prompt_ids"]), len(row["completion_ids"])
            metrics = {"reward": row["reward"], "reward_std": std}
            if row["index"] is not None:
                metrics["buffer_index"] = float(row["index"])
            sample = sample_cls(
                prompt=row["prompt"],
                completion=row["completion"],
                input_ids=np.asarray(row["prompt_ids"] + row["completion_ids"], dtype=np.int64),
                completion_mask=np.asarray([0] * n_prompt + [1] * n_completion, dtype=np.int64),
                old_log_probs=np.asarray([0.0] * n_prompt + row["logprobs"], dtype=np.float32),
                advantage=float(advantage),
                model_version=row["version"],
                group_id=group_id,
                metrics=metrics,
                enqueued_at=time.time(),
            )
            samples.append(sample)
        # whole or not at all: this thread is the queue's only producer, so the room it sees
        # can only grow until it puts
        bound = self.rollout_buffer.maxsize
        while bound and bound - self.rollout_buffer.qsize() < len(samples):
            if self._stop.wait(0.05):
                return  # stopping: the group is not queued
        for sample in samples:
            self.rollout_buffer.put_nowait(sample)
        self.metrics_queue.put({"rollout/groups_total": 1.0})
