"""HFRewardModelWrapper on real transformers reward models built from tiny configs."""

from __future__ import annotations

import functools
import inspect
import math
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, lazy_stack

from torchrl_trl_interop import (
    HFRewardModelWrapper,
    RewardOutputError,
    RewardShapeError,
    messages_to_history,
)
from torchrl_trl_interop.rewards._scoring import scores_without_mask
from torchrl_trl_interop.testing import (
    toy_chats,
    toy_padded,
    toy_reward_model,
    toy_tokenizer,
    toy_trainer_args,
)

TOKENS = ("tokens", "full")
MASK = ("masks", "all_attention_mask")
ARCHS = ["llama", "gpt2", "bert"]
EOS = 2  # <|im_end|> in the toy tokenizer; its pad is 0


@functools.cache
def reward_model(arch: str, pad_token_id: int | None = 0):
    return toy_reward_model(arch, pad_token_id=pad_token_id)


def make_rows(lengths, *, seed: int = 0, end_with_eos: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 300, (n,), generator=g) for n in lengths]
    if end_with_eos:
        for row in rows:
            row[-1] = EOS
    return rows


def score_alone(model, row: torch.Tensor) -> float:
    """The reference: the row scored by itself, no padding, at its last token.

    ``config.pad_token_id`` is cleared for the call so that a trailing token equal to it (pad ==
    eos) is not skipped by the model's pooling: alone, no token of the row is padding.
    """
    config = model.config
    old, config.pad_token_id = config.pad_token_id, None
    try:
        with torch.no_grad():
            return model(input_ids=row[None]).logits.reshape(()).item()
    finally:
        config.pad_token_id = old


def dense_td(ids, mask) -> TensorDict:
    return TensorDict({TOKENS: ids, MASK: mask}, batch_size=ids.shape[:-1])


def lazy_td(rows, *, mask_dtype=torch.bool):
    return lazy_stack(
        [TensorDict({TOKENS: r, MASK: torch.ones(len(r), dtype=mask_dtype)}) for r in rows]
    )


LAYOUTS = ["right", "left", "right_other_pad", "left_other_pad", "lazy", "jagged", "list"]


def build(layout: str, rows, mask_dtype) -> TensorDict:
    if layout == "lazy":
        return lazy_td(rows, mask_dtype=mask_dtype)
    if layout == "jagged":
        ids = torch.nested.nested_tensor(rows, layout=torch.jagged)
        mask = torch.nested.nested_tensor(
            [torch.ones(len(r), dtype=mask_dtype) for r in rows], layout=torch.jagged
        )
        return TensorDict({TOKENS: ids, MASK: mask}, batch_size=[len(rows)])
    if layout == "list":  # plain Python lists of 1-D tensors, stored as non-tensor data
        td = TensorDict(batch_size=[len(rows)])
        td.set_non_tensor(TOKENS, list(rows))
        td.set_non_tensor(MASK, [torch.ones(len(r), dtype=mask_dtype) for r in rows])
        return td
    side, _, other = layout.partition("_")
    pad_value = 7 if other else 0  # 7 is an ordinary token, not config.pad_token_id
    return dense_td(*toy_padded(rows, side, padding_value=pad_value, mask_dtype=mask_dtype))


