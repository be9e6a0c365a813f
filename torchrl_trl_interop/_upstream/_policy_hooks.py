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

For the rollout's own calls, :func:`generates_in_place` tells when torchrl's ``forward`` would
only run that step and write its output into the input: the policy then runs it on the input as
it is, without the ``forward``'s conversion of the input to a lazy stack of rows (~70 µs a call
for 4 rows, which only the step would read); :func:`rows_under` reads the rows the step needs
from the input's own layout instead.

The upstream fix that would retire it: a public, overridable generate step in torchrl's LLM
wrappers (or a way to pass a generate function), and a ``forward`` that reads a batch's rows
without converting the input to a lazy stack.
"""

from __future__ import annotations

from typing import Any

from ._gate import TENSORDICT_MEASURED, TORCHRL_MEASURED, use_fast

__all__ = ["check_generate_step", "generates_in_place", "rows_under", "with_generate_step"]

#: the internals this module reads or overrides (test/test_layout.py checks the list)
READS = (
    "torchrl.modules.llm.TransformersWrapper._from_transformers_generate_history",
    "tensordict.TensorDict._tensordict",
    "tensordict.tensorclass._tensordict",
)


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


def generates_in_place(policy: Any, td: Any, tensordict_out: Any, kwargs: dict) -> bool:
    """Whether torchrl's ``TransformersWrapper.forward(td, tensordict_out=..., **kwargs)``
    would run the history-mode generate step and write its output into ``td``, and nothing
    more, but for converting ``td`` to a lazy stack of rows first: a batch of rows (a
    ``TensorDict`` or a lazy stack of rows) on no device, no call-time generation argument,
    no ``tensordict_out``, no batching queue, one sample per row, ``inplace=True``. Only on
    the torchrl versions that ``forward`` was read on.

    Examples:
        >>> from tensordict import TensorDict
        >>> from transformers import GenerationConfig
        >>> from torchrl_trl_interop import TrainerModelPolicy
        >>> from torchrl_trl_interop.testing import toy_causal_lm, toy_tokenizer
        >>> tok = toy_tokenizer()
        >>> policy = TrainerModelPolicy(toy_causal_lm(tokenizer=tok), tok,
        ...                             GenerationConfig(max_new_tokens=2), temperature=1.0)
        >>> rows = TensorDict(batch_size=[2])
        >>> generates_in_place(policy, rows, None, {}), generates_in_place(policy, rows, None,
        ...                                                                {"max_new_tokens": 1})
        (True, False)
    """
    from tensordict import LazyStackedTensorDict, TensorDict

    if not use_fast(TORCHRL_MEASURED, TENSORDICT_MEASURED):
        return False
    layout = type(td)
    return (
        tensordict_out is None
        and not kwargs
        and (layout is TensorDict or (layout is LazyStackedTensorDict and td.stack_dim == 0))
        and td.batch_dims == 1
        and td.device is None
        and not policy.batching
        and policy.num_samples is None
        and policy.inplace is True
        and policy.input_mode == "history"
        and policy.generate
    )


def rows_under(td: Any, key: tuple[str, ...]) -> list | None:
    """Each row's value at ``key`` (a nested key's parts), read from the rows ``td`` holds:
    ``td`` a lazy stack of rows (public: on every version), or, on the measured tensordict
    versions, a ``TensorDict`` whose entry at ``key[0]`` is a tensorclass over a lazy stack of
    rows (a ``ChatHistory``, as a reset lays it out); ``None`` for any other layout
    (``td.get(key)`` then reads it).

    Examples:
        >>> from tensordict import TensorDict, lazy_stack
        >>> rows = lazy_stack([TensorDict({"a": {"b": i}}) for i in range(2)])
        >>> [int(v) for v in rows_under(rows, ("a", "b"))]
        [0, 1]
    """
    from tensordict import LazyStackedTensorDict, TensorDict, is_tensorclass

    rest = key
    if type(td) is TensorDict and len(key) > 1:  # the lazy stack under a tensorclass entry
        if not use_fast(TENSORDICT_MEASURED):
            return None
        entry = td._tensordict.get(key[0])
        if not is_tensorclass(entry):
            return None
        inner = entry.__dict__.get("_tensordict")
        if type(inner) is not LazyStackedTensorDict or inner.batch_size != td.batch_size:
            return None
        td, rest = inner, key[1:]
    if not isinstance(td, LazyStackedTensorDict) or td.stack_dim != 0 or not td.tensordicts:
        return None
    return [row.get(rest) for row in td.tensordicts]
