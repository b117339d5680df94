"""Overlay and point images with the constants of reference spec 1.1, in numpy and PIL (no matplotlib).

Mask overlay: cyan (0, 1, 1) at alpha 0.5 on mask pixels only, ``out = img * (1 - 0.5) + colour * 0.5``,
computed in integers (floor), so a pixel value v becomes (v // 2, (v + 255) // 2, (v + 255) // 2).

Points: for every point option a filled disc of radius 15 px in the option colour, then a white ring of
radius 15 px whose width is matplotlib's 2 pt line at 100 dpi (2.78 px), centred on the circle. Pixels
are hard-edged (the reference's matplotlib figure is anti-aliased), and the image keeps its exact size
(matplotlib's tight bounding box can add or drop a pixel row). Colour (1, 0.5, 0) is written as
(255, 128, 0) (each channel rounded).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

from chexpercept.vocab import COLOR_RGB

from .morph import clipped_stamp

POINT_RADIUS = 15
RING_WIDTH = 2 * 100 / 72  # 2 pt at 100 dpi, in px
OVERLAY_COLOR = "cyan"
#: zlib level of every PNG we encode (see encode_png)
PNG_COMPRESS_LEVEL = 1


def rgb255(color: str) -> tuple[int, int, int]:
    r, g, b = COLOR_RGB[color]
    return round(r * 255), round(g * 255), round(b * 255)


def overlay(image: np.ndarray, mask: np.ndarray, color: str = OVERLAY_COLOR) -> np.ndarray:
    """The RGB image with ``mask`` blended in at alpha 0.5 (spec 1.1), as uint8."""
    return Overlayer(image, color).apply(mask)


class Overlayer:
    """Blends masks into one image; the blended image is computed once and reused for every mask."""

    def __init__(self, image: np.ndarray, color: str = OVERLAY_COLOR):
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"expected an H x W x 3 image, got shape {image.shape}")
        self.image = image
        rgb = np.asarray(rgb255(color), dtype=np.uint16)
        self.blended = ((image.astype(np.uint16) + rgb) // 2).astype(np.uint8)

    def apply(self, mask: np.ndarray) -> np.ndarray:
        if mask.shape != self.image.shape[:2]:
            raise ValueError(f"mask shape {mask.shape} does not match image {self.image.shape[:2]}")
        return np.where(mask[:, :, None], self.blended, self.image)


def draw_points(image: np.ndarray, points: Sequence[tuple[tuple[int, int], str]]) -> np.ndarray:
    """Coloured discs with a white ring at each (x, y), in order (later points are drawn on top)."""
    out = image.copy()
    reach = int(np.ceil(POINT_RADIUS + RING_WIDTH / 2))
    yy, xx = np.mgrid[-reach : reach + 1, -reach : reach + 1]
    dist = np.sqrt(xx * xx + yy * yy)
    disc = dist <= POINT_RADIUS
    ring = np.abs(dist - POINT_RADIUS) <= RING_WIDTH / 2
    white = np.array([255, 255, 255], dtype=np.uint8)
    for (x, y), color in points:
        windows = clipped_stamp(x, y, reach, out.shape)
        if windows is None:
            continue
        sub = out[windows[0]]
        d, r = disc[windows[1]], ring[windows[1]]
        sub[d] = np.asarray(rgb255(color), dtype=np.uint8)
        sub[r] = white
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def encode_png(image: np.ndarray) -> bytes:
    """An 8-bit grey or RGB PNG: every row filtered with PNG's 'Sub' filter, zlib level 1.

    A plain, deterministic encoder about twice as fast as Pillow's at the same level (about 45 ms for
    a 1024 x 1024 RGB image, with files of similar size), since a bundle holds several such images
    per case.
    """
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"expected uint8 H x W or H x W x 3, got {image.dtype} {image.shape}")
    h, w = image.shape[:2]
    channels = 1 if image.ndim == 2 else 3
    rows = image.reshape(h, w * channels)
    filtered = np.empty((h, w * channels + 1), dtype=np.uint8)
    filtered[:, 0] = 1  # filter type Sub: each byte minus the byte one pixel to the left
    filtered[:, 1 : 1 + channels] = rows[:, :channels]
    np.subtract(rows[:, channels:], rows[:, :-channels], out=filtered[:, 1 + channels :], dtype=np.uint8)
    header = struct.pack(">IIBBBBB", w, h, 8, 0 if channels == 1 else 2, 0, 0, 0)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(filtered.tobytes(), PNG_COMPRESS_LEVEL)),
            _chunk(b"IEND", b""),
        )
    )
