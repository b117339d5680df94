"""Decoded images kept while their conversations are live, within a memory budget (least recently
used out first).

Every turn re-sends every image of its conversation so far: an RR case sends its X-ray on all nine
turns. Decoding a 1024x1024 PNG takes longer than the rest of rendering a request (bench/RESULTS.md,
"Continuous scheduling"), so a backend that hands its engine decoded images (vLLM's ``image_pil``
parts) decodes each image once while its conversation is live, with the engine's own loader (the
same pixels a file URL would give), and drops it when the conversation ends (``release``) or when
the budget needs the room. An image not kept is loaded by the engine from its file, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any


def image_bytes(image: Any) -> int:
    """Memory of a decoded PIL image (width x height x bands)."""
    width, height = image.size
    return width * height * len(image.getbands())


class DecodedImages:
    def __init__(self, load: Callable[[str], Any], budget: int):
        #: relative path -> decoded image, as the engine would load it
        self.load = load
        self.budget = budget
        self._images: OrderedDict[str, Any] = OrderedDict()
        self.held = 0
        self.hits = 0
        self.decoded = 0
        self.evicted = 0

    def get(self, relative: str) -> Any | None:
        """The decoded image (decoded now if it is not kept), or None when it does not fit."""
        image = self._images.get(relative)
        if image is not None:
            self._images.move_to_end(relative)
            self.hits += 1
            return image
        image = self.load(relative)
        self.decoded += 1
        size = image_bytes(image)
        if size > self.budget:
            return image
        while self._images and self.held + size > self.budget:
            _, old = self._images.popitem(last=False)
            self.held -= image_bytes(old)
            self.evicted += 1
        self._images[relative] = image
        self.held += size
        return image

    def release(self, prefixes: Iterable[str]) -> None:
        """Drop the images whose paths start with any of ``prefixes`` (ended conversations)."""
        starts = tuple(prefixes)
        for relative in [r for r in self._images if r.startswith(starts)]:
            self.held -= image_bytes(self._images.pop(relative))

    def record(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "decoded": self.decoded,
            "reused": self.hits,
            "evicted": self.evicted,
        }
