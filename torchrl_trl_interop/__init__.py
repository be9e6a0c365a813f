"""torchrl-trl-interop: mix TorchRL and Hugging Face TRL piece by piece.

* TorchRL -> TRL: :class:`TorchRLBufferDataset` exposes a torchrl ``ReplayBuffer`` as a torch
  ``IterableDataset`` of flat dicts and as Hugging Face ``datasets`` objects.
* TRL -> TorchRL: :class:`HFRewardModelWrapper` scores TensorDicts with any HF reward model.
* The online loop: :func:`as_trl_rollout_func` makes a TorchRL environment ``GRPOTrainer``'s
  rollout engine; :func:`as_trl_environment_factory` puts its tools and reward into TRL's own
  tool loop; :class:`RewardTransform` puts TRL rewards inside TorchRL environments.
* OpenEnv both ways: :func:`as_openenv_environment` serves a TorchRL environment to any OpenEnv
  trainer; :class:`OpenEnvChatEnv` drives an OpenEnv environment with TorchRL.
* Agents behind an OpenAI-compatible endpoint: :class:`OpenAIServer` serves a TorchRL policy to
  any agent, token for token; :func:`as_trl_agent_rollout_func` trains such an agent with GRPO.

Every public name is imported lazily, so ``import torchrl_trl_interop`` never imports
``transformers``, ``trl`` or ``datasets``; a feature that needs one imports it when used.
"""

from __future__ import annotations

import importlib
from typing import Any

# The one version (pyproject.toml reads it): the next release with a .dev suffix while
# CHANGELOG.md has an "Unreleased" section, the release itself once it is tagged.
__version__ = "0.2.0.dev0"

# public name -> the private module defining it, grouped as the folders are (docs/api.rst too)
_EXPORTS: dict[str, str] = {
    # conversations: History <-> TRL messages (pure functions)
    "history_to_messages": "_conversation",
    "messages_to_history": "_conversation",
    "MessageHistory": "_conversation",
    "split_prompt_completion": "_conversation",
    "is_conversational": "_conversation",
    "is_message_list": "_conversation",
    # data/: buffers <-> TRL and Hugging Face datasets
    "TorchRLBufferDataset": "data._dataset",
    "PaddingCollator": "data._collate",
    "CommittedWriter": "data._committed",
    "split_columns": "data._columns",
    "rows_to_tensordict": "data._rows",
    "replay_buffer_from_hf": "data._from_hf",
    "build_preference_pairs": "data._preferences",
    "BufferCheckpointCallback": "data._checkpoint",
    "last_complete_checkpoint": "data._checkpoint",
    # rewards/: reward models and reward functions, both ways; rewards inside environments
    "HFRewardModelWrapper": "rewards._reward_model",
    "RewardOutputError": "rewards._pooling",
    "RewardShapeError": "rewards._pooling",
    "as_trl_reward_func": "rewards._to_trl",
    "TRLRewardFuncWrapper": "rewards._from_trl",
    "RewardTransform": "rewards._env_transform",
    "as_reward_transform": "rewards._env_transform",
    # weights/: trainer weights -> generators, policy versions
    "WeightSyncCallback": "weights._callback",
    "weights_checksum": "weights._tensors",
    "RemotePolicy": "weights._remote_policy",
    "RayRemotePolicy": "weights._ray_policy",
    "StagingWeightSyncScheme": "weights._scheme",
    "StaleRolloutError": "weights._staleness",
    # rollouts/: TorchRL generation feeding TRL's trainers
    "as_trl_rollout_func": "rollouts._rollout_func",
    "score_final_answer": "rollouts._final_answer",
    "as_trl_environment_factory": "rollouts._env_factory",
    "as_trl_tools": "rollouts._trl_tools",
    "TrainerModelPolicy": "rollouts._trainer_policy",
    "trainer_generation_config": "rollouts._trainer",
    "TorchRLRolloutWorker": "rollouts._async_grpo",
    "TorchRLWeightTransfer": "rollouts._weight_transfer",
    # openenv/: OpenEnv both ways (the `openenv` extra)
    "as_openenv_environment": "openenv._to_openenv",
    "OpenEnvChatEnv": "openenv._from_openenv",
    "openenv_app": "openenv._serve",
    "openenv_server": "openenv._serve",
    # agents/: agents behind an OpenAI-compatible endpoint (the `agents` extra)
    "OpenAIServer": "agents._server",
    "as_trl_agent_rollout_func": "agents._rollout_func",
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
