"""Procedural phantom chest X-rays with anatomy and lesion masks (for testing software only).

A phantom is drawn from its masks: lungs (dark), heart and mediastinum (bright), spine, ribs, a body
outline, the abdomen below the diaphragm, then the lesion (brighter than the lung under it) and noise.
Lesions: blobs inside the lungs (consolidation, pneumonia, opacity, atelectasis, edema), fluid in
the lung bases with a meniscus (effusion), or an enlarged heart (cardiomegaly). Masks are what the
PhysioNet sources hold: lungs and heart at 1024 x 1024, lesions at MIMIC-ILS's 512 x 512; the image
is drawn from the 512 lesion mask scaled to 1024, so every answer derived from the saved masks agrees
with what the image shows. Nothing here resembles a patient.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

from chexpercept.vocab import CARDIOMEGALY

SIZE = 1024
LESION_SIZE = 512  # MIMIC-ILS masks are 512 x 512
_Y, _X = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)


@dataclass
class PhantomAnatomy:
    right_lung: np.ndarray  # patient right = image left
    left_lung: np.ndarray
    heart: np.ndarray


def _lung(cx: float, top: float, base: float, half_w: float, dome: float, lateral_sign: int) -> np.ndarray:
    """A lung: rounded apex, a lateral wall ending in a sharp costophrenic angle, a domed diaphragm."""
    apex_h = (base - top) * 0.42
    cy = top + apex_h
    upper = (cy >= _Y) & (((_X - cx) / half_w) ** 2 + ((_Y - cy) / apex_h) ** 2 <= 1.0)
    # below the apex the lateral wall flares slightly outward toward the base
    t = np.clip((_Y - cy) / max(1.0, base - cy), 0.0, 1.0)
    flare = half_w * (1.0 + 0.12 * t)
    lateral_edge = cx + lateral_sign * flare
    medial_edge = cx - lateral_sign * half_w * (1.0 - 0.05 * t)
    lo = np.minimum(lateral_edge, medial_edge)
    hi = np.maximum(lateral_edge, medial_edge)
    # diaphragm: highest in the middle of the lung, lowest at the lateral angle
    u = (_X - (cx - lateral_sign * half_w * 0.2)) / (half_w * 1.3)
    diaphragm = base - dome * np.clip(1.0 - u * u, 0.0, 1.0)
    lower = (cy < _Y) & (lo <= _X) & (hi >= _X) & (diaphragm >= _Y)
    return upper | lower


def draw_anatomy(rng: np.random.Generator, *, enlarged_heart: bool = False) -> PhantomAnatomy:
    """Random but plausible lungs and heart (lungs exclude the heart except a 4 px contact band)."""
    j = lambda s: float(rng.normal(0.0, s))  # noqa: E731
    scale = 1.0 + j(0.03)
    top = 150 + j(10)
    base = 800 + j(15)
    r_cx, l_cx = 330 + j(8), 694 + j(8)
    r_w, l_w = 150 * scale + j(5), 140 * scale + j(5)
    right = _lung(r_cx, top + j(6), base + j(6), r_w, 55 + j(8), -1)
    left = _lung(l_cx, top + 10 + j(6), base + 15 + j(6), l_w, 45 + j(8), +1)
    hx, hy = 560 + j(8), 640 + j(10)
    ha, hb = (225 + j(10), 165 + j(8)) if enlarged_heart else (150 + j(8), 118 + j(6))
    heart = ((_X - hx) / ha) ** 2 + ((_Y - hy) / hb) ** 2 <= 1.0
    core = ((_X - hx) / (ha - 4)) ** 2 + ((_Y - hy) / (hb - 4)) ** 2 <= 1.0
    right &= ~core
    left &= ~core
    # keep the lungs apart at the mediastinum
    right &= _X < 500
    left &= _X > 524
    return PhantomAnatomy(right, left, heart)


def _downsample(mask: np.ndarray) -> np.ndarray:
    """1024 -> 512 by 2x2 majority (ties count as lesion)."""
    blocks = mask.reshape(LESION_SIZE, 2, LESION_SIZE, 2).sum(axis=(1, 3))
    return blocks >= 2


def upsample(mask512: np.ndarray) -> np.ndarray:
    """512 -> 1024 nearest neighbour (what every reader of the masks does)."""
    return np.repeat(np.repeat(mask512, 2, axis=0), 2, axis=1)


def _blob(rng: np.random.Generator, cx: float, cy: float, size: float) -> np.ndarray:
    """A lumpy blob: a few overlapping rotated ellipses (drawn in a window around the centre)."""
    out = np.zeros((SIZE, SIZE), dtype=bool)
    r = int(size * 2.2) + 2
    y0, y1 = max(0, int(cy) - r), min(SIZE, int(cy) + r)
    x0, x1 = max(0, int(cx) - r), min(SIZE, int(cx) + r)
    if y0 >= y1 or x0 >= x1:
        return out
    yy, xx = _Y[y0:y1, x0:x1], _X[y0:y1, x0:x1]
    win = out[y0:y1, x0:x1]
    for _ in range(int(rng.integers(2, 5))):
        ox, oy = rng.normal(0, size * 0.35, 2)
        a, b = size * rng.uniform(0.55, 1.0), size * rng.uniform(0.45, 0.9)
        th = rng.uniform(0, np.pi)
        dx, dy = xx - (cx + ox), yy - (cy + oy)
        u = dx * np.cos(th) + dy * np.sin(th)
        v = -dx * np.sin(th) + dy * np.cos(th)
        win |= (u / a) ** 2 + (v / b) ** 2 <= 1.0
    return out


def _point_in(
    mask: np.ndarray, rng: np.random.Generator, y_range: tuple[float, float] | None = None
) -> tuple[float, float]:
    ys, xs = np.nonzero(mask)
    if y_range is not None:
        y0, y1 = np.quantile(ys, y_range[0]), np.quantile(ys, y_range[1])
        keep = (ys >= y0) & (ys <= y1)
        ys, xs = ys[keep], xs[keep]
    i = int(rng.integers(len(ys)))
    return float(xs[i]), float(ys[i])


def draw_lesion(lesion: str, anatomy: PhantomAnatomy, rng: np.random.Generator) -> np.ndarray:
    """The lesion mask at 512 x 512 (the MIMIC-ILS frame), built to lie inside the lungs."""
    lungs = {"right": anatomy.right_lung, "left": anatomy.left_lung}
    if lesion == CARDIOMEGALY:
        return _downsample(anatomy.heart)
    out = np.zeros((SIZE, SIZE), dtype=bool)
    if lesion == "effusion":
        sides = ["right", "left"] if rng.random() < 0.35 else [("right", "left")[int(rng.integers(2))]]
        for side in sides:
            lung = lungs[side]
            ys = np.nonzero(lung)[0]
            y_top, y_bot = ys.min(), ys.max()
            level = y_bot - (y_bot - y_top) * rng.uniform(0.18, 0.38)
            xs = np.nonzero(lung.any(axis=0))[0]
            lateral = xs.min() if side == "right" else xs.max()
            # meniscus: the fluid line rises toward the lateral wall
            rise = 60 * np.clip(1.0 - np.abs(_X - lateral) / max(1, xs.max() - xs.min()), 0, 1) ** 2
            out |= lung & (level - rise <= _Y)
    else:
        if lesion == "edema":
            sides = ["right", "left"]
        elif lesion in ("pneumonia", "consolidation", "opacity"):
            sides = ["right", "left"] if rng.random() < 0.3 else [("right", "left")[int(rng.integers(2))]]
        else:  # atelectasis
            sides = [("right", "left")[int(rng.integers(2))]]
        for side in sides:
            lung = lungs[side]
            for _ in range(int(rng.integers(1, 3))):
                if lesion == "atelectasis":
                    cx, cy = _point_in(lung, rng, (0.55, 0.9))
                    size = rng.uniform(45, 70)
                    blob = _blob(rng, cx, cy, size) & (np.abs(_Y - cy) < size * 0.45)
                elif lesion == "edema":
                    # perihilar: medial half, mid zone
                    xs = np.nonzero(lung.any(axis=0))[0]
                    mid = (xs.min() + xs.max()) / 2
                    medial = lung & ((mid <= _X) if side == "right" else (mid >= _X))
                    cx, cy = _point_in(medial, rng, (0.35, 0.7))
                    blob = _blob(rng, cx, cy, rng.uniform(60, 90))
                else:
                    inner = ndi.distance_transform_edt(lung[::4, ::4]) * 4 > 30
                    inner = np.repeat(np.repeat(inner, 4, axis=0), 4, axis=1) & lung
                    cx, cy = _point_in(inner if inner.any() else lung, rng)
                    blob = _blob(rng, cx, cy, rng.uniform(45, 85))
                out |= blob & lung
    lesion512 = _downsample(out)
    lung512 = _downsample(anatomy.right_lung | anatomy.left_lung)
    return lesion512 & lung512


def render_cxr(
    anatomy: PhantomAnatomy, lesion1024: np.ndarray | None, rng: np.random.Generator, *, lesion: str = ""
) -> np.ndarray:
    """A grey 1024 x 1024 uint8 phantom radiograph drawn from the masks."""
    img = np.full((SIZE, SIZE), 18.0, dtype=np.float32)
    body = ((_X - 512) / 470) ** 2 + ((_Y - 560) / 560) ** 2 <= 1.0
    img[body] = 150.0
    lungs = anatomy.right_lung | anatomy.left_lung
    # lungs darker toward the lateral walls
    img[lungs] = 66.0 - 14.0 * (np.abs(_X[lungs] - 512.0) / 400.0)
    # abdomen below the diaphragm is soft-tissue bright
    ys = np.nonzero(lungs.any(axis=1))[0]
    if ys.size:
        below = (ys.max() <= _Y) & body & ~lungs
        img[below] = 165.0
    spine = body & (np.abs(_X - 512) < 34) & ~lungs
    img[spine] = 205.0
    img[anatomy.heart] = 190.0
    # ribs: ten curved bands per side, brighter over the lungs
    for cx, sign in ((330.0, -1.0), (694.0, 1.0)):
        half = (_X < 512) if sign < 0 else (_X >= 512)
        rel = _Y - (150.0 + rng.normal(0, 4) + 0.00128 * (_X - cx + sign * 120.0) ** 2)
        k = np.round(rel / 62.0)
        band = half & body & (np.abs(rel - 62.0 * k) < 9.0) & (k >= 0) & (k < 10)
        img[band] += np.where(lungs[band], 34.0, 14.0)
    if lesion1024 is not None and lesion1024.any() and lesion != CARDIOMEGALY:
        soft = ndi.gaussian_filter(lesion1024.astype(np.float32), 2.5)
        img += soft * (70.0 + rng.normal(0, 6))
    img += rng.normal(0.0, 6.0, img.shape).astype(np.float32)
    img = ndi.gaussian_filter(img, 1.2)
    return np.clip(img, 0, 255).astype(np.uint8)


@dataclass
class PhantomStudy:
    """Everything drawn for one phantom image."""

    image: np.ndarray  # 1024 x 1024 grey uint8
    anatomy: PhantomAnatomy
    lesion512: np.ndarray | None


def draw_study(lesion: str, positive: bool, rng: np.random.Generator) -> PhantomStudy:
    anatomy = draw_anatomy(rng, enlarged_heart=positive and lesion == CARDIOMEGALY)
    lesion512 = draw_lesion(lesion, anatomy, rng) if positive else None
    image = render_cxr(anatomy, upsample(lesion512) if lesion512 is not None else None, rng, lesion=lesion)
    return PhantomStudy(image, anatomy, lesion512)
