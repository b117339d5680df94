"""``GenerationSummary``: what a ``generate`` run did (saved as the work folder's report.json)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chexpercept.bundle import JSON_NAME


@dataclass
class GenerationSummary:
    """What a run did: selected cases per cell, rejections, failures, shortfalls."""

    out: str
    cases: int = 0
    per_cell: dict[str, int] = field(default_factory=dict)
    rejected: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    shortfalls: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    built: int = 0
    seconds_built: float = 0.0
    aborted: str | None = None
    notes: list[str] = field(default_factory=list)
    synthetic: bool = False
    reviewed: bool = False

    @property
    def exit_code(self) -> int:
        return 1 if (self.failed or self.shortfalls or self.aborted) else 0

    def text(self) -> str:
        """The summary ``generate`` and ``synth`` print."""
        if self.aborted:
            lines = [f"stopped before writing {self.out}/{JSON_NAME}; finished cases are kept for a rerun"]
        else:
            lines = [f"wrote {self.cases} cases to {self.out}/{JSON_NAME}"]
        lines.append(
            f"  built {self.built} case(s) in {self.seconds_built:.1f} worker-seconds; {self.resumed} taken from an earlier run"
        )
        if self.synthetic:
            lines.append("  phantom data: for testing software only, never for comparing models")
        if not self.reviewed:
            lines.append("  unreviewed: no expert review sheets were given (provenance.reviewed = false)")
        lines += [f"  {note}" for note in self.notes]
        if self.rejected:
            reasons = Counter(r["reason"] for r in self.rejected)
            lines.append(f"  {len(self.rejected)} candidate(s) rejected and replaced:")
            lines += [f"    {n} x {reason}" for reason, n in reasons.most_common()]
        if self.failed:
            lines.append(f"  {len(self.failed)} case(s) FAILED:")
            lines += [f"    {f['key_id']}: {f['error']}" for f in self.failed]
        for s in self.shortfalls:
            lines.append(
                f"  SHORT: {s['lesion']} {s['path']}: {s['have']} of {s['wanted']} cases (no candidates left)"
            )
        if self.aborted:
            lines.append(f"  ABORTED: {self.aborted}")
        return "\n".join(lines)
