"""OpenEnv both ways: TorchRL environments served as OpenEnv environments, OpenEnv environments
driven by TorchRL.

The public names live at the top level (``from torchrl_trl_interop import OpenEnvChatEnv``); the
modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module). From a shell:
``python -m torchrl_trl_interop.openenv serve MODULE:make_env --port N`` (``--workers N``: N
processes behind one address).
"""
