"""Response parsing (reference and strict modes) and per-turn judging (spec 3.6, 3.7, 7.1 item 5)."""

import pytest

from chexpercept.answers import (
    STATUS_ANSWER,
    STATUS_BARE,
    STATUS_FINAL,
    STATUS_LOOSE,
    STATUS_NONE_TEXT,
    STATUS_UNPARSED,
    is_correct,
    oracle_answer_text,
    parse_answer,
)


@pytest.mark.parametrize(
    "text,indices,status",
    [
        ("Answer: 1", (1,), STATUS_ANSWER),
        ("I think...\nAnswer: 1, 3", (1, 3), STATUS_ANSWER),
        ("Answer: (2)", (2,), STATUS_ANSWER),
        ("answer:2\nAnswer: 4", (4,), STATUS_ANSWER),  # the last match wins
        ("<think>Answer: 1</think>Answer: 2", (2,), STATUS_ANSWER),
        ("\\boxed{3}", (3,), STATUS_BARE),
        ("The final answer is $2", (2,), STATUS_FINAL),
        ("4.", (4,), STATUS_BARE),
        ("1.5", (1, 5), STATUS_BARE),  # reference quirk kept in reference mode
        ("Answer: [2]", (2,), STATUS_LOOSE),  # found by the any-digit fallback
        ("**Answer:** 2", (2,), STATUS_LOOSE),
        ("The answer is 3", (3,), STATUS_LOOSE),
        ("zone 3 looks bad, answer 1", (3, 1), STATUS_LOOSE),  # every digit: the reference's weakness
        ("Answer: None", (-1,), STATUS_UNPARSED),
        ("", (-1,), STATUS_UNPARSED),
        (None, (-1,), STATUS_UNPARSED),
        ("<think>unterminated reasoning about option 2", (2,), STATUS_LOOSE),
        ("Answer: 1<unused94>", (1,), STATUS_ANSWER),
    ],
)
def test_reference_mode(text, indices, status):
    parsed = parse_answer(text)
    assert parsed.indices == indices
    assert parsed.status == status


def test_reference_pass1_string_is_kept():
    assert parse_answer("blah\nAnswer: 1, 3").text == "1,3"
    assert parse_answer("Yes, definitely").text == "Yes, definitely"


def test_glm_box_only_for_glm():
    text = "<|begin_of_box|>2<|end_of_box|>"
    assert parse_answer(text, model="glm-4v").status == STATUS_BARE
    assert parse_answer(text, model="glm-4v").indices == (2,)


@pytest.mark.parametrize(
    "text,indices,status",
    [
        ("Answer: 1", (1,), STATUS_ANSWER),
        ("Answer: [2]", (2,), STATUS_ANSWER),
        ("**Answer:** 2", (2,), STATUS_ANSWER),
        ("**Answer**: 2", (2,), STATUS_ANSWER),
        ("Answer - 2", (2,), STATUS_ANSWER),
        ("Answer: (1), (3)", (1, 3), STATUS_ANSWER),
        ("Answer: [1, 3]", (1, 3), STATUS_ANSWER),
        ("Answer: None", (6,), STATUS_NONE_TEXT),
        ("1.5", (-1,), STATUS_UNPARSED),
        ("zone 3 is involved", (-1,), STATUS_UNPARSED),
        ("<think>Answer: 1 ... never closed", (-1,), STATUS_UNPARSED),
        ("<think>x</think>\nAnswer: 4", (4,), STATUS_ANSWER),
        ("Answer: 2 because zone 3", (-1,), STATUS_UNPARSED),
        (None, (-1,), STATUS_UNPARSED),
    ],
)
def test_strict_mode(text, indices, status):
    parsed = parse_answer(text, mode="strict", none_index=6)
    assert (parsed.indices, parsed.status) == (indices, status)


def test_strict_none_without_none_option_is_unparsed():
    assert parse_answer("Answer: None", mode="strict").status == STATUS_UNPARSED


def test_judging():
    assert is_correct(parse_answer("Answer: 3,1"), [1, 3], multi_select=True)
    assert not is_correct(parse_answer("Answer: 1"), [1, 3], multi_select=True)
    assert is_correct(parse_answer("Answer: 2,1"), [2], multi_select=False)  # first number only (reference)
    assert not is_correct(parse_answer("Answer: 2,1", mode="strict"), [2], multi_select=False, mode="strict")
    assert not is_correct(parse_answer("garbage"), [1], multi_select=False)
    assert is_correct(parse_answer("Answer: None", mode="strict", none_index=4), [4], multi_select=True)


def test_oracle_text_sorted():
    assert oracle_answer_text([3, 1]) == "Answer: 1,3"
    assert oracle_answer_text([2]) == "Answer: 2"


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown parse mode"):
        parse_answer("Answer: 1", mode="lenient")