class TestScoresMatchAlone:
    @pytest.mark.parametrize("arch", ARCHS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    @pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long])
    def test_layouts(self, arch, layout, mask_dtype):
        model = reward_model(arch)
        rows = make_rows([4, 9, 1, 6, 9])
        td = build(layout, rows, mask_dtype)
        reward = HFRewardModelWrapper(model, inference_mode=True)(td)["reward"]
        expected = torch.tensor([score_alone(model, r) for r in rows])
        assert reward.shape == (5,)
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    @pytest.mark.parametrize("arch", ARCHS)
    @pytest.mark.parametrize("side", ["left", "right"])
    def test_pad_id_equals_eos(self, arch, side):
        # config.pad_token_id == eos_token_id and every row ends with eos: HF's pooling would
        # treat the trailing eos as padding; the mask says it is real
        model = reward_model(arch, pad_token_id=EOS)
        rows = make_rows([5, 3, 8], end_with_eos=True, seed=1)
        td = dense_td(*toy_padded(rows, side, padding_value=EOS))
        reward = HFRewardModelWrapper(model)(td)["reward"]
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(reward.detach(), expected, atol=1e-5, rtol=0)
        assert model.config.pad_token_id == EOS  # restored after the call

    @pytest.mark.parametrize("arch", ["llama", "gpt2"])
    def test_pad_token_id_none(self, arch):
        model = reward_model(arch, pad_token_id=None)
        rows = make_rows([2, 6, 4], seed=2)
        reward = HFRewardModelWrapper(model, inference_mode=True)(lazy_td(rows))["reward"]
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)
        assert model.config.pad_token_id is None

    def test_mask_with_holes(self):
        # the mask alone decides: zeros inside a row drop those tokens
        model = reward_model("gpt2")
        ids = torch.tensor([[11, 12, 13, 14, 15]])
        mask = torch.tensor([[1, 0, 1, 1, 0]])
        reward = HFRewardModelWrapper(model, inference_mode=True)(dense_td(ids, mask))["reward"]
        expected = score_alone(model, torch.tensor([11, 13, 14]))
        assert reward.item() == pytest.approx(expected, abs=1e-5)

    def test_mask_values_and_id_dtypes(self):
        """A mask's nonzero values mark real tokens (a 0/2 mask is a 0/1 one); int32 ids score
        as int64 ones."""
        model = reward_model("llama")
        rows = make_rows([4, 6, 2], seed=4)
        ids, mask = toy_padded(rows, "right", padding_value=0, mask_dtype=torch.long)
        wrapper = HFRewardModelWrapper(model, inference_mode=True)
        expected = torch.tensor([score_alone(model, r) for r in rows])
        for td in (dense_td(ids, mask * 2), dense_td(ids.int(), mask)):
            torch.testing.assert_close(wrapper(td)["reward"], expected, atol=1e-5, rtol=0)

    @settings(max_examples=40, deadline=None)
    @given(
        lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
        holes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=2),
        pads=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=2),
        mask_dtype=st.sampled_from([torch.bool, torch.long]),
    )
    def test_holes_and_pad_ids_among_real_tokens(self, lengths, holes, pads, mask_dtype):
        """Right-padded rows with holes punched in the mask and the pad id written among the
        real tokens: each row scores as its real tokens alone, or the call names the rows left
        with none."""
        model = reward_model("llama")
        ids, mask = toy_padded(make_rows(lengths, seed=len(lengths)), "right", padding_value=0,
                               mask_dtype=mask_dtype)  # fmt: skip
        for row, col in holes:
            if row < len(lengths) and col < ids.shape[-1]:
                mask[row, col] = 0
        for row, col in pads:
            if row < len(lengths) and col < ids.shape[-1]:
                ids[row, col] = 0
        wrapper = HFRewardModelWrapper(model, inference_mode=True)
        if not mask.bool().any(-1).all():
            with pytest.raises(ValueError, match="no real token"):
                wrapper(dense_td(ids, mask))
            return
        expected = torch.tensor([score_alone(model, i[m.bool()]) for i, m in zip(ids, mask)])
        reward = wrapper(dense_td(ids, mask))["reward"]
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    def test_no_mask_key_scores_every_token(self):
        model = reward_model("llama")
        rows = make_rows([3, 7], seed=3)
        td = lazy_stack([TensorDict({TOKENS: r}) for r in rows])
        wrapper = HFRewardModelWrapper(model, attention_mask_key=None, inference_mode=True)
        assert wrapper.in_keys == [TOKENS]
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(wrapper(td)["reward"], expected, atol=1e-5, rtol=0)


class TestBatchShapes:
    def test_scalar_batch(self):
        model = reward_model("llama")
        row = make_rows([6])[0]
        td = TensorDict({TOKENS: row, MASK: torch.ones(6, dtype=torch.bool)}, batch_size=[])
        reward = HFRewardModelWrapper(model, inference_mode=True)(td)["reward"]
        assert reward.shape == ()
        assert reward.item() == pytest.approx(score_alone(model, row), abs=1e-5)

    @pytest.mark.parametrize("ragged", [False, True])
    def test_env_by_group(self, ragged):
        model = reward_model("gpt2")
        rows = make_rows([3, 5, 2, 7, 4, 6], seed=4)
        if ragged:
            flat = lazy_td(rows)
            td = lazy_stack([lazy_stack(list(flat[:3].unbind(0))), lazy_stack(list(flat[3:]))])
        else:
            ids, mask = toy_padded(rows, "left")
            td = dense_td(ids.reshape(2, 3, -1), mask.reshape(2, 3, -1))
        assert td.batch_size == (2, 3)
        reward = HFRewardModelWrapper(model, inference_mode=True)(td)["reward"]
        expected = torch.tensor([score_alone(model, r) for r in rows]).reshape(2, 3)
        assert reward.shape == (2, 3)
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    @pytest.mark.parametrize("batch_size", [[], [4], [2, 2]])
    def test_unsqueeze_reward(self, batch_size):
        model = reward_model("llama")
        shape = (*batch_size, 5)
        td = dense_td(torch.randint(3, 300, shape), torch.ones(shape, dtype=torch.long))
        wrapper = HFRewardModelWrapper(
            model, reward_key=("next", "reward"), unsqueeze_reward=True, inference_mode=True
        )
        assert wrapper.out_keys == [("next", "reward")]
        assert wrapper(td)["next", "reward"].shape == (*batch_size, 1)

    def test_empty_batch(self):
        model = reward_model("llama")
        td = dense_td(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.bool))
        assert HFRewardModelWrapper(model)(td)["reward"].shape == (0,)


