"""Argument checks and optional dependencies: each error names the argument and the call.

This module imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import contextvars
import dis
import functools
import importlib.util
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from tensordict import TensorDictBase

_EXTRA_OF = {
    "transformers": "hf",
    "trl": "hf",
    "datasets": "hf",
    "accelerate": "hf",
    "ray": "ray",
    "openenv": "openenv",
    "uvicorn": "agents",
    "starlette": "agents",
    "openai": "agents",
    "smolagents": "smolagents",
}


def require(package: str, feature: str) -> None:
    """Raises an :class:`ImportError` naming the extra to install if ``package`` is missing."""
    if importlib.util.find_spec(package) is None:
        extra = _EXTRA_OF.get(package, "hf")
        raise ImportError(
            f"{feature} needs the optional package `{package}`, which is not installed. "
            f"Install it with `pip install torchrl-trl-interop[{extra}]` (or `pip install {package}`)."
        )


# -- the public call errors speak for -----------------------------------------------------------

_PUBLIC_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torchrl_trl_interop_public_call", default=None
)


def public_call(default: str) -> str:
    """The name an error message starts with: the public call being built, else ``default``.

    An object one public call builds for the user (``RewardTransform`` wrapping TRL reward
    functions in a ``TRLRewardFuncWrapper``) names that call in its errors, not its own class.

    Examples:
        >>> public_call("TRLRewardFuncWrapper")
        'TRLRewardFuncWrapper'
        >>> with speaking_for("RewardTransform"):
        ...     public_call("TRLRewardFuncWrapper")
        'RewardTransform'
    """
    return _PUBLIC_CALL.get() or default


@contextlib.contextmanager
def speaking_for(name: str) -> Iterator[None]:
    """Within the block, :func:`public_call` returns ``name`` (or the name of an outer block:
    the call the user made is the outermost one), and an error the package raises in it leaves
    the block opened by ``name`` (:func:`_sign`) unless an outer block or public call names it.
    Scoped to the thread or task.

    Never let the block span a ``yield``: a generator's context is its caller's, so the name
    would leak into the caller's code between two rows. Read the batch inside the block and
    yield its rows outside it, or decorate the generator function with :func:`boundary`.
    """
    outer = _PUBLIC_CALL.get()
    token = _PUBLIC_CALL.set(outer or name)
    try:
        yield
    except Exception as err:
        if outer is None:
            _sign(err, name)
        raise
    finally:
        _PUBLIC_CALL.reset(token)


def signed(message: str) -> str:
    """``message`` opened by the public call being made (``"TorchRLBufferDataset: ..."``);
    unchanged outside any public call. For a message that is not raised (a warning): the errors
    the package raises are signed once, by the public call they leave (:func:`boundary`).

    Examples:
        >>> signed("keys=[] selects no column.")
        'keys=[] selects no column.'
        >>> with speaking_for("TorchRLBufferDataset"):
        ...     signed("keys=[] selects no column.")
        'TorchRLBufferDataset: keys=[] selects no column.'
    """
    name = _PUBLIC_CALL.get()
    return f"{name}: {message}" if name else message


class Reply(Exception):
    """A mixin for an error whose message is a reply the model reads (a tool's failure, which
    TRL feeds back as ``{"error": ...}``), not an error for the user: no public call signs it.

    Examples:
        >>> class EpisodeOver(Reply, RuntimeError):
        ...     pass
        >>> @boundary("tool")
        ... def tool():
        ...     raise EpisodeOver("The episode is over.")
        >>> try:
        ...     tool()
        ... except RuntimeError as err:
        ...     print(err)
        The episode is over.
    """


_PACKAGE = __name__.partition(".")[0]
_RAISE_VARARGS = dis.opmap["RAISE_VARARGS"]


def _raised_by_package(err: BaseException) -> bool:
    """Whether the package raised ``err`` itself: the innermost frame of its traceback is a
    module of the package, stopped at a ``raise`` statement (``RAISE_VARARGS``).

    An error a C function raises in our frame (a torch op, ``int("x")``) stops that frame at a
    call instead, and one raised by a user's callback or another library ends in their frame:
    neither is ours to sign. A bare ``raise`` re-raising someone else's error adds no frame, so
    the innermost one stays theirs. ``tb_lasti`` is the byte offset of the frame's last
    instruction in ``co_code`` (Python 3.11 to 3.13; ``co_code`` holds the unspecialized
    opcodes, so an adaptive or instrumented instruction reads as its base one).

    Examples:
        >>> def fail():
        ...     raise ValueError("n must be > 0.")  # the doctest runs in this module's globals
        >>> def caught(call):
        ...     try:
        ...         call()
        ...     except Exception as err:
        ...         return _raised_by_package(err)
        >>> caught(fail)
        True
        >>> caught(lambda: torch.ones(2) + torch.ones(3)), caught(lambda: int("x"))
        (False, False)
        >>> import json
        >>> caught(lambda: json.loads("{"))  # raised in another library's frame
        False
    """
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__") or ""
    if module != _PACKAGE and not module.startswith(_PACKAGE + "."):
        return False
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] == _RAISE_VARARGS


def _sign(err: Exception, name: str) -> None:
    """Opens ``err``'s message with ``name`` (the outermost public call) if the package raised
    it (:func:`_raised_by_package`) and its one argument is a message not yet opened by
    ``name`` and not a :class:`Reply`; the same object stays (type, attributes,
    cause and traceback).

    A ``KeyError`` shows the repr of its message, signed or not, as Python prints it.

    Examples:
        >>> err = ValueError("keys=[] selects no column.")
        >>> try:
        ...     raise err
        ... except ValueError:
        ...     _sign(err, "TorchRLBufferDataset")
        >>> err
        ValueError('TorchRLBufferDataset: keys=[] selects no column.')
        >>> _sign(err, "TorchRLBufferDataset")  # once
        >>> str(err)
        'TorchRLBufferDataset: keys=[] selects no column.'
    """
    args = err.args
    if (
        not isinstance(err, Reply)
        and len(args) == 1
        and isinstance(args[0], str)
        and not args[0].startswith(name)
        and _raised_by_package(err)
    ):
        err.args = (f"{name}: {args[0]}",)


def type_error(arg: str, expected: str, value: Any, hint: str = "") -> TypeError:
    """The package's one "``arg`` must be ``expected``, got ..." error (the public call it leaves
    signs it): it shows ``value`` (cut at 100 characters) and its type, then ``hint`` (what to do).

    Examples:
        >>> type_error("batch_size", "an int", "8", " Pass 8.")
        TypeError("batch_size must be an int, got '8' of type str. Pass 8.")
    """
    return TypeError(
        f"{arg} must be {expected}, got {value!r:.100} of type {type(value).__name__}.{hint}"
    )


def check_among(wanted: Iterable[Any], known: Iterable[Any], arg: str, among: str) -> None:
    """Raises a :class:`KeyError` naming ``arg`` if ``wanted`` names something not in ``known``
    (``among`` says what ``known`` is, e.g. ``"the dataset's columns"``).

    Examples:
        >>> check_among(["a", "z"], ["a", "b"], "columns=", "the dataset's columns")
        Traceback (most recent call last):
        ...
        KeyError: "columns= names ['z'], not among the dataset's columns ['a', 'b']."
    """
    known = set(known)
    missing = sorted(set(wanted) - known)
    if missing:
        raise KeyError(f"{arg} names {missing}, not among {among} {sorted(known)}.")


def check_present(
    values: Iterable[Any], error: type[Exception], message: Callable[[list[int]], str]
) -> None:
    """Raises ``error(message(rows))`` if some of ``values`` are ``None``; ``rows`` are the first
    8 positions of a ``None``.

    Examples:
        >>> check_present([1.0, None], ValueError, lambda rows: f"rows {rows} hold no reward.")
        Traceback (most recent call last):
        ...
        ValueError: rows [1] hold no reward.
    """
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        raise error(message(missing[:8]))


def check_dicts(items: Iterable[Any], where: str, holding: str) -> None:
    """Raises a :class:`TypeError` naming the first item of ``items`` that is not a dict
    (``where[i]``); ``holding`` says what each dict should hold.

    Examples:
        >>> check_dicts([{"a": 1}, [1]], "rows", "mapping column names to values")
        Traceback (most recent call last):
        ...
        TypeError: rows[1] should be a dict mapping column names to values, got [1] of type list.
    """
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TypeError(
                f"{where}[{i}] should be a dict {holding}, got {item!r:.100} of type "
                f"{type(item).__name__}."
            )


_F = TypeVar("_F", bound=Callable[..., Any])


def boundary(name: str) -> Callable[[_F], _F]:
    """Decorates a public entry point: the errors the package raises while it runs, at any depth,
    leave it opened by ``name`` (``"name: ..."``), so a raise writes its plain message. The
    outermost public call signs, once; errors raised by C code (a torch op), by the user's
    callbacks or by other libraries pass through unchanged (:func:`_raised_by_package`).

    A generator function is signed around each step (never across a ``yield``): use it where a
    step reads a batch, not where it yields one row of many (``speaking_for`` around the read).
    A coroutine function stays one (its task's context holds the name). The decorated function
    keeps its name, signature and docstring (:func:`functools.wraps`).

    Examples:
        >>> @boundary("make_rows")
        ... def make_rows(n):
        ...     check_positive_int(n, "n")
        ...     return list(range(n))
        >>> make_rows(0)
        Traceback (most recent call last):
        ...
        ValueError: make_rows: n must be a positive integer, got n=0.
    """

    def decorate(fn: _F) -> _F:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def steps(*args: Any, **kwargs: Any) -> Iterator[Any]:
                gen = fn(*args, **kwargs)
                try:
                    value = None
                    while True:
                        with speaking_for(name):
                            try:
                                item = gen.send(value)
                            except StopIteration as stop:
                                return stop.value
                        value = yield item
                finally:
                    gen.close()  # a consumer that stops early closes the generator it wraps

            return steps  # type: ignore[return-value]

        if inspect.iscoroutinefunction(fn):  # stays a coroutine function (TRL awaits those)

            @functools.wraps(fn)
            async def awaited(*args: Any, **kwargs: Any) -> Any:
                with speaking_for(name):
                    return await fn(*args, **kwargs)

            return awaited  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if _PUBLIC_CALL.get() is not None:  # an outer public call already names the errors
                return fn(*args, **kwargs)
            token = _PUBLIC_CALL.set(name)
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                _sign(err, name)
                raise
            finally:
                _PUBLIC_CALL.reset(token)

        return call  # type: ignore[return-value]

    return decorate


# -- argument checks -----------------------------------------------------------------------------


def check_keywords(kwargs: Iterable[str], accepted: Iterable[str]) -> None:
    """Raises the :class:`TypeError` Python would, but naming the public call being made, the
    closest accepted name and every accepted one, if a keyword of ``kwargs`` is unknown.

    Examples:
        >>> with speaking_for("as_reward_transform"):
        ...     check_keywords({"only_dne": True}, ["only_done", "reward_key"])
        Traceback (most recent call last):
        ...
        TypeError: as_reward_transform() got an unexpected keyword argument 'only_dne' (did you mean 'only_done'?). It takes: ['only_done', 'reward_key'].
    """
    import difflib

    accepted = sorted(accepted)
    for name in kwargs:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            call = _PUBLIC_CALL.get() or "the call"
            raise TypeError(
                f"{call}() got an unexpected keyword argument {name!r}{hint}. It takes: {accepted}."
            )


def check_positive_int(value: Any, arg: str, *, allow_none: bool = False) -> None:
    """Raises a :class:`ValueError` unless ``value`` is a positive int (or ``None`` if allowed)."""
    if value is None and allow_none:
        return
    if not is_int(value) or value <= 0:
        expected = "a positive int or None" if allow_none else "a positive integer"  # upstream's
        raise ValueError(f"{arg} must be {expected}, got {arg}={value!r}.")


def check_optional_int(value: Any, arg: str, *, minimum: int, counts: str) -> None:
    """Raises a :class:`ValueError` unless ``value`` is ``None`` or an int ``>= minimum``; the
    message says what ``arg`` ``counts``.

    Examples:
        >>> check_optional_int(-1, "max_staleness", minimum=0, counts="optimizer steps")
        Traceback (most recent call last):
        ...
        ValueError: max_staleness must be None or an int >= 0 (optimizer steps), got max_staleness=-1.
    """
    if value is None:
        return
    if not is_int(value) or value < minimum:
        raise ValueError(
            f"{arg} must be None or an int >= {minimum} ({counts}), got {arg}={value!r}."
        )


def check_real(value: Any, arg: str, *, finite: bool = True) -> float:
    """``value`` as a float; raises unless it is a real number (and finite, if asked).

    Raises:
        TypeError: if ``value`` is not a real number (a ``str``, a list, ``None``, a bool...).
        ValueError: if ``finite`` and ``value`` is NaN or infinite.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(arg, "a real number (int or float)", value)
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{arg} must be a finite number, got {arg}={value!r}.")
    return value


def as_names(value: Any, arg: str) -> tuple[str, ...]:
    """A non-empty tuple of str from a str (one name, never its characters) or an iterable of str.

    Raises:
        TypeError: if ``value`` is neither a str nor an iterable of str; the message names ``arg``.
        ValueError: if ``value`` is empty.
    """
    if type(value) is tuple and value and all(type(v) is str for v in value):
        return value  # already checked (the per-row path)
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable) or isinstance(value, (bytes, dict)):
        raise type_error(arg, "a str or a list of str", value)
    names = tuple(value)
    bad = [v for v in names if not isinstance(v, str)]
    if bad:
        raise TypeError(
            f"{arg} must be a str or a list of str, got {value!r:.100} (holding "
            f"{type(bad[0]).__name__})."
        )
    if not names:
        raise ValueError(f"{arg} is empty; pass at least one name.")
    return names


