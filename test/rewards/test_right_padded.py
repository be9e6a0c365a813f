"""The dense right-padded CPU path of HFRewardModelWrapper (``rewards/_right_padded``).

It must give what the general path gives (same rewards, same errors) and leave every other input
to it: each test runs the wrapper as users call it, and again with the path switched off.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl_trl_interop import HFRewardModelWrapper
from torchrl_trl_interop.rewards import _reward_model
from torchrl_trl_interop.rewards._right_padded import input_embedding, score_right_padded
from torchrl_trl_interop.testing import toy_padded, toy_reward_model

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")
EOS = 2  # the toy tokenizer's eos; its pad is 0


@functools.cache
def model_of(arch: str, pad_token_id: int = 0):
    return toy_reward_model(arch, pad_token_id=pad_token_id)


def rows_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=g) for n in lengths]


def padded_td(rows, side="right", value=0, mask_dtype=torch.bool) -> TensorDict:
    ids, mask = toy_padded(rows, side, padding_value=value, mask_dtype=mask_dtype)
    return TensorDict({TOKENS: ids, MASK: mask}, batch_size=ids.shape[:-1])


@pytest.fixture
def general_reads(monkeypatch):
    """Counts the general path's token reads."""
    calls = []
    read = _reward_model.read_tokens

    def counted(*args, **kwargs):
        calls.append(1)
        return read(*args, **kwargs)

    monkeypatch.setattr(_reward_model, "read_tokens", counted)
    return calls


def both_paths(wrapper, td, monkeypatch):
    """``(outcome with the path, outcome without it)``: a reward tensor, or the error's type and
    message."""

    def run():
        try:
            return wrapper(td.clone())[wrapper.out_keys[0]]
        except Exception as err:  # compared, not swallowed
            return type(err), str(err)

    with_path = run()
    with monkeypatch.context() as m:
        m.setattr(_reward_model, "score_right_padded", lambda *a, **k: None)
        without = run()
    return with_path, without


def assert_same(with_path, without):
    if isinstance(without, tuple):
        assert with_path == without
    else:
        torch.testing.assert_close(with_path, without, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long])
@pytest.mark.parametrize("inference_mode", [True, False])
def test_dense_right_padded_rows_skip_the_reader(
    arch, mask_dtype, inference_mode, general_reads, monkeypatch
):
    model = model_of(arch)
    wrapper = HFRewardModelWrapper(model, inference_mode=inference_mode)
    td = padded_td(rows_of([5, 9, 3, 9]), mask_dtype=mask_dtype)
    with_path, without = both_paths(wrapper, td, monkeypatch)
    assert len(general_reads) == 1  # the run without the path only
    assert_same(with_path, without)
    assert with_path.dtype == torch.float32 and with_path.shape == (4,)
    assert with_path.requires_grad is not inference_mode
    if not inference_mode:  # gradients reach the model through this path too
        with_path.sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and any(bool(g.abs().sum()) for g in grads)
        model.zero_grad(set_to_none=True)


def test_under_the_callers_inference_mode(general_reads):
    model = model_of("llama")
    wrapper = HFRewardModelWrapper(model)
    td = padded_td(rows_of([13, 2]))  # a width no other test uses: built under inference_mode
    with torch.inference_mode():
        first = wrapper(td.clone())["reward"]
    assert not first.is_inference()
    second = wrapper(td.clone())["reward"]
    second.sum().backward()  # nothing built under inference_mode reaches the graph
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(first, second.detach())
    assert not general_reads


def test_group_shaped_batches_and_unsqueeze(general_reads, monkeypatch):
    rows = rows_of([4, 7, 2, 7, 5, 1])
    ids, mask = toy_padded(rows, "right", padding_value=0, mask_dtype=torch.long)
    td = TensorDict({TOKENS: ids.view(2, 3, -1), MASK: mask.view(2, 3, -1)}, batch_size=[2, 3])
    wrapper = HFRewardModelWrapper(model_of("llama"), reward_key=("next", "reward"),
                                   unsqueeze_reward=True)  # fmt: skip
    with_path, without = both_paths(wrapper, td, monkeypatch)
    assert len(general_reads) == 1
    assert with_path.shape == (2, 3, 1)
    assert_same(with_path, without)


