"""Stage 4 ground truth and overlap thresholds on hand-made masks and counts with known answers."""

import numpy as np
import pytest

from chexpercept import templates
from chexpercept.builder.attributes import (
    NoLungOverlap,
    attribute_qa,
    comparison_answer,
    comparison_qa,
    distribution_qa,
    location_qa,
    severity_qa,
)
from chexpercept.builder.overlap import ComponentOverlap, Coverage, component_overlap
from chexpercept.builder.regions import REGION_NAMES, ZONE_NAMES, partition, region_display, zones


def overlap_with_lungs(left: tuple[int, int], right: tuple[int, int]) -> ComponentOverlap:
    """A component covering ``covered`` of ``area`` pixels of each lung (>= 1 % counts)."""
    lungs = {
        "left lung": Coverage(left[0], left[1], left[0] * 100 >= left[1] and left[1] > 0),
        "right lung": Coverage(right[0], right[1], right[0] * 100 >= right[1] and right[1] > 0),
    }
    return ComponentOverlap("0", lungs, {}, {})


@pytest.mark.parametrize(
    ("zones_", "index", "answer"),
    [
        (["right upper zone lung"], 1, "1 zone"),
        (["right upper zone lung", "left mid zone lung"], 2, "2 zones"),
        (["right upper zone lung", "right mid zone lung", "right lower zone lung"], 3, "3 zones"),
        (["a", "b", "c", "d"], 4, "4 zones or more"),
        (["a", "b", "c", "d", "e", "f"], 4, "4 zones or more"),
    ],
)
def test_distribution_counts_zones(zones_, index, answer):
    qa = distribution_qa("edema", zones_)
    assert (qa["answer_index"], qa["answer"]) == (index, answer)
    assert qa["question"] == templates.distribution_question("edema")
    assert qa["answer_zones"] == zones_


def test_zero_zones_is_refused_not_four_or_more():
    with pytest.raises(NoLungOverlap):
        distribution_qa("edema", [])


@pytest.mark.parametrize(
    ("covered", "area", "index"),
    [
        (99, 300, 1),
        (100, 300, 2),
        (199, 300, 2),
        (200, 300, 3),
        (300, 300, 3),
        (0, 300, 1),
        (1, 3, 2),
        (2, 3, 3),
    ],
)
def test_severity_thresholds_are_exact(covered, area, index):
    ov = overlap_with_lungs(left=(covered, area), right=(0, 1000))
    qa = severity_qa("opacity", [ov], ["the left costophrenic angle"], np.random.default_rng(0))
    assert qa["selected_lung"] == "left lung"
    assert qa["answer_index"] == index
    assert qa["answer"] == templates.severity_options("left lung")[index - 1]
    assert qa["question"] == templates.severity_question("opacity", "left lung")
    assert qa["overlap_ratio"] == pytest.approx(covered / area)


def test_severity_sums_components_and_picks_the_lung_with_overlap():
    a = overlap_with_lungs(left=(0, 900), right=(200, 900))
    b = overlap_with_lungs(left=(0, 900), right=(100, 900))
    qa = severity_qa("opacity", [a, b], [], np.random.default_rng(0))
    assert qa["selected_lung"] == "right lung" and qa["answer_index"] == 2  # 300/900 = exactly 1/3
    # neither lung covered by 1 %: left lung with ratio 0 (reference)
    c = overlap_with_lungs(left=(5, 1000), right=(5, 1000))
    qa = severity_qa("opacity", [c], [], np.random.default_rng(0))
    assert (qa["selected_lung"], qa["answer_index"], qa["overlap_ratio"]) == ("left lung", 1, 0.0)


@pytest.mark.parametrize(
    ("left", "right", "left_has", "right_has", "index"),
    [
        (150, 100, True, True, 2),  # exactly 1.5x: larger
        (149, 100, True, True, 1),
        (100, 150, True, True, 3),
        (100, 149, True, True, 1),
        (3, 2, True, True, 2),
        (100, 100, True, True, 1),
        (500, 0, True, False, 4),  # single lung
        (0, 500, False, True, 4),
        (0, 0, False, False, 4),
    ],
)
def test_comparison_rule(left, right, left_has, right_has, index):
    assert comparison_answer(left, right, left_has, right_has) == index


def test_comparison_counts_only_lungs_covered_by_one_percent():
    a = overlap_with_lungs(left=(9, 1000), right=(300, 1000))  # left below 1 %: size 0, not present
    qa = comparison_qa([a])
    assert (qa["left_size"], qa["right_size"], qa["left_has_overlap"], qa["right_has_overlap"]) == (
        0,
        300,
        False,
        True,
    )
    assert qa["answer_index"] == 4
    assert qa["question"] == templates.comparison_question()


