"""Replies as real models write them (issue: field cases 1 and 2), each with its right value.

Reasoning markup of every model family of the registry (chexpercept.reasoning.FAMILIES) and the
decorations people and models put around an answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chexpercept.answers import (
    PARSE_STATUSES,
    STATUS_ANSWER,
    STATUS_LOOSE,
    STATUS_REASONING,
    STATUS_UNPARSED,
    parse_answer,
)
from chexpercept.eval.registry import REGISTRY
from chexpercept.reasoning import FAMILIES, family_of, remove_reasoning

MEDGEMMA_FINISHED = "<unused94>thought\nDraft: Answer: 1\nThe costophrenic angle is sharp.<unused95>Answer: 2"
MEDGEMMA_CUT = "<unused94>thought\nDraft: Answer: 1\nWait, the left angle looks sharp, so"
QWEN_CUT = "<think>\nDraft: Answer: 1\nWait, the left costophrenic angle is sharp, so"


@pytest.mark.parametrize(
    "text,strict,reference",
    [
        # the three inputs
        (MEDGEMMA_FINISHED, ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        (MEDGEMMA_CUT, ((-1,), STATUS_UNPARSED), ((1,), STATUS_REASONING)),
        (QWEN_CUT, ((-1,), STATUS_UNPARSED), ((1,), STATUS_REASONING)),
        # siblings: every family's markup, finished and cut off
        ("Draft: Answer: 1\nhmm</think>\n\nAnswer: 2", ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        (
            "Draft: Answer: 1\nhmm</think>\n\nI cannot tell.",
            ((-1,), STATUS_UNPARSED),
            ((1,), STATUS_REASONING),
        ),
        ("Draft: Answer: 1 then more thinking", ((-1,), STATUS_UNPARSED), ((1,), STATUS_ANSWER)),  # no markup
        ("<|channel>thought\nAnswer: 1<channel|>Answer: 2", ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        ("<|channel>thought\nAnswer: 1 but wait", ((-1,), STATUS_UNPARSED), ((1,), STATUS_REASONING)),
        (
            "<think>Answer: 1</think><|begin_of_box|>2<|end_of_box|>",
            ((2,), STATUS_ANSWER),
            ((2,), STATUS_LOOSE),
        ),
        ("<thought>Answer: 1</thought>Answer: 2", ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        ("<thought>Answer: 1, still thinking", ((-1,), STATUS_UNPARSED), ((1,), STATUS_REASONING)),
        # a complete <think> block is the reference's own rule: nothing to flag
        ("<think>Answer: 1</think>Answer: 2", ((2,), STATUS_ANSWER), ((2,), STATUS_ANSWER)),
        # reasoning that changes nothing is not flagged
        (
            "<unused94>thought\nThe angle is sharp.<unused95>Answer: 2",
            ((2,), STATUS_ANSWER),
            ((2,), STATUS_ANSWER),
        ),
    ],
)
def test_reasoning_markup_of_every_family(text, strict, reference):
    got_strict = parse_answer(text, mode="strict", none_index=6)
    got_reference = parse_answer(text, none_index=6)
    assert (got_strict.indices, got_strict.status) == strict
    assert (got_reference.indices, got_reference.status) == reference


@pytest.mark.parametrize(
    "text",
    [
        # the inputs
        "Answer: $2$",
        "Answer: 2. No",
        "Answer: 2 - No",
        "\\boxed{2}",
        "<|begin_of_box|>2<|end_of_box|>",
        # siblings: punctuation, markup, maths and answer boxes around a valid index
        "Answer: \\(2\\)",
        "Answer: \\[2\\]",
        "Answer: $\\boxed{2}$",
        "Answer: \\boxed{2}",
        "Answer: \\text{2}",
        "Answer: **2**",
        "**Answer: 2**",
        "Answer: `2`",
        "Answer: 2.",
        "Answer: 2: No",
        "Answer: 2) No",
        "Answer: 2 \u2013 No",
        "Answer: Option 2: No",
        "Answer: (2) No",
        "Answer: 2 (No)",
        "Answer\uff1a2",  # full-width colon (Qwen, GLM, Hulu-Med, Lingshu answer in Chinese punctuation)
        "Answer: \uff12",  # full-width digit
        "<answer>2</answer>",  # GLM-4.1V-Thinking
        "The final answer is \\boxed{2}.",
        "Answer:\n<|begin_of_box|>2<|end_of_box|>",
        # found by a tester: option texts that hold digits, echoed; other phrasings and endings
        "Answer: (2) 2 zones",
        "Answer: 2. 2 zones",
        "Answer: 2 (2nd mask)",
        "Answer: 2 (Less than 1/3 of the right lung area)",
        "Answer: 2 (The lesion is present in only one lung (left or right).)",
        "The answer is: 2",
        "Answer is: 2",
        "The correct answer is: (2) No",
        "Answer: 2\r\n",
        "Answer:\r\n2",
        "Answer: 2,",
        "Answer: 2!",
        "Answer: 2\u3002",
        "Answer: \uff12\uff0e No",
        "Answer:\u200b2",
        "Answer: 2<|im_end|>",
        "Answer: 2<end_of_turn>",
        "Answer: 2</s>",
        "Answer: 2 <eos>",
    ],
)
def test_decorations_around_a_valid_index_read_2(text):
    parsed = parse_answer(text, mode="strict", none_index=6, model="glm-4.6v")
    assert (parsed.indices, parsed.status) == ((2,), STATUS_ANSWER)


@pytest.mark.parametrize(
    "text",
    [
        "Answer: 2 or 3",
        "Answer: 2 (or 3)",
        "Answer: 2. or 3",
        "Answer: 2 - maybe 3",
        "Answer: 2 - 3",
        "\\boxed{2 or 3}",
        "Answer: $2$ or $3$",
        "Answer: 2.5",
        "<|begin_of_box|>maybe 2<|end_of_box|>",
        "Answer: between 2 and 3",
    ],
)
def test_ambiguous_text_is_still_refused(text):
    assert parse_answer(text, mode="strict", none_index=6).status == STATUS_UNPARSED


def test_multi_select_answers_in_boxes():
    assert parse_answer("\\boxed{1, 3}", mode="strict").indices == (1, 3)
    assert parse_answer("Answer: $1, 3$", mode="strict").indices == (1, 3)
    assert parse_answer("Answers: 1, 3", mode="strict").indices == (1, 3)
    assert parse_answer("Answer: 1 (Left upper zone), 3 (Right lower zone)", mode="strict").indices == (1, 3)


@pytest.mark.parametrize(
    "text",
    [
        "Answer: " + ", ".join(str(i) for i in range(1, 23)) + ", etc",
        "Answer: " + "1, " * 66666,
        "Answer: " + "1 and " * 22,
        "Answer: " + "1 , " * 20 + "x",
        "Answer:\n" * 25000,
        "Answer: 1" + "0" * 5000,
        "The answer is 1" + "1" * 4301,
    ],
)
def test_runaway_replies_are_read_quickly_and_never_raise(text):
    """A model looping until the token limit: linear time and no crash (Python refuses int() of more
    than 4,300 digits; such a number names no option and reads as -1)."""
    import time

    for mode in ("strict", "reference"):
        start = time.perf_counter()
        parsed = parse_answer(text, mode=mode)
        assert time.perf_counter() - start < 2.0, mode
        assert all(-1 <= i < 10**18 for i in parsed.indices)


def test_every_registry_model_has_a_family():
    for spec in REGISTRY.values():
        family = family_of(spec.model_id)
        assert family is not None, spec.name
        assert family_of(spec.name) == family and family_of(spec.reference_alias) == family
    assert family_of("google/medgemma-1.5-4b-it").name == "medgemma"
    assert family_of("google/gemma-4-31B-it").name == "gemma4"
    assert family_of("o3-mini").name == "gpt-5" and family_of("my-o3-model") is None
    assert family_of("") is None


def test_remove_reasoning():
    assert remove_reasoning("a<think>b</think>c<think>d") == "ac"
    assert remove_reasoning("before</think>after") == "after"
    assert remove_reasoning("x<unused94>thought y<unused95>z") == "xz"


def test_reasoning_status_is_a_parse_status():
    assert STATUS_REASONING in PARSE_STATUSES


def test_the_scoring_page_lists_the_markers_of_every_family():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "scoring.md").read_text()
    section = readme.split("**Reasoning markup per model family**", 1)[1].split("\n\n", 2)[1]
    for family in FAMILIES:
        row = next((line for line in section.splitlines() if line.startswith(f"| {family.name} |")), None)
        assert row is not None, family.name
        row = row.replace("\\|", "|")  # markdown tables escape the pipes of GLM's and Gemma 4's markers
        for open_marker, close_marker in family.reasoning:
            assert f"`{open_marker}`" in row and f"`{close_marker}`" in row, family.name
        for open_marker, close_marker in family.answer_boxes:
            assert f"`{open_marker}n{close_marker}`" in row, family.name