def as_mapping(value: Any, arg: str, what: str) -> dict:
    """``value`` as a dict (``None``: empty); raises a :class:`TypeError` naming ``arg`` and
    ``what`` it should map (e.g. ``"{column: key}"``) unless it is a mapping."""
    from collections.abc import Mapping

    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise type_error(arg, f"a dict {what}", value)
    return dict(value)


def check_tensordict(value: Any, arg: str) -> None:
    """Raises a :class:`TypeError` naming ``arg`` unless ``value`` is a TensorDict."""
    if not isinstance(value, TensorDictBase):
        raise type_error(arg, "a TensorDict (e.g. TensorDict({...}, batch_size=[n]))", value)


def check_tokenizer(value: Any, arg: str) -> None:
    """Raises a :class:`TypeError` naming ``arg`` unless ``value`` looks like an HF tokenizer."""
    looks_like = hasattr(value, "pad_token_id") or hasattr(value, "tokenizer")  # or a processor
    if value is not None and (not callable(value) or not looks_like):
        hint = (
            " Load it first: AutoTokenizer.from_pretrained(...)." if isinstance(value, str) else ""
        )
        raise type_error(arg, "a Hugging Face tokenizer (a PreTrainedTokenizerBase)", value, hint)


def as_device(value: Any, arg: str) -> torch.device | None:
    """``value`` as a :class:`torch.device` (``None`` passes); a :class:`TypeError` naming ``arg``
    for anything that is not a device."""
    if value is None or isinstance(value, torch.device):
        return value
    try:
        return torch.device(value)
    except (TypeError, RuntimeError) as err:
        expected = "a torch.device or a device string such as 'cpu' or 'cuda:0'"
        raise type_error(arg, expected, value) from err


def check_bool(value: Any, arg: str) -> bool:
    """``value`` if it is a bool (or a numpy bool); raises a :class:`TypeError` otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise type_error(arg, "a bool (True or False)", value)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int; a bool is not one, though Python makes it a subclass.

    Examples:
        >>> is_int(3), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, arg: str, *, allow_none: bool = False) -> None:
    """Raises a :class:`TypeError` unless ``value`` is an int (a bool is not one), or ``None`` if
    allowed.

    Examples:
        >>> check_int(None, "pad_token_id", allow_none=True)
        >>> check_int(2.0, "queue_maxsize")
        Traceback (most recent call last):
        ...
        TypeError: queue_maxsize must be an int, got 2.0 of type float.
    """
    if value is None and allow_none:
        return
    if not is_int(value):
        raise type_error(arg, "an int", value)


def module_repr(module: Any, before: Iterable[str], after: Iterable[str] = ()) -> str:
    """A module's repr in tensordict's layout: one field per line, keys between ``before``/``after``."""
    fields = [*before, f"in_keys={module.in_keys}", f"out_keys={module.out_keys}", *after]
    body = ",\n    ".join(fields)
    return f"{type(module).__name__}(\n    {body})"