class TestGradients:
    def test_gradients_flow_when_not_inference(self):
        model = reward_model("llama")
        td = lazy_td(make_rows([3, 5]))
        reward = HFRewardModelWrapper(model, inference_mode=False)(td)["reward"]
        assert reward.requires_grad
        model.zero_grad()
        reward.sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and any(g.abs().sum() > 0 for g in grads)
        model.zero_grad()

    def test_no_graph_in_inference_mode(self):
        model = reward_model("llama")
        reward = HFRewardModelWrapper(model, inference_mode=True)(lazy_td(make_rows([3, 5])))
        assert not reward["reward"].requires_grad
        assert reward["reward"].grad_fn is None
        assert not reward["reward"].is_inference()

    @pytest.mark.parametrize("inference_mode", [True, False])
    @pytest.mark.parametrize("outer_inference", [True, False])
    def test_downstream_backward(self, inference_mode, outer_inference):
        # regression from the upstream review: upstream hands back an inference tensor inside
        # a caller's torch.inference_mode(), and the backward below then raises
        model = reward_model("gpt2")
        td = dense_td(*toy_padded(make_rows([3, 5, 4]), "left"))
        wrapper = HFRewardModelWrapper(model, inference_mode=inference_mode)
        if outer_inference:
            with torch.inference_mode():
                reward = wrapper(td)["reward"]
        else:
            reward = wrapper(td)["reward"]
        assert not reward.is_inference()
        assert reward.dtype == torch.float32
        param = torch.nn.Parameter(torch.ones(3))
        (param * reward).sum().backward()  # upstream: "Inference tensors cannot be saved..."
        torch.testing.assert_close(param.grad, reward.detach())
        model.zero_grad()

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_half_model_gives_float32(self, dtype):
        model = toy_reward_model("llama", pad_token_id=0).to(dtype)
        reward = HFRewardModelWrapper(model, inference_mode=True)(lazy_td(make_rows([3, 5])))
        assert reward["reward"].dtype == torch.float32


class _ShapeSpy(torch.nn.Module):
    """Records the input shapes each call gets, then calls the wrapped model."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = model.config
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, input_ids, attention_mask=None):
        self.shapes.append(tuple(input_ids.shape))
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class TestMicroBatches:
    @pytest.mark.parametrize("arch", ["llama", "bert"])
    def test_bucketed_matches_single_call(self, arch):
        model = reward_model(arch)
        lengths = [9, 2, 7, 3, 8, 1, 5]
        rows = make_rows(lengths, seed=5)
        td = dense_td(*toy_padded(rows, "left"))
        full = HFRewardModelWrapper(model, inference_mode=True)(td.clone())["reward"]
        spy = _ShapeSpy(model)
        bucketed = HFRewardModelWrapper(spy, max_batch_size=3, inference_mode=True)(td)["reward"]
        torch.testing.assert_close(bucketed, full, atol=1e-5, rtol=0)
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(bucketed, expected, atol=1e-5, rtol=0)
        # sorted by length, each call padded only to its own longest row
        assert spy.shapes == [(3, 3), (3, 8), (1, 9)]

    def test_gradients_through_micro_batches(self):
        model = reward_model("llama")
        td = lazy_td(make_rows([4, 2, 6, 3, 5]))
        reward = HFRewardModelWrapper(model, max_batch_size=2)(td)["reward"]
        model.zero_grad()
        reward.sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        model.zero_grad()


class TestCausalModelsNeedNoMask:
    """A causal model's real tokens never attend to the padding on their right: its ragged
    micro-batches are scored without a mask (the causal kernel), an encoder's with one, and a
    model that warns about padding without a mask (GPT-2) with one too; every reward is the
    row's own."""

    @pytest.mark.parametrize("arch", ARCHS)
    def test_mask_passed_unless_causal_and_silent(self, arch, caplog):
        from transformers.utils.logging import warning_once

        model = reward_model(arch)
        masks = []

        def record(module, args, kwargs):
            masks.append(kwargs.get("attention_mask"))

        rows = make_rows([9, 2, 7, 3], seed=8)
        warning_once.cache_clear()  # transformers logs its padding warning once per process
        handle = model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            wrapper = HFRewardModelWrapper(model, max_batch_size=2, inference_mode=True)
            reward = wrapper(lazy_td(rows))["reward"]
        finally:
            handle.remove()
        assert len(masks) == 2  # two ragged micro-batches: (2, 3) and (7, 9)
        if arch == "llama":
            assert masks == [None, None]
        else:
            assert all(m is not None and not m.all() for m in masks)
        assert "attention_mask" not in caplog.text  # transformers' padding warning
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    def test_gpt2_keeps_its_mask_because_it_warns_without_one(self, caplog):
        """Why GPT-2 keeps its mask: called without one on padded rows, its forward logs
        transformers' padding warning, which a user of the wrapper should never see."""
        from transformers.utils.logging import warning_once

        model = toy_reward_model("gpt2", pad_token_id=0)
        assert not scores_without_mask(model)
        warning_once.cache_clear()  # logged once per process: make this call the first
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 0]]))
        assert "attention_mask" in caplog.text

    def test_one_bidirectional_layer_keeps_the_mask(self):
        model = toy_reward_model("llama", pad_token_id=0)
        assert scores_without_mask(model)
        model.model.layers[-1].self_attn.is_causal = False  # e.g. a prefix or encoder layer
        assert not scores_without_mask(model)
        rows = make_rows([6, 2, 4], seed=9)
        reward = HFRewardModelWrapper(model, inference_mode=True)(lazy_td(rows))["reward"]
        dense = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
        with torch.no_grad():  # the masked call, what the wrapper has to reproduce
            expected = model(input_ids=dense, attention_mask=mask).logits[:, 0]
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    def test_a_custom_module_is_not_assumed_causal(self):
        assert not scores_without_mask(_Dummy("tensor"))


