"""How much of each lung, zone and region a lesion component covers (reference spec 5.4.4).

Coverage is |lesion ∩ reference| / |reference| (the fraction of the *reference* area covered). Every
threshold is decided on the integer pixel counts, so a coverage of exactly 1 % or 20 % is never lost
to floating point: lungs count at >= 1 %, zones and regions at >= 20 %. When no zone (resp. region)
reaches 20 %, the best-covered one is promoted, provided it is covered at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .morph import bbox, padded_window

LUNG_MIN = Fraction(1, 100)
REGION_MIN = Fraction(1, 5)


def _at_least(covered: int, area: int, threshold: Fraction) -> bool:
    """covered / area >= threshold, in integers (no rounding at the boundary); False for no area."""
    return area > 0 and covered * threshold.denominator >= threshold.numerator * area


@dataclass(frozen=True)
class Coverage:
    """Pixels of a reference area covered by a lesion component, and whether that counts."""

    covered: int
    area: int
    has_overlap: bool

    @property
    def fraction(self) -> Fraction:
        return Fraction(self.covered, self.area) if self.area else Fraction(0)

    @classmethod
    def counted_at(cls, covered: int, area: int, threshold: Fraction) -> Coverage:
        """A coverage that counts as overlap when at least ``threshold`` of the area is covered."""
        return cls(covered, area, _at_least(covered, area, threshold))

    def at_least(self, threshold: Fraction) -> bool:
        return _at_least(self.covered, self.area, threshold)

    def at_most(self, threshold: Fraction) -> bool:
        return self.covered * threshold.denominator <= threshold.numerator * self.area


@dataclass
class ComponentOverlap:
    """Overlap of one lesion component with the lungs, the 6 zones and (non-cardiomegaly) the 20 regions."""

    component_id: str
    lungs: dict[str, Coverage]  # "left lung", "right lung"
    zones: dict[str, Coverage]
    regions: dict[str, Coverage]

    def lung_size(self, lung: str) -> int:
        """Pixels of the component in that lung, counted only when it covers >= 1 % of it (reference)."""
        cov = self.lungs[lung]
        return cov.covered if cov.has_overlap else 0


def _count(component: np.ndarray, box: tuple[int, int, int, int] | None, ref: np.ndarray) -> int:
    if box is None:
        return 0
    win = padded_window(box, 0, component.shape)
    return int(np.count_nonzero(component[win] & ref[win]))


def _with_promotion(counts: dict[str, tuple[int, int]]) -> dict[str, Coverage]:
    """Coverage >= 20 %; else the best-covered entry (first on ties) if it is covered at all."""
    out = {name: Coverage.counted_at(c, a, REGION_MIN) for name, (c, a) in counts.items()}
    if out and not any(v.has_overlap for v in out.values()):
        best = max(out, key=lambda n: out[n].fraction)  # max keeps the first of equal fractions
        if out[best].covered > 0:
            out[best] = Coverage(out[best].covered, out[best].area, True)
    return out


def component_overlap(
    component_id: str,
    component: np.ndarray,
    lungs: dict[str, np.ndarray],
    zone_masks: dict[str, np.ndarray],
    region_masks: dict[str, np.ndarray] | None,
    areas: dict[str, int] | None = None,
) -> ComponentOverlap:
    """Overlap info of one component; ``lungs`` is keyed ``right lung`` / ``left lung``.

    ``areas`` may carry precomputed pixel counts of every reference mask (they are shared by all
    components of a case).
    """
    areas = areas if areas is not None else {}
    box = bbox(component)

    def area(name: str, mask: np.ndarray) -> int:
        if name not in areas:
            areas[name] = int(np.count_nonzero(mask))
        return areas[name]

    lung_cov = {}
    for name in ("left lung", "right lung"):
        c, a = _count(component, box, lungs[name]), area(name, lungs[name])
        lung_cov[name] = Coverage.counted_at(c, a, LUNG_MIN)
    zone_cov = _with_promotion({n: (_count(component, box, m), area(n, m)) for n, m in zone_masks.items()})
    region_cov = (
        _with_promotion({n: (_count(component, box, m), area(n, m)) for n, m in region_masks.items()})
        if region_masks is not None
        else {}
    )
    return ComponentOverlap(component_id, lung_cov, zone_cov, region_cov)
