"""Attention masks for a prefill that continues from a cache, built by broadcasting.

A model that lets each image's tokens attend to one another in both directions (Gemma 3: the
processor marks them with ``token_type_ids``) has transformers build its sliding-window mask
element by element (``torch.vmap`` over batch x query x key), which on a CPU costs as much as the
attention itself once a turn's new tokens meet a long cached history. ``prefill_masks`` builds
the same boolean masks with a few tensor operations: for full-attention layers a key is seen when
it is not padding and comes no later than the query or sits in the query's image block; a
sliding-window layer also drops keys a window or more behind. The transformers backend uses them
only after ``same_as_model`` shows on a real batch that they equal the model's own masks.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

FULL = "full_attention"
SLIDING = "sliding_attention"


def block_ids(token_type_ids: Any) -> Any:
    """Each run of image tokens numbered 0, 1, ... along its row; -1 for text."""
    import torch

    is_image = token_type_ids == 1
    starts = is_image & ~torch.nn.functional.pad(is_image, (1, 0), value=False)[:, :-1]
    return torch.where(is_image, starts.long().cumsum(dim=1) - 1, -1)


def positions(attention_mask: Any, start: int, end: int) -> Any:
    """Each slot's position in its left-padded row (as generate counts them: padding at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:end]


def window_start(start: int, sliding_window: int | None) -> int:
    """The first key slot any query from ``start`` on sees in a sliding-window layer."""
    return max(0, start - sliding_window + 1) if sliding_window else 0


def prefill_masks(
    attention_mask: Any,
    token_type_ids: Any,
    start: int,
    end: int,
    sliding_window: int | None,
    sliding_from: int = 0,
    kinds: Collection[str] = (FULL, SLIDING),
) -> dict[str, Any]:
    """Boolean masks [batch, 1, end - start, keys] for queries at slots ``start:end``.

    Full-attention layers see keys ``0:end``; sliding-window layers keys ``sliding_from:end``
    (up to ``window_start``: the keys before it are masked for every query anyway, so the
    prefill can leave them out). ``attention_mask`` and ``token_type_ids``: [batch, >= end],
    the whole left-padded rows; ``kinds``: the layer types to build masks for.
    """
    import torch

    device = attention_mask.device
    queries = torch.arange(start, end, device=device)[:, None]
    blocks = block_ids(token_type_ids[:, :end].to(device))
    query_blocks = blocks[:, start:end, None]
    padding = attention_mask[:, None, :end].bool()

    def seen(first: int) -> Any:  # [batch, queries, keys first:end]
        keys = torch.arange(first, end, device=device)[None, :]
        same_block = (query_blocks == blocks[:, None, first:]) & (query_blocks >= 0)
        return ((keys <= queries)[None] | same_block) & padding[:, :, first:]

    masks = {}
    if FULL in kinds:
        masks[FULL] = seen(0)[:, None]
    if SLIDING in kinds and sliding_window is not None:
        if sliding_from > window_start(start, sliding_window):
            raise ValueError(f"keys from {sliding_from} on leave out some that a query from {start} sees")
        keys = torch.arange(sliding_from, end, device=device)[None, :]
        masks[SLIDING] = (seen(sliding_from) & (keys > queries - sliding_window)[None])[:, None]
    return masks


def cache_keyword(function: Any) -> str:
    """The name under which ``function`` (a model's forward, its create_masks_for_generate) takes a
    key-value cache: ``cache`` in recent transformers, ``past_key_values`` before (vLLM's CPU build
    pins transformers < 5.20, which has the old name)."""
    import inspect

    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def same_as_model(model: Any, attention_mask: Any, token_type_ids: Any, start: int, end: int) -> str:
    """'' where ``prefill_masks`` equals the masks ``model`` builds itself for the same prefill
    (a cache of ``start`` slots, queries ``start:end``), else what differs."""
    import torch
    from transformers import DynamicCache

    create = getattr(model, "create_masks_for_generate", None)
    if create is None:
        return "the model does not say how it builds its masks (no create_masks_for_generate)"
    config = model.config
    text = config.get_text_config()
    batch = attention_mask.shape[0]
    cache = DynamicCache()
    if start:  # only the cache's length matters to the masks
        heads = getattr(text, "num_key_value_heads", 1)
        empty = torch.zeros((batch, heads, start, 1), device=attention_mask.device)
        cache = DynamicCache(ddp_cache_data=[(empty, empty)] * text.num_hidden_layers)
    theirs = create(
        config=config,
        inputs_embeds=torch.empty((batch, end - start, 0), dtype=model.dtype, device=attention_mask.device),
        attention_mask=attention_mask[:, :end],
        **{cache_keyword(create): cache},
        position_ids=positions(attention_mask, start, end),
        token_type_ids=token_type_ids[:, :end],
        is_first_iteration=True,
    )
    ours = prefill_masks(attention_mask, token_type_ids, start, end, getattr(text, "sliding_window", None))
    if not isinstance(theirs, dict) or set(theirs) != set(ours):
        return f"the model's masks are {type(theirs).__name__} {sorted(theirs) if isinstance(theirs, dict) else ''}"
    for kind, mask in ours.items():
        expected = theirs[kind]
        if expected is None or expected.dtype != torch.bool:
            return f"the model's {kind} mask is {None if expected is None else expected.dtype}, not boolean"
        if not torch.equal(mask, expected.expand_as(mask)):
            return f"the {kind} mask differs from the model's"
    return ""
