"""Reward models and reward functions, both ways, and rewards inside TorchRL environments.

The public names live at the top level (``from torchrl_trl_interop import HFRewardModelWrapper``);
the modules here are private, one job each:

* ``_reward_model``: :class:`~torchrl_trl_interop.HFRewardModelWrapper`, read -> score -> write;
* ``_input_mode``: which input a reward class reads (``input_mode=`` and one key per mode);
* ``_inputs``: what the reward calls read, one reader per mode (tokens, text or History ->
  right-packed token ids; History or text -> TRL's prompts and completions);
* ``_pooling``: the pooled token, a model output's reward, the exceptions;
* ``_scoring``: scoring right-packed ids (the fill, length buckets, one host read);
* ``_right_padded``: the common CPU batch (dense rows padded on the right) scored as it is;
* ``_to_trl``: :func:`~torchrl_trl_interop.as_trl_reward_func`, a TorchRL module as a TRL
  reward function;
* ``_from_trl``: :class:`~torchrl_trl_interop.TRLRewardFuncWrapper`, TRL reward functions as a
  TorchRL module;
* ``_env_transform``: :class:`~torchrl_trl_interop.RewardTransform`, a reward inside an
  environment.
"""
