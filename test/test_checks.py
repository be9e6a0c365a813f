"""The one boundary that signs errors: ``_checks.boundary`` and ``speaking_for``."""

from __future__ import annotations

import pytest
import torch

from torchrl_trl_interop._checks import (
    as_device,
    as_names,
    boundary,
    check_among,
    check_dicts,
    check_int,
    check_positive_int,
    check_present,
    check_real,
    check_tokenizer,
    public_call,
    signed,
    speaking_for,
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
        err = type_error("dataset", "an iterable of dict rows", 3, " Pass rows.")
        assert str(err) == "dataset must be an iterable of dict rows, got 3 of type int. Pass rows."
        with pytest.raises(TypeError) as info:  # raised by the package: signed by the call
            run_check(check_tokenizer, "gpt2", "tokenizer")
        assert str(info.value) == (
            "shared_checks: tokenizer must be a Hugging Face tokenizer (a PreTrainedTokenizerBase), "
            "got 'gpt2' of type str. Load it first: AutoTokenizer.from_pretrained(...)."
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


class TestSignedOnce:
    """The outermost public call signs what the package raised, once; nothing else."""

    def test_a_nested_public_call_does_not_sign_again(self):
        with pytest.raises(ValueError) as info:
            outer(0)
        assert info.value.args == ("outer_call: n must be a positive integer, got n=0.",)

    def test_a_block_speaking_for_a_call_signs_at_its_exit(self):
        with pytest.raises(KeyError) as info, speaking_for("read"):
            check_among(["z"], ["a"], "columns=", "the columns")
        assert str(info.value) == "\"read: columns= names ['z'], not among the columns ['a'].\""
        with pytest.raises(ValueError) as info, speaking_for("read"):
            outer(0)  # the block is the outermost: it names the error, the calls inside do not
        assert info.value.args == ("read: n must be a positive integer, got n=0.",)
        assert public_call("none") == "none"

    def test_a_torch_error_raised_in_the_package_keeps_its_message(self):
        meta = torch.tensor(1.0, device="meta")
        with pytest.raises((RuntimeError, NotImplementedError)) as info:
            torch.tensor(1.0, device="meta").item()
        with pytest.raises(type(info.value)) as ours:
            run_check(check_real, meta, "reward")  # the package's own frame calls .item()
        assert ours.value.args == info.value.args

    def test_a_users_callback_error_passes_through_unchanged(self):
        class Names:
            def __iter__(self):
                raise ValueError("the user's own message")

        with pytest.raises(ValueError) as info:
            run_check(as_names, Names(), "keys")
        assert info.value.args == ("the user's own message",)

    def test_an_error_raised_from_another_is_signed_once_and_keeps_its_cause(self):
        with pytest.raises(TypeError) as info:
            run_check(as_device, "no-such-device", "device")
        err = info.value
        assert str(err).startswith("shared_checks: device must be a torch.device or a device")
        assert str(err).count("shared_checks") == 1
        assert isinstance(err.__cause__, RuntimeError)
        assert "shared_checks" not in str(err.__cause__)  # torch's own message, unsigned

    def test_signing_keeps_the_exception_object(self):
        with pytest.raises(KeyError) as info:
            run_check(check_among, ["z"], ["a"], "columns=", "the columns")
        err = info.value
        assert type(err) is KeyError and len(err.args) == 1
        frames = [tb.tb_frame.f_code.co_name for tb in _walk(err.__traceback__)]
        assert frames[-1] == "check_among"  # the traceback still ends at the raise

    def test_generator_and_coroutine_public_calls_sign_once(self):
        import asyncio

        @boundary("rows")
        def rows(n):
            yield from outer_rows(n)

        @boundary("outer_rows")
        def outer_rows(n):
            yield inner(n)

        with pytest.raises(ValueError) as info:
            list(rows(0))
        assert info.value.args == ("rows: n must be a positive integer, got n=0.",)

        @boundary("async_call")
        async def call(n):
            return outer(n)

        with pytest.raises(ValueError) as info:
            asyncio.run(call(0))
        assert info.value.args == ("async_call: n must be a positive integer, got n=0.",)

    def test_signed_still_opens_a_warning_with_the_call(self):
        with speaking_for("dataset"):
            assert signed("x") == "dataset: x"


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next
