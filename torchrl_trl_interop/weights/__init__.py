"""Trainer weights -> generators elsewhere, with policy versions and a staleness bound.

The public names live at the top level (``from torchrl_trl_interop import WeightSyncCallback``);
the modules here are private, one job each:

* ``_tensors``: the weights of a model, their checksum, and whether they fit a receiver;
* ``_stream``: a model's weights one tensor at a time (sharded parameters gathered one by one,
  LoRA merged or the adapter alone);
* ``_staging``: the shared-memory staging buffer a push into another process fills;
* ``_scheme``: ``StagingWeightSyncScheme``, the staging transport as a torchrl weight-sync
  scheme (sender fills, receiver commits between calls);
* ``_generator_process``: the process a :class:`~torchrl_trl_interop.RemotePolicy` runs;
* ``_remote_policy``: :class:`~torchrl_trl_interop.RemotePolicy`, a policy in another process;
* ``_ray_policy``: :class:`~torchrl_trl_interop.RayRemotePolicy`, a policy in N Ray actors;
* ``_remote_collector``, ``_vllm_sender``: the pushes into torchrl's ``RayLLMCollector`` and
  ``VLLMWeightSender``;
* ``_adapters``: every target as a torchrl scheme (its own, or an adapter over its API);
* ``_push``: the one weight push, into a scheme or a module, with its version;
* ``_callback``: :class:`~torchrl_trl_interop.WeightSyncCallback`, a trainer callback that
  pushes;
* ``_staleness``: policy versions and the staleness bound.
"""
