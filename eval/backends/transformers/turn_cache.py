"""Each live conversation's key/value cache, kept from one turn to the next.

Every turn re-sends the whole conversation, and all of it but the new user turn (system message,
earlier turns and their images, the model's own earlier answers) already went through the model
on the previous turn. ``TurnCache`` keeps, per live conversation, the keys and values of the
tokens its last generate call saw (prompt and answer) and, on the next turn, hands
``model.generate`` a cache holding the longest prefix the new prompt shares with them, so only
the rest is computed. What is reused is decided from the token ids themselves (and from which
image each image-token run stands for): where the chat template renders an earlier answer
differently from the tokens the model produced, or an oracle patches the history, the shared
prefix ends there and the rest is computed again. An image's token run is never split, because
the model sees each image's tokens together (Gemma 3 attends among them in both directions).

Rows of a batch are left-padded as usual: each row's cached tokens end where the batch's new
(uncached) tokens start, and that point is the same for every row, so a row whose new part is
shorter than the longest one recomputes a little of its history. Every layer keeps every slot,
so a later turn can reuse any prefix; a sliding-window layer still attends over its window only.
A conversation's first turn reuses the start it shares with any other (the system message). The
kept keys and values stay within a memory budget. The transformers backend turns this on only after a check at setup shows that
a reused turn gives the same answer as computing it from scratch (see backend.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def image_runs(ids: np.ndarray, image_token_id: int) -> list[tuple[int, int]]:
    """(start, end) of each run of image tokens in ``ids``, in order."""
    is_image = np.concatenate(([False], ids == image_token_id, [False]))
    edges = np.flatnonzero(is_image[1:] != is_image[:-1])
    return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2])]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def outside_runs(position: int, runs: Sequence[tuple[int, int]]) -> int:
    """``position`` moved back to the start of the image run it falls inside, if any."""
    for start, end in runs:
        if start < position < end:
            return start
    return position


@dataclass
class Stored:
    """What one conversation's last generate call left: its tokens and their keys and values."""

    ids: np.ndarray
    runs: list[tuple[int, int]]
    #: the image each run stands for (bundle-relative path)
    images: tuple[str, ...]
    #: per layer (keys, values), each [heads, len(ids), head_dim]
    layers: list[tuple[Any, Any]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


@dataclass
class Row:
    key_id: str
    #: the row's real prompt tokens (without the left padding)
    ids: np.ndarray
    runs: list[tuple[int, int]]
    images: tuple[str, ...]
    #: tokens taken from the cache (the first ``reused`` of ``ids``), and whose keys and values they are
    reused: int = 0
    source: Stored | None = None


@dataclass
class Plan:
    """How one left-padded batch continues from the conversations' caches."""

    rows: list[Row]
    #: padded prompt length, and how many leading slots come from the cache (the same for every row)
    width: int
    past: int
    #: per image of the batch (rows in order, each row's images in order): whether its tokens are
    #: computed in this call (so its pixel values are needed)
    new_images: list[bool] = field(default_factory=list)

    @property
    def reused_tokens(self) -> int:
        return sum(r.reused for r in self.rows)


@dataclass
class TurnCacheStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0
    #: turns whose keys and values were not kept because the memory budget was full
    not_kept: int = 0


class TurnCache:
    """Keys and values of each live conversation's last turn, and batch plans that reuse them."""

    def __init__(
        self,
        image_token_id: int | None,
        stop_ids: Sequence[int],
        max_bytes: int | None = None,
        windows: Sequence[int | None] = (),
    ):
        self.image_token_id = -1 if image_token_id is None else int(image_token_id)
        #: per layer, its sliding window (None: full attention); empty: every layer full
        self.windows = list(windows)
        self.stop_ids = np.asarray(sorted(set(stop_ids)), dtype=np.int64)
        #: memory the kept keys and values may take; a turn that does not fit is not kept (its
        #: conversation's next turn is computed from scratch)
        self.max_bytes = max_bytes
        self._stored: dict[str, Stored] = {}
        self.stats = TurnCacheStats()

    @property
    def nbytes(self) -> int:
        """Memory the kept keys and values take."""
        return sum(stored.nbytes for stored in self._stored.values())

    def __len__(self) -> int:
        return len(self._stored)

    def keep_only(self, key_ids: Sequence[str]) -> None:
        """Forget the conversations not among ``key_ids`` (they finished)."""
        live = set(key_ids)
        self._stored = {k: v for k, v in self._stored.items() if k in live}

    def clear(self) -> None:
        self._stored.clear()

    def plan(
        self,
        key_ids: Sequence[str],
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        images: Sequence[Sequence[str]],
    ) -> Plan | None:
        """The reuse plan of a left-padded batch, or None where its image tokens do not map onto
        its images one run per image (then the batch is computed from scratch and not stored)."""
        width = int(input_ids.shape[1])
        rows = []
        for key_id, ids, mask, row_images in zip(key_ids, input_ids, attention_mask, images):
            real = int(mask.sum())
            if real and not mask[width - real :].all():
                return None  # not left padding
            row_ids = np.asarray(ids[width - real :], dtype=np.int64)
            runs = image_runs(row_ids, self.image_token_id)
            if len(runs) != len(row_images):
                return None
            rows.append(Row(key_id, row_ids, runs, tuple(row_images)))
        for row in rows:
            row.source, row.reused = self._best_source(row)
        # the new part starts at the same slot in every row: the longest new part decides, and
        # no row's cut may fall inside an image run
        new = max(len(r.ids) - r.reused for r in rows)
        while True:
            moved = max(len(r.ids) - outside_runs(max(0, len(r.ids) - new), r.runs) for r in rows)
            if moved <= new:
                break
            new = moved
        for row in rows:
            row.reused = max(0, len(row.ids) - new)
        plan = Plan(rows, width, width - new)
        plan.new_images = [start >= row.reused for row in rows for start, _ in row.runs]
        self.stats.prompt_tokens += sum(len(r.ids) for r in rows)
        self.stats.reused_tokens += plan.reused_tokens
        return plan

    def _best_source(self, row: Row) -> tuple[Stored | None, int]:
        """The stored tokens sharing the longest prefix with the row, and that length.

        Its own conversation's last turn, or, for a conversation's first turn, whichever other
        conversation shares the most (the system message and the start of the first question are
        the same in every case; keys and values depend only on the tokens up to them)."""
        own = self._stored.get(row.key_id)
        candidates = [own] if own is not None else list(self._stored.values())
        best: tuple[Stored | None, int] = (None, 0)
        for stored in candidates:
            shared = self._reusable(row, stored)
            if shared > best[1]:
                best = (stored, shared)
        return best

    def _reusable(self, row: Row, stored: Stored) -> int:
        shared = common_prefix(stored.ids, row.ids)
        for k, (start, end) in enumerate(row.runs):
            if start >= shared:
                break
            if k >= len(stored.runs) or stored.runs[k] != (start, end) or stored.images[k] != row.images[k]:
                shared = start  # another image at this place: its tokens differ
                break
        # at least the last prompt token is computed: its logits give the first answer token
        return outside_runs(min(shared, len(row.ids) - 1), row.runs)

    def cache_for(self, plan: Plan) -> Any:
        """A DynamicCache holding each row's reused keys and values, left-padded to ``plan.past`` slots.

        A sliding-window layer (``windows``) keeps every slot but shows attention only its window
        (transformers' DynamicSlidingWindowLayer recording its past): the prefill and the decoding
        of a long conversation attend over the window, not the whole history, and the turn cache
        still gets every slot back.
        """
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        past = self._past(plan)
        count = len(past) if past else len(self.windows)
        if not count:
            return DynamicCache()
        layers = []
        for index in range(count):
            window = self.windows[index] if index < len(self.windows) else None
            if window:
                layer = DynamicSlidingWindowLayer(sliding_window=window)
                layer.activate_past_recording()
            else:
                layer = DynamicLayer()
            if past:
                layer.update(*past[index])
            layers.append(layer)
        cache = DynamicCache()
        cache.layers = layers
        return cache

    def _past(self, plan: Plan) -> list[tuple[Any, Any]]:
        """Per layer, the batch's reused keys and values [rows, heads, plan.past, head_dim]."""
        if plan.past == 0:
            return []
        first = next(r.source for r in plan.rows if r.reused and r.source is not None)
        layers = []
        for index, (k0, v0) in enumerate(first.layers):
            keys = k0.new_zeros((len(plan.rows), k0.shape[0], plan.past, k0.shape[2]))
            values = v0.new_zeros((len(plan.rows), v0.shape[0], plan.past, v0.shape[2]))
            for b, row in enumerate(plan.rows):
                if row.reused and row.source is not None:
                    k, v = row.source.layers[index]
                    keys[b, :, plan.past - row.reused :] = k[:, : row.reused]
                    values[b, :, plan.past - row.reused :] = v[:, : row.reused]
            layers.append((keys, values))
        return layers

    def store(self, plan: Plan, sequences: Any, cache: Any) -> None:
        """Keep each row's prompt and answer tokens with their keys and values for its next turn.

        ``sequences``: generate's output (prompt then new tokens); ``cache``: the cache it filled,
        which holds every token fed to the model (all but the last new one). A row's tokens after
        its first stop token are padding and are not kept.
        """
        new = sequences[:, plan.width :].cpu().numpy()
        fed = new[:, : max(0, new.shape[1] - 1)]
        stopped = np.isin(fed, self.stop_ids)
        # tokens up to and including each row's first stop token (all of them where none)
        kept = np.where(stopped.any(axis=1), stopped.argmax(axis=1) + 1, fed.shape[1])
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        per_token = sum(k[0, :, :1].nbytes + v[0, :, :1].nbytes for k, v in layers)
        used = self.nbytes
        for b, row in enumerate(plan.rows):
            old = self._stored.pop(row.key_id, None)
            used -= old.nbytes if old is not None else 0
            answer = fed[b, : kept[b]]
            start = plan.width - len(row.ids)
            end = plan.width + len(answer)
            if self.max_bytes is not None and used + per_token * (end - start) > self.max_bytes:
                self.stats.not_kept += 1
                continue
            self._stored[row.key_id] = stored = Stored(
                ids=np.concatenate([row.ids, answer]),
                runs=row.runs,
                images=row.images,
                layers=[(k[b, :, start:end].clone(), v[b, :, start:end].clone()) for k, v in layers],
            )
            used += stored.nbytes
