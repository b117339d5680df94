"""Chance-corrected agreement between annotators: Cohen's kappa (two raters) and Fleiss' kappa (any
number of raters, the same number per item). Small formulas, written out with numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's kappa of two raters' labels of the same items: (p_o - p_e) / (1 - p_e), with p_e from
    each rater's own label frequencies. NaN when there are no items or p_e == 1 (one label only)."""
    if len(a) != len(b):
        raise ValueError(f"the raters labelled {len(a)} and {len(b)} items")
    n = len(a)
    if n == 0:
        return float("nan")
    labels = sorted(set(a) | set(b))
    index = {label: i for i, label in enumerate(labels)}
    table = np.zeros((len(labels), len(labels)))
    for x, y in zip(a, b):
        table[index[x], index[y]] += 1
    table /= n
    p_o = float(np.trace(table))
    p_e = float(table.sum(axis=1) @ table.sum(axis=0))
    if p_e >= 1.0:
        return float("nan")
    return (p_o - p_e) / (1.0 - p_e)


def fleiss_kappa(counts: np.ndarray | Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa from an items x categories table of how many raters chose each category; every
    item must have the same number n >= 2 of ratings. NaN when there are no items or P_e == 1."""
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        return float("nan")
    per_item = table.sum(axis=1)
    n = per_item[0]
    if n < 2 or not np.all(per_item == n):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of ratings for every item")
    n_items = table.shape[0]
    p_j = table.sum(axis=0) / (n_items * n)
    p_i = ((table * table).sum(axis=1) - n) / (n * (n - 1))
    p_bar = float(p_i.mean())
    p_e = float((p_j * p_j).sum())
    if p_e >= 1.0:
        return float("nan")
    return (p_bar - p_e) / (1.0 - p_e)
