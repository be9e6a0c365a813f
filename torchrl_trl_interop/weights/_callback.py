"""Pushing a Hugging Face trainer's weights to a TorchRL policy: :class:`WeightSyncCallback`.

A ``transformers.TrainerCallback``: after every ``every_n_steps`` optimizer steps (and once when
training begins) it takes the trainer's model out of its accelerate wrapper and pushes it with
the package's one weight push (:func:`~torchrl_trl_interop.weights._push.push`), which streams
its weights one tensor at a time
(:func:`~torchrl_trl_interop.weights._stream.stream_weights`). Every push carries a policy
version: the trainer's ``global_step`` whose weights are pushed, so a rollout stamped with
version ``v`` was sampled by the weights of optimizer step ``v``. What each push sent and took
reaches the trainer's logs (``weights/push_bytes``, ``weights/push_seconds``,
``weights/version``).

On several ranks every rank gathers its part of each tensor; a receiver every rank shares (a
``RayRemotePolicy``) is pushed once, from rank 0, and each rank's own receivers (a
``RemotePolicy``, a module) by that rank; then the ranks agree on the outcome (one collective):
none goes on before the push is committed, and a push that failed on one rank raises on all.

This module imports ``transformers`` (the callback's base class); the package imports it only
when ``WeightSyncCallback`` is touched.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDictBase

from .._checks import boundary, check_bool, check_positive_int, require
from ._push import Pushed, push, pushed_by_every_rank, takes_delta, target_kind
from ._served import check_timeout
from ._stream import RankStream, several_ranks

try:
    from transformers import TrainerCallback
except ImportError:  # no transformers, no trainer to call it: push() still works by hand
    TrainerCallback = object

__all__ = ["PUSH_BYTES", "PUSH_SECONDS", "PUSH_VERSION", "WeightSyncCallback"]

#: the bytes a push sent (indices and values for a delta), averaged over the pushes of a log
PUSH_BYTES = "weights/push_bytes"
#: the seconds a push took on the trainer's side (gathered, sent, committed everywhere)
PUSH_SECONDS = "weights/push_seconds"
#: the version (optimizer step) of the last push
PUSH_VERSION = "weights/version"
#: the fraction of the pushes of a log that were deltas
PUSH_DELTA = "weights/push_delta"


def _agree(error: BaseException | None, step: int) -> None:
    """One collective: every rank learns whether the push of ``step`` failed anywhere, and a
    rank whose own push succeeded raises for the rank that failed."""
    dist = torch.distributed
    outcomes: list = [None] * dist.get_world_size()
    mine = None if error is None else f"{type(error).__name__}: {error}"
    dist.all_gather_object(outcomes, mine)
    failed = [(rank, outcome) for rank, outcome in enumerate(outcomes) if outcome is not None]
    if failed and error is None:
        rank, outcome = failed[0]
        raise RuntimeError(
            f"the push of the weights of step {step} failed on rank {rank}: {outcome}. Every "
            "rank stops with it (rank 0 pushes a receiver the ranks share)."
        )


def _unwrap(model: Any) -> torch.nn.Module:
    """The model out of its DDP/accelerate wrapper (``.module``), as accelerate unwraps it."""
    require("accelerate", "WeightSyncCallback")
    from accelerate.utils import extract_model_from_parallel

    if model is None:
        raise ValueError(
            "the trainer passed no model to the callback; add the callback to a transformers "
            "Trainer (callbacks=[...]) or call push(model, step) yourself."
        )
    return extract_model_from_parallel(model)


class WeightSyncCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that pushes the trainer's weights to a TorchRL policy.

    Pushes happen when training begins (version = the starting ``global_step``, 0 for a fresh
    run) and after every ``every_n_steps`` optimizer steps (version = ``global_step``). Between
    two pushes the policy samples with weights up to ``every_n_steps - 1`` steps old: that is
    the staleness :func:`~torchrl_trl_interop.as_trl_rollout_func` records per row and bounds
    with ``max_staleness``.

    It works with any HF/TRL trainer (``callbacks=[...]``, ``trainer.add_callback``,
    ``trainer.pop_callback(WeightSyncCallback)``). The model is taken out of its accelerate/DDP
    wrapper and its weights are streamed one tensor at a time: sharded parameters (FSDP2
    ``DTensor``, DeepSpeed ZeRO-3) are gathered one by one on every rank (see "Several ranks"
    below for who sends); a PEFT LoRA model sends its merged weights, or its adapter alone into
    the same PEFT model. A push needs about one tensor of extra memory, not one model.

    ``target`` decides which TorchRL machinery moves the weights. This table is the package's
    one list of weight targets (:func:`~torchrl_trl_interop.weights._push.push` sends to a
    torchrl ``WeightSyncScheme`` or copies into a module; the others reach it through a scheme):

    ==============================================  =============================================
    target (the scheme it sends through)            push
    ==============================================  =============================================
    :class:`~torchrl_trl_interop.RemotePolicy`      checked against the generator's names and
    (its ``weight_sync_scheme``, a                  shapes, streamed into its shared-memory
    ``StagingWeightSyncScheme``)                    staging buffer, committed there with
                                                    ``step`` between two calls
    :class:`~torchrl_trl_interop.RayRemotePolicy`   the same scheme over Ray: streamed straight
    (its ``weight_sync_scheme``)                    into Ray's object store (one ``ray.put``),
                                                    committed by every actor with ``step``
    a torchrl ``RayLLMCollector`` (adapted)         in its actor: checked against its policy, in
                                                    the wrapper's layout, its
                                                    ``update_policy_weights_``, its integer
                                                    ``PolicyVersion`` set to ``step``
    a torchrl collector here (``LLMCollector``,     ``target.update_policy_weights_(weights)``
    any ``Collector``; adapted)                     (checked when its policy is here); its
                                                    integer ``PolicyVersion`` set to ``step``
    torchrl's ``VLLMWeightSender`` (a               ``target.update_weights(weights)``: NCCL
    ``vLLMWrapper`` over ``AsyncVLLM``; adapted)    into the engines, checked first; registered
                                                    collectors' ``PolicyVersion`` set to ``step``
    a ``torchrl.weight_update.WeightSyncScheme``    ``target.send(weights)`` (initialised on the
    (torchrl's, or a ``StagingWeightSyncScheme``)   sender side and connected by the caller);
                                                    ours also takes the version
    an ``nn.Module`` (a torchrl LLM wrapper, a      the weights are copied in place (into a
    model) in this process                          wrapper's ``.model``)
    ==============================================  =============================================

    Weights that do not fit the receiving model (another size, a ``torch.compile`` or PEFT name
    prefix) raise before anything is sent, naming the parameters, whenever the receiver's names
    and shapes are known (a ``RemotePolicy``, a local collector, a module).

    **Delta pushes** (``delta=True``, a ``RemotePolicy`` or ``RayRemotePolicy`` target): only the
    elements whose value in the receiver's dtype changed since the last push are sent (flat
    indices and values); a push goes whole every ``full_push_every`` pushes, when too much
    changed to gain, or when a receiver does not hold the last push. The receivers end
    bit-exact: the trainer's weights cast to their dtypes. The sender keeps the last push in the
    receiver's dtypes (one copy of the model).

    **Every push is logged**: ``weights/push_bytes`` (what it sent), ``weights/push_seconds``
    (gathered, sent and committed), ``weights/version`` and ``weights/push_delta`` go into the
    next log of the trainer (its ``log_history`` and the callbacks after this one), averaged
    over the pushes since the previous log; :attr:`pushes` keeps every push's figures.

    **Several ranks** (``torchrun``/``accelerate``): every rank gathers its part of each tensor.
    A target every rank shares (a ``RayRemotePolicy``'s named actors, torchrl's vLLM sender, a
    torchrl scheme) is pushed once, from rank 0; each rank pushes its own ``RemotePolicy``,
    module or collector. The ranks then agree on the outcome (one collective): no rank goes on
    before the push is committed, and a push that failed on one rank raises on every rank.

    Args:
        target: where the weights go (see the table).

    Keyword Args:
        every_n_steps (int, optional): push after every ``every_n_steps`` optimizer steps.
            Defaults to ``1``.
        policy_version (PolicyVersion, optional): a torchrl
            :class:`~torchrl.envs.llm.transforms.PolicyVersion` (integer) whose version is set to
            the pushed step after each push, for a policy in this process whose environment
            stamps rollouts. Defaults to ``None``.
        delta (bool, optional): delta pushes (see above). Defaults to ``False``.
        full_push_every (int, optional): with ``delta``, a whole push every ``full_push_every``
            pushes. Defaults to ``10``.
        timeout (float, optional): seconds a push into a target without a timeout of its own
            (a ``RayLLMCollector``, torchrl's vLLM sender) may wait. Defaults to ``None`` (600
            s). A ``RemotePolicy`` or ``RayRemotePolicy`` waits its own ``timeout``.

    Attributes:
        version (int or None): the step of the last push (``None`` before the first).
        sync_seconds (list of float): the wall time of each push.
        pushes (list of dict): each push's ``version``, ``bytes``, ``seconds`` and ``delta``
            (the pushes this process sent).

    Raises:
        TypeError: if ``target`` is none of the above.
        ValueError: if ``every_n_steps`` or ``full_push_every`` is not a positive int, ``timeout``
            not a positive number, or ``delta=True`` meets a target that takes no deltas.

    Examples:
        >>> import torch
        >>> from transformers import TrainerCallback, TrainerState
        >>> from torchrl_trl_interop import weights_checksum
        >>> trainer_model, policy_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> callback = WeightSyncCallback(policy_model, every_n_steps=2)
        >>> isinstance(callback, TrainerCallback)
        True
        >>> state = TrainerState(global_step=2)
        >>> _ = callback.on_step_end(None, state, None, model=trainer_model)
        >>> callback.version, weights_checksum(policy_model) == weights_checksum(trainer_model)
        (2, True)
        >>> # In a trainer: Trainer(..., callbacks=[WeightSyncCallback(remote_policy)])
    """

    @boundary("WeightSyncCallback")
    def __init__(
        self,
        target: Any,
        *,
        every_n_steps: int = 1,
        policy_version: Any = None,
        delta: bool = False,
        full_push_every: int = 10,
        timeout: float | None = None,
    ) -> None:
        check_positive_int(every_n_steps, "every_n_steps")
        check_positive_int(full_push_every, "full_push_every")
        self.delta = check_bool(delta, "delta")
        self.timeout = None if timeout is None else check_timeout(timeout)
        target_kind(target)  # a target that cannot receive weights raises here
        if delta and not takes_delta(target):
            raise ValueError(
                "delta=True needs a target whose receivers apply delta pushes (a "
                f"RemotePolicy or a RayRemotePolicy), got target={type(target).__name__}. "
                "Leave delta=False."
            )
        self.target = target
        self.every_n_steps = every_n_steps
        self.full_push_every = full_push_every
        self.policy_version = policy_version
        self.version: int | None = None
        self.sync_seconds: list[float] = []
        self.pushes: list[dict[str, Any]] = []
        self._unlogged: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(target={type(self.target).__name__}, every_n_steps={self.every_n_steps}, "
            f"version={self.version})"
        )

    @boundary("WeightSyncCallback")  # the trainer calls it
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        self.push(_unwrap(model), state.global_step, state)
        return control

    @boundary("WeightSyncCallback")  # the trainer calls it
    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        if state.global_step % self.every_n_steps == 0 and state.global_step != self.version:
            self.push(_unwrap(model), state.global_step, state)
        return control

    @boundary("WeightSyncCallback")  # the trainer calls it
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs):
        """Adds the figures of the pushes since the last log to this log."""
        if not self._unlogged or logs is None:
            return control
        pushes, self._unlogged = self._unlogged, []
        figures = {
            PUSH_BYTES: sum(p["bytes"] for p in pushes) / len(pushes),
            PUSH_SECONDS: sum(p["seconds"] for p in pushes) / len(pushes),
            PUSH_DELTA: sum(p["delta"] for p in pushes) / len(pushes),
            PUSH_VERSION: pushes[-1]["version"],
        }
        logs.update(figures)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(figures)  # the trainer appended its copy of the logs already
        return control

    @boundary("WeightSyncCallback")
    def push(self, model: torch.nn.Module | TensorDictBase, step: int, state: Any = None) -> None:
        """Pushes ``model``'s weights (or a weights TensorDict) as version ``step``.

        On several ranks, call it on every rank: each gathers its part of each tensor, rank 0
        (or each rank, for its own receivers) sends, and the ranks agree on the outcome. With a
        ``state`` (a ``TrainerState``) and no process group, only the main process sends.

        Raises:
            KeyError: if the weights' names differ from the receiving model's (when known).
            ValueError: if their shapes differ from the receiving model's (when known).
            RuntimeError: if a receiver died, or (on every rank) the push failed on one rank.
            TimeoutError: if a receiver did not commit within its timeout.
        """
        start = time.perf_counter()
        ranks = several_ranks()
        if ranks:
            first = torch.distributed.get_rank() == 0
        else:
            first = state is None or getattr(state, "is_world_process_zero", True)
        sends = first or pushed_by_every_rank(self.target)
        gathered = isinstance(model, torch.nn.Module) and (ranks or not sends)
        weights = RankStream(model) if gathered else model  # every rank runs every gather
        error: BaseException | None = None
        pushed: Pushed | None = None
        try:
            if sends:
                pushed = push(
                    self.target,
                    weights,
                    step,
                    policy_version=self.policy_version,
                    delta=self.delta,
                    full_every=self.full_push_every,
                    timeout=self.timeout,
                )
        except Exception as err:  # noqa: BLE001 - raised below, once the ranks agree
            error = err
        finally:
            if isinstance(weights, RankStream):
                weights.drain()  # the gathers this rank has left, as the others run them
        if ranks:
            _agree(error, step)
        if error is not None:
            raise error
        seconds = time.perf_counter() - start
        self.version = step
        self.sync_seconds.append(seconds)
        if pushed is not None:
            figures = {"version": step, "bytes": pushed.bytes, "seconds": seconds}
            self.pushes.append({**figures, "delta": pushed.delta})
            self._unlogged.append(self.pushes[-1])