def test_location_options_and_gold():
    pos = [
        "the right costophrenic angle",
        "the intersection of the right lateral lung and the right mid zone lung",
    ]
    neg = [region_display(n)[0] for n in REGION_NAMES[2:8]]
    seen_k = set()
    for seed in range(40):
        qa = location_qa("effusion", pos, neg, np.random.default_rng(seed))
        options = qa["answer_options"]
        assert len(options) == 4 and options[-1] == templates.LOCATION_NONE
        assert len(set(options)) == 4
        gold = [i for i, o in enumerate(options[:3], start=1) if o in pos]
        assert qa["answer_index"] == (gold or [4])
        assert qa["answer"] == ", ".join(options[i - 1] for i in qa["answer_index"])
        assert qa["question"] == templates.location_question("effusion", options)
        seen_k.add(len(gold))
    assert seen_k == {0, 1, 2}


def test_location_tops_up_with_positives_when_negatives_run_short():
    pos = [region_display(n)[0] for n in REGION_NAMES[:19]]
    neg = [region_display(REGION_NAMES[19])[0]]
    for seed in range(20):
        qa = location_qa("edema", pos, neg, np.random.default_rng(seed))
        chosen = qa["answer_options"][:3]
        assert len(qa["answer_index"]) == sum(o in pos for o in chosen) >= 2


def test_overlap_thresholds_are_exact_and_best_region_is_promoted():
    shape = (40, 40)
    lung = np.zeros(shape, dtype=bool)
    lung[0:10, 0:10] = True  # 100 px
    other = np.zeros(shape, dtype=bool)
    other[20:30, 20:30] = True
    comp = np.zeros(shape, dtype=bool)
    comp[0, 0] = True  # exactly 1 % of the lung
    ov = component_overlap("0", comp, {"left lung": lung, "right lung": other}, {"z": lung}, None)
    assert ov.lungs["left lung"].has_overlap and ov.lung_size("left lung") == 1
    assert not ov.lungs["right lung"].has_overlap and ov.lung_size("right lung") == 0
    # 1 % of the zone: below 20 %, but the best zone with any coverage is promoted
    assert ov.zones["z"].has_overlap
    zone_a = lung.copy()
    zone_b = np.zeros(shape, dtype=bool)
    zone_b[0:2, 0:10] = True  # 20 px
    comp2 = np.zeros(shape, dtype=bool)
    comp2[0, 0:4] = True  # 4 px = exactly 20 % of zone_b, 4 % of zone_a
    ov = component_overlap(
        "0", comp2, {"left lung": lung, "right lung": other}, {"a": zone_a, "b": zone_b}, None
    )
    assert ov.zones["b"].has_overlap and not ov.zones["a"].has_overlap
    empty = np.zeros(shape, dtype=bool)
    ov = component_overlap(
        "0", comp2, {"left lung": lung, "right lung": other}, {"far": other, "none": empty}, None
    )
    assert not any(c.has_overlap for c in ov.zones.values())  # nothing covered: nothing promoted


def test_attribute_qa_on_a_hand_made_lesion():
    shape = (500, 500)
    right = np.zeros(shape, dtype=bool)
    right[100:400, 100:200] = True
    left = np.zeros(shape, dtype=bool)
    left[100:400, 300:400] = True
    lesion = np.zeros(shape, dtype=bool)
    lesion[300:400, 100:200] = (
        True  # the right lung base and one row of the mid zone: exactly 1/3 of the lung
    )
    regions = partition(right, left)
    z = zones(right, left)
    ov = component_overlap("0", lesion, {"right lung": right, "left lung": left}, z, regions)
    assert [n for n in ZONE_NAMES if ov.zones[n].has_overlap] == ["right lung base"]
    qa = attribute_qa("effusion", [ov], np.random.default_rng(0))
    assert list(qa) == ["distribution", "location", "severity/measurement", "comparison"]
    assert qa["distribution"]["answer_index"] == 1
    assert qa["distribution"]["answer_zones"] == ["right lower zone lung"]
    assert qa["severity/measurement"]["selected_lung"] == "right lung"
    assert qa["severity/measurement"]["answer_index"] == 2  # 10000 / 30000: "1/3 or more"
    assert qa["comparison"]["answer_index"] == 4


def test_attribute_qa_refuses_a_lesion_outside_the_lungs():
    shape = (200, 200)
    right = np.zeros(shape, dtype=bool)
    right[10:90, 10:50] = True
    left = np.zeros(shape, dtype=bool)
    left[10:90, 100:140] = True
    lesion = np.zeros(shape, dtype=bool)
    lesion[150:190, 150:190] = True
    ov = component_overlap(
        "0", lesion, {"right lung": right, "left lung": left}, zones(right, left), partition(right, left)
    )
    with pytest.raises(NoLungOverlap):
        attribute_qa("opacity", [ov], np.random.default_rng(0))