class _Dummy(torch.nn.Module):
    """A hand-written reward model: reward = mean token id, returned in several formats."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.weight = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask=None):
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        value = self.weight * (input_ids * mask).sum(-1) / mask.sum(-1)
        if self.kind == "tensor":
            return value
        if self.kind == "tensor_1":
            return value[:, None]
        if self.kind == "tuple":
            return (value[:, None], "extra")
        if self.kind == "rewards":
            return type("Out", (), {"rewards": value})()
        if self.kind == "dict":
            return {"logits": value[:, None]}
        if self.kind == "bad_shape":
            return value[:, None].expand(-1, 2)
        if self.kind == "nan":
            return value * float("nan")
        return object()


class TestModelOutputs:
    @pytest.mark.parametrize("kind", ["tensor", "tensor_1", "tuple", "rewards", "dict"])
    def test_readable_outputs(self, kind):
        td = lazy_td([torch.tensor([2, 4]), torch.tensor([3, 6, 9])])
        reward = HFRewardModelWrapper(_Dummy(kind))(td)["reward"]
        torch.testing.assert_close(reward.detach(), torch.tensor([3.0, 6.0]))

    def test_bad_output_shape(self):
        td = lazy_td([torch.tensor([2, 4]), torch.tensor([3, 6, 9])])
        wrapper = HFRewardModelWrapper(_Dummy("bad_shape"))
        with pytest.raises(RewardShapeError, match=r"returned shape \[2, 2\]"):
            wrapper(td)
        # right both ways: ValueError (bad value) and RuntimeError (what upstream raises)
        with pytest.raises(ValueError, match=r"\[2\] or \[2, 1\]"):
            wrapper(td)
        with pytest.raises(RuntimeError, match="one scalar reward per row"):
            wrapper(td)

    def test_num_labels_hint(self):
        # toy_reward_model pins num_labels=1: give a fresh model a two-label head instead
        model = toy_reward_model("llama", pad_token_id=0)
        model.score = torch.nn.Linear(model.config.hidden_size, 2, bias=False)
        model.config.num_labels = 2
        with pytest.raises(RewardShapeError, match="num_labels=2"):
            HFRewardModelWrapper(model)(lazy_td(make_rows([3, 4])))

    def test_unreadable_output(self):
        td = lazy_td([torch.tensor([2, 4])])
        with pytest.raises(RewardOutputError, match="of type object"):
            HFRewardModelWrapper(_Dummy("object"))(td)
        with pytest.raises(RuntimeError, match="could not extract reward"):
            HFRewardModelWrapper(_Dummy("object"))(td)

    def test_nonfinite(self):
        td = lazy_td([torch.tensor([2, 4])])
        with pytest.raises(ValueError, match="NaN or infinite"):
            HFRewardModelWrapper(_Dummy("nan"))(td)
        with pytest.warns(RuntimeWarning, match="NaN or infinite"):
            out = HFRewardModelWrapper(_Dummy("nan"), nonfinite="warn")(td)
        assert math.isnan(out["reward"][0].item())
        out = HFRewardModelWrapper(_Dummy("nan"), nonfinite="ignore")(td)
        assert math.isnan(out["reward"][0].item())


class TestTextAndHistory:
    def test_text_appends_eos_like_reward_trainer(self, tokenizer):
        model = reward_model("llama")
        texts = ["Hello world!", "Two plus two is four.<|im_end|>"]
        td = TensorDict({"text": texts}, batch_size=[2])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tokenizer, text_key="text", inference_mode=True
        )
        assert wrapper.in_keys == ["text"]
        reward = wrapper(td)["reward"]
        expected = [
            score_alone(model, torch.tensor(tokenizer("Hello world!<|im_end|>")["input_ids"])),
            score_alone(model, torch.tensor(tokenizer(texts[1])["input_ids"])),
        ]
        torch.testing.assert_close(reward, torch.tensor(expected), atol=1e-5, rtol=0)

    def test_text_without_eos(self, tokenizer):
        model = reward_model("gpt2")
        td = TensorDict({"text": ["Hello world!"]}, batch_size=[1])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tokenizer, text_key="text", append_eos=False, inference_mode=True
        )
        expected = score_alone(model, torch.tensor(tokenizer("Hello world!")["input_ids"]))
        assert wrapper(td)["reward"].item() == pytest.approx(expected, abs=1e-5)

    def test_history(self, tokenizer):
        model = reward_model("llama")
        chats = toy_chats(3)
        td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[3])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tokenizer, history_key=("history", "full"), inference_mode=True
        )
        reward = wrapper(td)["reward"]
        expected = [
            score_alone(
                model,
                torch.tensor(
                    tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)[
                        "input_ids"
                    ]
                ),
            )
            for chat in chats
        ]
        torch.testing.assert_close(reward, torch.tensor(expected), atol=1e-5, rtol=0)

    def test_history_scalar_batch(self, tokenizer):
        model = reward_model("llama")
        chat = toy_chats(2)[1]
        td = TensorDict({"history": messages_to_history(chat)}, batch_size=[])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tokenizer, history_key="history", inference_mode=True
        )
        ids = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        reward = wrapper(td)["reward"]
        assert reward.shape == ()
        assert reward.item() == pytest.approx(score_alone(model, torch.tensor(ids)), abs=1e-5)

    def test_text_shared_by_every_row(self, tokenizer):
        # a single string on a [2] tensordict is one NonTensorData shared by both rows
        td = TensorDict({"text": "Hello world!"}, batch_size=[2])
        wrapper = HFRewardModelWrapper(
            reward_model("llama"), tokenizer=tokenizer, text_key="text", inference_mode=True
        )
        reward = wrapper(td)["reward"]
        assert reward.shape == (2,)
        assert reward[0] == reward[1]

    def test_history_env_by_group(self, tokenizer):
        model = reward_model("llama")
        rows = [TensorDict({"history": messages_to_history(c)}) for c in toy_chats(4)]
        td = lazy_stack([lazy_stack(rows[:2]), lazy_stack(rows[2:])])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tokenizer, history_key="history", inference_mode=True
        )
        assert wrapper(td)["reward"].shape == (2, 2)

    def test_matches_reward_trainer_preparation(self, tmp_path):
        from datasets import Dataset
        from trl import RewardConfig, RewardTrainer

        tok = toy_tokenizer()
        model = toy_reward_model("llama", tokenizer=tok, seed=1)
        data = {
            "chosen": ["The assistant answers politely.", "Two plus two is four."] * 2,
            "rejected": ["The fox.", "Two plus two is five."] * 2,
        }
        args = RewardConfig(
            dataset_num_proc=None, **toy_trainer_args(tmp_path, logging_strategy="no", bf16=False)
        )
        trainer = RewardTrainer(
            model=model, args=args, train_dataset=Dataset.from_dict(data), processing_class=tok
        )
        trainer.train()
        prepared = trainer.train_dataset
        assert prepared[0]["chosen_ids"][-1] == tok.eos_token_id  # RewardTrainer appended EOS
        model = trainer.model.eval()

        td = TensorDict({"text": {"full": data["chosen"][:2]}}, batch_size=[2])
        wrapper = HFRewardModelWrapper(
            model, tokenizer=tok, text_key=("text", "full"), inference_mode=True
        )
        reward = wrapper(td)["reward"]
        with torch.no_grad():
            expected = [
                model(input_ids=torch.tensor([prepared[i]["chosen_ids"]])).logits.item()
                for i in range(2)
            ]
        torch.testing.assert_close(reward, torch.tensor(expected), atol=1e-5, rtol=0)


class TestErrors:
    def test_missing_token_key(self):
        td = TensorDict({"other": torch.zeros(2, 3)}, batch_size=[2])
        with pytest.raises(KeyError, match=r"token_key=\('tokens', 'full'\).*found \['other'\]"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_missing_mask_key(self):
        td = TensorDict({TOKENS: torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
        with pytest.raises(KeyError, match=r"attention_mask_key=.*found \[\('tokens', 'full'\)\]"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_missing_text_key(self, tokenizer):
        td = TensorDict({"prompt": ["hi"]}, batch_size=[1])
        wrapper = HFRewardModelWrapper(reward_model("llama"), tokenizer=tokenizer, text_key="text")
        with pytest.raises(KeyError, match=r"text_key='text'.*found \['prompt'\]"):
            wrapper(td)

    def test_mask_shape_mismatch(self):
        td = TensorDict(
            {TOKENS: torch.ones(2, 4, dtype=torch.long), MASK: torch.ones(2, 3)}, batch_size=[2]
        )
        with pytest.raises(ValueError, match="does not match the tokens"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_ragged_mask_length_mismatch(self):
        td = lazy_stack(
            [
                TensorDict({TOKENS: torch.ones(3, dtype=torch.long), MASK: torch.ones(3)}),
                TensorDict({TOKENS: torch.ones(4, dtype=torch.long), MASK: torch.ones(2)}),
            ]
        )
        with pytest.raises(ValueError, match="row 1 .* has 4 tokens but a mask of length 2"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_empty_row(self):
        td = dense_td(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 0], [0, 0, 0]]))
        with pytest.raises(ValueError, match=r"row\(s\) \[1\] .* no real token"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_float_tokens(self):
        td = dense_td(torch.ones(2, 3), torch.ones(2, 3))
        with pytest.raises(TypeError, match="torch.float32 values; expected integer"):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_history_wrong_type(self, tokenizer):
        td = TensorDict({"history": torch.zeros(2, 3)}, batch_size=[2])
        wrapper = HFRewardModelWrapper(
            reward_model("llama"), tokenizer=tokenizer, history_key="history"
        )
        with pytest.raises(TypeError, match="expected a torchrl.data.llm.History"):
            wrapper(td)

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"max_batch_size": 0}, "max_batch_size=0"),
            ({"nonfinite": "skip"}, "nonfinite='skip'"),
            ({"text_key": "t", "history_key": "h", "tokenizer": "tok"}, "both text_key"),
            ({"history_key": "h"}, "needs the reward model's tokenizer"),
            ({"tokenizer": "tok"}, "only used with text_key= or history_key="),
            ({"text_key": "t", "tokenizer": "tok", "token_key": "ids"}, "would be ignored"),
            ({"chat_template_kwargs": {}}, "only used with history_key"),
        ],
    )
    def test_constructor_errors(self, kwargs, match, tokenizer):
        if kwargs.get("tokenizer") == "tok":
            kwargs = {**kwargs, "tokenizer": tokenizer}
        with pytest.raises(ValueError, match=match):
            HFRewardModelWrapper(reward_model("llama"), **kwargs)

    def test_append_eos_without_eos_token(self):
        tok = toy_tokenizer()
        tok.eos_token = None
        with pytest.raises(ValueError, match="has no eos_token"):
            HFRewardModelWrapper(reward_model("llama"), tokenizer=tok, text_key="t")

    def test_constructor_type_errors(self):
        with pytest.raises(TypeError, match="model must be a callable nn.Module"):
            HFRewardModelWrapper("not a model")
        with pytest.raises(TypeError, match="reward_key must be a key: .*, got 3 of type int"):
            HFRewardModelWrapper(reward_model("llama"), reward_key=3)


class TestDropIn:
    def test_signature_matches_upstream(self):
        from torchrl.modules.llm.trl_interop import HFRewardModelWrapper as Upstream

        ours = inspect.signature(HFRewardModelWrapper.__init__).parameters
        for name, param in inspect.signature(Upstream.__init__).parameters.items():
            assert name in ours
            assert ours[name].kind == param.kind
            assert ours[name].default == param.default

    def test_keys_model_state_dict_repr(self):
        from torchrl.modules.llm.trl_interop import HFRewardModelWrapper as Upstream

        model = reward_model("llama")
        wrapper = HFRewardModelWrapper(model)
        assert wrapper.model is model
        assert wrapper.in_keys == [TOKENS, MASK]
        assert wrapper.out_keys == ["reward"]
        assert list(wrapper.state_dict()) == list(Upstream(model).state_dict())
        assert "in_keys=[('tokens', 'full'), ('masks', 'all_attention_mask')]" in repr(wrapper)


def test_history_scored_when_the_user_turned_list_to_stack_off():
    from tensordict import TensorDict, set_list_to_stack

    tok = toy_tokenizer()
    chats = toy_chats(3)
    td = TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[3])
    rm = HFRewardModelWrapper(
        toy_reward_model(tokenizer=tok), tokenizer=tok, history_key=("history", "full")
    )
    expected = rm(td.clone())["reward"]
    with set_list_to_stack(False):
        got = rm(td)["reward"]
    torch.testing.assert_close(got, expected)


class TestHostSyncs:
    """The wrapper reads the device once per call on dense input, after the model ran."""

    @pytest.mark.parametrize("side", ["right", "left"])
    @pytest.mark.parametrize("pad_value", [0, 7])  # the model's pad id; an ordinary token
    @pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long])
    @pytest.mark.parametrize("nonfinite", ["raise", "ignore"])
    def test_one_read_on_dense_input(self, side, pad_value, mask_dtype, nonfinite):
        from torchrl_trl_interop.testing import count_host_syncs, stub_reward_model

        model = stub_reward_model()  # reads nothing back itself
        assert model.config.pad_token_id == 0
        rows = make_rows([7, 3, 12, 5], seed=5)
        td = dense_td(*toy_padded(rows, side, padding_value=pad_value, mask_dtype=mask_dtype))
        wrapper = HFRewardModelWrapper(model, inference_mode=True, nonfinite=nonfinite)
        with count_host_syncs() as syncs:
            reward = wrapper(td)["reward"]
        assert syncs.count <= 1, syncs.calls
        with torch.no_grad():  # the stub alone on each unpadded row
            expected = torch.cat([model(input_ids=r[None]) for r in rows]).reshape(-1)
        torch.testing.assert_close(reward, expected)

    @pytest.mark.parametrize("side", ["right", "left"])
    @pytest.mark.parametrize("pad_value", [0, 7])
    @pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long])
    def test_one_read_beyond_the_model_own(self, side, pad_value, mask_dtype):
        """A real model with a known vocabulary and position limit (checked for every call):
        the wrapper adds one read to those the model's own forward makes."""
        from torchrl_trl_interop.testing import count_host_syncs

        model = reward_model("llama")
        rows = make_rows([7, 3, 12, 5], seed=5)
        ids, mask = toy_padded(rows, side, padding_value=pad_value, mask_dtype=mask_dtype)
        wrapper = HFRewardModelWrapper(model, inference_mode=True)
        with count_host_syncs() as syncs:
            reward = wrapper(dense_td(ids, mask))["reward"]
        with torch.no_grad(), count_host_syncs() as own:  # the model on the same batch
            model(input_ids=ids, attention_mask=mask.long())
        assert syncs.count <= own.count + 1, (syncs.calls, own.calls)
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)

    def test_a_bad_id_found_in_the_one_read(self):
        """An id outside the vocabulary is found in the call's one read (the model ran on ids
        clamped into it) and raises the same error, naming the row; no reward is written."""
        model = reward_model("llama")
        vocab = model.get_input_embeddings().num_embeddings
        td = dense_td(torch.tensor([[5, 6, 7], [8, vocab, 9]]), torch.ones(2, 3, dtype=torch.bool))
        with pytest.raises(ValueError, match=rf"token id {vocab} \(row 1\)"):
            HFRewardModelWrapper(model, inference_mode=True)(td)
        assert "reward" not in td.keys()

    @pytest.mark.parametrize("arch", ["llama", "gpt2"])
    def test_a_row_ending_with_the_pad_id_is_scored_again(self, arch):
        # the pad id (0) is not EOS, so it is used as the fill without looking at the rows;
        # the row whose last real token is 0 is found with the rewards and the batch rescored
        model = reward_model(arch)
        rows = make_rows([5, 3, 8], seed=6)
        rows[1][-1] = 0
        td = dense_td(*toy_padded(rows, "right", padding_value=0))
        reward = HFRewardModelWrapper(model, inference_mode=True)(td)["reward"]
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(reward, expected, atol=1e-5, rtol=0)
        assert model.config.pad_token_id == 0

    def test_config_looked_up_once(self, monkeypatch):
        from torchrl_trl_interop.rewards import _pooling as pooling
        from torchrl_trl_interop.rewards import _reward_model as module

        calls = []
        real = pooling.text_config
        monkeypatch.setattr(module, "text_config", lambda m: calls.append(m) or real(m))
        model = reward_model("llama")
        wrapper = HFRewardModelWrapper(model, inference_mode=True)
        td = lazy_td(make_rows([3, 4]))
        for _ in range(3):
            wrapper(td)
        assert len(calls) == 1


