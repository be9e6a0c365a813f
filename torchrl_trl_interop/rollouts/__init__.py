"""TorchRL generation feeding TRL's trainers: the rollout function, TRL's tool loop, AsyncGRPO.

The public names live at the top level (``from torchrl_trl_interop import as_trl_rollout_func``);
the modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module).
"""
