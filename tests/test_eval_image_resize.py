"""Which processors get their images resized once (fixed size) and which keep them as they are."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from chexpercept.eval.backends.transformers.image_resize import FixedResize, fixed_resize_of


def processor(images_kwargs=None, **image_processor):
    settings = {"do_resize": True, "size": {"height": 56, "width": 56}, "resample": 2, **image_processor}
    return SimpleNamespace(image_processor=SimpleNamespace(**settings), images_kwargs=images_kwargs or {})


def test_a_fixed_height_and_width_is_resized_once_with_the_processors_filter():
    plan, why_not = fixed_resize_of(processor(resample=3))
    assert plan == FixedResize(width=56, height=56, resample=3) and why_not == ""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 120, 3), dtype=np.uint8))
    resized = plan.apply(image)
    assert resized.size == (56, 56)
    assert np.array_equal(np.asarray(resized), np.asarray(image.resize((56, 56), Image.Resampling.BICUBIC)))
    assert plan.describe() == "56x56, bicubic"


@pytest.mark.parametrize(
    ("proc", "reason"),
    [
        (processor(size={"shortest_edge": 336}), "not a fixed height and width"),
        (processor(size={"shortest_edge": 56, "longest_edge": 1024}), "not a fixed height and width"),
        (processor(size={"height": 56, "width": 56, "max_pixels": 4096}), "not a fixed height and width"),
        (processor(do_pan_and_scan=True), "do_pan_and_scan"),
        (processor(images_kwargs={"do_pan_and_scan": True}), "do_pan_and_scan"),
        (processor(do_image_splitting=True), "do_image_splitting"),
        (processor(image_grid_pinpoints=[[336, 672]]), "image_grid_pinpoints"),
        (processor(do_resize=False), "does not resize"),
        (processor(resample="bilinear-antialias"), "not a Pillow filter"),
        (SimpleNamespace(tokenizer=object()), "no image processor"),
    ],
)
def test_processors_that_size_from_the_image_keep_the_originals(proc, reason):
    plan, why_not = fixed_resize_of(proc)
    assert plan is None and reason in why_not


def test_the_real_gemma3_image_processor_is_fixed_size():
    transformers = pytest.importorskip("transformers")
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 48})
    plan, _ = fixed_resize_of(SimpleNamespace(image_processor=image_processor, images_kwargs={}))
    assert plan == FixedResize(width=48, height=64, resample=int(Image.Resampling.BILINEAR))


def test_the_pixel_cache_stacks_each_images_own_output_computed_once():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from chexpercept.eval.backends.transformers.pixel_cache import PixelCache

    real = transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    calls = []

    class Counting:
        def __call__(self, images, **kwargs):
            calls.append(len(images))
            return real(images, **kwargs)

        size = real.size

    rng = np.random.default_rng(1)
    a, b, c = (Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(3))
    cache = PixelCache(Counting())
    got = cache([[a, b], [c]], return_tensors="pt")
    want = real([[a, b], [c]], return_tensors="pt")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert calls == [1, 1, 1] and cache.cached == 3 and cache.size is real.size
    again = cache([c, a], return_tensors="pt")
    assert calls == [1, 1, 1]
    assert torch.equal(again["pixel_values"], want["pixel_values"][[2, 0]])
    cache([a], return_tensors="pt", do_normalize=False)  # other settings: computed again
    assert calls == [1, 1, 1, 1]
    cache.keep_only([a])
    assert cache.cached == 1
