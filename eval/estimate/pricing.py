"""What API calls cost: the paper's price table, image tokens and prompt-caching rules per provider.

Prices are the reference's table (spec 3.10; USD per 1M tokens: input, cached input, output). The
provider rules say how many input tokens an image costs and when a repeated prefix is billed at the
cached price; the estimator (eval/estimate/count.py) uses both, the openai backend prices the usage each
reply reports.

Sources of the provider rules (checked 2026-12):
- OpenAI, ``detail: high`` (the default for these sizes): the image is fitted into 2048 x 2048, its
  shorter side scaled to 768, and cut into 512-px tiles; tokens = base + tiles x per-tile, with
  base/per-tile 85/170 for the GPT-4o and GPT-4.1 families and 70/140 for the GPT-5 family
  (platform.openai.com, "Images and vision: calculating costs"). A 1024 x 1024 image: 4 tiles.
  Prompt caching: prompts of at least 1,024 tokens, the cached prefix counted in steps of 128.
- Gemini 3: an image costs its media resolution's token budget, 1,120 tokens at the default (high)
  for images (ai.google.dev, "Media resolution"). Implicit caching: the reference's estimator bills a
  prefix at the cached price from 8,000 tokens on (spec 3.12), kept here.
- Any other model: the reference's default of 1,024 tokens per image and caching from 1,024 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: USD per 1M tokens: input, cached input, output (spec 3.10)
PRICES: dict[str, tuple[float, float, float]] = {
    "gemini-3.1-flash-lite-preview": (0.25, 0.025, 1.50),
    "gemini-3.1-pro-preview": (2.00, 0.20, 12.00),
    "gpt-5.4-nano": (0.20, 0.02, 1.25),
    "gpt-5.4-mini": (0.75, 0.075, 4.50),
    "gpt-5.4": (2.50, 0.25, 15.00),
}


def price_for(model_id: str) -> tuple[float, float, float] | None:
    """The longest price-table key contained in the lower-cased model id (spec 3.10)."""
    name = model_id.lower()
    keys = [k for k in PRICES if k in name]
    return PRICES[max(keys, key=len)] if keys else None


def call_cost(
    model_id: str, input_tokens: int | None, cached_tokens: int | None, output_tokens: int | None
) -> float | None:
    """USD of one call: uncached input, cached input and output at the model's prices; None (unknown,
    never 0) for a model without a price or when a count is unknown (None: the server did not say)."""
    price = price_for(model_id)
    if price is None or input_tokens is None or cached_tokens is None or output_tokens is None:
        return None
    if not 0 <= cached_tokens <= input_tokens or output_tokens < 0:  # a report that contradicts itself
        return None
    p_in, p_cached, p_out = price
    return ((input_tokens - cached_tokens) * p_in + cached_tokens * p_cached + output_tokens * p_out) / 1e6


@dataclass(frozen=True)
class ProviderRules:
    """How one provider counts image tokens and bills repeated prefixes."""

    name: str
    #: "tiles": OpenAI's 512-px tiles; "fixed": ``image_tokens`` per image whatever its size
    image_rule: str
    image_tokens: int = 0
    tile_base: int = 0
    tile_tokens: int = 0
    #: a prefix shorter than this is never billed as cached
    cache_min_tokens: int = 1024
    #: the cached part is a multiple of this many tokens
    cache_step: int = 1
    #: chat-format tokens per message (role and separators) and priming the reply
    message_overhead: int = 4
    reply_overhead: int = 3

    def image(self, width: int, height: int) -> int:
        """Input tokens of one ``width`` x ``height`` image."""
        if self.image_rule == "fixed":
            return self.image_tokens
        if width <= 0 or height <= 0:
            raise ValueError(f"image size must be positive, got {width} x {height}")
        scale = min(1.0, 2048 / max(width, height))
        w, h = width * scale, height * scale
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
        tiles = math.ceil(w / 512) * math.ceil(h / 512)
        return self.tile_base + tiles * self.tile_tokens

    def cached(self, prefix_tokens: int) -> int:
        """The part of a repeated prefix of ``prefix_tokens`` tokens billed at the cached price."""
        if prefix_tokens < self.cache_min_tokens:
            return 0
        return prefix_tokens - prefix_tokens % self.cache_step


OPENAI_GPT5 = ProviderRules("openai (GPT-5 family)", "tiles", tile_base=70, tile_tokens=140, cache_step=128)
OPENAI_GPT4 = ProviderRules("openai (GPT-4o/4.1)", "tiles", tile_base=85, tile_tokens=170, cache_step=128)
GEMINI3 = ProviderRules("gemini 3", "fixed", image_tokens=1120, cache_min_tokens=8000)
DEFAULT_RULES = ProviderRules("other (the reference's defaults)", "fixed", image_tokens=1024)


def rules_for(model_id: str) -> ProviderRules:
    """The provider rules of an API model id (by its family name; others: the reference's defaults)."""
    name = model_id.lower()
    if "gemini" in name:
        return GEMINI3
    if "gpt-5" in name:
        return OPENAI_GPT5
    if "gpt-4" in name:
        return OPENAI_GPT4
    return DEFAULT_RULES
