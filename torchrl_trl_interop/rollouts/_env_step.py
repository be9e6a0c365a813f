"""The old import path of :mod:`torchrl_trl_interop._upstream._env_step` (kept for
``rollouts/_tool_env.py`` until it imports from ``_upstream``); nothing is defined here."""

from __future__ import annotations

from .._upstream._env_step import inverts, step, step_mdp

__all__ = ["inverts", "step", "step_mdp"]
