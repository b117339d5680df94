"""Parsing model responses into option indices, and judging them against the gold answer.

Two modes:

``reference`` (default) reproduces the reference implementation's two passes (spec 3.6) so that
numbers match the paper: pass 1 extracts ``Answer: ...``-style digits from the raw text, pass 2
normalises what is left and, as a last resort, takes every digit run in the text.

``strict`` counts only the last valid answer statement outside reasoning: ``Answer ...`` or an
answer box (``\\boxed{2}``, GLM's ``<|begin_of_box|>2<|end_of_box|>``, ``<answer>2</answer>``). It
understands ``Answer: [2]``, ``**Answer:** 2``, ``Answer - 2``, ``Answer: (1), (3)``,
``Answer: 1 and 3``, ``Answer: $2$``, ``Answer: \\(2\\)``, ``Answer：２`` (full-width), an index
echoed with its option (``Answer: (2) No``, ``Answer: 2. No``, ``Answer: 2 - No``) and maps
``Answer: None`` to the question's None option. Reasoning is ignored for every model family of
``chexpercept.reasoning`` (``<think>``, MedGemma's ``<unused94>``, Gemma 4's channels...): complete
blocks, everything after a block that was never closed (a reply cut off by the token limit) and
everything before a lone close marker (templates that open the block in the prompt). Digits
elsewhere in the text never count. Anything else is unparsed (and wrong), and a single-choice
question answered with several numbers is wrong.

In reference mode an answer that the reference's parser reads from inside reasoning it does not
recognise or that never finished (MedGemma's thoughts, a cut-off ``<think>``) keeps the reference's
value, so that numbers match the paper, but gets the status ``reasoning``, so that such answers
can be counted.

Neither mode raises on odd input (None, an unterminated ``<think>``, "1.5", markdown); each result
carries a parse status so that parse failures can be counted per task.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from .reasoning import ALL_BOXES, BOXED, has_reasoning_markup, remove_reasoning

ParseMode = Literal["reference", "strict"]
PARSE_MODES: tuple[str, ...] = ("reference", "strict")

#: statuses, from cleanest to loosest
STATUS_ANSWER = "answer"  # an "Answer: n" statement
STATUS_FINAL = "final_answer"  # "final answer ... n"
STATUS_BARE = "bare"  # the whole reply is numbers
STATUS_LOOSE = "loose"  # reference pass-2 fallbacks ("answer is n", last digit line, any digits)
STATUS_NONE_TEXT = "none_text"  # strict: "Answer: None" mapped to the None option
STATUS_REASONING = "reasoning"  # reference: read from inside unfinished or unrecognised reasoning
STATUS_UNPARSED = "unparsed"  # nothing usable: scored as -1 (wrong)
PARSE_STATUSES: tuple[str, ...] = (
    STATUS_ANSWER,
    STATUS_FINAL,
    STATUS_BARE,
    STATUS_LOOSE,
    STATUS_NONE_TEXT,
    STATUS_REASONING,
    STATUS_UNPARSED,
)

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)  # the reference's own reasoning rule
_UNUSED = re.compile(r"<unused\d+>")
_BOXED = re.compile(r"\\boxed\{([\d,\s]*)\}")
_GLM_BOX = re.compile(r"<\|begin_of_box\|>(.*?)<\|end_of_box\|>", re.DOTALL)
_ANSWER = re.compile(r"[Aa]nswer\s*:\s*\(?(\d+(?:\s*,\s*\d+)*)\)?")
_FINAL = re.compile(r"final answer[^$\d]*\$?(\d+(?:\s*,\s*\d+)*)", re.IGNORECASE | re.DOTALL)
_ONLY_NUMBERS = re.compile(r"[\d,\s.]+")
_ANSWER_IS = re.compile(r"answers?\s+(?:is|are)\s*[:\-]?\s*(\d+(?:\s*,\s*\d+)*)", re.IGNORECASE)
_DIGIT_LINE = re.compile(r"[\d,\s]+")
_DIGITS = re.compile(r"\d+")
_SIGNED_INT = re.compile(r"-?\d+")
_MAX_DIGITS = 18

# strict mode: "answer" (any case, optional markdown), a separator, then the answer text on that
# line; matched at each place the word starts (markdown before it does not matter)
_STRICT_FROM = re.compile(
    r"answers?(?:\*\*|__)?[ \t]*(?:\bis\b[ \t]*:?|:|-|=)[ \t]*(?:\*\*|__)?[ \t]*([^\n]*)", re.IGNORECASE
)
#: the same as one search, for text whose case mapping changes its length: "answer" not preceded
#: by a letter or digit, as _strict_statements checks on the fast path
_STRICT = re.compile(r"(?<![^\W_])" + _STRICT_FROM.pattern, re.IGNORECASE)
# The body of a statement is read after _compact (single spaces, none inside brackets or before a
# comma), so that the patterns below match in one way only: no backtracking blow-up on a long
# reply that repeats "1, 1, 1, ...". Indices have at most 4 digits (a question has at most 9 options).
_STRICT_ITEM = r"(?:\(\d{1,4}\)|\[\d{1,4}\]|\d{1,4})(?: ?\([^()\d]*\))?"
_STRICT_LIST = re.compile(
    r"(?:options? )?(?:\[|\()?"
    + _STRICT_ITEM
    + r"(?:(?:, ?and |, ?| and | ?& ?)"
    + _STRICT_ITEM
    + r")*(?:\]|\))?",
    re.IGNORECASE,
)
#: an index echoed with its option's text, which may hold digits ("(2) 2 zones", "2. No",
#: "2 - No", "Option 2: No", "1 (Less than 1/3 of the right lung area)"); the text must hold a word
#: and must not hedge ("2 - 3", "2. or 3" are refused)
_STRICT_ECHO = re.compile(
    r"(?:options? )?(?:\((\d{1,4})\) ?|(\d{1,4}) ?[.:)\-\u2013\u2014] ?|(\d{1,4}) ?(?=\())(.+)",
    re.IGNORECASE,
)
_HEDGE = re.compile(r"\(?(?:or|and|maybe|possibly|perhaps)\b|/", re.IGNORECASE)
_LETTER = re.compile(r"[^\W\d_]{2}")
#: maths and markup around an answer: $2$, \(2\), \[2\], \text{2}, \mathbf{2}
_STRICT_MATH = re.compile(r"\\(?:text|mathrm|mathbf|textbf)\{([^{}]*)\}")
_STRICT_MATH_DELIMS = re.compile(r"\$+|\\[()\[\]]")
#: special tokens left at the end of a line (<|im_end|>, <end_of_turn>, </s>, <eos>, <turn|>)
_TRAILING_TOKENS = re.compile(r"(?:[ \t]*<[|/]?[A-Za-z_]{1,30}\|?>)+[ \t]*$")
_STRICT_NONE = re.compile(r"[\[\(]?[ \t]*none\b", re.IGNORECASE)
_STRICT_TRIM = " \t\r*_`.;,!\u3002\u200b\ufeff"
_NEXT_TEXT = re.compile(r"\S")


@dataclass(frozen=True)
class ParsedAnswer:
    """The option indices read from a response, and how they were found."""

    indices: tuple[int, ...]
    status: str
    #: the reference's pass-1 string (what its all_results.json stores as the response)
    text: str

    @property
    def parsed(self) -> bool:
        return self.status != STATUS_UNPARSED


def strip_thinking(text: str) -> str:
    """The reference's rule: remove complete <think>...</think> blocks and <unusedNN> tokens."""
    if "<think>" in text:
        text = _THINK.sub("", text)
    return _UNUSED.sub("", text) if "<unused" in text else text


