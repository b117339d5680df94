"""Images a model would not see correctly, and a dataset cache that missed changed images
(issue: field cases 7 and 8), each with its right value.

7: a 16-bit greyscale PNG (as DICOM exports and some PNG converters write them) copied into a bundle
   reaches a model as a white image. Its siblings: 32-bit integer and float greyscale, and the 8-bit
   modes that are not the release's RGB (grey, grey with alpha, RGBA, palette), which are converted.
8: the arrow cache must notice a replaced or truncated image, and all_checks must check.
"""

from __future__ import annotations

import json
import os

import datasets
import numpy as np
import pytest
from PIL import Image

import chexpercept  # noqa: F401  (registers the builder)
from chexpercept.builder.sources import load_cxr
from chexpercept.bundle import UNSAFE_MODES, check_image_file, read_bundle, write_sha256sums
from chexpercept.errors import BundleValidationError


def ramp16(size: int = 1024) -> np.ndarray:
    """A 16-bit greyscale radiograph-like ramp (values up to 65535, as 16-bit exports hold)."""
    row = np.linspace(0, 65535, size, dtype=np.float64)
    return np.tile(row, (size, 1)).astype(np.uint16)


def test_16_bit_grey_through_convert_rgb_is_white(tmp_path):
    """What the issue saw: Pillow's convert("RGB"), as backends use it, clips 16-bit values."""
    path = tmp_path / "g16.png"
    Image.fromarray(ramp16(64)).save(path)
    with Image.open(path) as im:
        assert im.mode == "I;16"
        assert np.asarray(im.convert("RGB")).mean() > 250


@pytest.mark.parametrize(
    "mode,writer",
    [
        ("I;16", lambda p: Image.fromarray(ramp16()).save(p)),
        ("I", lambda p: Image.fromarray(ramp16().astype(np.int32)).save(p.with_suffix(".tif"))),
        ("F", lambda p: Image.fromarray(ramp16().astype(np.float32)).save(p.with_suffix(".tif"))),
    ],
)
def test_unsafe_modes_are_converted_by_generate_and_flagged_by_validation(tmp_path, mode, writer):
    path = tmp_path / "cxr.png"
    writer(path)
    source = path if path.exists() else path.with_suffix(".tif")
    with Image.open(source) as im:
        assert im.mode == mode and mode in UNSAFE_MODES
    # validation names the problem (basic: from the header, no decoding); a TIFF is no bundle format
    problem = check_image_file(source, "basic")
    if source.suffix == ".tif":
        assert problem is not None and "does not decode as PNG or JPEG: the file starts with" in problem
    else:
        assert problem is not None and f"image mode {mode}" in problem and "white image" in problem
    # generate's reader converts it instead of copying it: 8-bit RGB with the ramp kept
    cxr = load_cxr(source)
    assert cxr.png_bytes is None and cxr.rgb.dtype == np.uint8 and cxr.rgb.shape == (1024, 1024, 3)
    row = cxr.rgb[512, :, 0].astype(int)
    assert row[0] < 5 and row[-1] > 250 and np.all(np.diff(row) >= 0)  # dark to bright, not white


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P"])
def test_other_8_bit_modes_are_converted_to_the_releases_rgb(tmp_path, mode):
    grey = (ramp16() >> 8).astype(np.uint8)
    im = Image.fromarray(grey).convert(mode)
    path = tmp_path / "cxr.png"
    im.save(path)
    assert check_image_file(path, "full") is None  # they survive convert("RGB"): not flagged
    cxr = load_cxr(path)
    assert cxr.png_bytes is None  # not copied as is: the release holds 8-bit RGB
    assert cxr.rgb.shape == (1024, 1024, 3)
    np.testing.assert_allclose(cxr.rgb[512, :, 0], grey[512], atol=1)


def test_8_bit_rgb_still_passes_through_byte_for_byte(tmp_path):
    path = tmp_path / "cxr.png"
    Image.fromarray(np.repeat((ramp16() >> 8).astype(np.uint8)[:, :, None], 3, axis=2)).save(path)
    assert load_cxr(path, decode=False).png_bytes == path.read_bytes()


