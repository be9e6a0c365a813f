"""Version gates for the speed paths that read torchrl's and tensordict's internals."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from importlib import metadata

__all__ = ["TENSORDICT_MEASURED", "TORCHRL_MEASURED", "measured_on", "plain_upstream", "use_fast"]


@functools.cache
def measured_on(package: str, low: str, high: str) -> bool:
    """Whether the installed ``package`` lies in ``[low, high)``: the versions a speed path was
    measured on (and whose private attributes it reads).

    Examples:
        >>> measured_on("torchrl", "0.0", "99.0")
        True
        >>> measured_on("torchrl", "99.0", "100.0")
        False
    """
    from packaging.version import Version

    try:
        installed = Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return False
    return Version(low) <= installed < Version(high)


#: The torchrl versions the torchrl speed paths were measured on.
TORCHRL_MEASURED: tuple[str, str, str] = ("torchrl", "0.14.1", "0.15")
#: The tensordict versions the tensordict speed paths were measured on.
TENSORDICT_MEASURED: tuple[str, str, str] = ("tensordict", "0.14.0", "0.15")

_FORCED_PLAIN = [False]


@functools.cache
def _all_measured(*gates: tuple[str, str, str]) -> bool:
    """Whether every gate holds (read once per set of gates: then one cache look-up a call)."""
    return all(measured_on(*gate) for gate in gates)


def use_fast(*gates: tuple[str, str, str]) -> bool:
    """Whether a speed path may run: every gate holds and :func:`plain_upstream` is not active.

    Examples:
        >>> use_fast(TORCHRL_MEASURED) == measured_on(*TORCHRL_MEASURED)
        True
        >>> with plain_upstream():
        ...     use_fast(TORCHRL_MEASURED)
        False
    """
    return not _FORCED_PLAIN[0] and _all_measured(*gates)


@contextlib.contextmanager
def plain_upstream() -> Iterator[None]:
    """Every speed path takes its plain upstream branch inside this block (tests run both).

    Examples:
        >>> with plain_upstream():
        ...     use_fast()
        False
    """
    previous = _FORCED_PLAIN[0]
    _FORCED_PLAIN[0] = True
    try:
        yield
    finally:
        _FORCED_PLAIN[0] = previous
