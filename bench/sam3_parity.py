"""Benchmark: the two SAM 3 implementations of ``--deformer sam3`` on one set of weights.

One random model is built with Meta's ``sam3`` package (``build_meta_model``, random weights: none can
be downloaded here), its weights are renamed into transformers' ``Sam3TrackerModel`` layout
(``meta_to_transformers``), and both deformers (``--sam3-impl meta`` and ``transformers``) deform the
same masks with the same prompts on the same images. Reported: the IoU of the final 1024 x 1024 masks
(target >= 0.99), the largest difference of the image features and of the low-resolution logits, and
whether both picked the same of SAM's three masks.

The renaming is ours: transformers' conversion scripts (``convert_sam3_to_hf.py``,
``convert_sam3_video_to_hf.py``) are not part of its wheel, and its ``conversion_mapping.py`` only maps
transformers' own Sam3 video checkpoints (``detector_model.`` / ``tracker_model.``) onto the tracker,
not Meta's layout. Every parameter of the tracker model must be filled, with matching shapes.

Runs in the environment of ``scripts/setup_sam3_meta.sh`` (both packages side by side):

    .venv-sam3/bin/python bench/sam3_parity.py                       # small ViT, 2 images
    .venv-sam3/bin/python bench/sam3_parity.py --vit full --images 1 --write
"""

from __future__ import annotations

import argparse
import platform
import re
import time

import numpy as np
from shared import write_section

SECTION = "## SAM 3 parity"
#: ViT sizes (Meta's ViT arguments); the prompt encoder and mask decoder are always the released ones
VITS = {
    "tiny": {"embed_dim": 64, "depth": 2, "num_heads": 2, "global_att_blocks": (1,)},
    "small": {"embed_dim": 256, "depth": 4, "num_heads": 4, "global_att_blocks": (1, 3)},
    "full": {},
}

#: Meta's names (Sam3Image with the interactive predictor) -> Sam3TrackerModel's, applied in order
_RULES: list[tuple[str, str]] = [
    # the image encoder: Meta's ViT trunk
    (
        r"^backbone\.vision_backbone\.trunk\.pos_embed$",
        "vision_encoder.backbone.embeddings.position_embeddings",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.patch_embed\.proj\.",
        "vision_encoder.backbone.embeddings.patch_embeddings.projection.",
    ),
    (r"^backbone\.vision_backbone\.trunk\.ln_pre\.", "vision_encoder.backbone.layer_norm."),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.norm(\d)\.",
        r"vision_encoder.backbone.layers.\1.layer_norm\2.",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.attn\.proj\.",
        r"vision_encoder.backbone.layers.\1.attention.o_proj.",
    ),
    (
        r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.attn\.qkv\.",
        r"vision_encoder.backbone.layers.\1.attention.qkv.",
    ),
    (r"^backbone\.vision_backbone\.trunk\.blocks\.(\d+)\.mlp\.", r"vision_encoder.backbone.layers.\1.mlp."),
    # the tracker's feature pyramid (Meta: sam2_convs) is the tracker model's neck
    (
        r"^backbone\.vision_backbone\.sam2_convs\.(\d+)\.dconv_2x2_1\.",
        r"vision_encoder.neck.fpn_layers.\1.scale_layers.2.",
    ),
    (
        r"^backbone\.vision_backbone\.sam2_convs\.(\d+)\.dconv_2x2(_0)?\.",
        r"vision_encoder.neck.fpn_layers.\1.scale_layers.0.",
    ),
    (
        r"^backbone\.vision_backbone\.sam2_convs\.(\d+)\.conv_1x1\.",
        r"vision_encoder.neck.fpn_layers.\1.proj1.",
    ),
    (
        r"^backbone\.vision_backbone\.sam2_convs\.(\d+)\.conv_3x3\.",
        r"vision_encoder.neck.fpn_layers.\1.proj2.",
    ),
    # the interactive predictor's SAM heads
    (r"^inst_interactive_predictor\.model\.no_mem_embed$", "no_memory_embedding"),
    (r"^inst_interactive_predictor\.model\.sam_prompt_encoder\.", "prompt_encoder."),
    (r"^inst_interactive_predictor\.model\.sam_mask_decoder\.", "mask_decoder."),
    (
        r"^prompt_encoder\.pe_layer\.positional_encoding_gaussian_matrix$",
        "prompt_encoder.shared_embedding.positional_embedding",
    ),
    (r"^prompt_encoder\.mask_downscaling\.0\.", "prompt_encoder.mask_embed.conv1."),
    (r"^prompt_encoder\.mask_downscaling\.1\.", "prompt_encoder.mask_embed.layer_norm1."),
    (r"^prompt_encoder\.mask_downscaling\.3\.", "prompt_encoder.mask_embed.conv2."),
    (r"^prompt_encoder\.mask_downscaling\.4\.", "prompt_encoder.mask_embed.layer_norm2."),
    (r"^prompt_encoder\.mask_downscaling\.6\.", "prompt_encoder.mask_embed.conv3."),
    (r"^mask_decoder\.output_upscaling\.0\.", "mask_decoder.upscale_conv1."),
    (r"^mask_decoder\.output_upscaling\.1\.", "mask_decoder.upscale_layer_norm."),
    (r"^mask_decoder\.output_upscaling\.3\.", "mask_decoder.upscale_conv2."),
    (
        r"^mask_decoder\.(iou_prediction_head|pred_obj_score_head|output_hypernetworks_mlps\.\d+)\.layers\.0\.",
        r"mask_decoder.\1.proj_in.",
    ),
    (
        r"^mask_decoder\.(iou_prediction_head|pred_obj_score_head|output_hypernetworks_mlps\.\d+)\.layers\.1\.",
        r"mask_decoder.\1.layers.0.",
    ),
    (
        r"^mask_decoder\.(iou_prediction_head|pred_obj_score_head|output_hypernetworks_mlps\.\d+)\.layers\.2\.",
        r"mask_decoder.\1.proj_out.",
    ),
    (
        r"^mask_decoder\.transformer\.layers\.(\d+)\.mlp\.lin1\.",
        r"mask_decoder.transformer.layers.\1.mlp.proj_in.",
    ),
    (
        r"^mask_decoder\.transformer\.layers\.(\d+)\.mlp\.lin2\.",
        r"mask_decoder.transformer.layers.\1.mlp.proj_out.",
    ),
    (
        r"^mask_decoder\.transformer\.layers\.(\d+)\.norm(\d)\.",
        r"mask_decoder.transformer.layers.\1.layer_norm\2.",
    ),
    (r"^mask_decoder\.transformer\.norm_final_attn\.", "mask_decoder.transformer.layer_norm_final_attn."),
    (r"\.out_proj\.", ".o_proj."),
]


