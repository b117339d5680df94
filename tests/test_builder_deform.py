"""Point prompts and the morphology deformer: direction and confinement of every change."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from chexpercept.builder.deformation_plan import Anatomies, deform_case
from chexpercept.builder.deformers import (
    DEFORMERS,
    DeformRequest,
    Prompt,
    implementations,
    make_deformer,
    satisfies,
)
from chexpercept.builder.deformers.morphology import MorphologyDeformer
from chexpercept.builder.morph import MaskGeometry
from chexpercept.builder.overlap import component_overlap
from chexpercept.builder.points import MIN_SPACING, collect_prompt, radius_for
from chexpercept.builder.regions import partition, zones

SHAPE = (400, 400)


def disk(cx, cy, r, shape=SHAPE):
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def half(shape=SHAPE, right=True):
    m = np.zeros(shape, dtype=bool)
    if right:
        m[:, 200:] = True
    else:
        m[:, :200] = True
    return m


@pytest.mark.parametrize("operation", ["expansion", "contraction"])
def test_collected_points_lie_on_the_contour_inside_the_region(operation):
    mask = disk(200, 200, 90)
    geom = MaskGeometry(mask)
    region = half(right=True)
    for seed in range(10):
        levels = collect_prompt(geom, operation, region, 2, np.random.default_rng(seed), avoid=[(290, 200)])
        assert levels is not None and 2 <= len(levels[0]) <= 4 and 2 <= len(levels[1]) <= len(levels[0])
        for depth, level in enumerate(levels, start=1):
            r = radius_for(operation, depth)
            for x, y in level:
                assert region[y, x]
                d = np.hypot(x - 200, y - 200)
                assert abs(d - (90 + r if operation == "expansion" else 90 - r)) < 2.5
                assert (x - 290) ** 2 + (y - 200) ** 2 >= 50**2
            for i, p in enumerate(level if depth == 1 else []):
                for q in level[i + 1 :]:
                    assert (p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2 >= MIN_SPACING**2


def _prompt(mask, operation, region, seed=0, depth=2):
    levels = collect_prompt(MaskGeometry(mask), operation, region, depth, np.random.default_rng(seed))
    points = [p for level in levels for p in level]
    return Prompt("test", operation, points, radius_for(operation, len(levels)), region)


def test_morphology_expansion_only_grows_inside_its_region():
    mask = disk(200, 200, 80)
    region = half(right=True) & (np.mgrid[:400, :400][0] < 200)
    deformer = MorphologyDeformer()
    for seed in range(8):
        prompt = _prompt(mask, "expansion", region, seed)
        out = deformer.deform(
            DeformRequest(MaskGeometry(mask), [prompt], np.ones(SHAPE, bool)), np.random.default_rng(0)
        )
        assert (out >= mask).all(), "expansion removed pixels"
        assert out.sum() > mask.sum()
        assert not (out & ~mask & ~region).any(), "grew outside the chosen sub-region"
        assert satisfies(out, [prompt])
        cx, cy = prompt.center
        assert out[cy, cx]


def test_morphology_contraction_only_shrinks_inside_its_region():
    mask = disk(200, 200, 110)
    region = half(right=False)
    deformer = MorphologyDeformer()
    for seed in range(8):
        prompt = _prompt(mask, "contraction", region, seed)
        out = deformer.deform(
            DeformRequest(MaskGeometry(mask), [prompt], np.ones(SHAPE, bool)), np.random.default_rng(0)
        )
        assert (out <= mask).all(), "contraction added pixels"
        assert out.sum() < mask.sum()
        assert not (mask & ~out & ~region).any(), "shrank outside the chosen sub-region"
        assert satisfies(out, [prompt])
        cx, cy = prompt.center
        assert not out[cy, cx]


def test_both_directions_at_once_stay_in_their_regions():
    mask = disk(200, 200, 100)
    up = np.zeros(SHAPE, dtype=bool)
    up[:200] = True
    grow = _prompt(mask, "expansion", up & half(right=True))
    shrink = _prompt(mask, "contraction", ~up & half(right=False))
    out = MorphologyDeformer().deform(
        DeformRequest(MaskGeometry(mask), [grow, shrink], np.ones(SHAPE, bool)), np.random.default_rng(0)
    )
    assert not (out & ~mask & ~grow.region).any()
    assert not (mask & ~out & ~shrink.region).any()
    assert (out & ~mask).any() and (mask & ~out).any()
    assert satisfies(out, [grow, shrink])


def test_satisfies_checks_point_sides():
    mask = disk(200, 200, 50)
    region = np.ones(SHAPE, dtype=bool)
    assert satisfies(mask, [Prompt("a", "expansion", [(200, 200)], 0, region)])
    assert not satisfies(mask, [Prompt("a", "contraction", [(200, 200)], 0, region)])
    assert not satisfies(np.zeros(SHAPE, bool), [])


def test_make_deformer_names():
    assert make_deformer("morphology").name == "morphology"
    assert isinstance(make_deformer("morphology", impl="numpy"), MorphologyDeformer)
    assert DEFORMERS == ("morphology", "sam3")
    assert implementations("sam3") == ("transformers", "meta")
    with pytest.raises(ValueError, match="unknown deformer"):
        make_deformer("paint")
    with pytest.raises(ValueError, match="unknown sam3 implementation"):
        make_deformer("sam3", impl="paint")


def test_deformers_import_torch_only_when_sam3_is_built():
    code = (
        "import sys\n"
        "from chexpercept.builder.deformers import deformer_class, make_deformer\n"
        "make_deformer('morphology')\n"
        "deformer_class('sam3')\n"
        "assert 'torch' not in sys.modules, 'torch imported before a sam3 deformer was built'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sam3_impl_option_checks(tmp_path):
    from chexpercept.builder.config import GenerateConfig
    from chexpercept.builder.sources import SourceError

    def config(**kw):
        base = dict(out=str(tmp_path / "o"), per_cell=1, cxr_png="x", mimic_ils="y", anatomy="z")
        return GenerateConfig(**{**base, "deformer": "sam3", **kw})

    with pytest.raises(SourceError, match="--sam3-impl must be one of transformers, meta"):
        config(sam3_checkpoint="a/b", sam3_impl="paint").check()
    with pytest.raises(SourceError, match=r"needs --sam3-checkpoint \(Meta's checkpoint file"):
        config(sam3_impl="meta").check()
    with pytest.raises(SourceError, match="is not a file"):
        config(sam3_impl="meta", sam3_checkpoint=str(tmp_path)).check()
    default = config(sam3_checkpoint="owner/sam3")
    assert default.deformer_options() == {"impl": "transformers", "checkpoint": "owner/sam3", "device": None}
    assert "sam3_impl" not in default.fingerprint()  # runs made before --sam3-impl existed still resume
    checkpoint = tmp_path / "sam3.pt"
    checkpoint.write_bytes(b"")
    meta = config(sam3_impl="meta", sam3_checkpoint=str(checkpoint))
    assert meta.deformer_options()["impl"] == "meta" and meta.fingerprint()["sam3_impl"] == "meta"


def test_sam3_meta_missing_package_names_the_extra_and_the_script(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['sam3'] = None  # as if Meta's package were not installed\n"
        "from chexpercept.builder.deformers.sam3_meta import import_model_builder\n"
        "try:\n"
        "    import_model_builder()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "chexpercept[sam3-meta]" in out and "scripts/setup_sam3_meta.sh" in out
    if importlib.util.find_spec("sam3") is None:
        from chexpercept.builder.config import GenerateConfig
        from chexpercept.builder.sources import SourceError

        checkpoint = tmp_path / "sam3.pt"
        checkpoint.write_bytes(b"")
        config = GenerateConfig(
            out=str(tmp_path / "o"),
            per_cell=1,
            cxr_png="x",
            mimic_ils="y",
            anatomy="z",
            deformer="sam3",
            sam3_impl="meta",
            sam3_checkpoint=str(checkpoint),
        )
        with pytest.raises(SourceError, match=r"setup_sam3_meta\.sh"):
            config.check()


def _lungs(shape=(600, 600)):
    right = np.zeros(shape, dtype=bool)
    right[60:560, 20:280] = True
    left = np.zeros(shape, dtype=bool)
    left[60:560, 320:580] = True
    return right, left


@pytest.mark.parametrize("lesion", ["opacity", "cardiomegaly"])
def test_deform_case_steps_agree_with_their_masks(lesion):
    right, left = _lungs()
    if lesion == "cardiomegaly":
        comp = disk(300, 380, 90, right.shape)
    else:
        comp = disk(150, 366, 45, right.shape) & right
    for side in (right, left):
        if (comp & side).any():
            side |= comp
    lungs = {"right lung": right, "left lung": left}
    z = zones(right, left)
    regions = None if lesion == "cardiomegaly" else partition(right, left)
    ov = component_overlap("0", comp, lungs, z, regions)
    anatomies = Anatomies(z if regions is None else regions, right | left, lesion == "cardiomegaly")
    for seed in range(3):
        result = deform_case([comp], [ov], anatomies, MorphologyDeformer(), np.random.default_rng(seed))
        (plan,) = result.components
        assert plan.steps
        for step in plan.steps:
            cx, cy = step.center
            if step.kind == "expansion":
                assert step.mask[cy, cx] and not comp[cy, cx]
            else:
                assert comp[cy, cx] and not step.mask[cy, cx]
            for name, fake in step.fake_masks:
                assert name.startswith(f"{step.name}_fake_")
                assert not np.array_equal(fake, step.mask)
        kinds = [s.kind for s in plan.steps]
        assert kinds == sorted(kinds, key=lambda k: k != "expansion")  # expansions first
