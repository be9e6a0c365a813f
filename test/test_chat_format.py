"""``_chat_format``: the one renderer, on real models' templates (TRL's shipped ones).

What the rollout does with it is checked template by template in
``test/rollouts/test_template_conformance.py``; here, the renderer's own contract.
"""

from __future__ import annotations

import pytest
from trl.chat_template_utils import (
    gemma3_chat_template,
    llama3_1_chat_template,
    qwen2_5_chat_template,
    qwen3_5_think_chat_template,
    qwen3_chat_template,
)

from torchrl_trl_interop._chat_format import (
    ChatFormat,
    answer_turn,
    opening_of,
    template_name,
    torchrl_template,
)
from torchrl_trl_interop.testing import toy_template_tokenizer, toy_tokenizer

USER = {"role": "user", "content": "What is 2 plus 3?"}


class TestWhichTemplate:
    def test_the_tokenizers_own_by_default(self):
        tok = toy_template_tokenizer(llama3_1_chat_template)
        chat = ChatFormat.of(tok)
        assert chat.template == tok.chat_template
        assert chat.render([[USER]], add_generation_prompt=True) == [
            tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
        ]

    def test_a_named_one_wins(self):
        tok = toy_template_tokenizer(llama3_1_chat_template)
        chat = ChatFormat.of(tok, chat_template_name="chatml_format")
        assert chat.template == torchrl_template("chatml_format") != tok.chat_template
        assert chat.name == "torchrl's 'chatml_format' template"
        given = ChatFormat.of(tok, chat_template=qwen2_5_chat_template)
        assert given.name == "TRL's qwen2_5.jinja"

    def test_template_kwargs_reach_every_render(self):
        tok = toy_template_tokenizer(qwen3_chat_template)
        thinking = ChatFormat.of(tok).render([[USER]], add_generation_prompt=True)[0]
        quiet = ChatFormat.of(tok, template_kwargs={"enable_thinking": False})
        assert quiet.render([[USER]], add_generation_prompt=True)[0] == thinking + (
            "<think>\n\n</think>\n\n"
        )

    def test_built_once_per_tokenizer_and_template(self):
        tok = toy_tokenizer()
        assert ChatFormat.of(tok) is ChatFormat.of(tok)
        assert ChatFormat.of(tok) is not ChatFormat.of(tok, template_kwargs={"x": 1})
        tok.chat_template = qwen2_5_chat_template  # the tokenizer's template changed
        assert ChatFormat.of(tok).template == qwen2_5_chat_template

    def test_no_template_is_refused(self):
        tok = toy_tokenizer()
        tok.chat_template = None
        with pytest.raises(ValueError, match="has no chat template"):
            ChatFormat.of(tok)
        with pytest.raises(ValueError, match="not one of torchrl's chat templates"):
            ChatFormat.of(toy_tokenizer(), chat_template_name="nonexistent")

    def test_template_name(self):
        assert template_name(gemma3_chat_template) == "TRL's gemma3.jinja"
        assert "name_or_path" not in template_name("{{ x }}", toy_tokenizer())