def meta_to_transformers(meta_state: dict, torch) -> dict:
    """Meta's ``Sam3Image`` state dict (the parts the interactive predictor uses) in Sam3TrackerModel's names."""
    out: dict = {}
    for key, value in meta_state.items():
        if not key.startswith(
            ("backbone.vision_backbone.", "inst_interactive_predictor.model.sam_", "inst_")
        ):
            continue
        if ".freqs_cis" in key or key.startswith("backbone.vision_backbone.convs."):
            continue  # RoPE tables (recomputed by transformers) and the detector's own pyramid
        if key.startswith("inst_interactive_predictor.model.") and not key.startswith(
            ("inst_interactive_predictor.model.sam_", "inst_interactive_predictor.model.no_mem_embed")
        ):
            continue  # memory encoder, memory attention, object pointers: video tracking only
        new = key
        for pattern, replacement in _RULES:
            new = re.sub(pattern, replacement, new)
        if new.endswith("attention.qkv.weight") or new.endswith("attention.qkv.bias"):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), torch.chunk(value, 3, dim=0)):
                out[new.replace("qkv", name)] = part
            continue
        if new == "vision_encoder.backbone.embeddings.position_embeddings":
            value = value[:, 1:]  # Meta keeps a class-token position; transformers does not
        if new == "prompt_encoder.point_embeddings":
            continue
        m = re.match(r"^prompt_encoder\.point_embeddings\.(\d+)\.weight$", new)
        if m:
            out.setdefault("_points", {})[int(m.group(1))] = value
            continue
        out[new] = value
    points = out.pop("_points", {})
    if points:
        out["prompt_encoder.point_embed.weight"] = torch.cat([points[i] for i in sorted(points)], dim=0)
    out["shared_image_embedding.positional_embedding"] = out[
        "prompt_encoder.shared_embedding.positional_embedding"
    ]
    return out


def tracker_config(vit: dict):
    """The Sam3TrackerConfig of Meta's model with ViT arguments ``vit`` (VITS entry)."""
    from transformers import Sam3TrackerConfig

    embed = vit.get("embed_dim", 1024)
    return Sam3TrackerConfig(
        vision_config={
            "model_type": "sam3_vision_model",
            "backbone_config": {
                "model_type": "sam3_vit_model",
                "hidden_size": embed,
                "intermediate_size": int(embed * 4.625),
                "num_hidden_layers": vit.get("depth", 32),
                "num_attention_heads": vit.get("num_heads", 16),
                "global_attn_indexes": list(vit.get("global_att_blocks", (7, 15, 23, 31))),
                # Meta's ViT builds its LayerNorms with eps=1e-5 (vitdet.py); transformers' default is 1e-6
                "layer_norm_eps": 1e-5,
            },
        }
    )