def ragged(rows) -> TensorDict:
    return lazy_stack([TensorDict({("tokens", "full"): r}) for r in rows])


class TestRewardModelNeverMutatesTheModel:
    """Regression (issue 10, item 3): the wrapper swapped ``config.pad_token_id`` during the call, with no lock."""

    @pytest.mark.parametrize("pad_token_id", [EOS, None])  # pad == eos; no pad id at all
    def test_config_untouched_during_the_call(self, pad_token_id):
        model = toy_reward_model("llama", pad_token_id=pad_token_id)
        seen = []
        model.register_forward_pre_hook(lambda *_: seen.append(model.config.pad_token_id))
        rows = [torch.tensor([5, 6, EOS]), torch.tensor([7, 8, 9, 10, EOS])]
        HFRewardModelWrapper(model, attention_mask_key=None, inference_mode=True)(ragged(rows))
        assert seen == [pad_token_id]  # before: the swapped pad id, seen by every other caller

    def test_one_model_scored_from_several_threads(self):
        model = toy_reward_model("llama", pad_token_id=EOS)
        g = torch.Generator().manual_seed(0)
        batches = []
        for b in range(4):
            rows = [torch.randint(3, 300, (int(n),), generator=g) for n in range(3, 9)]
            for row in rows[b % 2 :: 2]:
                row[-1] = EOS  # half the rows end with the pad id: those calls need a fill id
            batches.append(rows)
        wrapper = HFRewardModelWrapper(model, attention_mask_key=None, inference_mode=True)
        expected = [wrapper(ragged(rows))["reward"] for rows in batches]
        wrong = []

        def score(k: int) -> None:
            for _ in range(10):
                out = wrapper(ragged(batches[k]))["reward"]
                if not torch.allclose(out, expected[k], atol=1e-6):
                    wrong.append(k)

        threads = [threading.Thread(target=score, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []
        assert model.config.pad_token_id == EOS


class TestInputMode:
    """``input_mode=`` as TorchRL names it (issue 19), and the key arguments it replaces."""

    def chats_td(self) -> TensorDict:
        chats = toy_chats(3)
        return TensorDict({"history": {"full": messages_to_history(chats)}}, batch_size=[3])

    def text_td(self) -> TensorDict:
        texts = ["Hello world!", "Two plus two is four.", "Hi"]
        return TensorDict({"text": {"full": texts}}, batch_size=[3])

    def test_tokens_is_the_default(self):
        rows = make_rows([4, 2, 6], seed=3)
        model = reward_model("llama")
        default = HFRewardModelWrapper(model, inference_mode=True)
        explicit = HFRewardModelWrapper(model, input_mode="tokens", inference_mode=True)
        assert default.input_mode == explicit.input_mode == "tokens"
        assert default.in_keys == explicit.in_keys == [TOKENS, MASK]
        torch.testing.assert_close(
            default(lazy_td(rows))["reward"], explicit(lazy_td(rows))["reward"]
        )
        expected = torch.tensor([score_alone(model, r) for r in rows])
        torch.testing.assert_close(explicit(lazy_td(rows))["reward"], expected, atol=1e-5, rtol=0)

    @pytest.mark.parametrize("mode", ["text", "history"])
    def test_text_and_history_read_torchrls_keys(self, tokenizer, mode):
        """What ``RewardTrainer`` trained on: text with EOS appended, chats rendered."""
        model, key = reward_model("llama"), (mode, "full")
        if mode == "text":
            td = self.text_td()
            rows = [tokenizer(t + tokenizer.eos_token)["input_ids"] for t in td["text", "full"]]
        else:
            td = self.chats_td()
            rows = tokenizer.apply_chat_template(toy_chats(3), tokenize=True, return_dict=True)
            rows = rows["input_ids"]
        expected = torch.tensor([score_alone(model, torch.tensor(ids)) for ids in rows])
        new = HFRewardModelWrapper(model, input_mode=mode, tokenizer=tokenizer)
        old = HFRewardModelWrapper(model, tokenizer=tokenizer, **{f"{mode}_key": key})
        assert new.in_keys == old.in_keys == [key]
        assert new.input_mode == old.input_mode == mode
        for rm in (new, old):
            torch.testing.assert_close(
                rm(td.clone())["reward"].detach(), expected, atol=1e-5, rtol=0
            )

    def test_a_mode_with_its_own_key(self, tokenizer):
        rm = HFRewardModelWrapper(
            reward_model("llama"), input_mode="text", text_key="answer", tokenizer=tokenizer
        )
        assert rm.in_keys == ["answer"] and "input_mode='text'" in repr(rm)
        no_mask = HFRewardModelWrapper(
            reward_model("llama"), input_mode="text", attention_mask_key=None, tokenizer=tokenizer
        )  # None is no key: nothing is ignored
        assert no_mask.in_keys == [("text", "full")]


class TestEmptyRows:
    """Regression (issue 20, item 17): rows of length 0 raised a raw reshape error."""

    def test_every_ragged_row_empty(self):
        empty = torch.zeros(0, dtype=torch.long)
        td = lazy_td([empty, empty])
        with pytest.raises(
            ValueError,
            match=r"token_key=\('tokens', 'full'\) \(a row of length 0.*row\(s\) \[0, 1\]",
        ):
            HFRewardModelWrapper(reward_model("llama"))(td)

    def test_dense_rows_of_width_zero(self):
        td = dense_td(torch.zeros(2, 3, 0, dtype=torch.long), torch.zeros(2, 3, 0))
        with pytest.raises(ValueError, match=r"row\(s\) \[0, 1, 2, 3, 4, 5\] \(flattened index\)"):
            HFRewardModelWrapper(reward_model("llama"), inference_mode=True)(td)

    @pytest.mark.parametrize("mask", [True, False])
    def test_one_empty_row_among_others(self, mask):
        rows = [torch.tensor([5, 6]), torch.zeros(0, dtype=torch.long), torch.tensor([7])]
        td = lazy_td(rows) if mask else lazy_stack([TensorDict({TOKENS: r}) for r in rows])
        rm = HFRewardModelWrapper(reward_model("llama"), attention_mask_key=MASK if mask else None)
        with pytest.raises(ValueError, match=r"token_key=\('tokens', 'full'\).*row\(s\) \[1\]"):
            rm(td)

    def test_an_empty_text(self, tokenizer):
        td = TensorDict({"text": ["Hi", ""]}, batch_size=[2])
        rm = HFRewardModelWrapper(
            reward_model("llama"),
            input_mode="text",
            text_key="text",
            tokenizer=tokenizer,
            append_eos=False,
        )
        with pytest.raises(ValueError, match=r"text_key='text': row\(s\) \[1\] .* no token"):
            rm(td)
