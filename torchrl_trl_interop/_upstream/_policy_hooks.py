"""torchrl's ``TransformersWrapper`` generate step, taken over by a subclass: a missing hook.

:class:`~torchrl_trl_interop.TrainerModelPolicy` generates as a TRL trainer does (real tokens,
every log-prob scored, the whole ``GenerationConfig``), in the history-mode step torchrl 0.14.1's
``TransformersWrapper.forward`` calls: the private ``_from_transformers_generate_history``. There
is no public seam for it, so :func:`with_generate_step` sets the class's own ``_generate_step`` in
its place, here, in one line. On the torchrl versions it was written for
(:data:`~torchrl_trl_interop._upstream.TORCHRL_MEASURED`) that step is known to be called; on any
other (and under :func:`~torchrl_trl_interop._upstream.plain_upstream`), :func:`check_generate_step`
refuses to build the policy where torchrl's wrapper no longer has it, since torchrl would then
generate its own way without a word.

The upstream fix that would retire it: a public, overridable generate step in torchrl's LLM
wrappers (or a way to pass a generate function).
"""

from __future__ import annotations

from ._gate import TORCHRL_MEASURED, use_fast

__all__ = ["check_generate_step", "with_generate_step"]

#: the internals this module reads or overrides (test/test_layout.py checks the list)
READS = ("torchrl.modules.llm.TransformersWrapper._from_transformers_generate_history",)


def with_generate_step(policy_cls: type) -> type:
    """Class decorator: the class's ``_generate_step(td, cfg, out)`` becomes the history-mode
    generate step torchrl's ``TransformersWrapper.forward`` calls.

    Examples:
        >>> from torchrl.modules.llm import TransformersWrapper
        >>> @with_generate_step
        ... class Policy(TransformersWrapper):
        ...     def _generate_step(self, td, cfg, out):
        ...         return out
        >>> "_from_transformers_generate_history" in vars(Policy)
        True
    """
    step = vars(policy_cls)["_generate_step"]
    policy_cls._from_transformers_generate_history = step
    return policy_cls


def check_generate_step() -> None:
    """Raises a :class:`RuntimeError` where torchrl's ``TransformersWrapper`` no longer has the
    step :func:`with_generate_step` takes over (checked off the measured torchrl versions).

    Examples:
        >>> check_generate_step()
    """
    if use_fast(TORCHRL_MEASURED):
        return
    from torchrl.modules.llm import TransformersWrapper

    if not callable(getattr(TransformersWrapper, "_from_transformers_generate_history", None)):
        from importlib.metadata import version

        raise RuntimeError(
            f"torchrl {version('torchrl')}'s TransformersWrapper has no "
            "'_from_transformers_generate_history', the generate step this policy replaces "
            "(torchrl has no public hook for it): it would generate torchrl's way. Install "
            f"torchrl {TORCHRL_MEASURED[1]} to {TORCHRL_MEASURED[2]} (exclusive), or report it."
        )
