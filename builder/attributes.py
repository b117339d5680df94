"""Stage 4 ground truth and questions: distribution, location, severity, comparison (reference spec 2.7).

Thresholds are exact: severity compares 3 * lesion pixels with the lung area (1/3 and 2/3 never
depend on floating point), comparison compares 2 * larger with 3 * smaller (1.5x). A lesion that covers
no lung region at all has no zone to count; the reference answers "4 zones or more" for it (spec 7.3
item 29). We raise ``NoLungOverlap`` instead and the generator rejects that case with that reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chexpercept import templates

from .overlap import ComponentOverlap
from .regions import REGION_NAMES, region_display

NUM_LOCATION_CHOICES = 3  # plus "None of the above (options 1-3)"


class NoLungOverlap(ValueError):
    """The lesion covers no lung region, so its Stage 4 attributes are undefined."""


def positive_regions(overlaps: list[ComponentOverlap]) -> list[str]:
    """Region names positive in any component, in the canonical order of REGION_NAMES."""
    return [name for name in REGION_NAMES if any(o.regions[name].has_overlap for o in overlaps)]


def distribution_qa(lesion: str, pos_zones: list[str]) -> dict[str, Any]:
    """Number of positive zones: 1, 2, 3 or "4 zones or more"; zero zones is refused."""
    n = len(pos_zones)
    if n == 0:
        raise NoLungOverlap("the lesion covers no lung region, so it is present in no zone")
    index = min(n, 4)
    options = list(templates.DISTRIBUTION_OPTIONS)
    return templates.qa(
        templates.distribution_question(lesion),
        options,
        options[index - 1],
        index,
        answer_zones=list(pos_zones),
    )


def location_qa(
    lesion: str, pos_displays: list[str], neg_displays: list[str], rng: np.random.Generator
) -> dict[str, Any]:
    """Three region options (some positive, the rest negative) plus "None of the above (options 1-3)"."""
    max_select = min(NUM_LOCATION_CHOICES, len(pos_displays))
    k = int(rng.integers(0, max_select + 1))
    pos_order = [pos_displays[i] for i in rng.permutation(len(pos_displays))]
    chosen_pos = pos_order[:k]
    n_neg = min(NUM_LOCATION_CHOICES - k, len(neg_displays))
    chosen_neg = [neg_displays[i] for i in rng.permutation(len(neg_displays))[:n_neg]]
    # negatives ran short: top up with further positives (which are answers too)
    extra_pos = pos_order[k : k + NUM_LOCATION_CHOICES - k - n_neg]
    positives = set(chosen_pos) | set(extra_pos)
    picked = chosen_pos + chosen_neg + extra_pos
    options = [picked[i] for i in rng.permutation(len(picked))] + [templates.LOCATION_NONE]
    gold = [i for i, opt in enumerate(options[:-1], start=1) if opt in positives]
    answer_zones = [options[i - 1] for i in gold]
    if not gold:
        gold = [len(options)]
    answer = ", ".join(options[i - 1] for i in gold)
    return templates.qa(
        templates.location_question(lesion, options), options, answer, gold, answer_zones=answer_zones
    )


def severity_qa(
    lesion: str,
    overlaps: list[ComponentOverlap],
    answer_zones: list[str],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Fraction of one lung covered: < 1/3, [1/3, 2/3), >= 2/3; the lung is chosen as the reference does."""
    has = {lung: any(o.lungs[lung].has_overlap for o in overlaps) for lung in ("left lung", "right lung")}
    both = [lung for lung in ("left lung", "right lung") if has[lung]]
    mentions_left = any("left" in z for z in answer_zones)
    mentions_right = any("right" in z for z in answer_zones)
    lung: str | None = None
    if mentions_left and mentions_right:
        lung = both[int(rng.integers(0, len(both)))] if both else "left lung"
    elif mentions_left and has["left lung"]:
        lung = "left lung"
    elif mentions_right and has["right lung"]:
        lung = "right lung"
    if lung is None:
        lung = both[int(rng.integers(0, len(both)))] if both else "left lung"
    # a lung without >= 1 % coverage is only chosen when neither lung has any: ratio 0 (reference)
    covered = sum(o.lungs[lung].covered for o in overlaps) if has[lung] else 0
    area = overlaps[0].lungs[lung].area if overlaps else 0
    if area == 0 or 3 * covered < area:
        index = 1
    elif 3 * covered < 2 * area:
        index = 2
    else:
        index = 3
    options = templates.severity_options(lung)
    ratio = covered / area if area else 0.0
    return templates.qa(
        templates.severity_question(lesion, lung),
        options,
        options[index - 1],
        index,
        overlap_ratio=ratio,
        selected_lung=lung,
    )


def comparison_answer(left_size: int, right_size: int, left_has: bool, right_has: bool) -> int:
    """1 similar, 2 left larger, 3 right larger, 4 only one lung (exact 1.5x rule on pixel counts)."""
    if not (left_has and right_has):
        return 4
    if left_size == 0 and right_size == 0:
        return 1
    if left_size == 0:
        return 3
    if right_size == 0:
        return 2
    if 2 * left_size >= 3 * right_size:
        return 2
    if 2 * right_size >= 3 * left_size:
        return 3
    return 1


def comparison_qa(overlaps: list[ComponentOverlap]) -> dict[str, Any]:
    left_size = sum(o.lung_size("left lung") for o in overlaps)
    right_size = sum(o.lung_size("right lung") for o in overlaps)
    left_has = any(o.lungs["left lung"].has_overlap for o in overlaps)
    right_has = any(o.lungs["right lung"].has_overlap for o in overlaps)
    index = comparison_answer(left_size, right_size, left_has, right_has)
    options = list(templates.COMPARISON_OPTIONS)
    return templates.qa(
        templates.comparison_question(),
        options,
        options[index - 1],
        index,
        left_size=left_size,
        right_size=right_size,
        left_has_overlap=left_has,
        right_has_overlap=right_has,
    )


def attribute_qa(lesion: str, overlaps: list[ComponentOverlap], rng: np.random.Generator) -> dict[str, Any]:
    """``attribute_extraction_qa`` of a non-cardiomegaly positive: the four questions in stored order."""
    pos = positive_regions(overlaps)
    pos_displays = [region_display(n)[0] for n in pos]
    neg_displays = [region_display(n)[0] for n in REGION_NAMES if n not in pos]
    pos_zones: list[str] = []
    for name in pos:
        zone = region_display(name)[1]
        if zone not in pos_zones:
            pos_zones.append(zone)
    distribution = distribution_qa(lesion, pos_zones)
    location = location_qa(lesion, pos_displays, neg_displays, rng)
    severity = severity_qa(lesion, overlaps, location["answer_zones"], rng)
    return {
        "distribution": distribution,
        "location": location,
        "severity/measurement": severity,
        "comparison": comparison_qa(overlaps),
    }
