"""The sam3 deformer on Meta's ``sam3`` package (``--sam3-impl meta``), on CPU with random weights.

Marked ``sam3_meta``: it runs in the environment of ``scripts/setup_sam3_meta.sh`` (``scripts/test.sh``
builds it on first use) and is skipped, with the reason, where ``import sam3`` fails. The model is
Meta's own architecture with a small ViT (the prompt encoder and mask decoder as released), so one
image and a few prompts take seconds; random weights give meaningless masks, so these tests check the
contract around the network: shapes, prompts, determinism, and agreement with the transformers path on
the same weights.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.sam3_meta

torch = pytest.importorskip("torch")
try:
    import sam3  # noqa: F401
except Exception as e:  # ImportError, or torchvision's RuntimeError on a CPU torch without the shim
    pytest.skip(
        f"Meta's sam3 package does not import here ({type(e).__name__}: {e}); "
        "build its environment with scripts/setup_sam3_meta.sh",
        allow_module_level=True,
    )

from chexpercept.builder.deformers import DeformRequest, Prompt, make_deformer  # noqa: E402
from chexpercept.builder.deformers.sam3_meta import MetaSam3Deformer, build_meta_model  # noqa: E402
from chexpercept.builder.morph import MaskGeometry  # noqa: E402

TINY_VIT = {"embed_dim": 64, "depth": 2, "num_heads": 2, "global_att_blocks": (1,)}


@pytest.fixture(scope="module")
def meta_model():
    torch.manual_seed(0)
    return build_meta_model(None, vit=TINY_VIT)


def disk(cx, cy, r, shape=(1024, 1024)):
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def case():
    image = np.zeros((1024, 1024, 3), dtype=np.uint8)
    image[:, 512:] = 200
    image[300:700, 200:500] = 90
    mask = disk(400, 500, 150)
    lungs = disk(400, 500, 260)
    requests = [
        DeformRequest(
            MaskGeometry(mask),
            [
                Prompt("a", "expansion", [(590, 500), (585, 530)], 40.0, lungs),
                Prompt("b", "contraction", [(300, 500), (305, 470)], 20.0, lungs),
            ],
            lungs,
        ),
        DeformRequest(MaskGeometry(mask), [Prompt("c", "contraction", [(420, 380)], 20.0, lungs)], lungs),
    ]
    return image, requests


def test_meta_deformer_prompts_in_mask_out(meta_model):
    deformer = make_deformer("sam3", impl="meta", checkpoint=meta_model, device="cpu")
    assert isinstance(deformer, MetaSam3Deformer)
    assert deformer.input_size == 1008 and deformer.mask_size == (288, 288)
    image, requests = case()
    with pytest.raises(RuntimeError, match="begin_case"):
        deformer.deform(requests[0], np.random.default_rng(0))
    deformer.begin_case(image)
    assert tuple(deformer.embeddings["image_embed"].shape) == (1, 256, 72, 72)
    for request in requests:
        out = deformer.deform(request, np.random.default_rng(0))
        assert out.shape == (1024, 1024) and out.dtype == bool
        np.testing.assert_array_equal(out, deformer.deform(request, np.random.default_rng(0)))


def test_meta_and_transformers_agree_on_the_same_weights(meta_model):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        from sam3_parity import meta_to_transformers, tracker_config
    finally:
        sys.path.pop(0)
    from transformers import Sam3TrackerModel

    hf_model = Sam3TrackerModel(tracker_config(TINY_VIT)).eval()
    hf_model.load_state_dict(meta_to_transformers(meta_model.state_dict(), torch), strict=True)
    meta = make_deformer("sam3", impl="meta", checkpoint=meta_model, device="cpu")
    hf = make_deformer("sam3", impl="transformers", checkpoint=hf_model, device="cpu")
    image, requests = case()
    meta.begin_case(image)
    hf.begin_case(image)
    for request in requests:
        a = meta.deform(request, np.random.default_rng(3))
        b = hf.deform(request, np.random.default_rng(3))
        union = (a | b).sum()
        assert union == 0 or (a & b).sum() / union >= 0.99
