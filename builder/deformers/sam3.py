"""The ``sam3`` deformer: SAM 3 interactive prediction from a mask prompt plus point prompts (spec 5.4.6).

Two implementations share everything but the network (``Sam3Prompting`` below): transformers'
``Sam3TrackerModel`` (``Sam3Deformer``, weights from a local folder or a Hub id; the default) and Meta's
``sam3`` package (``sam3_meta.MetaSam3Deformer``, the reference's code). Both use our own image pre- and
post-processing, so the transformers path needs no torchvision: the CXR is resized to the model's input
size (1008) with bilinear anti-aliased interpolation, scaled by 1/255 and normalised with mean and std
0.5; points are scaled to that frame; the low-resolution logits (288 x 288) are interpolated back to
1024 x 1024 and thresholded at 0. The image is encoded once per case; every deformation only runs the
prompt encoder and the mask decoder.

The prompt follows the reference: positive points on a 64 px grid inside the mask (away from the
contraction points), the expansion points (label 1) and the contraction points (label 0); the mask
input is the base mask as logits (+-ln 1e8), raised around expansion points (inside the lungs, except
for distractors) and lowered around contraction points by a random "organic" kernel of radius 15 in
the 288 frame. Positive points whose mask-input logit is not positive are dropped. Of SAM's three
masks the one with the best predicted IoU is kept; components under 1000 px are removed.

torch and transformers are imported only when this deformer is built (``pip install chexpercept[sam3]``).
An implementation provides ``input_size``, ``mask_size``, ``_dtype``, ``_encode(pixel_values)`` (run once
per case) and ``_decode(points, labels, mask_input)`` -> (low-resolution logits (3, h, w), IoU scores (3,)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import ndimage as ndi

from ..morph import MIN_COMPONENT, clipped_stamp, remove_small_components
from .base import DeformRequest

LOGIT = math.log(1e8)  # 18.42: "certainly inside" in the reference's mask input
KERNEL_RADIUS = 15  # in the 288 x 288 mask-input frame
KERNEL_MIN = 0.1
GRID = 64


def organic_kernel(rng: np.random.Generator, radius: int = KERNEL_RADIUS) -> np.ndarray:
    """A random blob in [0, 1]: multi-frequency noise (1, 2, 4; weights 1/f) times a rotated ellipse falloff."""
    size = 2 * radius + 1
    noise = np.zeros((size, size), dtype=np.float64)
    for f in (1, 2, 4):
        coarse = rng.random((f + 1, f + 1))
        noise += ndi.zoom(coarse, size / (f + 1), order=3, mode="nearest")[:size, :size] / f
    noise = (noise - noise.min()) / max(1e-9, float(noise.max() - noise.min()))
    a, b = radius * rng.uniform(0.5, 1.5), radius * rng.uniform(0.5, 1.5)
    theta = rng.uniform(0, math.pi)
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1].astype(np.float64)
    u = xx * math.cos(theta) + yy * math.sin(theta)
    v = -xx * math.sin(theta) + yy * math.cos(theta)
    falloff = np.clip(1.0 - (u / a) ** 2 - (v / b) ** 2, 0.0, 1.0)
    return noise * falloff


class Sam3Prompting:
    """The prompts, pre- and post-processing every SAM 3 implementation shares (see the module docstring)."""

    name = "sam3"
    torch: Any
    device: str
    input_size: int
    mask_size: tuple[int, int]
    embeddings: Any = None
    image_shape: tuple[int, int] | None = None

    def _dtype(self) -> Any:
        raise NotImplementedError

    def _encode(self, pixel_values: Any) -> Any:
        raise NotImplementedError

    def _decode(self, points: Any, labels: Any, mask_input: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------ pre-processing
    def pixel_values(self, image: np.ndarray) -> Any:
        """(1, 3, S, S) float tensor: bilinear resize to S, x / 255, (x - 0.5) / 0.5."""
        torch = self.torch
        x = torch.from_numpy(np.array(image, dtype=np.float32)).permute(2, 0, 1)[None]
        x = torch.nn.functional.interpolate(
            x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False, antialias=True
        )
        x = x / 255.0
        return ((x - 0.5) / 0.5).to(self.device, dtype=self._dtype())

    def begin_case(self, image: np.ndarray) -> None:
        with self.torch.inference_mode():
            self.embeddings = self._encode(self.pixel_values(image))
        self.image_shape = image.shape[:2]

    def _to_mask_frame(self, mask: np.ndarray) -> np.ndarray:
        torch = self.torch
        t = torch.from_numpy(mask.astype(np.float32))[None, None]
        t = torch.nn.functional.interpolate(
            t, size=self.mask_size, mode="bilinear", align_corners=False, antialias=True
        )
        return t[0, 0].numpy()

    def mask_input(self, request: DeformRequest, rng: np.random.Generator) -> np.ndarray:
        """The edited low-resolution mask prompt (spec 5.4.6 step 3), shape mask_size."""
        h, w = request.base.shape
        logits = np.where(self._to_mask_frame(request.base.mask) >= 0.5, LOGIT, -LOGIT)
        lungs = self._to_mask_frame(request.lungs) >= 0.5
        hi, lo_ = float(logits.max()), float(logits.min())
        low = lo_ - 2.0 * (hi - lo_)
        mh, mw = self.mask_size
        for prompt in request.prompts:
            for x, y in prompt.points:
                k = organic_kernel(rng)
                r = k.shape[0] // 2
                windows = clipped_stamp(round(x * mw / w), round(y * mh / h), r, (mh, mw))
                if windows is None:
                    continue
                kk = k[windows[1]]
                sub = logits[windows[0]]
                where = kk > KERNEL_MIN
                if prompt.positive:
                    if not request.fake:
                        where &= lungs[windows[0]]
                    sub[where] = np.maximum(sub[where], hi * kk[where])
                else:
                    sub[where] = np.minimum(sub[where], low + (hi - low) * (1.0 - kk[where]))
        return logits.astype(np.float32)

    def point_prompts(self, request: DeformRequest, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(points (N, 2) in the image frame, labels (N,)): grid positives, expansion (1), contraction (0)."""
        mask = request.base.mask
        h, w = mask.shape
        negatives = [p for q in request.prompts if not q.positive for p in q.points]
        keep_away = max((q.reach + 15 for q in request.prompts if not q.positive), default=0)
        points: list[tuple[int, int]] = []
        labels: list[int] = []
        for y in range(0, h, GRID):
            for x in range(0, w, GRID):
                if mask[y, x] and all((x - a) ** 2 + (y - b) ** 2 > keep_away**2 for a, b in negatives):
                    points.append((x, y))
                    labels.append(1)
        for prompt in request.prompts:
            for p in prompt.points:
                points.append(p)
                labels.append(1 if prompt.positive else 0)
        mh, mw = logits.shape
        kept_p, kept_l = [], []
        for (x, y), label in zip(points, labels):
            if label == 1 and logits[min(mh - 1, y * mh // h), min(mw - 1, x * mw // w)] <= 0:
                continue  # the reference drops positives the mask input calls outside
            kept_p.append((x, y))
            kept_l.append(label)
        return np.asarray(kept_p, dtype=np.float32).reshape(-1, 2), np.asarray(kept_l, dtype=np.int64)

    def deform(self, request: DeformRequest, rng: np.random.Generator) -> np.ndarray:
        if self.embeddings is None or self.image_shape != request.base.shape:
            raise RuntimeError("begin_case(image) must be called with the case's CXR first")
        torch = self.torch
        h, w = request.base.shape
        logits = self.mask_input(request, rng)
        points, labels = self.point_prompts(request, logits)
        scale = np.asarray([self.input_size / w, self.input_size / h], dtype=np.float32)
        dtype = self._dtype()
        with torch.inference_mode():
            low_res, scores = self._decode(
                torch.from_numpy(points * scale).to(self.device, dtype=dtype),
                torch.from_numpy(labels).to(self.device),
                torch.from_numpy(logits).to(self.device, dtype=dtype),
            )
            best = int(scores.argmax())
            full = torch.nn.functional.interpolate(
                low_res[best][None, None].float(), size=(h, w), mode="bilinear", align_corners=False
            )
            mask = (full[0, 0] > 0).cpu().numpy()
        return remove_small_components(mask, MIN_COMPONENT)


class Sam3Deformer(Sam3Prompting):
    """SAM 3 through transformers' ``Sam3TrackerModel`` (``--sam3-impl transformers``, the default)."""

    def __init__(self, checkpoint: str | Any, device: str | None = None, dtype: str = "float32"):
        try:
            import torch
            from transformers import Sam3TrackerModel
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(
                "the sam3 deformer needs torch and transformers>=5: pip install 'chexpercept[sam3]'"
            ) from e
        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(checkpoint, Sam3TrackerModel):
            model = checkpoint
        else:
            model = Sam3TrackerModel.from_pretrained(checkpoint, dtype=getattr(torch, dtype))
        self.model = model.to(self.device).eval()
        encoder = self.model.prompt_encoder
        self.input_size = int(encoder.input_image_size)
        self.mask_size = tuple(int(s) for s in encoder.mask_input_size)
        self.embeddings = None
        self.image_shape = None

    def _dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    def _encode(self, pixel_values: Any) -> Any:
        return self.model.get_image_embeddings(pixel_values)

    def _decode(self, points: Any, labels: Any, mask_input: Any) -> tuple[Any, Any]:
        """points (N, 2) in the input frame, labels (N,), mask_input (h, w) -> ((3, h, w), (3,))."""
        out = self.model(
            image_embeddings=self.embeddings,
            input_points=points[None, None],
            input_labels=labels[None, None],
            input_masks=mask_input[None, None],
            multimask_output=True,
        )
        return out.pred_masks[0, 0], out.iou_scores[0, 0]
