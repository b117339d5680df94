"""The engine's limits as vLLM 0.32 reads its arguments (``max_model_len``, ``limit_mm_per_prompt``,
``language_model_only``), for checks made before any engine starts: the runner's preflight and the
harnesses' set-up checks read them here, once."""

from __future__ import annotations

from typing import Any

from chexpercept.eval.protocol import BackendError


def engine_max_model_len(value: Any, where: str) -> int | None:
    """The engine's context length (tokens) as vLLM reads ``max_model_len``: a positive int is the
    limit; None, or -1 ("auto": vLLM fits it to memory, at most the model's own), leave it to the model's
    config. Raises BackendError naming ``where`` for any other value (vLLM would refuse it at load)."""
    if value is None or (type(value) is int and value == -1):
        return None
    if type(value) is int and value > 0:
        return value
    raise BackendError(
        f"max_model_len in {where} must be a positive integer or -1 (fit to memory), got {value!r}"
    )


def engine_image_limit(args: dict[str, Any], where: str) -> int | None:
    """Images per prompt as vLLM 0.32 reads ``limit_mm_per_prompt`` (vllm/config/multimodal.py): absent,
    None (this backend sizes it); ``{"image": n}``; ``{"image": {"count": n, ...}}`` (count 999 when
    left out); a dict without "image" (999: vLLM's default for a modality not named);
    ``language_model_only`` true (0). Raises BackendError naming ``where`` for any other form."""
    if args.get("language_model_only") is True:
        return 0
    limits = args.get("limit_mm_per_prompt")
    if limits is None:
        return None
    if not isinstance(limits, dict):
        raise BackendError(
            f'limit_mm_per_prompt in {where} must be an object such as {{"image": 4}}, got {limits!r}'
        )
    image = limits.get("image", {})
    count = image.get("count", 999) if isinstance(image, dict) else image
    if type(count) is int and count >= 0:
        return count
    raise BackendError(
        f"limit_mm_per_prompt.image in {where} must be a count (an integer >= 0, or an object with "
        f'"count"), got {image!r}'
    )