def _unbox(text: str) -> str:
    return _BOXED.sub(lambda m: m.group(1), text) if "\\boxed{" in text else text


def _unwrap_glm(text: str) -> str:
    return _GLM_BOX.sub(lambda m: m.group(1), text) if "<|begin_of_box|>" in text else text


def reference_pass1(response: str | None, *, model: str = "") -> tuple[str, str]:
    """Pass 1 of the reference (INF parse_response): returns (string, status)."""
    text = response or ""
    if "glm" in model.lower():
        text = _unwrap_glm(text)
    text = _unbox(strip_thinking(text))
    matches = _ANSWER.findall(text)
    if matches:
        return ",".join(_DIGITS.findall(matches[-1])), STATUS_ANSWER
    m = _FINAL.search(text)
    if m:
        return ",".join(_DIGITS.findall(m.group(1))), STATUS_FINAL
    stripped = text.strip()
    if stripped and _ONLY_NUMBERS.fullmatch(stripped):
        return ",".join(_DIGITS.findall(stripped)), STATUS_BARE
    return stripped, STATUS_LOOSE


def reference_pass2(parsed: str) -> tuple[list[int], bool]:
    """Pass 2 of the reference (SCO normalize_response + extract_int): (ints, found_any)."""
    if not parsed:
        return [-1], False
    text = strip_thinking(parsed.strip())
    m = _ANSWER_IS.search(text)
    if m:
        digits = ",".join(_DIGITS.findall(m.group(1)))
    else:
        digits = ""
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line and _DIGIT_LINE.fullmatch(line) and _DIGITS.search(line):
                digits = ",".join(_DIGITS.findall(line))
                break
        if not digits:
            digits = ",".join(_DIGITS.findall(text))
    if not digits:
        return [-1], False
    out = []
    for piece in digits.split(","):
        m2 = _SIGNED_INT.search(piece)
        # a runaway reply can hold a digit run too long for int() (Python refuses > 4300 digits);
        # any number that long names no option: -1, as the reference's "nothing usable"
        out.append(int(m2.group(0)) if m2 and len(m2.group(0)) <= _MAX_DIGITS else -1)
    return out, True


