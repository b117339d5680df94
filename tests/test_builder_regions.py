"""The 20-region partition, zones and the fast square erosion, on hand-made masks with known answers."""

import numpy as np
import pytest
from skimage.morphology import erosion

from chexpercept.builder.morph import square_erosion
from chexpercept.builder.regions import (
    REGION_NAMES,
    ZONE_NAMES,
    footprint_side,
    partition,
    region_display,
    zones,
)

SPEC_REGION_NAMES = [
    "right costophrenic angle",
    "left costophrenic angle",
    "right medial lung & right upper zone lung",
    "right medial lung & right mid zone lung",
    "right medial lung & right lung base",
    "left medial lung & left upper zone lung",
    "left medial lung & left mid zone lung",
    "left medial lung & left lung base",
    "right lateral lung & right upper zone lung",
    "right lateral lung & right mid zone lung",
    "right lateral lung & right lung base",
    "left lateral lung & left upper zone lung",
    "left lateral lung & left mid zone lung",
    "left lateral lung & left lung base",
    "right peripheral lung & right upper zone lung",
    "right peripheral lung & right mid zone lung",
    "right peripheral lung & right lung base",
    "left peripheral lung & left upper zone lung",
    "left peripheral lung & left mid zone lung",
    "left peripheral lung & left lung base",
]


def rect(shape, y0, y1, x0, x1):
    m = np.zeros(shape, dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 9, 16, 17, 31])
def test_square_erosion_equals_skimage_reflect(size):
    rng = np.random.default_rng(size)
    for _ in range(40):
        h, w = rng.integers(size, 48, 2)
        mask = rng.random((h, w)) < rng.uniform(0.6, 0.995)
        expected = erosion(mask, footprint=np.ones((size, size), dtype=bool), mode="reflect").astype(bool)
        np.testing.assert_array_equal(square_erosion(mask, size), expected)


def test_square_erosion_on_lung_shapes_equals_skimage():
    yy, xx = np.mgrid[:120, :120]
    mask = ((xx - 35) ** 2 / 25**2 + (yy - 60) ** 2 / 50**2 < 1) | (
        (xx - 85) ** 2 / 22**2 + (yy - 62) ** 2 / 48**2 < 1
    )
    for size in (10, 11, 24, 25):
        expected = erosion(mask, footprint=np.ones((size, size), dtype=bool), mode="reflect").astype(bool)
        np.testing.assert_array_equal(square_erosion(mask, size), expected)


def test_region_names_and_order_follow_the_spec():
    assert list(REGION_NAMES) == SPEC_REGION_NAMES
    assert ZONE_NAMES == (
        "right upper zone lung",
        "right mid zone lung",
        "right lung base",
        "left upper zone lung",
        "left mid zone lung",
        "left lung base",
    )
    shape = (500, 500)
    regions = partition(rect(shape, 100, 400, 100, 200), rect(shape, 100, 400, 300, 400))
    assert list(regions) == SPEC_REGION_NAMES
    assert all(m.dtype == bool and m.shape == shape for m in regions.values())


def test_display_names():
    assert region_display("right peripheral lung & right lung base") == (
        "the intersection of the right peripheral lung and the right lower zone lung",
        "right lower zone lung",
    )
    assert region_display("left medial lung & left upper zone lung") == (
        "the intersection of the left medial lung and the left upper zone lung",
        "left upper zone lung",
    )
    assert region_display("left costophrenic angle") == (
        "the left costophrenic angle",
        "left lower zone lung",
    )
    with pytest.raises(ValueError):
        region_display("heart")


def test_vertical_thirds_and_medial_lateral_areas():
    shape = (500, 500)
    right = rect(shape, 100, 400, 100, 200)  # y 100..399, x 100..199 (image left)
    left = rect(shape, 100, 400, 300, 400)
    z = zones(right, left)
    # h = 300, b1 = 200, b2 = 300: upper y <= 200, mid 200 < y <= 300, base y > 300
    assert z["right upper zone lung"].sum() == 101 * 100
    assert z["right mid zone lung"].sum() == 100 * 100
    assert z["right lung base"].sum() == 99 * 100
    regions = partition(right, left)
    # mid_x = int((199 + 100) / 2) = 149: right medial x >= 149 (51 columns), lateral x < 149
    assert regions["right medial lung & right upper zone lung"].sum() == 101 * 51
    assert regions["right lateral lung & right upper zone lung"].sum() == 101 * 49
    # left: mid_x = int((399 + 300) / 2) = 349: medial x < 349 (49 columns), lateral x >= 349
    assert regions["left medial lung & left mid zone lung"].sum() == 100 * 49
    assert regions["left lateral lung & left mid zone lung"].sum() == 100 * 51
    assert regions["left medial lung & left mid zone lung"][250, 300]
    assert regions["right medial lung & right mid zone lung"][250, 199]


