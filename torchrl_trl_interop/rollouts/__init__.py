"""TorchRL generation feeding TRL's trainers: the rollout function and AsyncGRPO's seams.

The public names live at the top level (``from torchrl_trl_interop import as_trl_rollout_func``);
the modules here are private, one job each:

* ``_rollout_func``: :func:`~torchrl_trl_interop.as_trl_rollout_func`, a TorchRL environment as
  ``GRPOTrainer``'s rollout engine;
* ``_episodes``: chat-environment episodes as token sequences;
* ``_trainer_policy``: a TRL trainer's own model as a TorchRL LLM policy;
* ``_async_grpo``: :class:`~torchrl_trl_interop.TorchRLRolloutWorker`;
* ``_weight_transfer``: :class:`~torchrl_trl_interop.TorchRLWeightTransfer`.
"""
