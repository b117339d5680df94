"""The 20-region lung partition and the 6 lung zones (reference spec 5.4.5), and their display names (2.7).

``partition(right_lung, left_lung)`` is the stable entry point. The patient's right lung is on the image
left. By default it reproduces the reference exactly, including two quirks (spec 7.3 item 36): the
square footprint of the peripheral rim is sized from the right lung only and used for both sides, and
the bottom point of the left core breaks ties toward the smaller x while every other tie-break mirrors.
``mode="corrected"`` sizes the footprint per side from that side's own lung and mirrors the left tie-break.

The reference erodes with skimage and a footprint about half a lung wide (about 14 s per image);
``morph.square_erosion`` gives the identical result in a few tens of milliseconds.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .morph import bbox, largest_component, square_erosion

PartitionMode = Literal["reference", "corrected"]
PARTITION_MODES: tuple[str, ...] = ("reference", "corrected")

SIDES: tuple[str, str] = ("right", "left")
#: zone names as the reference stores them (the lower zone is called "lung base")
ZONE_SUFFIXES: tuple[str, str, str] = ("upper zone lung", "mid zone lung", "lung base")
ZONE_NAMES: tuple[str, ...] = tuple(f"{side} {z}" for side in SIDES for z in ZONE_SUFFIXES)

#: the 20 region names, in the reference's insertion order (spec 2.7)
REGION_NAMES: tuple[str, ...] = (
    "right costophrenic angle",
    "left costophrenic angle",
    *(
        f"{side} {part} lung & {side} {zone}"
        for part in ("medial", "lateral", "peripheral")
        for side in SIDES
        for zone in ZONE_SUFFIXES
    ),
)

#: footprint side used when the lung that sizes it is empty (reference constant)
DEFAULT_FOOTPRINT = 50


def region_display(name: str) -> tuple[str, str]:
    """(display text, zone) of a region name, as the location question shows it (spec 2.7).

    ``right peripheral lung & right lung base`` -> (``the intersection of the right peripheral lung and
    the right lower zone lung``, ``right lower zone lung``); ``left costophrenic angle`` -> (``the left
    costophrenic angle``, ``left lower zone lung``).
    """
    if " & " in name:
        area, zone = name.split(" & ", 1)
        zone = zone.replace("lung base", "lower zone lung")
        return f"the intersection of the {area} and the {zone}", zone
    if name.endswith(" costophrenic angle"):
        side = name.split(" ", 1)[0]
        return f"the {name}", f"{side} lower zone lung"
    raise ValueError(f"not a lung region name: {name!r}")


def side_of(name: str) -> str:
    """'right' or 'left' for a region or zone name."""
    side = name.split(" ", 1)[0]
    if side not in SIDES:
        raise ValueError(f"region {name!r} has no side")
    return side


def vertical_thirds(lung: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper, mid and base thirds of a lung by its own vertical extent (spec 5.4.5)."""
    box = bbox(lung)
    if box is None:
        empty = np.zeros_like(lung, dtype=bool)
        return empty, empty.copy(), empty.copy()
    y_min, y_end = box[0], box[1]
    h = y_end - y_min  # == y_max - y_min + 1
    b1 = y_min + h // 3
    b2 = y_min + (2 * h) // 3
    y = np.arange(lung.shape[0])[:, None]
    upper = lung & (y <= b1)
    mid = lung & (y > b1) & (y <= b2)
    base = lung & (y > b2)
    return upper, mid, base


def zones(right_lung: np.ndarray, left_lung: np.ndarray) -> dict[str, np.ndarray]:
    """The 6 zones keyed by ZONE_NAMES (vertical thirds of each lung)."""
    out: dict[str, np.ndarray] = {}
    for side, lung in (("right", right_lung), ("left", left_lung)):
        for suffix, mask in zip(ZONE_SUFFIXES, vertical_thirds(np.asarray(lung, dtype=bool))):
            out[f"{side} {suffix}"] = mask
    return out


