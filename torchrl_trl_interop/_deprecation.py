"""Deprecations: every deprecated public name, its replacement and the version that removes it.

The policy (``CHANGELOG.md``, ``docs/install.rst``): a public name that goes, including the
:mod:`torchrl_trl_interop.testing` helpers, is kept for one minor version after the release that
deprecates it, and warns with a :class:`DeprecationWarning` that names its replacement and the
version that removes it. :data:`DEPRECATED` is the one list of them: the deprecated callables
warn through :func:`warn_deprecated`, a package serves its deprecated attributes through
:func:`deprecated_getattr`, and ``test/test_deprecation.py`` checks each entry (it warns, its
version is still ahead of the package's, the changelog lists it).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["DEPRECATED", "Deprecation", "deprecated_getattr", "warn_deprecated"]


class Deprecation(NamedTuple):
    """What replaces a deprecated name, the version that removes it, and (for a module
    attribute) the private module that still holds it."""

    replacement: str
    removed_in: str
    home: str | None = None


def _testing(replacement: str, *, module: str) -> Deprecation:
    # helpers the testing face exported until 2026-12-04 and then dropped without notice: served
    # again, deprecated
    return Deprecation(replacement, "0.3.0", f"torchrl_trl_interop.testing.{module}")


#: every deprecated public name (qualified) -> its :class:`Deprecation`
DEPRECATED: dict[str, Deprecation] = {
    "torchrl_trl_interop.as_reward_transform": Deprecation(
        "RewardTransform(module, **kwargs), the same transform", "0.3.0"
    ),
    "torchrl_trl_interop.is_conversational": Deprecation(
        "trl.data_utils.is_conversational, TRL's own check", "0.3.0"
    ),
    "torchrl_trl_interop.testing.free_port": _testing(
        "a socket bound to port 0 (socket.socket().bind(('127.0.0.1', 0)), then getsockname())",
        module="_torchrun",
    ),
    "torchrl_trl_interop.testing.run_torchrun": _testing(
        "torchrun --standalone --nproc_per_node=N script.py (torch.distributed.run)",
        module="_torchrun",
    ),
    "torchrl_trl_interop.testing.scripted_episode": _testing(
        "as_trl_environment_factory(make_env)(): call its reset() and tool methods, then "
        "factory.reward_func",
        module="_tool_task",
    ),
    "torchrl_trl_interop.testing.tool_result_reward": _testing(
        "calculator_answer (it scores the final answer) or a reward function of your own",
        module="_tool_task",
    ),
    "torchrl_trl_interop.testing.TOOL_TOKENS": _testing(
        "toy_tool_tokenizer().get_added_vocab()", module="_tool_task"
    ),
    "torchrl_trl_interop.testing.toy_counter_env": _testing(
        "toy_calculator_env (a ChatEnv with a tool and a reward)", module="_envs"
    ),
    "torchrl_trl_interop.testing.toy_prompting_env": _testing(
        "toy_primed_chat_env (a ChatEnv that serves its own prompts)", module="_envs"
    ),
    "torchrl_trl_interop.testing.shout": _testing(
        "a function of your own (str.upper)", module="_envs"
    ),
    "torchrl_trl_interop.testing.CHATML_TEMPLATE": _testing(
        "toy_tokenizer().chat_template", module="_tokenizer"
    ),
    "torchrl_trl_interop.testing.PAD_TOKEN": _testing(
        "toy_tokenizer().pad_token", module="_tokenizer"
    ),
    "torchrl_trl_interop.testing.DEMO_WARNING_FILTERS": _testing(
        "demo_setup(), which installs these filters", module="_toy_task"
    ),
    "torchrl_trl_interop.testing.BIG_LLAMA_SIZES": _testing(
        "toy_big_llama().config (its sizes)", module="_weights"
    ),
}


def deprecation_message(qualname: str) -> str:
    """The warning of ``qualname``, an entry of :data:`DEPRECATED`.

    Examples:
        >>> deprecation_message("torchrl_trl_interop.testing.PAD_TOKEN")
        'torchrl_trl_interop.testing.PAD_TOKEN is deprecated and will be removed in 0.3.0: use toy_tokenizer().pad_token.'
    """
    entry = DEPRECATED[qualname]
    return (
        f"{qualname} is deprecated and will be removed in {entry.removed_in}: "
        f"use {entry.replacement}."
    )


def warn_deprecated(qualname: str, *, stacklevel: int = 2) -> None:
    """Warns that ``qualname`` (an entry of :data:`DEPRECATED`) is deprecated; ``stacklevel``
    counts from the caller of this function (2: its caller's caller, the user's line).

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_deprecated("torchrl_trl_interop.as_reward_transform")
        >>> caught[0].category.__name__, "removed in 0.3.0" in str(caught[0].message)
        ('DeprecationWarning', True)
    """
    warnings.warn(deprecation_message(qualname), DeprecationWarning, stacklevel=stacklevel + 1)


def deprecated_getattr(package: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that serves its deprecated attributes (the
    entries of :data:`DEPRECATED` with a ``home``) from their private modules, with a warning.

    Examples:
        >>> import warnings
        >>> getattr_ = deprecated_getattr("torchrl_trl_interop.testing")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     getattr_("PAD_TOKEN")
        '<|endoftext|>'
        >>> caught[0].category.__name__
        'DeprecationWarning'
        >>> getattr_("nothing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'torchrl_trl_interop.testing' has no attribute 'nothing'
    """

    def __getattr__(name: str) -> Any:
        qualname = f"{package}.{name}"
        entry = DEPRECATED.get(qualname)
        if entry is None or entry.home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # stacklevel 2 from here: the line that reads the attribute (an import or an access)
        warnings.warn(deprecation_message(qualname), DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(entry.home), name)

    return __getattr__