class TestAnswers:
    @pytest.mark.parametrize(
        "template, closing, stop",
        [
            (qwen2_5_chat_template, "<|im_end|>\n", "<|im_end|>"),
            (llama3_1_chat_template, "<|eot_id|>", "<|eot_id|>"),
            (gemma3_chat_template, "<end_of_turn>\n", "<end_of_turn>"),
        ],
    )
    def test_the_templates_own_markers(self, template, closing, stop):
        tok = toy_template_tokenizer(template, eos_token="<eos>")  # eos is not the turn's end
        chat = ChatFormat.of(tok)
        assert chat.turn_closing == closing
        assert chat.end_of_turn_id == tok.convert_tokens_to_ids(stop)
        ids = chat.encode([f"It is 5.{stop}"])[0]
        assert chat.answer(ids) == ("It is 5.", True)
        assert chat.answer(ids[:-1]) == ("It is 5.", False)  # cut short: no stop token

    def test_several_stop_ids(self):
        tok = toy_template_tokenizer(llama3_1_chat_template)
        tok.add_special_tokens(
            {"additional_special_tokens": ["<|end_of_text|>"]}, replace_extra_special_tokens=False
        )
        end_of_text = tok.convert_tokens_to_ids("<|end_of_text|>")
        chat = ChatFormat.of(tok)
        ids = chat.encode(["5<|end_of_text|>"])[0]
        assert chat.answer(ids) == ("5<|end_of_text|>", False)  # not a stop unless told
        assert chat.answer(ids, [end_of_text]) == ("5", True)
        assert chat.stop_ids([end_of_text]) == [tok.eos_token_id, end_of_text]

    def test_a_reasoning_block_the_prompt_opened_is_the_answers(self):
        tok = toy_template_tokenizer(qwen3_5_think_chat_template)
        chat = ChatFormat.of(tok)
        prompt = chat.prompt_ids([[USER]])[0]
        ids = chat.encode(["Adding.\n</think>\n\n5<|im_end|>"])[0]
        content, ended = chat.answer(ids, prompt_ids=prompt)
        assert ended and content == "<think>\nAdding.\n</think>\n\n5"
        again = tok.apply_chat_template(
            [USER, {"role": "assistant", "content": content}], tokenize=False
        )
        sampled = tok.decode(prompt + ids, skip_special_tokens=False)
        assert again.startswith(sampled)  # the template renders it as it was sampled

    def test_a_batch_reads_as_each_answer_on_its_own(self):
        tok = toy_template_tokenizer(qwen3_5_think_chat_template)
        chat = ChatFormat.of(tok)
        prompts = chat.prompt_ids([[USER], [{"role": "user", "content": "Hi"}]])
        rows = chat.encode(["Adding.\n</think>\n\n5<|im_end|>", "Hello and"])
        one_by_one = [chat.answer(r, prompt_ids=p) for r, p in zip(rows, prompts)]
        assert chat.answers(rows, prompt_ids=prompts) == one_by_one
        assert chat.answers(rows) == [chat.answer(r) for r in rows]

    @pytest.mark.parametrize("clean_up", [False, True])
    def test_decode_is_the_tokenizers(self, clean_up):
        """Through the Rust backend where the tokenizer's decode is only that, else through the
        tokenizer (spaces cleaned up): the same text either way."""
        from torchrl_trl_interop._chat_format import _decodes_in_backend

        tok = toy_tokenizer()
        tok.clean_up_tokenization_spaces = clean_up
        chat = ChatFormat.of(tok)
        rows = chat.encode(["2 + 3 = 5<|im_end|>", "<|im_start|>user\nHi ,<|im_end|>"]) + [[]]
        assert _decodes_in_backend(tok) is not clean_up
        for skip in (False, True):
            expected = tok.batch_decode(rows, skip_special_tokens=skip)
            assert chat.decode(rows, skip_special_tokens=skip) == expected

    def test_encode_is_the_tokenizers(self):
        """Through the Rust backend where the tokenizer's call is only that, else through the
        tokenizer (a backend left padding, special tokens split): the same ids either way."""
        from torchrl_trl_interop._chat_format import _encodes_in_backend

        tok = toy_tokenizer()
        chat = ChatFormat.of(tok)
        texts = ["<|im_start|>user\nHi ,<|im_end|>\n", "2 + 3 = 5<|im_end|>"]
        assert _encodes_in_backend(tok)
        assert chat.encode(texts) == tok(texts, add_special_tokens=False)["input_ids"]
        tok(texts, padding=True)  # leaves the backend padding
        assert not _encodes_in_backend(tok)
        assert chat.encode(texts) == tok(texts, add_special_tokens=False)["input_ids"]
        assert _encodes_in_backend(tok)  # the tokenizer's call reset it
        tok.split_special_tokens = True
        assert not _encodes_in_backend(tok)
        split = chat.encode(texts)
        assert split == tok(texts, add_special_tokens=False)["input_ids"]
        assert split[1] != tok(texts[1], split_special_tokens=False)["input_ids"]

    def test_a_group_of_equal_rows_reads_as_each_row(self):
        """GRPO's groups (equal prompts in a row) are rendered, encoded and decoded once per
        run: the same texts and ids as the tokenizer's batch calls, each row its own list."""
        tok = toy_tokenizer()
        chat = ChatFormat.of(tok)
        other = {"role": "user", "content": "Hi"}
        chats = [[USER], [USER], [other], [USER], [USER], [USER]]
        texts = chat.render(chats, add_generation_prompt=True)
        assert texts == tok.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        ids = chat.encode(texts)
        assert ids == tok(texts, add_special_tokens=False)["input_ids"]
        assert len({id(row) for row in ids}) == len(ids)  # changing one changes no other
        assert chat.decode(ids) == tok.batch_decode(ids, skip_special_tokens=False)

    def test_runs_of_values_without_a_truth_value(self):
        """Values whose ``==`` is not a bool (an array inside a message) count as distinct."""
        import numpy as np

        from torchrl_trl_interop._chat_format import _each_distinct, _runs

        arrays = [{"image": np.zeros(2)}, {"image": np.zeros(2)}]
        assert _runs(arrays) == (arrays, [0, 1])
        assert _runs([1, 1, 2, 1]) == ([1, 2, 1], [0, 0, 1, 2])
        assert _each_distinct([[1], [1]], list) == [[1], [1]]

    def test_opening_of(self):
        assert opening_of("<|im_start|>assistant\n<think>\n") == "<think>\n"
        assert opening_of("<think>\nx</think>\n\n") == ""

    def test_answer_turn_is_a_history_turn(self):
        from torchrl_trl_interop import history_to_messages

        turn = answer_turn("5", True)
        assert turn.batch_size == (1,)
        assert history_to_messages(turn) == [{"role": "assistant", "content": "5"}]


