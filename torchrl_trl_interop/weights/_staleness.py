"""Policy versions and staleness: how many optimizer steps a rollout's weights lag behind.

A rollout stamped with ``policy_version = v`` was sampled with the weights of optimizer step
``v`` (:class:`~torchrl_trl_interop.WeightSyncCallback` pushes version ``global_step``); consumed
at step ``s`` its staleness is ``s - v``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._checks import check_int, check_optional_int, check_present

__all__ = [
    "STALENESS_MAX",
    "STALENESS_MEAN",
    "StaleRolloutError",
    "check_max_staleness",
    "check_policy_version",
    "check_staleness",
    "set_policy_version",
]


#: the mean staleness of a call's rows, in optimizer steps
STALENESS_MEAN = "rollout/staleness_mean"
#: the largest staleness of a call's rows
STALENESS_MAX = "rollout/staleness_max"


class StaleRolloutError(RuntimeError):
    """A rollout's weights are older than the ``max_staleness`` bound allows."""


def check_max_staleness(value: Any) -> None:
    """Raises ``ValueError`` unless ``value`` is ``None`` or an int ``>= 0`` (signed by the
    public call being made)."""
    check_optional_int(value, "max_staleness", minimum=0, counts="optimizer steps")


def check_policy_version(value: Any, arg: str = "policy_version") -> int:
    """``value`` if it is an int ``>= 0`` (an optimizer step); nothing is coerced.

    Raises:
        TypeError: if ``value`` is not an int (``"1"``, ``1.0``, ``True``).
        ValueError: if it is negative.

    Examples:
        >>> check_policy_version(3)
        3
        >>> check_policy_version("1")
        Traceback (most recent call last):
        ...
        TypeError: policy_version must be an int, got '1' of type str.
        >>> check_policy_version(-3)
        Traceback (most recent call last):
        ...
        ValueError: policy_version must be an int >= 0 (the optimizer step whose weights these are), got policy_version=-3.
    """
    check_int(value, arg)
    if value < 0:
        raise ValueError(
            f"{arg} must be an int >= 0 (the optimizer step whose weights these are), got "
            f"{arg}={value!r}."
        )
    return int(value)


def check_staleness(
    versions: Sequence[int | None],
    step: int,
    max_staleness: int | None,
    *,
    log: Callable[[dict[str, list[float]]], None] | None = None,
) -> list[int]:
    """Per-row staleness against the trainer's optimizer ``step``; logs it; enforces the bound.

    The mean and max (``rollout/staleness_mean``, ``rollout/staleness_max``) go to ``log``
    (the rollout function gives the trainer's metrics), before the bound is enforced. Errors
    open with the public call being made.

    Raises:
        StaleRolloutError: if a row is older than ``max_staleness`` steps, or has no version.

    Examples:
        >>> logged = {}
        >>> check_staleness([5, 4, 4], 5, 1, log=logged.update)
        [0, 1, 1]
        >>> logged
        {'rollout/staleness_mean': [0.6666666666666666], 'rollout/staleness_max': [1.0]}
        >>> check_staleness([2], 5, 1)
        Traceback (most recent call last):
        ...
        torchrl_trl_interop.weights._staleness.StaleRolloutError: row 0 was sampled by the weights of step 2, 3 steps behind the trainer (step 5); max_staleness=1. ...
    """
    check_present(
        versions,
        StaleRolloutError,
        lambda rows: (
            f"rows {rows} carry no policy version while others do; every turn of every rollout "
            "must be stamped (one policy per rollout function)."
        ),
    )
    staleness = [step - int(v) for v in versions]
    if log is not None:
        log(
            {
                STALENESS_MEAN: [sum(staleness) / len(staleness)],
                STALENESS_MAX: [float(max(staleness))],
            }
        )
    if max_staleness is not None and max(staleness) > max_staleness:
        i = max(range(len(staleness)), key=staleness.__getitem__)
        raise StaleRolloutError(
            f"row {i} was sampled by the weights of step {versions[i]}, {staleness[i]} steps "
            f"behind the trainer (step {step}); max_staleness={max_staleness}. The "
            "generator's weights are pushed too rarely: use WeightSyncCallback(every_n_steps "
            f"<= {max_staleness + 1}), or raise max_staleness."
        )
    return staleness


def set_policy_version(tracker: Any, version: int) -> None:
    """Sets an integer torchrl ``PolicyVersion`` to ``version`` (others are left to their owner)."""
    if tracker is not None and getattr(tracker, "version_type", None) in (int, "int"):
        tracker.version = int(version)
