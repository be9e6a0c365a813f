"""Reward models and reward functions, both ways, and rewards inside TorchRL environments.

The public names live at the top level (``from torchrl_trl_interop import HFRewardModelWrapper``);
the modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module).
"""