class TestBetweenTurns:
    def test_what_the_template_writes_after_an_answer(self):
        tok = toy_template_tokenizer(llama3_1_chat_template)
        chat = ChatFormat.of(tok)
        turns = [USER, {"role": "assistant", "content": "5"}, {"role": "tool", "content": "ok"}]
        sampled = chat.encode(["5<|eot_id|>"])
        (added,) = chat.added_after([turns], [1], sampled)
        full = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        prompt = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
        assert full == prompt + "5<|eot_id|>" + added  # the whole rendering, in three parts

    def test_an_answer_cut_short_gets_the_whole_closing(self):
        tok = toy_template_tokenizer(qwen2_5_chat_template)
        chat = ChatFormat.of(tok)
        turns = [USER, {"role": "assistant", "content": "5"}, {"role": "user", "content": "?"}]
        (added,) = chat.added_after([turns], [1], chat.encode(["5"]))
        assert added.startswith("<|im_end|>\n<|im_start|>user\n?")


class TestRefusals:
    def test_a_role_the_template_raises_on(self):
        chat = ChatFormat.of(toy_template_tokenizer(gemma3_chat_template))
        with pytest.raises(ValueError, match=r"TRL's gemma3\.jinja cannot render a 'tool' turn"):
            chat.check_roles(["tool"])
        chat.check_roles(["user"])  # Gemma 3 renders user replies

    def test_a_role_the_template_drops(self):
        from trl.chat_template_utils import phi3_chat_template

        chat = ChatFormat.of(toy_template_tokenizer(phi3_chat_template))
        with pytest.raises(ValueError, match=r"phi3\.jinja drops the content of a 'tool' turn"):
            chat.check_roles(["tool"])

    def test_several_turns_take_trls_training_variant_where_the_own_one_fails(self):
        from trl.chat_template_utils import qwen3_training_chat_template

        chat = ChatFormat.of(toy_template_tokenizer(qwen3_chat_template))
        assert chat.for_turns(["tool"]) is chat  # past reasoning kept after tool turns
        assert chat.turn_problem(["user"]) is not None  # dropped after a user turn
        assert chat.for_turns(["user"]).template == qwen3_training_chat_template

    def test_several_turns_refused_without_a_variant_that_renders_them(self):
        from trl.chat_template_utils import deepseekv3_chat_template

        chat = ChatFormat.of(toy_template_tokenizer(deepseekv3_chat_template))
        with pytest.raises(
            ValueError, match=r"deepseekv3\.jinja cannot render a rollout of several"
        ):
            chat.for_turns(["tool"])

    def test_a_render_refused_names_the_template_and_the_roles(self):
        from trl.chat_template_utils import gemma_chat_template

        chat = ChatFormat.of(toy_template_tokenizer(gemma_chat_template))
        system = {"role": "system", "content": "Be brief."}
        with pytest.raises(ValueError, match=r"gemma\.jinja cannot render.*'system', 'user'"):
            chat.render([[system, USER]], add_generation_prompt=True)


@pytest.mark.parametrize("adds_bos", [False, True])
def test_bos_written_once(adds_bos):
    """bos written by the template, and by the tokenizer too (Llama's): once in the prompt."""
    tok = toy_template_tokenizer(llama3_1_chat_template, adds_bos=adds_bos)
    ids = ChatFormat.of(tok).prompt_ids([[USER]])[0]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert ids == tok.apply_chat_template([USER], add_generation_prompt=True, return_dict=False)
    if adds_bos:  # the tokenizer would add a second one to text it tokenizes itself
        text = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
        assert tok(text)["input_ids"].count(tok.bos_token_id) == 2
