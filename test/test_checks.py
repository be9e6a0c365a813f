"""The one boundary that signs errors: ``_checks.boundary`` and ``signed``."""

from __future__ import annotations

import pytest

from torchrl_trl_interop._checks import (
    boundary,
    check_among,
    check_dicts,
    check_int,
    check_positive_int,
    check_present,
    public_call,
    signed,
    type_error,
)


@boundary("inner_call")
def inner(n):
    check_positive_int(n, "n")
    return n


@boundary("outer_call")
def outer(n):
    return inner(n)


@boundary("read_batches")
def batches(sizes):
    for size in sizes:
        check_positive_int(size, "size")
        yield public_call("none")


def test_a_public_call_signs_its_checks():
    with pytest.raises(ValueError, match=r"^inner_call: n must be a positive integer, got n=0\.$"):
        inner(0)


def test_the_outermost_public_call_names_the_error():
    with pytest.raises(ValueError, match=r"^outer_call: n must be"):
        outer(-1)


def test_outside_any_public_call_nothing_is_signed():
    assert signed("x") == "x"
    with pytest.raises(ValueError, match=r"^n must be"):
        check_positive_int(0, "n")
    inner(1)
    assert public_call("none") == "none"  # nothing left behind by a call that returned
    with pytest.raises(ValueError):
        inner(0)
    assert public_call("none") == "none"  # nor by one that raised


def test_a_generator_is_signed_per_step_and_never_between_them():
    gen = batches([1, 2, 0])
    assert next(gen) == "read_batches"  # inside the step
    assert public_call("none") == "none"  # the caller's code between two steps is not signed
    assert next(gen) == "read_batches"
    with pytest.raises(ValueError, match=r"^read_batches: size must be a positive integer"):
        next(gen)
    assert public_call("none") == "none"


def test_closing_the_wrapper_closes_the_generator():
    closed = []

    @boundary("rows")
    def rows():
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    gen = rows()
    assert next(gen) == 1
    gen.close()
    assert closed == [True]
    assert list(rows()) == [1, 2]


def test_a_coroutine_function_stays_one_and_is_signed():
    import asyncio
    import inspect

    @boundary("async_tool")
    async def tool(n: int) -> int:
        """Doubles n."""
        check_positive_int(n, "n")
        return 2 * n

    assert inspect.iscoroutinefunction(tool)
    assert tool.__name__ == "tool" and tool.__doc__ == "Doubles n."
    assert list(inspect.signature(tool).parameters) == ["n"]
    assert asyncio.run(tool(2)) == 4
    with pytest.raises(ValueError, match=r"^async_tool: n must be"):
        asyncio.run(tool(0))


@boundary("shared_checks")
def run_check(check, *args, **kwargs):
    return check(*args, **kwargs)


class TestSharedChecks:
    """The message shapes written once in ``_checks``, signed by the public call."""

    def test_type_error_shows_value_type_and_hint(self):
        err = run_check(type_error, "dataset", "an iterable of dict rows", 3, " Pass rows.")
        assert isinstance(err, TypeError)
        assert str(err) == (
            "shared_checks: dataset must be an iterable of dict rows, got 3 of type int. Pass rows."
        )

    def test_type_error_cuts_long_values(self):
        assert "x" * 101 not in str(type_error("a", "b", "x" * 500))

    def test_check_among(self):
        run_check(check_among, ["a"], ["a", "b"], "columns=", "the columns")  # passes
        with pytest.raises(KeyError, match=r"shared_checks: columns= names \['c', 'z'\], not"):
            run_check(check_among, ["z", "a", "c"], ("a", "b"), "columns=", "the columns")

    def test_check_dicts_names_the_first_bad_item(self):
        run_check(check_dicts, [{}, {"a": 1}], "rows", "of columns")  # passes
        with pytest.raises(TypeError, match=r"^shared_checks: rows\[2\] should be a dict of col"):
            run_check(check_dicts, [{}, {}, "x", 5], "rows", "of columns")

    def test_check_present_lists_at_most_eight_rows(self):
        run_check(check_present, [0, 0.0, ""], ValueError, str)  # falsy values are present
        with pytest.raises(RuntimeError, match=r"^shared_checks: \[0, 1, 2, 3, 4, 5, 6, 7\]$"):
            run_check(check_present, [None] * 10, RuntimeError, str)

    def test_check_int_refuses_bools_and_floats(self):
        run_check(check_int, 0, "queue_maxsize")  # passes
        run_check(check_int, None, "pad_token_id", allow_none=True)  # passes
        for bad in (True, 2.0, None):
            with pytest.raises(
                TypeError, match=r"^shared_checks: queue_maxsize must be an int, got"
            ):
                run_check(check_int, bad, "queue_maxsize")
