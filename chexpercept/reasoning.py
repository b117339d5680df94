"""How each model family marks its reasoning and its final answer in the text it generates.

One table (``FAMILIES``) serves every part of the toolkit that reads a reply: strict parsing removes
every family's reasoning before it looks for the answer (a close marker without its open marker
counts as a block the chat template opened in the prompt, as Qwen's do); reference parsing (which
reproduces the reference's parser) uses it to flag answers read from inside reasoning; the backends
keep whichever of these markers their tokenizer holds as special tokens (which
``skip_special_tokens`` decoding drops, e.g. Gemma 4's) and put an API's separate reasoning field
back into the reply between the family's markers.

Sources (checked 2026-12): the chat templates and tokenizer files of the models on the Hugging Face
Hub, vLLM's reasoning parsers (``vllm/reasoning/``), and the providers' API references; docs/scoring.md
("Reasoning markup per model family") lists the same table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One model family's reasoning and answer markup."""

    name: str
    #: lower-case fragments of model ids, registry names or reference aliases of the family
    match: tuple[str, ...]
    #: reasoning blocks as (open, close) markers
    reasoning: tuple[tuple[str, str], ...] = ()
    #: final-answer boxes as (open, close) markers (the answer is what they hold)
    answer_boxes: tuple[tuple[str, str], ...] = ()
    #: what the family's replies look like, for docs/scoring.md
    notes: str = ""


FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen",
        ("qwen", "huatuo", "lingshu"),
        reasoning=(("<think>", "</think>"),),
        notes="Qwen3.5/3.6 templates open <think> in the prompt (the reply holds only </think>); "
        "enable_thinking=False inserts an empty block. Qwen2.5-VL derivatives (HuatuoGPT-Vision, "
        "Lingshu) do not think",
    ),
    Family(
        "medgemma",
        ("medgemma", "gemma-3", "gemma3"),
        reasoning=(("<unused94>", "<unused95>"),),
        notes="thoughts between <unused94>thought and <unused95> (ordinary tokens: decoding keeps them); "
        "replies cut off by the token limit often never close the block",
    ),
    Family(
        "gemma4",
        ("gemma-4", "gemma4"),
        reasoning=(("<|channel>", "<channel|>"),),
        notes="thinking (off by default) between <|channel>thought and <channel|>, special tokens: "
        "without them a reply would start with a bare 'thought'",
    ),
    Family(
        "glm",
        ("glm",),
        reasoning=(("<think>", "</think>"),),
        answer_boxes=(("<|begin_of_box|>", "<|end_of_box|>"), ("<answer>", "</answer>")),
        notes="GLM-4.5V/4.6V think in <think> blocks and box the answer in "
        "<|begin_of_box|>...<|end_of_box|>; GLM-4.1V-Thinking answers in <answer>...</answer>",
    ),
    Family(
        "internvl",
        ("internvl",),
        reasoning=(("<think>", "</think>"),),
        notes="<think> blocks only with the model card's thinking system prompt (not the benchmark's)",
    ),
    Family(
        "hulu-med",
        ("hulu",),
        reasoning=(("<think>", "</think>"),),
        notes="the reference decodes with use_think=True; no other markup documented",
    ),
    Family(
        "gpt-5",
        ("gpt-5", "o1", "o3", "o4"),
        notes="OpenAI and Azure return no reasoning text (only a reasoning token count); a refused "
        "request comes back with content null and a refusal",
    ),
    Family(
        "gemini",
        ("gemini",),
        reasoning=(("<thought>", "</thought>"),),
        notes="thoughts come back in the content only when include_thoughts is set (tags as Google's "
        "OpenAI-compatible endpoint writes them; Vertex's thought_tag_marker gives <think>)",
    ),
)
#: the markers for reasoning of a model whose family is not known
DEFAULT_BLOCK: tuple[str, str] = ("<think>", "</think>")
#: answer boxes every family may use (LaTeX)
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
#: every family's reasoning markers, longest first (a reply may mix families' markup)
ALL_BLOCKS: tuple[tuple[str, str], ...] = tuple(
    sorted({b for f in FAMILIES for b in f.reasoning}, key=lambda b: -len(b[0]))
)
ALL_BOXES: tuple[tuple[str, str], ...] = tuple(dict.fromkeys(b for f in FAMILIES for b in f.answer_boxes))
_MARKERS: tuple[str, ...] = tuple(m for block in ALL_BLOCKS for m in block)


def family_of(model: str) -> Family | None:
    """The family of a model id, registry name or reference alias; None when it is not known."""
    name = model.lower()
    if not name:
        return None
    last = name.rstrip("/").rsplit("/", 1)[-1]
    for family in FAMILIES:
        for fragment in family.match:
            if fragment in ("o1", "o3", "o4"):  # OpenAI's o-series: a whole leading word only
                if re.match(rf"{fragment}(?:\b|-|$)", last):
                    return family
            elif fragment in name:
                return family
    return None


def has_reasoning_markup(text: str) -> bool:
    """True when the text holds any family's reasoning marker."""
    return any(m in text for m in _MARKERS)


def remove_reasoning(text: str) -> str:
    """The text outside reasoning, by every family's markers.

    Complete blocks go; an unfinished block (opened, never closed: the reply was cut off) takes the
    rest of the text with it; a close marker without its open marker (templates that open the block
    in the prompt) means everything before it was reasoning.
    """
    for open_marker, close_marker in ALL_BLOCKS:
        if open_marker not in text and close_marker not in text:
            continue
        out = []
        rest = text
        while True:
            start = rest.find(open_marker)
            end = rest.find(close_marker)
            if end != -1 and (start == -1 or end < start):  # closes a block opened before the reply
                rest = rest[end + len(close_marker) :]
                out = []
                continue
            if start == -1:
                out.append(rest)
                break
            out.append(rest[:start])
            end = rest.find(close_marker, start + len(open_marker))
            if end == -1:  # never closed: the rest is reasoning
                break
            rest = rest[end + len(close_marker) :]
        text = "".join(out)
    return text