def test_peripheral_rim_and_costophrenic_angle_of_rectangles():
    shape = (500, 500)
    right = rect(shape, 100, 400, 100, 200)
    left = rect(shape, 100, 400, 300, 400)
    assert footprint_side(right) == 50  # mean width 100 on rows r1, r2 -> s = 50
    regions = partition(right, left)
    # core of a 100-wide rectangle eroded by 50 (even: 24 before, 25 after): x 124..174, y 124..374
    periph_r = np.zeros(shape, dtype=bool)
    periph_r[100:400, 100:124] = True  # lateral band x < 124 on the middle rows
    periph_r[100:125, 124] = True  # top rows keep x <= top.x = 124
    periph_r[374:400, 124] = True  # bottom rows keep x <= bottom.x = 124
    got_r = sum(
        regions[f"right peripheral lung & right {z}"]
        for z in ("upper zone lung", "mid zone lung", "lung base")
    )
    np.testing.assert_array_equal(got_r.astype(bool), periph_r)
    # left (image right), core x 324..374: keep x > 374 in the middle, x >= top.x / bottom.x at the ends
    periph_l = np.zeros(shape, dtype=bool)
    periph_l[100:400, 375:400] = True
    periph_l[100:125, 374] = True  # top tie-break: largest x of the core's top row (374)
    periph_l[374:400, 324:375] = True  # reference bottom tie-break: smallest x (324) -> keeps x >= 324
    got_l = sum(
        regions[f"left peripheral lung & left {z}"] for z in ("upper zone lung", "mid zone lung", "lung base")
    )
    np.testing.assert_array_equal(got_l.astype(bool), periph_l)
    # costophrenic angle: rows >= y_min + int(299 * 3 / 4) = 324 of the rim
    cpa = periph_r.copy()
    cpa[:324] = False
    np.testing.assert_array_equal(regions["right costophrenic angle"], cpa)


def test_corrected_mode_mirrors_the_left_bottom_tie_break():
    shape = (500, 500)
    right = rect(shape, 100, 400, 100, 200)
    left = rect(shape, 100, 400, 300, 400)
    corrected = partition(right, left, mode="corrected")
    got_l = sum(
        corrected[f"left peripheral lung & left {z}"]
        for z in ("upper zone lung", "mid zone lung", "lung base")
    )
    expected = np.zeros(shape, dtype=bool)
    expected[100:400, 375:400] = True
    expected[100:125, 374] = True
    expected[374:400, 374] = True  # bottom point now the largest x, mirroring the right lung
    np.testing.assert_array_equal(got_l.astype(bool), expected)


def test_reference_sizes_the_footprint_from_the_right_lung_only():
    shape = (600, 600)
    right = rect(shape, 100, 400, 100, 160)  # 60 wide -> s = 30 for both sides in reference mode
    left = rect(shape, 100, 400, 300, 500)  # 200 wide -> s = 100 in corrected mode
    ref = partition(right, left)
    cor = partition(right, left, mode="corrected")
    ref_rim = ref["left peripheral lung & left mid zone lung"].sum()
    cor_rim = cor["left peripheral lung & left mid zone lung"].sum()
    # the left rim is the columns past the core's right edge: s // 2 of them (15 for s = 30, 50 for 100)
    assert ref_rim == 100 * 15
    assert cor_rim == 100 * 50
    # the right lung is the same in both modes (its own footprint)
    for name in REGION_NAMES:
        if name.startswith("right"):
            np.testing.assert_array_equal(ref[name], cor[name])


def test_empty_and_degenerate_lungs():
    shape = (100, 100)
    empty = np.zeros(shape, dtype=bool)
    regions = partition(empty, empty)
    assert all(not m.any() for m in regions.values())
    # a 1-pixel-wide right lung gives a zero footprint in the reference; we use 1 instead of crashing
    thin = rect(shape, 10, 90, 20, 21)
    left = rect(shape, 10, 90, 60, 80)
    regions = partition(thin, left)
    assert (
        regions["right lateral lung & right mid zone lung"].sum()
        + regions["right medial lung & right mid zone lung"].sum()
        == zones(thin, left)["right mid zone lung"].sum()
    )
    with pytest.raises(ValueError):
        partition(thin, left, mode="nonsense")
    with pytest.raises(ValueError):
        partition(thin, left[:50])
