"""TorchRL generation feeding TRL's trainers: the rollout function, TRL's tool loop, AsyncGRPO.

The public names live at the top level (``from torchrl_trl_interop import as_trl_rollout_func``);
the modules here are private, one job each:

* ``_rollout_func``: :func:`~torchrl_trl_interop.as_trl_rollout_func`, a TorchRL environment as
  ``GRPOTrainer``'s rollout engine;
* ``_episodes``: chat-environment episodes as token sequences;
* ``_env_factory``: :func:`~torchrl_trl_interop.as_trl_environment_factory`, a TorchRL
  environment in ``GRPOTrainer``'s own tool loop (``environment_factory=``);
* ``_tool_env``: one TorchRL environment as one TRL environment instance;
* ``_tools``: the tools a TorchRL environment carries, and the syntax each transform reads;
* ``_tool_schemas``: tool signatures TRL renders, from JSON schemas and Python callables;
* ``_trl_tools``: :func:`~torchrl_trl_interop.as_trl_tools`, plain tools for ``tools=``;
* ``_trainer``: the one reader of a TRL trainer (what it reads, for which TRL versions);
* ``_trainer_policy``: a TRL trainer's own model as a TorchRL LLM policy;
* ``_async_grpo``: :class:`~torchrl_trl_interop.TorchRLRolloutWorker`;
* ``_weight_transfer``: :class:`~torchrl_trl_interop.TorchRLWeightTransfer`.
"""
