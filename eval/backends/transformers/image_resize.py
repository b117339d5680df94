"""Resize each image once, to the fixed input size its processor would resize it to on every turn.

A conversation re-sends its whole history each turn, so a processor that resizes every image to
one fixed size (Gemma3 896x896, SigLIP-style towers, the tiny test model's 56x56) repeats the same
costly resize of a 1024x1024 X-ray on every turn. Resizing the decoded image once, with the
processor's own filter, makes the processor's resize an identity (Pillow returns a copy when the size
already matches) and leaves its output unchanged. Processors that choose the size from the image
(dynamic resolution, tiling, pan-and-scan) are left alone, and the backend checks the equality on a
real image before relying on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

#: image-processor switches that make the output depend on the image's own size or shape
_TILING_FLAGS = (
    "do_pan_and_scan",
    "do_image_splitting",
    "crop_to_patches",
    "image_grid_pinpoints",
    "do_dynamic_resize",
    "dynamic_hd",
    "use_thumbnail",
)
#: size keys that mean "depends on the image" (shortest edge, pixel budgets, ...)
_DYNAMIC_SIZE_KEYS = (
    "shortest_edge",
    "longest_edge",
    "max_height",
    "max_width",
    "min_pixels",
    "max_pixels",
)


@dataclass(frozen=True)
class FixedResize:
    """The resize a fixed-size image processor applies to every image."""

    width: int
    height: int
    #: a Pillow resampling filter (the processor's own)
    resample: int

    def apply(self, image: Image.Image) -> Image.Image:
        return image.resize((self.width, self.height), resample=Image.Resampling(self.resample))

    def describe(self) -> str:
        return f"{self.width}x{self.height}, {Image.Resampling(self.resample).name.lower()}"


def _value(source: Any, key: str) -> Any:
    if source is None:
        return None
    if isinstance(source, dict):
        return source.get(key)
    return getattr(source, key, None)


def fixed_resize_of(processor: Any) -> tuple[FixedResize | None, str]:
    """The processor's fixed resize, or None and why the images must stay as they are."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return None, "the processor has no image processor"
    if not _value(image_processor, "do_resize"):
        return None, "the image processor does not resize"
    defaults = getattr(processor, "images_kwargs", None)  # a processor's own image defaults
    for flag in _TILING_FLAGS:
        if _value(image_processor, flag) or _value(defaults, flag):
            return None, f"the image processor's {flag} makes the input size depend on the image"
    size = _value(image_processor, "size")
    height, width = _value(size, "height"), _value(size, "width")
    dynamic = [k for k in _DYNAMIC_SIZE_KEYS if _value(size, k)]
    if not (height and width) or dynamic:
        return None, f"the image processor's size {size} is not a fixed height and width"
    resample = _value(image_processor, "resample")
    try:
        resample = int(resample)
        Image.Resampling(resample)
    except (TypeError, ValueError):
        return None, f"the image processor's resample filter {resample!r} is not a Pillow filter"
    return FixedResize(width=int(width), height=int(height), resample=resample), ""
