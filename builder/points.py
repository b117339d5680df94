"""Point prompts on dilated and eroded contours (reference spec 5.4.6 step 2 and 5.4.8).

A deformation is described by points: to grow a mask into a region, points on the contour of the mask
dilated by 32 px per depth level; to shrink it, points on the contour of the mask eroded by 16 px per
level (one and two iterations of OpenCV's 32x32 ellipse in the reference). Depth 1 takes 2-4 points
close together (at least 30 px apart); every deeper level takes fewer, each the nearest contour point
to one of the level above. All distances are compared as exact integer squares.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .morph import MaskGeometry

Point = tuple[int, int]

EXPANSION_STEP = 32  # px per depth level (2 iterations of a 16 px disk)
CONTRACTION_STEP = 16  # px per depth level (1 iteration)
MIN_SPACING = 30  # px between points of one depth level
WIDTHS = (2, 3, 4)  # points at depth 1
WIDTHS_DEEP = (3, 4, 5)  # points at depth 1 when a fake mask starts deeper than 2
FAKE_POINT_DISTANCE = 100  # px between distractor points and anything else
FAKE_POINTS_MAX = 5
FALLBACK_TRIES = 500


def radius_for(operation: str, depth: int) -> int:
    return (EXPANSION_STEP if operation == "expansion" else CONTRACTION_STEP) * depth


def contour_candidates(
    geom: MaskGeometry, operation: str, radius: float, region: np.ndarray | None
) -> np.ndarray:
    """(N, 2) array of (x, y) contour pixels at ``radius`` inside ``region`` (None: anywhere)."""
    win, edge = geom.contour(operation, radius)
    if region is not None:
        edge = edge & region[win]
    ys, xs = np.nonzero(edge)
    return np.stack([xs + win[1].start, ys + win[0].start], axis=1).astype(np.int64)


def far_from(cands: np.ndarray, points: Sequence[Point], distance: int) -> np.ndarray:
    """Candidates at least ``distance`` px from every point."""
    if len(cands) == 0 or not points:
        return cands
    pts = np.asarray(points, dtype=np.int64)
    d2 = ((cands[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2)
    return cands[(d2 >= distance * distance).all(axis=1)]


def _nearest(cands: np.ndarray, to: Point) -> int:
    d2 = ((cands - np.asarray(to, dtype=np.int64)) ** 2).sum(axis=1)
    return int(np.argmin(d2))


def collect_prompt(
    geom: MaskGeometry,
    operation: str,
    region: np.ndarray | None,
    depth: int,
    rng: np.random.Generator,
    *,
    avoid: Sequence[Point] = (),
    avoid_distance: int = 50,
    widths: Sequence[int] = WIDTHS,
) -> list[list[Point]] | None:
    """Points per depth level (1..depth), or None when the contours cannot hold them all."""
    levels: list[list[Point]] = []
    used: set[Point] = set()
    width_prev = 0
    for d in range(1, depth + 1):
        cands = far_from(
            contour_candidates(geom, operation, radius_for(operation, d), region), avoid, avoid_distance
        )
        if len(cands) == 0:
            return None
        if d == 1:
            width = int(rng.choice(np.asarray(widths)))
            first = tuple(int(v) for v in cands[int(rng.integers(len(cands)))])
            chosen: list[Point] = [first]
            while len(chosen) < width:
                ok = far_from(cands, chosen, MIN_SPACING)
                if len(ok) == 0:
                    return None
                chosen.append(tuple(int(v) for v in ok[_nearest(ok, first)]))
        else:
            width = int(rng.integers(2, max(2, width_prev - 1) + 1))
            above = levels[-1]
            if width > len(above):
                return None
            anchors = [above[i] for i in rng.choice(len(above), size=width, replace=False)]
            chosen = []
            for anchor in anchors:
                free = np.array([c for c in cands.tolist() if tuple(c) not in used], dtype=np.int64).reshape(
                    -1, 2
                )
                if len(free) == 0:
                    return None
                pick = tuple(int(v) for v in free[_nearest(free, anchor)])
                chosen.append(pick)
                used.add(pick)
        used.update(chosen)
        levels.append(chosen)
        width_prev = width
    return levels


def pick_spread(
    cands: np.ndarray,
    rng: np.random.Generator,
    *,
    limit: int = FAKE_POINTS_MAX,
    distance: int = FAKE_POINT_DISTANCE,
) -> list[Point]:
    """Up to ``limit`` candidates: the first uniformly, each next uniformly among those far from all picked."""
    picked: list[Point] = []
    pool = cands
    while len(picked) < limit and len(pool):
        p = tuple(int(v) for v in pool[int(rng.integers(len(pool)))])
        picked.append(p)
        pool = far_from(pool, [p], distance)
    return picked


def fake_points(
    geom: MaskGeometry,
    operation: str,
    region: np.ndarray | None,
    depth: int,
    center: Point,
    avoid: Sequence[Point],
    rng: np.random.Generator,
) -> list[Point]:
    """Distractor points on the dilated (``expansion``) or eroded (``contraction``) contour of a step mask.

    At least ``FAKE_POINT_DISTANCE`` from the step's centre and from ``avoid``; deeper contours are
    tried when fewer than 2 are found, then random region pixels 100-300 px from the centre.
    """
    keep_away = [center, *avoid]
    picked: list[Point] = []
    for d in (depth, depth + 1, depth + 2):
        cands = far_from(
            contour_candidates(geom, operation, CONTRACTION_STEP * d, region), keep_away, FAKE_POINT_DISTANCE
        )
        picked = pick_spread(cands, rng)
        if len(picked) >= 2:
            return picked
    # random region pixels 100-300 px from the centre, far from everything else (rejection sampling)
    area = region if region is not None else np.ones(geom.shape, dtype=bool)
    ys, xs = np.nonzero(area)
    if len(ys) == 0:
        return picked
    cx, cy = center
    for _ in range(FALLBACK_TRIES):
        if len(picked) >= 2:
            break
        i = int(rng.integers(len(ys)))
        p = (int(xs[i]), int(ys[i]))
        d2 = (p[0] - cx) ** 2 + (p[1] - cy) ** 2
        if 100 * 100 <= d2 <= 300 * 300 and len(
            far_from(np.asarray([p]), [*keep_away, *picked], FAKE_POINT_DISTANCE)
        ):
            picked.append(p)
    return picked
