"""Pushing a Hugging Face trainer's weights to a TorchRL policy: :class:`WeightSyncCallback`.

A ``transformers.TrainerCallback``: after every ``every_n_steps`` optimizer steps (and once when
training begins) it takes the trainer's model out of its accelerate wrapper and pushes it with
the package's one weight push (:func:`~torchrl_trl_interop.weights._push.push`), which streams
its weights one tensor at a time
(:func:`~torchrl_trl_interop.weights._stream.stream_weights`). Every push carries a policy
version: the trainer's ``global_step`` whose weights are pushed, so a rollout stamped with
version ``v`` was sampled by the weights of optimizer step ``v``.

This module imports ``transformers`` (the callback's base class); the package imports it only
when ``WeightSyncCallback`` is touched.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDictBase

from .._checks import boundary, check_positive_int, require, signed
from ._push import push, target_kind
from ._stream import stream_weights

try:
    from transformers import TrainerCallback
except ImportError:  # no transformers, no trainer to call it: push() still works by hand
    TrainerCallback = object

__all__ = ["WeightSyncCallback"]


def _unwrap(model: Any) -> torch.nn.Module:
    """The model out of its DDP/accelerate wrapper (``.module``), as accelerate unwraps it."""
    require("accelerate", "WeightSyncCallback")
    from accelerate.utils import extract_model_from_parallel

    if model is None:
        raise ValueError(
            signed(
                "the trainer passed no model to the callback; add the callback to a transformers "
                "Trainer (callbacks=[...]) or call push(model, step) yourself."
            )
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
    ``DTensor``, DeepSpeed ZeRO-3) are gathered one by one on every rank and only the main
    process (``state.is_world_process_zero``) sends; a PEFT LoRA model sends its merged weights,
    or its adapter alone into the same PEFT model. A push needs about one tensor of extra
    memory, not one model.

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
    :class:`~torchrl_trl_interop.RayRemotePolicy`   the same scheme over Ray: streamed into one
    (its ``weight_sync_scheme``)                    buffer, put in Ray's object store once,
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

    Args:
        target: where the weights go (see the table).

    Keyword Args:
        every_n_steps (int, optional): push after every ``every_n_steps`` optimizer steps.
            Defaults to ``1``.
        policy_version (PolicyVersion, optional): a torchrl
            :class:`~torchrl.envs.llm.transforms.PolicyVersion` (integer) whose version is set to
            the pushed step after each push, for a policy in this process whose environment
            stamps rollouts. Defaults to ``None``.

    Attributes:
        version (int or None): the step of the last push (``None`` before the first).
        sync_seconds (list of float): the wall time of each push.

    Raises:
        TypeError: if ``target`` is none of the above.
        ValueError: if ``every_n_steps`` is not a positive int.

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
    def __init__(self, target: Any, *, every_n_steps: int = 1, policy_version: Any = None) -> None:
        check_positive_int(every_n_steps, "every_n_steps")
        target_kind(target)  # a target that cannot receive weights raises here
        self.target = target
        self.every_n_steps = every_n_steps
        self.policy_version = policy_version
        self.version: int | None = None
        self.sync_seconds: list[float] = []

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

    @boundary("WeightSyncCallback")
    def push(self, model: torch.nn.Module | TensorDictBase, step: int, state: Any = None) -> None:
        """Pushes ``model``'s weights (or a weights TensorDict) as version ``step``.

        With ``state`` (a ``TrainerState``), every rank gathers (one parameter at a time) and
        only rank 0 sends.

        Raises:
            KeyError: if the weights' names differ from the receiving model's (when known).
            ValueError: if their shapes differ from the receiving model's (when known).
        """
        start = time.perf_counter()
        if state is not None and not getattr(state, "is_world_process_zero", True):
            if not isinstance(model, TensorDictBase):  # its part of each gather, nothing sent
                for _ in stream_weights(model):
                    pass
            return
        push(self.target, model, step, policy_version=self.policy_version)
        self.version = step
        self.sync_seconds.append(time.perf_counter() - start)