def test_generate_from_16_bit_pngs_gives_images_a_model_sees(tmp_path):
    """The issue's command: generate --cxr-png DIR with 16-bit greyscale 1024 x 1024 PNGs."""
    from chexpercept.builder.pipeline import GenerateConfig, generate
    from chexpercept.builder.synth_sources import synthesize_sources

    sources = synthesize_sources(tmp_path / "src", per_cell=1, seed=3, lesions=("effusion",), progress=False)
    ils = json.loads((sources / "mimic-ils" / "mimic_ils_instruction_answer.json").read_text())["train"]
    flat = tmp_path / "png16"
    flat.mkdir()
    for s in ils.values():
        with Image.open(sources / "mimic-cxr-jpg" / "files" / s["image_path"]) as jpg:
            grey = np.asarray(jpg.convert("L").resize((1024, 1024)), dtype=np.uint16) * 257
        Image.fromarray(grey).save(flat / f"{s['dicom_id']}.png")
    report = generate(
        GenerateConfig(
            out=str(tmp_path / "out"),
            per_cell=1,
            cxr_png=str(flat),
            mimic_ils=str(sources / "mimic-ils"),
            anatomy=str(sources / "anatomy"),
            lesions=["effusion"],
            progress=False,
        )
    )
    assert report.exit_code == 0, report.text()
    bundle = read_bundle(tmp_path / "out", check_images="full")
    for case in bundle.cases:
        with Image.open(bundle.root / case.cxr_image) as im:
            assert im.mode == "RGB"
            assert np.asarray(im.convert("RGB")).mean() < 200  # not white


def test_validation_and_load_dataset_name_a_16_bit_image(fresh_bundle):
    key = read_bundle(fresh_bundle).cases[0].key_id
    xray = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    Image.fromarray(ramp16(32)).save(xray)
    with pytest.raises(BundleValidationError, match=rf"{key}.*xray.png.*image mode I;16"):
        read_bundle(fresh_bundle)
    with pytest.raises(BundleValidationError, match=rf"{key}.*xray.png.*image mode I;16"):
        datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle))


# ------------------------------------------------------------------------------ 8. the cache
def _first_image(bundle_dir):
    key = read_bundle(bundle_dir).cases[0].key_id
    return key, bundle_dir / "chexpercept" / key / "detection_qa" / "xray.png"


def test_a_replaced_image_is_served_anew(fresh_bundle):
    key, xray = _first_image(fresh_bundle)

    def stored_bytes() -> bytes:
        ds = datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle), embed_images=True)["train"]
        row = ds.cast_column("image", datasets.Image(decode=False))[0]
        assert row["key_id"] == key
        return row["image"]["bytes"]

    assert stored_bytes() == xray.read_bytes()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(xray)
    assert stored_bytes() == xray.read_bytes()


def test_a_truncated_image_is_noticed_on_reload(fresh_bundle):
    key, xray = _first_image(fresh_bundle)
    assert datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle))["train"].num_rows == 21
    data = xray.read_bytes()
    xray.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleValidationError, match=rf"{key}.*xray.png"):
        datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle), verification_mode="all_checks")
    with pytest.raises(BundleValidationError, match=rf"{key}.*truncated"):
        datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle))


def test_all_checks_run_on_a_cached_dataset(fresh_bundle):
    """Same size, same modification time, other bytes: the fingerprint cannot see it, the checks do."""
    write_sha256sums(fresh_bundle)
    key, xray = _first_image(fresh_bundle)
    assert datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle))["train"].num_rows == 21
    stat = xray.stat()
    data = bytearray(xray.read_bytes())
    data[40] ^= 0xFF  # inside the image data
    xray.write_bytes(bytes(data))
    os.utime(xray, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle))["train"].num_rows == 21  # cached
    with pytest.raises(BundleValidationError, match=rf"{key}.*(sha256 does not match|does not decode)"):
        datasets.load_dataset("chexpercept", data_dir=str(fresh_bundle), verification_mode="all_checks")
