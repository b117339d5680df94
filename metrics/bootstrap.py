"""Earlier names of the intervals and the paired comparison, kept importable.

The intervals and tests were a stratified bootstrap and a permutation test; they are now one
design-based method (metrics/inference.py; comparisons in metrics/comparisons.py). These names call
it; their resampling arguments are accepted and not used.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: model_scores imports inference
    from .model_scores import ModelScores


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(
        f"chexpercept.metrics.bootstrap.{name} is deprecated: use {instead} (the intervals are design-based "
        "and need no resampling)",
        DeprecationWarning,
        stacklevel=3,
    )


def bootstrap_intervals(
    report: ModelScores, *, n_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, tuple[float, float] | None]:
    """``chexpercept.metrics.inference.intervals(report.matrix, level=level)``."""
    from .inference import intervals

    _deprecated("bootstrap_intervals", "ModelScores.with_intervals or metrics.inference.intervals")
    return intervals(report.matrix, level=level)


def compare_reports(
    a: ModelScores,
    b: ModelScores,
    *,
    keys: Sequence[str] | None = None,
    n_resamples: int = 1000,
    n_permutations: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, Any]]:
    """``chexpercept.metrics.comparisons.compare_reports(a, b, keys=keys, level=level)``."""
    from .comparisons import compare_reports as compare

    _deprecated("compare_reports", "chexpercept.metrics.compare_reports")
    return compare(a, b, keys=keys, level=level)
