"""Response parsing (reference and strict modes) and per-turn judging (spec 3.6, 3.7, 7.1 item 5)."""

import pytest

from chexpercept.answers import (
    STATUS_ANSWER,
    STATUS_BARE,
    STATUS_FINAL,
    STATUS_LOOSE,
    STATUS_NONE_TEXT,
    STATUS_REASONING,
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
        # the reference reads it; the status says it came from reasoning that never finished
        ("<think>unterminated reasoning about option 2", (2,), STATUS_REASONING),
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


# The reference's known weaknesses (spec 7.1 item 5): reference mode keeps its verdicts, strict
# mode reads them as a person would; neither crashes and both say how the answer was found.
@pytest.mark.parametrize(
    "text,reference,strict",
    [
        ("Answer: [2]", ((2,), STATUS_LOOSE), ((2,), STATUS_ANSWER)),
        ("**Answer:** 2", ((2,), STATUS_LOOSE), ((2,), STATUS_ANSWER)),
        ("Answer - 2", ((2,), STATUS_LOOSE), ((2,), STATUS_ANSWER)),
        ("Answer: (1), (3)", ((1,), STATUS_ANSWER), ((1, 3), STATUS_ANSWER)),  # reference: first only
        ("Answer: None", ((-1,), STATUS_UNPARSED), ((5,), STATUS_NONE_TEXT)),
        ("<think>zone 3, maybe 4 ... (max tokens)", ((3, 4), STATUS_REASONING), ((-1,), STATUS_UNPARSED)),
        ("1.5", ((1, 5), STATUS_BARE), ((-1,), STATUS_UNPARSED)),
        ("Zone 3 is clear; 1/3 of the lung. Answer: 2", ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        ("Zone 3 is clear; 1/3 of the lung, so 2", ((3, 1, 3, 2), STATUS_LOOSE), ((-1,), STATUS_UNPARSED)),
    ],
)
def test_reference_weaknesses_in_both_modes(text, reference, strict):
    ref = parse_answer(text, none_index=5)
    got = parse_answer(text, mode="strict", none_index=5)
    assert (ref.indices, ref.status) == reference
    assert (got.indices, got.status) == strict


@pytest.mark.parametrize(
    "text,indices,status",
    [
        ("reasoning about 3 options</think>\n\nAnswer: 2", (2,), STATUS_ANSWER),  # template opened <think>
        ("Answer:\n2", (2,), STATUS_ANSWER),  # answer on the next line
        ("Answer: 1 and 3", (1, 3), STATUS_ANSWER),
        ("Answer: 1, and 3", (1, 3), STATUS_ANSWER),
        ("Answer: Options 1, 3", (1, 3), STATUS_ANSWER),
        ("Answer: (2) No", (2,), STATUS_ANSWER),  # the option echoed after its number
        ("Answer: 2 (No)", (2,), STATUS_ANSWER),
        ("Final Answer: \\boxed{1,3}", (1, 3), STATUS_ANSWER),
        (
            "Answer: 2\n\nI am fairly sure the answer is likely correct.",
            (2,),
            STATUS_ANSWER,
        ),  # last valid one
        ("Answer: 1\nOn reflection, Answer: 3", (3,), STATUS_ANSWER),
        ("The answer is 4.", (4,), STATUS_ANSWER),
        ("Answer: None of the above (options 1-3)", (5,), STATUS_NONE_TEXT),
        ("Answer: (2) 2 zones", (2,), STATUS_ANSWER),  # an option text with digits, echoed
        ("Answer: 1.5", (-1,), STATUS_UNPARSED),
        ("<|begin_of_box|>Answer: 3<|end_of_box|>", (3,), STATUS_ANSWER),
        ("", (-1,), STATUS_UNPARSED),
    ],
)
def test_strict_mode_more_forms(text, indices, status):
    parsed = parse_answer(text, mode="strict", none_index=5)
    assert (parsed.indices, parsed.status) == (indices, status)


@pytest.mark.parametrize(
    "text", ["__Answer__: 2", "x_answer: 2", "Final Answer: 2", "banswer: 2", "**Answer**: 3 and 4"]
)
def test_strict_mode_reads_the_same_when_case_mapping_changes_the_length(text):
    """'İ'.lower() is two characters: the whole-text search must agree with the per-word path."""
    plain = parse_answer(text, mode="strict", none_index=5)
    shifted = parse_answer("İ " + text, mode="strict", none_index=5)
    assert (shifted.indices, shifted.status) == (plain.indices, plain.status)


def test_non_string_responses_and_memoisation():
    assert parse_answer(2).indices == (2,)  # a bare number from a JSON file
    first = parse_answer("Answer: 3", mode="strict")
    assert parse_answer("Answer: 3", mode="strict") is first
    assert parse_answer("Answer: None", mode="strict", none_index=4).indices == (4,)
    assert parse_answer("Answer: None", mode="strict", none_index=9).indices == (9,)