def medial_lateral(lung: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
    """Split a lung at the middle of its horizontal extent; medial is toward the image centre."""
    box = bbox(lung)
    if box is None:
        empty = np.zeros_like(lung, dtype=bool)
        return empty, empty.copy()
    x_min, x_max = box[2], box[3] - 1
    mid_x = int((x_max + x_min) / 2)
    x = np.arange(lung.shape[1])[None, :]
    if side == "left":  # image right: medial is the smaller x
        return lung & (x < mid_x), lung & (x >= mid_x)
    return lung & (x >= mid_x), lung & (x < mid_x)


def footprint_side(lung: np.ndarray) -> int:
    """Half the mean width of a lung on the rows at one and two thirds of its height (reference rule)."""
    box = bbox(lung)
    if box is None:
        return DEFAULT_FOOTPRINT
    y_min, y_max = box[0], box[1] - 1
    r1 = y_min + (y_max - y_min) // 3
    r2 = y_min + 2 * (y_max - y_min) // 3
    avg_width = (int(lung[r1].sum()) + int(lung[r2].sum())) / 2
    return int(avg_width / 2)


def _extreme(
    points_y: np.ndarray, points_x: np.ndarray, *, lowest_y: bool, smallest_x: bool
) -> tuple[int, int]:
    y = points_y.min() if lowest_y else points_y.max()
    xs = points_x[points_y == y]
    x = xs.min() if smallest_x else xs.max()
    return int(y), int(x)


def peripheral(
    lung: np.ndarray, core: np.ndarray, side: str, mode: PartitionMode = "reference"
) -> np.ndarray:
    """The lateral band of a lung outside its eroded core (spec 5.4.5 steps 3-5)."""
    core = core & lung
    if not core.any():
        return lung.copy()
    core = largest_component(core)
    ys, xs = np.nonzero(core)
    lung_box = bbox(lung)
    assert lung_box is not None
    lung_top, lung_bottom = lung_box[0], lung_box[1] - 1
    out = lung.copy()
    width = lung.shape[1]
    x = np.arange(width)
    rows = np.arange(ys.min(), ys.max() + 1)
    # per row extreme core x (every row between top and bottom has core pixels: it is connected)
    row_min = np.full(lung.shape[0], width, dtype=np.int64)
    row_max = np.full(lung.shape[0], -1, dtype=np.int64)
    np.minimum.at(row_min, ys, xs)
    np.maximum.at(row_max, ys, xs)
    if side == "right":
        top = _extreme(ys, xs, lowest_y=True, smallest_x=True)
        bottom = _extreme(ys, xs, lowest_y=False, smallest_x=True)
        out[lung_top : top[0] + 1, top[1] + 1 :] = False
        middle = rows[(rows > top[0]) & (rows < bottom[0])]
        if middle.size:
            out[middle] &= x[None, :] < row_min[middle][:, None]
        out[bottom[0] : lung_bottom + 1, bottom[1] + 1 :] = False
    else:
        top = _extreme(ys, xs, lowest_y=True, smallest_x=False)
        bottom = _extreme(ys, xs, lowest_y=False, smallest_x=mode == "reference")
        out[lung_top : top[0] + 1, : top[1]] = False
        middle = rows[(rows > top[0]) & (rows < bottom[0])]
        if middle.size:
            out[middle] &= x[None, :] > row_max[middle][:, None]
        out[bottom[0] : lung_bottom + 1, : bottom[1]] = False
    return out


def costophrenic_angle(peripheral_mask: np.ndarray, lung: np.ndarray) -> np.ndarray:
    """Bottom quarter (by the lung's own extent) of the peripheral rim."""
    box = bbox(lung)
    if box is None:
        return np.zeros_like(lung, dtype=bool)
    y_min, y_max = box[0], box[1] - 1
    cut_y = y_min + int((y_max - y_min) * 3 / 4)
    out = peripheral_mask.copy()
    out[:cut_y] = False
    return out


def partition(
    right_lung: np.ndarray, left_lung: np.ndarray, *, mode: PartitionMode = "reference"
) -> dict[str, np.ndarray]:
    """The 20 boolean region masks keyed by REGION_NAMES, in that order.

    mode: ``reference`` (default, reproduces the reference's numbers) or ``corrected`` (footprint
    sized per side from that side's lung; mirrored tie-breaks). See the module docstring.
    """
    if mode not in PARTITION_MODES:
        raise ValueError(f"unknown partition mode {mode!r}; expected one of {', '.join(PARTITION_MODES)}")
    lungs = {"right": np.asarray(right_lung, dtype=bool), "left": np.asarray(left_lung, dtype=bool)}
    if lungs["right"].shape != lungs["left"].shape or lungs["right"].ndim != 2:
        raise ValueError(
            f"lung masks must be 2-D and of the same shape, got {lungs['right'].shape} and {lungs['left'].shape}"
        )
    union = lungs["right"] | lungs["left"]
    cores: dict[str, np.ndarray] = {}
    if mode == "reference":
        core = square_erosion(union, max(1, footprint_side(lungs["right"])))
        cores = {"right": core, "left": core}
    else:
        for side in SIDES:
            cores[side] = square_erosion(union, max(1, footprint_side(lungs[side])))

    parts: dict[str, dict[str, np.ndarray]] = {}
    thirds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    cpa: dict[str, np.ndarray] = {}
    for side in SIDES:
        lung = lungs[side]
        thirds[side] = vertical_thirds(lung)
        medial, lateral = medial_lateral(lung, side)
        rim = peripheral(lung, cores[side], side, mode)
        parts[side] = {"medial": medial, "lateral": lateral, "peripheral": rim}
        cpa[side] = costophrenic_angle(rim, lung)

    out: dict[str, np.ndarray] = {
        "right costophrenic angle": cpa["right"],
        "left costophrenic angle": cpa["left"],
    }
    for part in ("medial", "lateral", "peripheral"):
        for side in SIDES:
            for suffix, zone in zip(ZONE_SUFFIXES, thirds[side]):
                out[f"{side} {part} lung & {side} {suffix}"] = parts[side][part] & zone
    assert tuple(out) == REGION_NAMES
    return out