def requests(n_images: int, rng: np.random.Generator):
    """Phantom-like images (smooth noise + two bright lung fields) and two deformation requests each."""
    from chexpercept.builder.deformers import DeformRequest, Prompt
    from chexpercept.builder.morph import MaskGeometry

    yy, xx = np.mgrid[:1024, :1024]
    out = []
    for _ in range(n_images):
        base = rng.random((16, 16))
        from scipy import ndimage as ndi

        field = ndi.zoom(base, 64, order=3)[:1024, :1024]
        lungs = ((xx - 330) / 170) ** 2 + ((yy - 520) / 300) ** 2 <= 1
        lungs |= ((xx - 700) / 170) ** 2 + ((yy - 520) / 300) ** 2 <= 1
        image = np.clip(60 + 120 * field + 60 * lungs, 0, 255).astype(np.uint8)
        image = np.repeat(image[..., None], 3, axis=2)
        cx, cy = int(rng.integers(280, 380)), int(rng.integers(420, 620))
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= 90**2
        grow = DeformRequest(
            MaskGeometry(mask),
            [Prompt("a", "expansion", [(cx + 110, cy), (cx + 100, cy + 30)], 40.0, lungs)],
            lungs,
        )
        shrink = DeformRequest(
            MaskGeometry(mask),
            [Prompt("b", "contraction", [(cx - 60, cy), (cx - 55, cy - 20)], 20.0, lungs)],
            lungs,
        )
        out.append((image, [grow, shrink]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vit", choices=sorted(VITS), default="small", help="ViT size (default small)")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="record the numbers in bench/RESULTS.md")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import Sam3TrackerModel

    from chexpercept.builder.deformers import make_deformer
    from chexpercept.builder.deformers.sam3_meta import build_meta_model

    torch.set_num_threads(args.threads)
    vit = VITS[args.vit]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    meta_model = build_meta_model(None, vit=vit)
    converted = meta_to_transformers(meta_model.state_dict(), torch)
    hf_model = Sam3TrackerModel(tracker_config(vit)).eval()
    expected = hf_model.state_dict()
    missing = sorted(set(expected) - set(converted))
    unexpected = sorted(set(converted) - set(expected))
    wrong = sorted(
        k for k in set(expected) & set(converted) if tuple(expected[k].shape) != tuple(converted[k].shape)
    )
    if missing or unexpected or wrong:
        raise SystemExit(
            f"conversion incomplete: missing {missing[:8]}, unexpected {unexpected[:8]}, shapes {wrong[:8]}"
        )
    hf_model.load_state_dict(converted, strict=True)
    n_meta = sum(p.numel() for p in meta_model.parameters())
    n_hf = sum(p.numel() for p in hf_model.parameters())
    build_s = time.perf_counter() - t0

    meta = make_deformer("sam3", impl="meta", checkpoint=meta_model, device="cpu")
    hf = make_deformer("sam3", impl="transformers", checkpoint=hf_model, device="cpu")
    rows, ious, feature_diffs, logit_diffs, same_pick = [], [], [], [], 0
    fixed_ious, fixed_feature_diffs = [], []
    encode_s = {"meta": 0.0, "transformers": 0.0}
    for i, (image, reqs) in enumerate(requests(args.images, np.random.default_rng(0))):
        for name, d in (("meta", meta), ("transformers", hf)):
            t = time.perf_counter()
            d.begin_case(image)
            encode_s[name] += time.perf_counter() - t
        # the image features the mask decoder sees: the lowest-resolution map and the two high-resolution ones
        hf_emb = hf.embeddings
        meta_maps = [*meta.embeddings["high_res_feats"], meta.embeddings["image_embed"]]
        feature_diffs.append(max(float((a - b).abs().max()) for a, b in zip(meta_maps, hf_emb)))
        # transformers 5.24 adds no_memory_embedding to the 4th pyramid level (36 x 36), which it then
        # drops; Meta adds it to the 72 x 72 map the decoder reads. The same deformer with it added there:
        fixed = make_deformer("sam3", impl="transformers", checkpoint=hf_model, device="cpu")
        fixed.image_shape = hf.image_shape
        fixed.embeddings = [
            *hf_emb[:-1],
            hf_emb[-1] + hf_model.no_memory_embedding.detach().reshape(1, -1, 1, 1),
        ]
        fixed_feature_diffs.append(
            max(float((a - b).abs().max()) for a, b in zip(meta_maps, fixed.embeddings))
        )
        for j, req in enumerate(reqs):
            masks, picks, lows = {}, {}, {}
            for name, d in (("meta", meta), ("transformers", hf)):
                logits = d.mask_input(req, np.random.default_rng(100 + j))
                points, labels = d.point_prompts(req, logits)
                scale = np.asarray([d.input_size / 1024, d.input_size / 1024], dtype=np.float32)
                with torch.inference_mode():
                    low, scores = d._decode(
                        torch.from_numpy(points * scale), torch.from_numpy(labels), torch.from_numpy(logits)
                    )
                lows[name], picks[name] = low.float(), int(scores.argmax())
                masks[name] = d.deform(req, np.random.default_rng(100 + j))
            a, b = masks["meta"], masks["transformers"]
            c = fixed.deform(req, np.random.default_rng(100 + j))
            fixed_union = int((a | c).sum())
            fixed_ious.append(1.0 if fixed_union == 0 else int((a & c).sum()) / fixed_union)
            union = int((a | b).sum())
            iou = 1.0 if union == 0 else int((a & b).sum()) / union
            ious.append(iou)
            logit_diffs.append(float((lows["meta"] - lows["transformers"]).abs().max()))
            same_pick += picks["meta"] == picks["transformers"]
            rows.append(
                f"| {i} | {req.prompts[0].operation} | {len(points)} | {iou:.4f} | {int(a.sum())} | {int(b.sum())} | "
                f"{logit_diffs[-1]:.2e} | {picks['meta']} / {picks['transformers']} | {fixed_ious[-1]:.4f} |"
            )
    n = len(ious)
    table = "\n".join(
        [
            "| image | prompt | points | mask IoU | meta px | transformers px | max abs logit diff "
            "| mask picked (meta / tf) | IoU, tf + no_memory_embedding |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    import importlib.metadata as md

    vit_text = (
        "released size (1024 wide, 32 blocks)" if not vit else ", ".join(f"{k}={v}" for k, v in vit.items())
    )
    text = f"""{SECTION}

`--sam3-impl meta` (Meta's `sam3` {md.version("sam3")}) against `--sam3-impl transformers` (transformers
{transformers.__version__}, `Sam3TrackerModel`) on one set of random weights: built with Meta's builder
(ViT: {vit_text}; prompt encoder and mask decoder as released; no text encoder), renamed into the tracker's
layout by `meta_to_transformers` (every tracker parameter filled, shapes checked, strict load), then both
deformers on the same {args.images} phantom-like 1024 x 1024 image(s) with {n} requests (one expansion and one
contraction each: the grid positives, the prompt points, the edited mask input). torch {torch.__version__},
{platform.machine()}, {args.threads} threads; `.venv-sam3/bin/python bench/sam3_parity.py --vit {args.vit}
--images {args.images} --write`.

- parameters: Meta {n_meta / 1e6:.1f}M (detector heads included), transformers tracker {n_hf / 1e6:.1f}M; build +
  conversion {build_s:.0f} s; image encoding {encode_s["meta"] / args.images:.1f} s (meta) and
  {encode_s["transformers"] / args.images:.1f} s (transformers) per image
- **mask IoU: min {min(ious):.4f}, mean {sum(ious) / n:.4f}** over {n} requests (target >= 0.99); the same one
  of SAM's three masks picked in {same_pick} of {n}
- largest absolute difference of the image features the mask decoder reads: {max(feature_diffs):.2e}; of
  the low-resolution logits: {max(logit_diffs):.2e}
- the difference, explained: the ViT trunks agree to about 1e-6 (checked separately on a random input);
  beyond float32 rounding, the feature difference is Meta's `no_mem_embed`. Meta's
  `predict_inst` adds it to the 72 x 72 map the mask decoder reads; transformers {transformers.__version__}'s
  `Sam3TrackerModel.get_image_embeddings` (and `forward`) adds its `no_memory_embedding` to the last of
  the vision encoder's *four* pyramid levels (36 x 36), which it then drops, so the decoder never sees it.
  With it added to the 72 x 72 map on the transformers side (last column): features agree to
  {max(fixed_feature_diffs):.2e} and the **mask IoU is min {min(fixed_ious):.4f}, mean {sum(fixed_ious) / n:.4f}**.
  Random weights draw `no_mem_embed` with std 0.02; a trained checkpoint's value may differ more.
- random weights make crude masks: requests whose masks are empty on both sides count as IoU 1; the
  informative rows are those with pixels. Not run: the released ViT size (1024 wide, 32 blocks,
  about 450M parameters in the image encoder), whose image encoding on this 2-core machine would take
  minutes per image and implementation; the prompt encoder and mask decoder, where the two codes
  differ most, are the released ones here.

{table}
"""
    print(text)
    if args.write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
