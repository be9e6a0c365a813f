"""Attended spans of a dense mask: every mask, every dtype, the fast and the plain path agree;
packing the real tokens of each row to its start."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl_trl_interop._padding import _spans_torch, mask_spans, pack_right


@st.composite
def masks(draw):
    """``[B, L]`` masks of any pattern: padded left or right, holes, empty rows, every dtype."""
    rows = draw(st.integers(1, 6))
    width = draw(st.integers(1, 9))
    pattern = draw(st.sampled_from(["right", "left", "both", "any"]))
    values = []
    for _ in range(rows):
        if pattern == "any":
            values.append(draw(st.lists(st.booleans(), min_size=width, max_size=width)))
            continue
        n = draw(st.integers(0, width))
        start = {"right": 0, "left": width - n}.get(pattern)
        if start is None:
            start = draw(st.integers(0, width - n))
        values.append([start <= i < start + n for i in range(width)])
    dtype = draw(st.sampled_from([torch.bool, torch.int64, torch.int32, torch.float32]))
    return torch.tensor(values).to(dtype)


def reference(mask: torch.Tensor) -> tuple[list[int], list[int], bool]:
    """Per row, in Python: first attended index, one past the last, and whether the mask is
    boolean and attends every position in between."""
    firsts, lasts, solid = [], [], mask.dtype == torch.bool
    for row in mask.bool().tolist():
        hits = [i for i, v in enumerate(row) if v]
        first, last = (hits[0], hits[-1] + 1) if hits else (0, 0)
        firsts.append(first)
        lasts.append(last)
        solid = solid and all(row[first:last])
    return firsts, lasts, solid


@settings(max_examples=300, deadline=None)
@given(masks())
def test_spans_match_the_rows(mask):
    first, last, solid = reference(mask)
    spans = mask_spans(mask)
    assert spans.first.tolist() == first
    assert spans.last.tolist() == last
    assert spans.solid == solid
    assert spans.first.dtype == spans.last.dtype == torch.int64
    plain = _spans_torch(mask)  # what a mask on another device goes through
    assert plain[0].tolist() == first and plain[1].tolist() == last


@settings(max_examples=300, deadline=None)
@given(masks(), st.integers(0, 2))
def test_split_cuts_every_column_to_its_span(mask, inner):
    rows, width = mask.shape
    value = torch.arange(rows * width * 2**inner).reshape(rows, width, *([2] * inner))
    spans = mask_spans(mask)
    first, last, _ = reference(mask)
    cut = spans.split(value)
    assert [r.tolist() for r in cut] == [
        value[i, f:e].tolist() for i, (f, e) in enumerate(zip(first, last))
    ]
    assert all(r.untyped_storage().data_ptr() == value.untyped_storage().data_ptr() for r in cut)
    own = spans.split(mask)  # the mask's own rows: all attended when solid
    assert [r.tolist() for r in own] == [
        mask[i, f:e].tolist() for i, (f, e) in enumerate(zip(first, last))
    ]
    assert all(r.dtype == mask.dtype for r in own)


def test_solid_mask_rows_are_new_tensors_not_views_of_one_another():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    rows = mask_spans(mask).split(mask)
    rows[0][0] = False  # writing into one row changes no other row and not the mask
    assert rows[1].all() and mask.all(1).tolist() == [False, True] and mask[0, 0]


@pytest.mark.parametrize("shape", [(3, 5), (4,), (2, 3, 4)], ids=["other-width", "1-d", "3-d"])
def test_tensors_of_other_shapes_are_split_as_they_are(shape):
    spans = mask_spans(torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 0]]))
    value = torch.arange(torch.Size(shape).numel()).reshape(shape)
    assert [r.tolist() for r in spans.split(value)] == [r.tolist() for r in value.unbind(0)]


def test_rows_of_width_zero():
    spans = mask_spans(torch.zeros(3, 0, dtype=torch.bool))
    assert spans.first.tolist() == spans.last.tolist() == [0, 0, 0]
    assert [r.numel() for r in spans.split(torch.zeros(3, 0))] == [0, 0, 0]


@given(masks(), st.integers(0, 2**31))
@settings(max_examples=200, deadline=None)
def test_pack_right_keeps_each_rows_real_tokens_in_order_then_zeros(mask, seed):
    """Every mask pattern (holes, empty rows, full rows): the real tokens of each row, in order,
    from position 0, then zeros; the lengths count them."""
    real = mask.bool()
    ids = torch.randint(1, 1000, real.shape, generator=torch.Generator().manual_seed(seed))
    packed, lengths = pack_right(ids, real)
    width = real.shape[1]
    expected = [
        [t for t, r in zip(row, keep) if r] + [0] * (width - sum(keep))
        for row, keep in zip(ids.tolist(), real.tolist())
    ]
    assert packed.tolist() == expected
    assert lengths.tolist() == real.sum(-1).tolist()
    assert packed.dtype == ids.dtype and lengths.dtype == torch.int64


def test_pack_right_on_leading_batch_dims_and_width_zero():
    ids = torch.tensor([[[0, 5, 6], [7, 0, 8]], [[9, 9, 9], [0, 0, 0]]])
    packed, lengths = pack_right(ids, ids != 0)
    assert packed.tolist() == [[[5, 6, 0], [7, 8, 0]], [[9, 9, 9], [0, 0, 0]]]
    assert lengths.tolist() == [[2, 2], [3, 0]]
    packed, lengths = pack_right(
        torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.bool)
    )
    assert packed.shape == (2, 0) and lengths.tolist() == [0, 0]
