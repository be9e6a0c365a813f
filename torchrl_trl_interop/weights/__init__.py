"""Trainer weights -> generators elsewhere, with policy versions and a staleness bound.

The public names live at the top level (``from torchrl_trl_interop import WeightSyncCallback``);
the modules here are private, one job each:

* ``_sync``: the weights of a model, their checksum, and
  :class:`~torchrl_trl_interop.WeightSyncCallback`;
* ``_remote_policy``: :class:`~torchrl_trl_interop.RemotePolicy`, a policy in another process;
* ``_staleness``: policy versions and the staleness bound.
"""