def test_pad_equal_to_eos_when_no_row_holds_it(general_reads, monkeypatch):
    wrapper = HFRewardModelWrapper(model_of("llama", pad_token_id=EOS))
    with_path, without = both_paths(wrapper, padded_td(rows_of([3, 6]), value=EOS), monkeypatch)
    assert len(general_reads) == 1
    assert_same(with_path, without)


def _with_row(rows, i, values):
    rows = [r.clone() for r in rows]
    rows[i][-len(values) :] = torch.tensor(values)
    return rows


ROWS = rows_of([4, 6, 2])
OTHER_INPUT = {
    "left padding": lambda: padded_td(ROWS, side="left"),
    "padding holding another id": lambda: padded_td(ROWS, value=7),
    "a row ending with the pad id": lambda: padded_td(_with_row(ROWS, 1, [0])),
    "a pad id inside a row": lambda: padded_td(_with_row(ROWS, 1, [0, 9])),
    "an id outside the vocabulary": lambda: padded_td(_with_row(ROWS, 0, [100_000])),
    "a negative id": lambda: padded_td(_with_row(ROWS, 2, [-3])),
    "an empty row": lambda: padded_td([*ROWS, torch.zeros(0, dtype=torch.long)]),
    "a hole in the mask": lambda: (lambda td: td[MASK].__setitem__((1, 2), 0) or td)(
        padded_td(ROWS)
    ),
    "a mask value of 2": lambda: (lambda td: td.set(MASK, td[MASK] * 2))(
        padded_td(ROWS, mask_dtype=torch.long)
    ),
    "int32 ids": lambda: (lambda td: td.set(TOKENS, td[TOKENS].int()))(padded_td(ROWS)),
}


@pytest.mark.parametrize("case", sorted(OTHER_INPUT))
def test_other_input_goes_to_the_general_path(case, general_reads, monkeypatch):
    model = model_of("llama")
    td = OTHER_INPUT[case]()
    with torch.no_grad():
        direct = score_right_padded(
            model, input_embedding(model), model.config, td, TOKENS, MASK, max_batch_size=None,
            maskless=True,
            nonfinite="raise",
        )  # fmt: skip
    assert direct is None
    with_path, without = both_paths(HFRewardModelWrapper(model), td, monkeypatch)
    assert len(general_reads) == 2  # both runs read through the general path
    assert_same(with_path, without)


def test_micro_batches_and_long_rows_go_to_the_general_path(general_reads, monkeypatch):
    td = padded_td(rows_of([4, 6, 2]))
    with_path, without = both_paths(
        HFRewardModelWrapper(model_of("llama"), max_batch_size=2), td, monkeypatch
    )
    assert len(general_reads) == 2
    assert_same(with_path, without)
    short = toy_reward_model("gpt2", pad_token_id=0, n_positions=5)
    with_path, without = both_paths(HFRewardModelWrapper(short), td, monkeypatch)
    assert isinstance(without, tuple) and "max_position_embeddings" in without[1]
    assert with_path == without


def test_a_nonfinite_reward_raises_as_the_general_path_does(monkeypatch):
    model = toy_reward_model("llama", pad_token_id=0)
    with torch.no_grad():
        model.score.weight.fill_(float("nan"))
    with_path, without = both_paths(HFRewardModelWrapper(model), padded_td(ROWS), monkeypatch)
    assert isinstance(without, tuple) and "NaN or infinite" in without[1]
    assert with_path == without


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    holes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=2),
    pads=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=2),
    mask_dtype=st.sampled_from([torch.bool, torch.long]),
)
def test_same_outcome_as_the_general_path(lengths, holes, pads, mask_dtype):
    """Right-padded batches with holes punched in the mask and pad ids written among the real
    tokens: the wrapper's outcome is the general path's, whichever path scores them."""
    td = padded_td(rows_of(lengths, seed=len(lengths)), mask_dtype=mask_dtype)
    width = td[TOKENS].shape[-1]
    for row, col in holes:
        if row < len(lengths) and col < width:
            td[MASK][row, col] = 0
    for row, col in pads:
        if row < len(lengths) and col < width:
            td[TOKENS][row, col] = 0
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_path, without = both_paths(HFRewardModelWrapper(model_of("llama")), td, monkeypatch)
    assert_same(with_path, without)
