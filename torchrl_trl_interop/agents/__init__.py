"""Agents behind an OpenAI-compatible endpoint: a TorchRL policy served token for token, every
call recorded per episode, the episodes as GRPO rollouts.

The public names live at the top level (``from torchrl_trl_interop import OpenAIServer``); the
modules here are private. What each one holds: the module table of ``docs/overview.rst``
(``test/test_layout.py`` checks that it lists every module). The guide is ``docs/agents.rst``.
"""