def parse_answer(
    response: str | None,
    *,
    mode: ParseMode = "reference",
    none_index: int | None = None,
    model: str = "",
) -> ParsedAnswer:
    """Read option indices from a raw model response.

    none_index: the 1-based index of the question's None option, if it has one (points: the last
    option; location: 4); strict mode maps a textual ``None`` answer to it.
    model: the model's name; reference mode unwraps GLM's answer box only when it contains "glm".
    Results are memoised (scoring re-parses many identical short answers).
    """
    if mode not in PARSE_MODES:
        raise ValueError(f"unknown parse mode {mode!r}; expected one of {PARSE_MODES}")
    if response is not None and not isinstance(response, str):
        response = str(response)
    return _parse_cached(response or "", mode, none_index, "glm" in model.lower())


@lru_cache(maxsize=1 << 16)
def _parse_cached(response: str, mode: str, none_index: int | None, glm: bool) -> ParsedAnswer:
    model = "glm" if glm else ""
    pass1, status = reference_pass1(response, model=model)
    if mode == "reference":
        ints, found = reference_pass2(pass1)
        if not found:
            return ParsedAnswer((-1,), STATUS_UNPARSED, pass1)
        if has_reasoning_markup(response) and _reference_ints(remove_reasoning(response), model) != ints:
            status = STATUS_REASONING  # the reference's answer depends on text inside reasoning
        return ParsedAnswer(tuple(ints), status, pass1)
    return _parse_strict(response, none_index=none_index, pass1=pass1)


def _reference_ints(text: str, model: str) -> list[int]:
    """The reference's reading of a text ([-1] when it finds nothing)."""
    return reference_pass2(reference_pass1(text, model=model)[0])[0]


def strict_visible_text(response: str) -> str:
    """The part of a response strict mode reads: every family's reasoning removed (see
    ``chexpercept.reasoning``), full-width forms folded (NFKC), each answer box turned into an
    ``Answer:`` statement of its own."""
    text = remove_reasoning(response)
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    if "\\boxed{" in text or "<" in text:
        for open_marker, close_marker in ALL_BOXES:
            text = text.replace(open_marker, "\nAnswer: ").replace(close_marker, "\n")
        text = BOXED.sub(lambda m: "\nAnswer: " + m.group(1) + "\n", text)
    return _UNUSED.sub("", text) if "<unused" in text else text


