"""Trainer weights -> generators elsewhere, with policy versions and a staleness bound.

The public names live at the top level (``from torchrl_trl_interop import WeightSyncCallback``); the
modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module).
"""
