"""split_columns and schema resolution: one sampled batch -> per-row columns."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, lazy_stack

from torchrl_trl_interop import split_columns
from torchrl_trl_interop._keys import as_nested_key
from torchrl_trl_interop.data._columns import Selection, column_keys


def nested_batch() -> TensorDict:
    return TensorDict(
        {
            "ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
            "mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
            "a": {"b": {"c": torch.tensor([1.0, 2.0])}},
            "text": ["x", "y"],
        },
        batch_size=[2],
    )


class TestKeyForms:
    @pytest.mark.parametrize("key", ["ids", ("ids",)])
    def test_a_str_key_is_one_key_not_its_characters(self, key):
        """Regression: ``keys=["ids"]`` was iterated as characters (AttributeError)."""
        out = split_columns(nested_batch(), keys=[key], attention_mask_key="mask")
        assert list(out) == [("ids",)]
        assert [row.tolist() for row in out[("ids",)]] == [[5, 6], [7, 8, 9]]

    def test_a_single_key_needs_no_list(self):
        assert list(split_columns(nested_batch(), keys="text")) == [("text",)]

    @pytest.mark.parametrize("key", [("a", "b", "c"), ("a", ("b", "c")), (("a", "b"), "c")])
    def test_every_nested_key_form(self, key):
        """Regression: ``("a", ("b", "c"))`` is a valid tensordict key and was refused."""
        out = split_columns(nested_batch(), keys=[key])
        assert list(out) == [("a", "b", "c")]
        assert [row.item() for row in out[("a", "b", "c")]] == [1.0, 2.0]

    @pytest.mark.parametrize("bad", [1, (), ("a", 1), None, b"ids"])
    def test_not_a_key(self, bad):
        with pytest.raises(TypeError, match="keys"):
            split_columns(nested_batch(), keys=[bad])

    def test_as_nested_key_names_the_argument(self):
        with pytest.raises(TypeError, match=r"reward_key must be a key: .*, got 3 of type int"):
            as_nested_key(3, "reward_key")


class TestSplit:
    def test_every_leaf_by_default(self):
        out = split_columns(nested_batch())
        assert set(out) == {("ids",), ("mask",), ("a", "b", "c"), ("text",)}
        assert out[("text",)] == ["x", "y"]

    def test_ragged_lazy_stack_with_mask(self):
        rows = [
            TensorDict({"ids": torch.tensor([0, 4, 5]), "m": torch.tensor([0, 1, 1])}),
            TensorDict({"ids": torch.tensor([6]), "m": torch.tensor([1])}),
        ]
        out = split_columns(lazy_stack(rows), keys=["ids"], attention_mask_key="m")
        assert [r.tolist() for r in out[("ids",)]] == [[4, 5], [6]]

    def test_device(self):
        out = split_columns(nested_batch(), keys=["ids"], device="cpu")
        assert out[("ids",)][0].device.type == "cpu"


class TestSchema:
    def test_subtree_and_rename(self):
        selection = Selection(keys=[("a",)], rename={("a", "b", "c"): "abc"}, sep="/")
        schema = selection.resolve(nested_batch())
        assert schema.columns == [("a", "b", "c")] and schema.names == ["abc"]

    def test_missing_key(self):
        with pytest.raises(KeyError, match="'nope' from keys="):
            Selection(keys=[("nope",)]).resolve(nested_batch())

    def test_column_keys_walk_sub_tensordicts(self):
        assert ("a", "b", "c") in column_keys(nested_batch())
