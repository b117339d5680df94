"""Each image's pixel values computed once while a conversation uses it, not once per turn.

A conversation re-sends every earlier image on each turn, and the image processor converts,
rescales and normalizes each of them again. For a fixed-size processor (see image_resize.py) every
image is processed on its own, so a batch's pixel values are the images' own outputs stacked:
``PixelCache`` stands in for the image processor, keeps each live image's output and stacks them.
The transformers backend uses it only after checking on real images that the model inputs are
bit for bit those of the processor itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class PixelCache:
    """An image processor whose output per image object is computed once (all other attributes pass through)."""

    def __init__(self, image_processor: Any):
        self.wrapped = image_processor
        #: id(image) -> (the image, the keyword arguments, its arrays); the image is held so its id stays unique
        self._outputs: dict[int, tuple[Any, dict[str, Any], dict[str, np.ndarray]]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __call__(self, images: Any, **kwargs: Any) -> Any:
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.image_utils import make_flat_list_of_images

        return_tensors = kwargs.pop("return_tensors", None)
        flat = make_flat_list_of_images(images)
        if not flat:
            return self.wrapped(images, return_tensors=return_tensors, **kwargs)
        parts = [self._output(image, kwargs) for image in flat]
        stacked = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        return BatchFeature(stacked, tensor_type=return_tensors)

    def _output(self, image: Any, kwargs: dict[str, Any]) -> dict[str, np.ndarray]:
        entry = self._outputs.get(id(image))
        if entry is not None and entry[0] is image and _same(entry[1], kwargs):
            return entry[2]
        out = self.wrapped([image], return_tensors="np", **kwargs)
        arrays = {key: np.asarray(value) for key, value in out.items()}
        self._outputs[id(image)] = (image, dict(kwargs), arrays)
        return arrays

    def keep_only(self, images: Iterable[Any]) -> None:
        """Forget the outputs of every image not in ``images`` (those of finished conversations)."""
        live = {id(image) for image in images}
        self._outputs = {k: v for k, v in self._outputs.items() if k in live}

    @property
    def cached(self) -> int:
        """How many images' outputs are held."""
        return len(self._outputs)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        return bool(a == b)
    except ValueError:  # arrays among the arguments: compare them as different
        return False
