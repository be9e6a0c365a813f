"""The one boundary that signs errors: ``_checks.boundary`` and ``signed``."""

from __future__ import annotations

import pytest

from torchrl_trl_interop._checks import boundary, check_positive_int, public_call, signed


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
