"""The ``sam3`` deformer on Meta's ``sam3`` package (``--sam3-impl meta``), the reference's implementation.

Same prompts, pre- and post-processing and outputs as the transformers implementation (``Sam3Prompting``
in ``sam3.py``); only the network differs. The model is built from Meta's own
builder pieces as ``build_sam3_image_model(enable_inst_interactivity=True)`` builds them, without the
text encoder and the detector heads (``build_meta_model``), and its weights come from Meta's checkpoint
file (``sam3.pt``) through Meta's loader; nothing is downloaded. Per case the image goes once through the model's vision
backbone and the interactive predictor's feature preparation (the first two feature levels through the
mask decoder's ``conv_s0``/``conv_s1``, ``no_mem_embed`` added to the last), as Meta's
``Sam3Processor.set_image`` and ``Sam3Image.predict_inst`` do; every deformation runs the tracker's
prompt encoder and mask decoder on our pre-processed tensors. Meta's own image transform and its mask
post-processing (hole filling with a CUDA kernel, skipped on CPU with a warning) are not used: the
low-resolution logits are interpolated and thresholded exactly as on the transformers path.

Meta's package pins numpy<2.4 and huggingface-hub<2 and ``import sam3`` needs triton and psutil, so it
lives in its own environment: ``bash scripts/setup_sam3_meta.sh`` (``pip install 'chexpercept[sam3-meta]'``
on a CUDA machine).
"""

from __future__ import annotations

from typing import Any

from .sam3 import Sam3Prompting

#: how to get Meta's package, named in every error about it
INSTALL_HINT = (
    "--sam3-impl meta needs Meta's sam3 package: pip install 'chexpercept[sam3-meta]' "
    "(on a CPU machine: bash scripts/setup_sam3_meta.sh, which builds .venv-sam3 with torch, sam3 and the "
    "torchvision shim it needs)"
)


def import_model_builder() -> Any:
    """Meta's ``sam3.model_builder``; ImportError naming the extra and the setup script when missing."""
    try:
        from sam3 import model_builder
    except Exception as e:  # ImportError, or torchvision's RuntimeError on a CPU torch without the shim
        raise ImportError(f"{INSTALL_HINT}; importing it failed with {type(e).__name__}: {e}") from e
    return model_builder


def build_meta_model(checkpoint_path: str | None, *, vit: dict[str, Any] | None = None) -> Any:
    """The parts of Meta's SAM 3 image model that interactive prediction uses, on the CPU.

    Built from ``sam3.model_builder``'s own pieces as ``build_sam3_image_model(enable_inst_interactivity=
    True)`` builds them: the vision backbone with the tracker's feature pyramid (``backbone``, a
    ``SAM3VLBackbone`` without text encoder) and the interactive predictor around the tracker
    (``inst_interactive_predictor``), so the parameter names are those of ``Sam3Image`` and Meta's
    ``_load_checkpoint`` fills them from ``sam3.pt``. Left out: the text encoder (deformation has no
    text prompts; the PyPI wheel of sam3 0.1.4 also lacks the BPE vocabulary it reads) and the
    detector's transformer, scoring and segmentation heads (unused by ``predict_inst``); their weights
    in the checkpoint are unused keys, which Meta's loader ignores. Two measures for sam3 0.1.4 on a CPU
    torch: its position encodings and the detector's box tables are precomputed on ``device="cuda"``;
    here the encodings are computed on the first forward instead (same values, input's device), and the
    detector is not built. ``vit`` overrides arguments of Meta's ViT (``embed_dim``, ``depth``,
    ``num_heads``, ``global_att_blocks``, ...) to build a smaller random model for tests and benchmarks;
    None keeps the released architecture. Without ``checkpoint_path`` the weights are random.
    """
    builder = import_model_builder()
    import torch
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor
    from sam3.model.vl_combiner import SAM3VLBackbone

    position_encoding = builder.PositionEmbeddingSine

    def lazy_position_encoding(*args: Any, precompute_resolution: Any = None, **kwargs: Any) -> Any:
        return position_encoding(*args, **kwargs)

    def other_vit(compile_mode: Any = None) -> Any:
        from sam3.model.vitdet import ViT

        return ViT(**{**_VIT_ARGS, **(vit or {}), "compile_mode": compile_mode})

    saved = builder.PositionEmbeddingSine, builder._create_vit_backbone
    builder.PositionEmbeddingSine = lazy_position_encoding
    if vit:
        builder._create_vit_backbone = other_vit
    try:
        visual = builder._create_vision_backbone(enable_inst_interactivity=True)
        tracker = builder.build_tracker(apply_temporal_disambiguation=False)
    finally:
        builder.PositionEmbeddingSine, builder._create_vit_backbone = saved
    model = torch.nn.Module()
    model.backbone = SAM3VLBackbone(visual=visual, text=None, scalp=1)
    model.inst_interactive_predictor = SAM3InteractiveImagePredictor(tracker)
    if checkpoint_path is not None:
        builder._load_checkpoint(model, checkpoint_path)
    return model.eval()


