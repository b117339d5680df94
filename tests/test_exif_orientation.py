"""What a person sees is what the pipeline uses (issue 21 item 4): EXIF orientation is honoured by
browsers and ignored by Pillow, so by every model backend and by the masks drawn on the pixels.

Members: a source JPG with an orientation tag served to the review page (test_review_access and
test_review_browser); a source PNG with an ``eXIf`` chunk, which generate used to copy byte for byte
into the bundle (the report's viewer would then show it rotated); a bundle image carrying an
orientation, which validation now names.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from chexpercept.builder.sources import load_cxr, png_has_exif
from chexpercept.bundle import check_image_file, read_bundle
from chexpercept.errors import BundleValidationError


def _marked(size=1024) -> np.ndarray:
    arr = np.zeros((size, size, 3), dtype=np.uint8)
    arr[: size // 4, : size // 4] = 255  # a white block top-left, as stored
    return arr


def _png(arr, orientation=None) -> bytes:
    buf = io.BytesIO()
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif
    Image.fromarray(arr).save(buf, format="PNG", **kwargs)
    return buf.getvalue()


def test_a_png_with_exif_is_re_encoded_not_copied(tmp_path):
    arr = _marked()
    plain, tagged = tmp_path / "plain.png", tmp_path / "tagged.png"
    plain.write_bytes(_png(arr))
    tagged.write_bytes(_png(arr, orientation=8))
    assert not png_has_exif(plain.read_bytes()) and png_has_exif(tagged.read_bytes())
    assert load_cxr(plain, decode=False).png() == plain.read_bytes()  # the release's files pass through
    out = load_cxr(tagged, decode=False).png()
    assert out != tagged.read_bytes() and not png_has_exif(out)
    with Image.open(io.BytesIO(out)) as im:
        assert not im.getexif() and np.array_equal(np.asarray(im), arr)  # the stored pixels, unrotated


def test_a_jpg_with_an_orientation_gives_its_stored_pixels(tmp_path):
    path = tmp_path / "x.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_marked(512)[..., 0]).save(path, format="JPEG", quality=95, exif=exif)
    cxr = load_cxr(path)
    assert (
        cxr.rgb.shape == (1024, 1024, 3)
        and cxr.rgb[:100, :100].mean() > 200
        and cxr.rgb[:100, -100:].mean() < 50
    )
    with Image.open(io.BytesIO(cxr.png())) as im:
        assert not im.getexif()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_validation_names_an_image_with_an_orientation(fresh_bundle, fmt):
    entries = json.loads((fresh_bundle / "chexpercept.json").read_text())
    key = next(k for k in entries if "negative" in k)
    image = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_marked(32)).save(image, format=fmt, exif=exif)
    assert "EXIF orientation 6" in check_image_file(image, "basic")
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png: image carries EXIF orientation 6" in str(e.value)
    Image.fromarray(_marked(32)).save(image, format=fmt)  # the same pixels without the tag are fine
    assert len(read_bundle(fresh_bundle)) == len(entries)
