"""What a backend hands back besides the reply as the reference records it: the whole reply as the
parser must read it.

The reference records a reply as its engine decodes it (``skip_special_tokens=True``) and re-sends
that text in the history; the runner does the same. Two things that text can lose, which the parser
needs (``chexpercept.reasoning``):

* reasoning markers that are special tokens (Gemma 4's ``<|channel>`` ... ``<channel|>``): the
  decoders drop them, and a reply then reads as if its reasoning were the answer. ``MarkerDecoder``
  decodes the generated ids a second time, keeping those markers and dropping every other special
  token;
* an API's separate reasoning field (vLLM serve with a reasoning parser: ``reasoning`` or, before
  vLLM 0.16, ``reasoning_content``): ``join_reasoning`` puts it back in front of the content between
  the family's markers, unclosed when the model never finished it (``content: null``).

The result goes to ``TurnResult.full_response`` (None when it equals the reply).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chexpercept.reasoning import ALL_BLOCKS, DEFAULT_BLOCK, family_of


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    return ids


class MarkerDecoder:
    """Decodes generated token ids keeping the reasoning markers that are special tokens of this
    tokenizer (any family's, so that fine-tunes under other names are covered too)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        special = _special_ids(tokenizer)
        vocab = tokenizer.get_vocab()
        markers = {m for block in ALL_BLOCKS for m in block}
        #: id -> marker, for the markers this tokenizer holds as special tokens
        self.markers: dict[int, str] = {vocab[m]: m for m in markers if m in vocab and vocab[m] in special}
        self._special = special - set(self.markers)

    @property
    def active(self) -> bool:
        return bool(self.markers)

    def full_text(self, token_ids: Sequence[int], text: str) -> str | None:
        """The reply with its special reasoning markers, or None when it has none (then ``text``
        is the whole reply)."""
        ids = [int(i) for i in token_ids]
        if not self.markers or not any(i in self.markers for i in ids):
            return None
        kept = [i for i in ids if i not in self._special]
        full = self.tokenizer.decode(kept, skip_special_tokens=False)
        return None if full == text else full


def join_reasoning(reasoning: str | None, content: str | None, model: str) -> str | None:
    """The whole reply from an API's separate reasoning and content fields, reasoning between the
    model family's markers (``<think>`` ... ``</think>`` when the family has none); the block stays
    open when ``content`` is None (the reasoning never finished). None without reasoning."""
    if not reasoning:
        return None
    family = family_of(model)
    open_marker, close_marker = family.reasoning[0] if family and family.reasoning else DEFAULT_BLOCK
    if content is None:
        return open_marker + reasoning
    return open_marker + reasoning + close_marker + content
