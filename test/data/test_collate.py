"""PaddingCollator against transformers.DataCollatorWithPadding on the same rows."""

from __future__ import annotations

import pytest
import torch

from torchrl_trl_interop import PaddingCollator
from torchrl_trl_interop._padding import pad_rows


def rows_of(lengths, *, with_mask=True, mask_dtype=torch.int64, label=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        row = {"input_ids": torch.randint(3, 300, (n,), generator=g)}
        if with_mask:
            row["attention_mask"] = torch.ones(n, dtype=mask_dtype)
        if label:
            row["label"] = torch.rand((), generator=g)
        rows.append(row)
    return rows


def assert_same_batch(ours, theirs):
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


class TestPaddingCollator:
    @pytest.mark.parametrize("side", ["left", "right"])
    @pytest.mark.parametrize("multiple", [None, 8])
    @pytest.mark.parametrize("with_mask", [True, False])
    @pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool])
    def test_same_batch_as_data_collator_with_padding(self, side, multiple, with_mask, mask_dtype):
        from transformers import DataCollatorWithPadding

        from torchrl_trl_interop.testing import toy_tokenizer

        tok = toy_tokenizer(padding_side=side)
        rows = rows_of([5, 1, 9, 3], with_mask=with_mask, mask_dtype=mask_dtype)
        theirs = DataCollatorWithPadding(tok, pad_to_multiple_of=multiple)(rows)
        ours = PaddingCollator(tok, pad_to_multiple_of=multiple)(rows)
        assert_same_batch(ours, dict(theirs))

    def test_the_batch_stays_on_the_rows_device(self):
        """Regression (the H200 check): rows from a CUDA storage came back with a CPU attention
        mask, and a mask of ragged rows could not scatter them. ``meta`` stands in for CUDA here:
        a CPU-built mask shows on it the same way."""
        rows = [{"input_ids": torch.arange(n, device="meta")} for n in (3, 5)]
        out = PaddingCollator(pad_token_id=0)(rows)
        assert out["input_ids"].device.type == "meta", out["input_ids"].device
        assert out["attention_mask"].device.type == "meta", out["attention_mask"].device
        assert out["input_ids"].shape == out["attention_mask"].shape == (2, 5)

    def test_python_list_rows_from_hf_datasets(self, tokenizer):
        from transformers import DataCollatorWithPadding

        rows = [{"input_ids": [5, 6, 7], "score": 1}, {"input_ids": [8], "score": 2}]
        assert_same_batch(
            PaddingCollator(tokenizer)(rows), dict(DataCollatorWithPadding(tokenizer)(rows))
        )

    def test_strings_and_messages_pass_through(self, tokenizer):
        chat = [{"role": "user", "content": "Hi"}]
        rows = [
            {"input_ids": torch.tensor([5, 6]), "prompt": "a", "messages": chat},
            {"input_ids": torch.tensor([7]), "prompt": "b", "messages": chat * 2},
        ]
        batch = PaddingCollator(tokenizer)(rows)
        assert batch["prompt"] == ["a", "b"]
        assert batch["messages"] == [chat, chat * 2]

    def test_other_ragged_columns_padded_with_their_value(self, tokenizer):
        rows = [
            {"input_ids": torch.tensor([5, 6]), "assistant_mask": torch.tensor([False, True])},
            {"input_ids": torch.tensor([7]), "assistant_mask": torch.tensor([True])},
        ]
        batch = PaddingCollator(tokenizer, pad_values={"assistant_mask": False})(rows)
        assert batch["assistant_mask"].dtype == torch.bool
        assert batch["assistant_mask"].tolist() == [[False, True], [True, False]]

    def test_pad_id_override_and_side(self):
        rows = rows_of([2, 4], with_mask=False, label=False)
        batch = PaddingCollator(pad_token_id=-1, padding_side="left")(rows)
        assert batch["input_ids"][0, :2].tolist() == [-1, -1]
        assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]

    def test_needs_a_pad_id(self):
        with pytest.raises(ValueError, match="needs a pad id"):
            PaddingCollator()

    def test_tokenizer_without_pad_token(self, tokenizer):
        tokenizer.pad_token = None
        with pytest.raises(ValueError, match="no pad token"):
            PaddingCollator(tokenizer)(rows_of([2, 3]))

    def test_rows_with_different_columns(self, tokenizer):
        rows = rows_of([2, 3])
        del rows[1]["label"]
        with pytest.raises(ValueError, match="row 1 has columns"):
            PaddingCollator(tokenizer)(rows)

    @pytest.mark.parametrize("bad", [0, -4, 2.5])
    def test_bad_pad_to_multiple_of(self, bad):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            PaddingCollator(pad_token_id=0, pad_to_multiple_of=bad)

    def test_bad_padding_side(self):
        with pytest.raises(ValueError, match="padding_side"):
            PaddingCollator(pad_token_id=0, padding_side="middle")
        with pytest.raises(ValueError, match="padding_side"):
            pad_rows([torch.tensor([1])], 0, padding_side="up")

    def test_empty_rows(self):
        with pytest.raises(ValueError, match="empty list"):
            PaddingCollator(pad_token_id=0)([])


class TestValuesThatAreNotTokens:
    """Regression (issue 20, item 9): float token ids were truncated (``[1.5, 2.0]`` -> ``[1, 2]``)
    where ``DataCollatorWithPadding`` raises; a ``None`` gave a dtype error naming no column."""

    @pytest.mark.parametrize("as_tensor", [False, True])
    @pytest.mark.parametrize("name", ["input_ids", "attention_mask", "token_type_ids"])
    def test_a_fractional_token_value_is_refused(self, tokenizer, as_tensor, name):
        values = [[1.0, 2.0], [3.0, 1.5]]
        rows = [{"input_ids": [5, 6], name: v} for v in values]
        if name == "input_ids":
            rows = [{"input_ids": v} for v in values]
        if as_tensor:
            rows = [{k: torch.tensor(v) for k, v in row.items()} for row in rows]
        with pytest.raises(ValueError, match=rf"column '{name}' .* row 1 holds 1.5 \(torch.float"):
            PaddingCollator(tokenizer)(rows)

    def test_whole_float_ids_are_cast_exactly(self, tokenizer):
        batch = PaddingCollator(tokenizer)([{"input_ids": [5.0, 6.0]}, {"input_ids": [7.0]}])
        assert batch["input_ids"].dtype == torch.int64
        assert batch["input_ids"].tolist() == [[5, 6], [7, tokenizer.pad_token_id]]

    @pytest.mark.parametrize(
        ("column", "values", "row"),
        [
            ("score", [1.0, None], 1),
            ("score", [None, 1.0], 0),
            ("input_ids", [[5, 6], None], 1),
            ("ids", [[5, 6], ["a"]], 1),
        ],
    )
    def test_a_value_that_is_no_number_names_its_column_and_row(
        self, tokenizer, column, values, row
    ):
        from transformers import DataCollatorWithPadding

        rows = [{"input_ids": [5, 6], column: v} for v in values]
        with pytest.raises((TypeError, ValueError)):  # the HF collator refuses them too
            DataCollatorWithPadding(tokenizer)([dict(r) for r in rows])
        with pytest.raises(
            ValueError, match=rf"column '{column}' cannot be made a tensor: row {row}"
        ):
            PaddingCollator(tokenizer)(rows)
