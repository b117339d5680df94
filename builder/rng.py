"""Seeded randomness: one independent generator per (seed, key_id, purpose).

Every random choice of a case draws from a generator derived from the run seed and the case's key_id,
never from global state or from the order cases are processed in, so the output is identical for any
number of workers and on a rerun.
"""

from __future__ import annotations

import hashlib

import numpy as np

from chexpercept.domains import SEED


def derive(seed: int, *labels: str) -> np.random.Generator:
    """A numpy Generator determined by the seed and the labels (e.g. key_id, purpose)."""
    SEED.require(seed, "seed")
    digest = hashlib.sha256("\0".join(labels).encode("utf-8")).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, *words]))
