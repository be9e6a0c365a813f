"""torchrl-trl-interop: mix TorchRL and Hugging Face TRL piece by piece.

* TorchRL -> TRL: :class:`TorchRLBufferDataset` exposes a torchrl ``ReplayBuffer`` as a torch
  ``IterableDataset`` of flat dicts and as Hugging Face ``datasets`` objects.
* TRL -> TorchRL: :class:`HFRewardModelWrapper` scores TensorDicts with any HF reward model.
* The online loop: :func:`as_trl_rollout_func` makes a TorchRL environment ``GRPOTrainer``'s
  rollout engine; :func:`as_reward_transform` puts TRL rewards inside TorchRL environments.

Every public name is imported lazily, so ``import torchrl_trl_interop`` never imports
``transformers``, ``trl`` or ``datasets``; a feature that needs one imports it when used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> submodule defining it, by direction (docs/api.rst follows the same groups)
_EXPORTS: dict[str, str] = {
    # TorchRL -> TRL: buffers as datasets
    "TorchRLBufferDataset": "replay_dataset",
    "PaddingCollator": "collate",
    "CommittedWriter": "online",
    "split_columns": "columns",
    "build_preference_pairs": "preferences",
    "as_trl_rollout_func": "rollout_func",
    "BufferCheckpointCallback": "checkpoint",
    "last_complete_checkpoint": "checkpoint",
    # TRL -> TorchRL: reward models as modules, TRL data into buffers and environments
    "HFRewardModelWrapper": "reward_model",
    "RewardOutputError": "pooling",
    "RewardShapeError": "pooling",
    "replay_buffer_from_hf": "buffer_from_hf",
    "RewardTransform": "reward_transform",
    "as_reward_transform": "reward_transform",
    # generation apart from training: weight sync, policy versions, TRL's AsyncGRPO seams
    "WeightSyncCallback": "weight_sync",
    "weights_checksum": "weight_sync",
    "RemotePolicy": "remote_policy",
    "StaleRolloutError": "staleness",
    "TorchRLRolloutWorker": "async_grpo",
    "TorchRLWeightTransfer": "weight_transfer",
    # reward functions, both ways
    "as_trl_reward_func": "trl_reward_func",
    "TRLRewardFuncWrapper": "reward_func_module",
    # conversations
    "history_to_messages": "conversation",
    "messages_to_history": "conversation",
    "split_prompt_completion": "conversation",
    "is_conversational": "conversation",
    "is_message_list": "conversation",
    "rows_to_tensordict": "rows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