def _parse_strict(response: str, *, none_index: int | None, pass1: str) -> ParsedAnswer:
    text = strict_visible_text(response)
    candidates: list[str] = []
    for m in _strict_statements(text):
        body = m.group(1).strip(_STRICT_TRIM)
        if not body:  # "Answer:" with the answer on the next non-empty line
            nxt = _NEXT_TEXT.search(text, m.end())
            if nxt is not None:
                end = text.find("\n", nxt.start())
                body = text[nxt.start() : end if end != -1 else len(text)].strip(_STRICT_TRIM)
        candidates.append(body)
    for body in reversed(candidates):
        indices = _strict_body(body, none_index)
        if indices is not None:
            status = (
                STATUS_NONE_TEXT if indices == (none_index,) and _STRICT_NONE.match(body) else STATUS_ANSWER
            )
            return ParsedAnswer(indices, status, pass1)
    return ParsedAnswer((-1,), STATUS_UNPARSED, pass1)


def _strict_statements(text: str) -> list[re.Match[str]]:
    """Every "answer <separator> ..." statement, found from the word's positions (fast on long text)."""
    lower = text.lower()
    if len(lower) != len(text):  # case mapping changed the length: positions would not line up
        return list(_STRICT.finditer(text))
    out = []
    i = lower.find("answer")
    while i >= 0:
        if i == 0 or not text[i - 1].isalnum():
            m = _STRICT_FROM.match(text, i)
            if m:
                out.append(m)
        i = lower.find("answer", i + 6)
    return out


def _compact(body: str) -> str:
    """Single spaces; none just inside brackets or before a comma (see _STRICT_LIST)."""
    body = " ".join(body.split())
    return re.sub(r"([(\[]) | (?=[)\],])", r"\1", body)


def _strict_body(body: str, none_index: int | None) -> tuple[int, ...] | None:
    """Indices named by one answer statement, or None when it is not a valid answer."""
    if "<" in body:
        body = _TRAILING_TOKENS.sub("", body).strip(_STRICT_TRIM)
    if "\\" in body or "$" in body:
        body = _STRICT_MATH_DELIMS.sub("", _STRICT_MATH.sub(lambda m: m.group(1), body)).strip(_STRICT_TRIM)
    if _STRICT_NONE.match(body):
        return None if none_index is None else (none_index,)
    body = _compact(body)
    if _STRICT_LIST.fullmatch(body):
        without_echo = re.sub(r" ?\([^\d()]*\)", "", body)
        return tuple(int(d) for d in _DIGITS.findall(without_echo))
    m = _STRICT_ECHO.fullmatch(body)
    if m and _LETTER.search(m.group(4)) and not _HEDGE.match(m.group(4)):
        return (int(m.group(1) or m.group(2) or m.group(3)),)
    return None


def is_correct(
    parsed: ParsedAnswer | Sequence[int],
    gold: Sequence[int],
    *,
    multi_select: bool,
    mode: ParseMode = "reference",
) -> bool:
    """Reference scoring (spec 3.7): single choice compares the first number, multi-select compares sets.

    In strict mode a single-choice answer must name exactly one option.
    """
    indices = parsed.indices if isinstance(parsed, ParsedAnswer) else tuple(parsed)
    if not indices:
        return False
    if multi_select:
        return set(indices) == set(gold)
    if mode == "strict" and len(indices) != 1:
        return False
    return indices[0] == gold[0]


def oracle_answer_text(gold: Sequence[int]) -> str:
    """The text an implicit oracle writes into the history: ``Answer: n`` or ``Answer: a,b`` (sorted)."""
    return "Answer: " + ",".join(str(i) for i in sorted(gold))
