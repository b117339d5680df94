"""Exact prompt strings of the benchmark (reference spec sections 2 and 3).

Numbers depend on these texts byte for byte, so they are written once here and used by the
generator, the validator, the conversation engine and the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .vocab import CARDIOMEGALY, ORDINALS

SYSTEM_MESSAGE = (
    "You are an expert radiologist. Analyze the given chest X-ray image and the question. "
    "Provide the final answer in the following format: 'Answer: [Option Number]'. "
    "Only the option number(s) should be included in the final answer part. "
    "(e.g., 'Answer: 1', 'Answer: 2', 'Answer: 1,3')."
)

YES_NO: tuple[str, str] = ("Yes", "No")


def qa(question: str, options: list[Any], answer: str, answer_index: Any, **extra: Any) -> dict[str, Any]:
    """One question of a bundle entry, its fields in the release's order (spec 1.3)."""
    return {
        "question": question,
        "answer_options": options,
        "answer": answer,
        "answer_index": answer_index,
        **extra,
    }


def yes_no_qa(question: str, yes: bool, **extra: Any) -> dict[str, Any]:
    """A Yes/No question whose gold is ``yes`` (option 1 "Yes", option 2 "No")."""
    return qa(question, list(YES_NO), "Yes" if yes else "No", 1 if yes else 2, **extra)


HEART_NOTE = " Note that lesions overlapping with the heart do not need to be considered."

INITIAL_CONTEXT_BASE = (
    "The colored points indicate potential locations where the mask may need to be adjusted. "
    "The mask may need to be expanded towards these points, contracted at these locations, or both."
)

ZONES_SENTENCE = (
    "right upper zone lung, right mid zone lung, right lower zone lung, "
    "left upper zone lung, left mid zone lung, left lower zone lung"
)
DISTRIBUTION_OPTIONS: tuple[str, ...] = ("1 zone", "2 zones", "3 zones", "4 zones or more")
LOCATION_NONE = "None of the above (options 1-3)"
COMPARISON_OPTIONS: tuple[str, ...] = (
    "Both lesions are similar in size.",
    "The left lung lesion is larger than the right lung lesion.",
    "The right lung lesion is larger than the left lung lesion.",
    "The lesion is present in only one lung (left or right).",
)
SIZE_RATIO_THRESHOLD = 1.5


def option_block(options: Sequence[str]) -> str:
    """``(1) a\\n(2) b`` as every question ends with (after ``\\n\\nOptions:\\n``)."""
    return "\n".join(f"({i}) {opt}" for i, opt in enumerate(options, start=1))


def with_options(stem: str, options: Sequence[str]) -> str:
    return f"{stem}\n\nOptions:\n{option_block(options)}"


def detection_question(lesion: str) -> str:
    if lesion in ("opacity", "consolidation"):
        stem = f"Is any {lesion} visible in the image?"
    else:
        stem = f"Is any finding suggestive of {lesion} visible in the image?"
    return with_options(stem, YES_NO)


def heart_note(lesion: str) -> str:
    return "" if lesion.lower() == CARDIOMEGALY else HEART_NOTE


def contour_eval_question(lesion: str) -> str:
    stem = (
        f"The image shows a chest X-ray with a predicted mask for the {lesion} (shown in the overlay). "
        f"Is any major revision needed?{heart_note(lesion)}"
    )
    return with_options(stem, YES_NO)


def initial_context(lesion: str) -> str:
    return INITIAL_CONTEXT_BASE + heart_note(lesion)


def point_option_labels(colors: Sequence[str | None]) -> list[str]:
    """Option texts for the point questions: ``red point`` ... and ``None`` for the last option."""
    return ["None" if c in (None, "None") else f"{c} point" for c in colors]


def expansion_question(lesion: str, option_labels: Sequence[str]) -> str:
    stem = (
        f"Which point(s), if any, should be used to expand the mask toward areas of the {lesion} "
        "that are not currently covered? Select all points where expansion is needed. "
        "If no expansion is needed, select 'None'."
    )
    return with_options(stem, option_labels)


def contraction_question(lesion: str, option_labels: Sequence[str]) -> str:
    stem = (
        f"Which point(s), if any, should be used to contract the mask away from areas that are not part "
        f"of the {lesion}? Select all points where contraction is needed. "
        "If no contraction is needed, select 'None'."
    )
    return with_options(stem, option_labels)


def mask_option_labels(n: int) -> list[str]:
    return [f"{ORDINALS[i]} mask" for i in range(n)]


def revision_result_question(n_options: int) -> str:
    return with_options("Choose the mask that reflects the modifications.", mask_option_labels(n_options))


def distribution_question(lesion: str) -> str:
    stem = f"In how many zones is the {lesion} present in the image? Consider the following zones: {ZONES_SENTENCE}."
    return with_options(stem, DISTRIBUTION_OPTIONS)


def location_question(lesion: str, options: Sequence[str]) -> str:
    stem = (
        f"Where is the {lesion} located in the image? "
        "Select all locations where the lesion is present from the options."
    )
    return with_options(stem, options)


def severity_options(lung: str) -> list[str]:
    return [
        f"Less than 1/3 of the {lung} area",
        f"1/3 or more but less than 2/3 of the {lung} area",
        f"2/3 or more of the {lung} area",
    ]


def severity_question(lesion: str, lung: str) -> str:
    stem = (
        f"What proportion of the {lung} area does the {lesion} occupy? "
        "Note that the lung area excludes the heart area."
    )
    return with_options(stem, severity_options(lung))


def comparison_question() -> str:
    stem = (
        "Assess and compare the sizes of the lesion across both lungs. If the lesion is present in only one "
        "lung, select the corresponding option. Note that the lung area excludes the heart area. "
        f"A lesion is considered larger if it is {SIZE_RATIO_THRESHOLD} times or more the size of the other."
    )
    return with_options(stem, COMPARISON_OPTIONS)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, else <n>th, as the revision-result oracle text spells it (spec 3.5)."""
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
