"""Trainer weights -> generators elsewhere, with policy versions and a staleness bound.

The public names live at the top level (``from torchrl_trl_interop import WeightSyncCallback``);
the modules here are private, one job each:

* ``_tensors``: the weights of a model, their checksum, and whether they fit a receiver;
* ``_stream``: a model's weights one tensor at a time (sharded parameters gathered one by one,
  LoRA merged or the adapter alone);
* ``_staging``: the shared-memory staging buffer a push into another process fills;
* ``_generator_process``: the process a :class:`~torchrl_trl_interop.RemotePolicy` runs;
* ``_remote_policy``: :class:`~torchrl_trl_interop.RemotePolicy`, a policy in another process;
* ``_push``: the one weight push, into any target, with its version;
* ``_callback``: :class:`~torchrl_trl_interop.WeightSyncCallback`, a trainer callback that
  pushes;
* ``_staleness``: policy versions and the staleness bound.
"""
