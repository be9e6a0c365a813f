"""The tutorial's toy task: questions, the sloppy teacher, the reward, readability, set-up."""

from __future__ import annotations

import os
import warnings

import pytest

from torchrl_trl_interop.testing import (
    arithmetic_chats,
    arithmetic_questions,
    correct_answer,
    demo_setup,
    parse_question,
    printable_share,
    worked_answer,
)


def test_questions_cover_every_pair():
    questions = arithmetic_questions(max_operand=4)
    assert len(questions) == len(set(questions)) == 25
    assert {parse_question(q) for q in questions} == {(a, b) for a in range(5) for b in range(5)}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_questions_bad_max_operand(bad):
    with pytest.raises(ValueError, match="max_operand"):
        arithmetic_questions(max_operand=bad)


def test_parse_question_names_the_form():
    with pytest.raises(ValueError, match="What is a plus b"):
        parse_question("How are you?")


@pytest.mark.parametrize("accuracy", [0.0, 0.3, 1.0])
def test_teacher_accuracy_and_slip(accuracy):
    chats = arithmetic_chats(400, accuracy=accuracy, system_prompt="Be brief.", seed=1)
    assert all([m["role"] for m in c] == ["system", "user", "assistant"] for c in chats)
    right = correct_answer([c[:-1] for c in chats], [c[-1:] for c in chats])
    assert abs(sum(right) / len(chats) - accuracy) < 0.08
    for chat, ok in zip(chats, right):
        a, b = parse_question(chat[1]["content"])
        slip = worked_answer(a, b, f"{a}{b}")
        assert chat[-1]["content"] == (worked_answer(a, b) if ok else slip)
    assert arithmetic_chats(5, seed=3) == arithmetic_chats(5, seed=3)


def test_teacher_bad_accuracy():
    with pytest.raises(ValueError, match="accuracy"):
        arithmetic_chats(2, accuracy=1.5)


def test_correct_answer_formats():
    """Strings and TRL message lists; the last number counts; '03' is not 3; unknown prompts 0."""
    prompt = [{"role": "system", "content": "What is 9 plus 9?"}]
    prompt += [{"role": "user", "content": "What is 0 plus 3?"}]
    answers = ["0 plus 3 is 3.", "0 plus 3 is 03.", "3, no: 4", "three"]
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    assert correct_answer([prompt] * 4, completions) == [1.0, 0.0, 0.0, 0.0]
    assert correct_answer(["What is 2 plus 2?", "Hi"], ["4", "4"]) == [1.0, 0.0]


def test_printable_share():
    assert printable_share(["abc", "\x00"]) == 0.75
    assert printable_share([]) == 0.0


def test_demo_setup_keeps_user_settings(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "svg")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert demo_setup(seed=0) is True  # not under sphinx-gallery
        warnings.warn("You are using 'rollout_func', experimental", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]
    assert os.environ["MPLBACKEND"] == "svg" and os.environ["HF_HUB_OFFLINE"] == "1"