#: the arguments of the released model's ViT (sam3 0.1.4, ``model_builder._create_vit_backbone``)
_VIT_ARGS: dict[str, Any] = {
    "img_size": 1008,
    "pretrain_img_size": 336,
    "patch_size": 14,
    "embed_dim": 1024,
    "depth": 32,
    "num_heads": 16,
    "mlp_ratio": 4.625,
    "norm_layer": "LayerNorm",
    "drop_path_rate": 0.1,
    "qkv_bias": True,
    "use_abs_pos": True,
    "tile_abs_pos": True,
    "global_att_blocks": (7, 15, 23, 31),
    "rel_pos_blocks": (),
    "use_rope": True,
    "use_interp_rope": True,
    "window_size": 24,
    "pretrain_use_cls_token": True,
    "retain_cls_token": False,
    "ln_pre": True,
    "ln_post": False,
    "return_interm_layers": False,
    "bias_patch_embed": False,
}


class MetaSam3Deformer(Sam3Prompting):
    """SAM 3 through Meta's ``sam3`` package.

    ``checkpoint`` is the path of Meta's checkpoint file (``sam3.pt``), or an already built
    ``Sam3Image`` model with the instance-interactivity predictor (tests, benchmarks).
    """

    def __init__(self, checkpoint: str | Any, device: str | None = None, dtype: str = "float32"):
        try:
            import torch
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(INSTALL_HINT) from e
        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(checkpoint, torch.nn.Module):
            model = checkpoint
        else:
            model = build_meta_model(str(checkpoint))
        if getattr(model, "inst_interactive_predictor", None) is None:
            raise ValueError(
                "the sam3 model needs the interactive predictor (enable_inst_interactivity=True)"
            )
        self.model = model.to(self.device, dtype=getattr(torch, dtype)).eval()
        self.predictor = self.model.inst_interactive_predictor
        self.tracker = self.predictor.model
        encoder = self.tracker.sam_prompt_encoder
        self.input_size = int(self.tracker.image_size)
        self.mask_size = tuple(int(s) for s in encoder.mask_input_size)
        self.embeddings = None
        self.image_shape = None

    def _dtype(self) -> Any:
        return next(self.tracker.parameters()).dtype

    def _encode(self, pixel_values: Any) -> Any:
        """The predictor's features for one image, as ``set_image`` + ``predict_inst`` prepare them."""
        out = self.model.backbone.forward_image(pixel_values)["sam2_backbone_out"]
        decoder = self.tracker.sam_mask_decoder
        out["backbone_fpn"][0] = decoder.conv_s0(out["backbone_fpn"][0])
        out["backbone_fpn"][1] = decoder.conv_s1(out["backbone_fpn"][1])
        _, feats, _, _ = self.tracker._prepare_backbone_features(out)
        feats[-1] = feats[-1] + self.tracker.no_mem_embed
        sizes = self.predictor._bb_feat_sizes
        maps = [f.permute(1, 2, 0).reshape(1, -1, *size) for f, size in zip(feats, sizes)]
        return {"image_embed": maps[-1], "high_res_feats": maps[:-1]}

    def _decode(self, points: Any, labels: Any, mask_input: Any) -> tuple[Any, Any]:
        """points (N, 2) in the input frame, labels (N,), mask_input (h, w) -> ((3, h, w), (3,))."""
        encoder = self.tracker.sam_prompt_encoder
        sparse, dense = encoder(
            points=(points[None], labels[None].int()), boxes=None, masks=mask_input[None, None]
        )
        low_res, scores, _, _ = self.tracker.sam_mask_decoder(
            image_embeddings=self.embeddings["image_embed"],
            image_pe=encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=True,
            repeat_image=False,
            high_res_features=self.embeddings["high_res_feats"],
        )
        return low_res[0], scores[0]
