"""Rendering constants of spec 1.1 (cyan overlay at alpha 0.5, point discs) and the PNG encoder."""

import io

import numpy as np
import pytest
from PIL import Image

from chexpercept.builder.render import POINT_RADIUS, Overlayer, draw_points, encode_png, overlay, rgb255


def test_overlay_blends_cyan_only_on_mask_pixels():
    img = np.zeros((4, 4, 3), dtype=np.uint8)
    img[..., :] = np.arange(16, dtype=np.uint8).reshape(4, 4, 1) * 17  # 0 .. 255 grey
    mask = np.zeros((4, 4), dtype=bool)
    mask[1:3, 1:3] = True
    out = overlay(img, mask)
    v = img[..., 0].astype(int)
    # out = img * 0.5 + cyan * 0.5 (floor): (v // 2, (v + 255) // 2, (v + 255) // 2)
    np.testing.assert_array_equal(out[mask][:, 0], v[mask] // 2)
    np.testing.assert_array_equal(out[mask][:, 1], (v[mask] + 255) // 2)
    np.testing.assert_array_equal(out[mask][:, 2], (v[mask] + 255) // 2)
    np.testing.assert_array_equal(out[~mask], img[~mask])
    assert np.array_equal(Overlayer(img).apply(mask), out)
    with pytest.raises(ValueError):
        overlay(img, mask[:2])


def test_points_are_coloured_discs_with_a_white_ring():
    img = np.zeros((100, 100, 3), dtype=np.uint8)
    out = draw_points(img, [((50, 50), "red"), ((0, 99), "orange")])
    assert tuple(out[50, 50]) == (255, 0, 0)
    assert tuple(out[50, 50 + POINT_RADIUS - 3]) == (255, 0, 0)
    assert tuple(out[50, 50 + POINT_RADIUS]) == (255, 255, 255)  # ring centred on the radius
    assert tuple(out[50, 50 + POINT_RADIUS + 3]) == (0, 0, 0)
    assert tuple(out[99, 0]) == rgb255("orange") == (255, 128, 0)  # clipped at the border
    assert rgb255("purple") == (128, 0, 128) and rgb255("pink") == (255, 191, 204)


@pytest.mark.parametrize("shape", [(1, 1, 3), (7, 5, 3), (6, 9), (1024, 1024, 3)])
def test_png_encoder_round_trips(shape):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=shape, dtype=np.uint8)
    data = encode_png(arr)
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "PNG" and im.size == (shape[1], shape[0])
        np.testing.assert_array_equal(np.asarray(im), arr)
    assert encode_png(arr) == data  # deterministic
    with pytest.raises(ValueError):
        encode_png(arr.astype(np.float32))
