"""The sam3 deformer on CPU with a tiny random Sam3TrackerModel built from a config (no weights download).

A random model cannot produce meaningful masks; these tests check everything around it: the
pre-processing, the prompts, the mask input, shapes, loading from a folder, and that the pipeline
runs with it (its cases are rejected when the masks do not satisfy the prompts).
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from chexpercept.builder.deformers import DeformRequest, Prompt, make_deformer  # noqa: E402
from chexpercept.builder.deformers.sam3 import LOGIT, Sam3Deformer, organic_kernel  # noqa: E402
from chexpercept.builder.morph import MaskGeometry  # noqa: E402


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

    torch.manual_seed(0)
    config = Sam3TrackerConfig(
        vision_config={
            "model_type": "sam3_vision_model",
            "fpn_hidden_size": 32,
            "backbone_config": {
                "model_type": "sam3_vit_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": 1008,
                "patch_size": 14,
                "window_size": 24,
                "global_attn_indexes": [1],
            },
        },
        prompt_encoder_config={"hidden_size": 32},
        mask_decoder_config={
            "hidden_size": 32,
            "mlp_dim": 64,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": 32,
        },
    )
    model = Sam3TrackerModel(config).eval()
    path = tmp_path_factory.mktemp("sam3") / "tiny-sam3"
    model.save_pretrained(path)
    return path


def disk(cx, cy, r, shape=(1024, 1024)):
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def test_sam3_deformer_prompts_in_mask_out(tiny_checkpoint):
    deformer = make_deformer("sam3", checkpoint=str(tiny_checkpoint), device="cpu")
    assert (
        isinstance(deformer, Sam3Deformer)
        and deformer.input_size == 1008
        and deformer.mask_size == (288, 288)
    )
    image = np.zeros((1024, 1024, 3), dtype=np.uint8)
    image[:, 512:] = 255
    px = deformer.pixel_values(image)
    assert tuple(px.shape) == (1, 3, 1008, 1008)
    assert float(px[0, 0, 0, 0]) == pytest.approx(-1.0) and float(px[0, 0, 0, -1]) == pytest.approx(1.0)
    mask = disk(400, 500, 150)
    lungs = disk(400, 500, 260)
    request = DeformRequest(
        MaskGeometry(mask),
        [
            Prompt("a", "expansion", [(590, 500), (585, 530)], 40.0, lungs),
            Prompt("b", "contraction", [(300, 500), (305, 470)], 20.0, lungs),
        ],
        lungs,
    )
    with pytest.raises(RuntimeError, match="begin_case"):
        deformer.deform(request, np.random.default_rng(0))
    deformer.begin_case(image)
    out = deformer.deform(request, np.random.default_rng(0))
    assert out.shape == (1024, 1024) and out.dtype == bool
    again = deformer.deform(request, np.random.default_rng(0))
    np.testing.assert_array_equal(out, again)  # same rng, same mask


def test_sam3_mask_input_and_point_prompts(tiny_checkpoint):
    deformer = Sam3Deformer(str(tiny_checkpoint), device="cpu")
    mask = disk(400, 500, 150)
    lungs = disk(400, 500, 200)
    grow = Prompt("a", "expansion", [(590, 500)], 40.0, lungs)
    grow_outside_lungs = Prompt("c", "expansion", [(900, 900)], 40.0, lungs)
    shrink = Prompt("b", "contraction", [(300, 500)], 20.0, lungs)
    request = DeformRequest(MaskGeometry(mask), [grow, grow_outside_lungs, shrink], lungs)
    logits = deformer.mask_input(request, np.random.default_rng(1))
    assert logits.shape == (288, 288)
    s = 288 / 1024
    assert logits[int(500 * s), int(400 * s)] == pytest.approx(LOGIT)  # inside the mask
    assert logits[int(500 * s), int(590 * s)] > 0  # raised around the expansion point, inside the lungs
    assert logits[int(900 * s), int(900 * s)] == pytest.approx(-LOGIT)  # not raised outside the lungs
    assert logits[int(500 * s), int(300 * s)] < -LOGIT  # lowered below anything else
    fake = DeformRequest(MaskGeometry(mask), [grow_outside_lungs], lungs, fake=True)
    assert deformer.mask_input(fake, np.random.default_rng(1))[int(900 * s), int(900 * s)] > 0
    points, labels = deformer.point_prompts(request, logits)
    pairs = {tuple(map(int, p)): int(label) for p, label in zip(points, labels)}
    assert pairs[(590, 500)] == 1 and pairs[(300, 500)] == 0
    assert (900, 900) not in pairs  # positive point where the mask input says outside: dropped
    grid = [p for p, label in pairs.items() if label == 1 and p[0] % 64 == 0 and p[1] % 64 == 0]
    assert grid and all(mask[y, x] for x, y in grid)
    assert all((x - 300) ** 2 + (y - 500) ** 2 > 35**2 for x, y in grid)  # none next to the contraction


def test_organic_kernel_is_a_bounded_blob():
    k = organic_kernel(np.random.default_rng(0))
    assert k.shape == (31, 31) and k.min() >= 0 and k.max() <= 1
    assert k[15, 15] > 0 and k[0, 0] == 0


def test_pipeline_runs_with_the_sam3_deformer(tiny_checkpoint, tmp_path):
    from chexpercept.builder.pipeline import GenerateConfig, generate
    from chexpercept.builder.synth_sources import synthesize_sources

    sources = synthesize_sources(
        tmp_path / "src", per_cell=1, seed=0, lesions=("cardiomegaly",), progress=False
    )
    ils = json.loads((sources / "mimic-ils" / "mimic_ils_instruction_answer.json").read_text())["train"]
    pairs = [
        p
        for s in ils.values()
        for kind in ("positive_pairs", "negative_pairs")
        for p in s["instruction_answer_pairs"][kind]
    ]
    positive = next(p["pair_id"] for p in pairs if "positive" in p["pair_id"])
    negative = next(p["pair_id"] for p in pairs if "negative" in p["pair_id"])
    sheet = tmp_path / "review.csv"  # one positive and one negative keep the run short on CPU
    sheet.write_text(f"key_id,optimal?\ncardiomegaly_{positive},y\ncardiomegaly_{negative},y\n")
    report = generate(
        GenerateConfig(
            out=str(tmp_path / "out"),
            per_cell=1,
            mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"),
            mimic_ils=str(sources / "mimic-ils"),
            anatomy=str(sources / "anatomy"),
            lesions=["cardiomegaly"],
            review=[str(sheet)],
            deformer="sam3",
            sam3_checkpoint=str(tiny_checkpoint),
            device="cpu",
            progress=False,
        )
    )
    # random weights: the positive may be rejected (its masks need not satisfy the prompts), never crash
    assert not report.failed and report.built == 2, report.text()
    entries = json.loads((tmp_path / "out" / "chexpercept.json").read_text())
    assert all(e["provenance"]["deformer"] == "sam3" for e in entries.values())
    assert f"cardiomegaly_{negative}" in entries
    assert report.rejected or f"cardiomegaly_{positive}" in entries
