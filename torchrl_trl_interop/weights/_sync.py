"""Pushing a Hugging Face trainer's weights to a TorchRL policy that lives elsewhere.

:class:`WeightSyncCallback` is a ``transformers.TrainerCallback``: after every ``every_n_steps``
optimizer steps (and once when training begins) it takes the trainer's model out of its
accelerate wrapper, reads its parameters as a TensorDict (``TensorDict.from_module``) and hands
them to TorchRL's own weight-sync machinery: a collector's ``update_policy_weights_``, a
``torchrl.weight_update`` scheme initialised on the sender side, a
:class:`~torchrl_trl_interop.RemotePolicy` in another process, or a policy module in this process.
Every push carries a policy version: the trainer's ``global_step`` whose weights are pushed, so a
rollout stamped with version ``v`` was sampled by the weights of optimizer step ``v``.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .._checks import check_positive_int, require

__all__ = [
    "WeightSyncCallback",
    "copy_weights_into",
    "model_weights",
    "policy_model",
    "weights_checksum",
]

_OWNER = "WeightSyncCallback"


def policy_model(policy: Any) -> Any:
    """The module whose weights a policy samples with: a torchrl LLM wrapper's ``.model``.

    A TensorDict module with a ``model`` (``TransformersWrapper``, ``vLLMWrapper``...) gives its
    model; anything else (a Hugging Face model, an ``nn.Module``) is returned as is.

    Examples:
        >>> from tensordict.nn import TensorDictModule
        >>> linear = torch.nn.Linear(2, 2)
        >>> policy_model(linear) is linear
        True
    """
    from tensordict.nn import TensorDictModuleBase

    inner = getattr(policy, "model", None)
    if isinstance(policy, TensorDictModuleBase) and isinstance(inner, torch.nn.Module):
        return inner
    return policy


def copy_weights_into(policy: Any, weights: TensorDictBase) -> None:
    """Copies ``weights`` in place into the model a policy in this process samples with.

    Examples:
        >>> linear = torch.nn.Linear(2, 2)
        >>> copy_weights_into(linear, model_weights(torch.nn.Linear(2, 2)).apply(torch.zeros_like))
        >>> linear.weight.abs().sum().item()
        0.0
    """
    from torchrl.weight_update import WeightStrategy

    WeightStrategy("tensordict").apply_weights(policy_model(policy), weights, inplace=True)


def model_weights(model: torch.nn.Module) -> TensorDictBase:
    """The parameters and buffers of ``model`` as a TensorDict (full tensors, detached).

    Sharded parameters (``DTensor``, FSDP2) are gathered with ``full_tensor()``: every rank must
    call this, as with TRL's own weight streaming.

    Examples:
        >>> model_weights(torch.nn.Linear(2, 3))["weight"].shape
        torch.Size([3, 2])
    """
    weights = TensorDict.from_module(model).data

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    return weights.apply(full)


def weights_checksum(weights: torch.nn.Module | TensorDictBase) -> str:
    """A SHA-256 of every tensor's bytes, in sorted key order: equal only for equal weights.

    Examples:
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> weights_checksum(a) == weights_checksum(a), weights_checksum(a) == weights_checksum(b)
        (True, False)
    """
    if isinstance(weights, torch.nn.Module):
        weights = model_weights(weights)
    digest = hashlib.sha256()
    flat = weights.flatten_keys(".")
    for key in sorted(flat.keys()):
        tensor = flat.get(key).detach().cpu().contiguous()
        digest.update(key.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _unwrap(model: Any) -> torch.nn.Module:
    """The model out of its DDP/accelerate wrapper (``.module``), as accelerate unwraps it."""
    require("accelerate", _OWNER)
    from accelerate.utils import extract_model_from_parallel

    if model is None:
        raise ValueError(
            f"{_OWNER}: the trainer passed no model to the callback; add the callback to a "
            "transformers Trainer (callbacks=[...]) or call push(model, step) yourself."
        )
    return extract_model_from_parallel(model)


class WeightSyncCallback:
    """A ``transformers`` trainer callback that pushes the trainer's weights to a TorchRL policy.

    Pushes happen when training begins (version = the starting ``global_step``, 0 for a fresh
    run) and after every ``every_n_steps`` optimizer steps (version = ``global_step``). Between
    two pushes the policy samples with weights up to ``every_n_steps - 1`` steps old: that is
    the staleness :func:`~torchrl_trl_interop.as_trl_rollout_func` records per row and bounds
    with ``max_staleness``.

    It has every event of ``transformers.TrainerCallback`` (duck-typed, so importing it does not
    import transformers) and works with any HF/TRL trainer. The model is taken out of its
    accelerate/DDP wrapper; on several processes every rank
    gathers sharded parameters and only the main process (``state.is_world_process_zero``)
    pushes.

    ``target`` decides which TorchRL machinery moves the weights:

    ============================================  ===============================================
    target                                        push
    ============================================  ===============================================
    :class:`~torchrl_trl_interop.RemotePolicy`    ``target.update_policy_weights_(weights,
                                                  policy_version=step)``: torchrl's
                                                  ``MultiProcessWeightSyncScheme`` into another
                                                  process, then the version is committed there
    a torchrl collector (``LLMCollector``,        ``target.update_policy_weights_(weights)``;
    ``RayLLMCollector``, any ``Collector``)       its ``PolicyVersion`` tracker, when local and
                                                  integer, is set to ``step``
    a ``torchrl.weight_update.WeightSyncScheme``  ``target.send(weights)`` (initialised on the
                                                  sender side and connected by the caller)
    an ``nn.Module`` (a torchrl LLM wrapper, a    the weights are copied in place (into a
    model) in this process                        wrapper's ``.model``)
    ============================================  ===============================================

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
        >>> from transformers import TrainerState
        >>> trainer_model, policy_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> callback = WeightSyncCallback(policy_model, every_n_steps=2)
        >>> state = TrainerState(global_step=2)
        >>> _ = callback.on_step_end(None, state, None, model=trainer_model)
        >>> callback.version, weights_checksum(policy_model) == weights_checksum(trainer_model)
        (2, True)
        >>> # In a trainer: Trainer(..., callbacks=[WeightSyncCallback(remote_policy)])
    """

    def __init__(self, target: Any, *, every_n_steps: int = 1, policy_version: Any = None) -> None:
        check_positive_int(every_n_steps, "every_n_steps", _OWNER)
        self.kind = _target_kind(target)
        self.target = target
        self.every_n_steps = every_n_steps
        self.policy_version = policy_version
        self.version: int | None = None
        self.sync_seconds: list[float] = []

    def __repr__(self) -> str:
        return (
            f"{_OWNER}(target={type(self.target).__name__}, every_n_steps={self.every_n_steps}, "
            f"version={self.version})"
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        self.push(_unwrap(model), state.global_step, state)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        if state.global_step % self.every_n_steps == 0 and state.global_step != self.version:
            self.push(_unwrap(model), state.global_step, state)
        return control

    def push(self, model: torch.nn.Module | TensorDictBase, step: int, state: Any = None) -> None:
        """Pushes ``model``'s weights (or a weights TensorDict) as version ``step``.

        With ``state`` (a ``TrainerState``), every rank gathers and only rank 0 sends.
        """
        start = time.perf_counter()
        weights = model if isinstance(model, TensorDictBase) else model_weights(model)
        if state is not None and not getattr(state, "is_world_process_zero", True):
            return
        if self.kind == "remote":
            self.target.update_policy_weights_(weights, policy_version=step)
        elif self.kind == "collector":
            self.target.update_policy_weights_(_as_policy_weights(self.target, weights))
            tracker = getattr(self.target, "policy_version_tracker", None)
            _set_version(tracker, step)
        elif self.kind == "scheme":
            self.target.send(weights)
        else:
            copy_weights_into(self.target, weights)
        _set_version(self.policy_version, step)
        self.version = step
        self.sync_seconds.append(time.perf_counter() - start)


def _as_policy_weights(collector: Any, weights: TensorDictBase) -> TensorDictBase:
    """A local collector updates its policy's weights: a torchrl LLM wrapper's model sits under
    ``"model"`` (``TensorDict.from_module(wrapper)``), so the model's weights go there."""
    policy = getattr(collector, "policy", None)
    if policy is not None and policy_model(policy) is not policy:
        return TensorDict({"model": weights}, batch_size=[])
    return weights


def _set_version(tracker: Any, step: int) -> None:
    """Sets an integer torchrl ``PolicyVersion`` to ``step`` (others are left to their owner)."""
    if tracker is not None and getattr(tracker, "version_type", None) in (int, "int"):
        tracker.version = int(step)


def _target_kind(target: Any) -> str:
    from torchrl.weight_update import WeightSyncScheme

    from ._remote_policy import RemotePolicy

    if isinstance(target, RemotePolicy):
        return "remote"
    if isinstance(target, WeightSyncScheme):
        return "scheme"
    if callable(getattr(target, "update_policy_weights_", None)):
        return "collector"
    if isinstance(target, torch.nn.Module):
        return "module"
    raise TypeError(
        f"{_OWNER}: target={type(target).__name__} cannot receive weights. Expected a "
        "RemotePolicy, a torchrl collector (with update_policy_weights_), a torchrl "
        "WeightSyncScheme initialised on the sender side, or an nn.Module (a policy in this "
        "process)."
    )


def _no_op(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
    return control


# The other events of ``transformers.TrainerCallback`` (duck-typed: transformers calls each event
# by name and checks no base class, so this module need not import transformers).
for _event in (
    "on_init_end",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
):
    setattr(WeightSyncCallback, _event, _no_op)
