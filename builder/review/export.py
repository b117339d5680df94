"""``chexpercept review export REVIEW_DIR``: the review sheets ``generate --review`` reads, agreement
between annotators and the disagreements to adjudicate.

Written to ``REVIEW_DIR/export/``:

* ``positive_labeling_sheet.csv``: the reference's positive sheet (key_id, dicom_id, target, pair_id,
  mapped_location, segmentation_source, plot_path, optimal?);
* ``negative_labeling_sheet.csv``: the reference's negative sheet (lesion, key_id, dicom_id, optimal?);
  ``optimal?`` is ``y`` for an accepted case and empty otherwise (any non-empty value accepts, spec 5.2);
* ``agreement.csv``: Cohen's kappa for every pair of annotators, Fleiss' kappa over the cases with the
  full number of ratings (accept/reject; skips are no rating);
* ``disagreements.csv``: cases with both an accept and a reject, each annotator's decision and note.

A case is accepted under ``unanimous`` (default) when at least one annotator accepted it and none
rejected it; under ``majority`` when accepts outnumber rejects. The last decision of an annotator for
a case wins.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath

import numpy as np

from chexpercept.escape import csv_cell, shell_word, terminal
from chexpercept.fileio import replaced_dir, write_atomic
from chexpercept.input_files import RESULTS, open_input
from chexpercept.vocab import CARDIOMEGALY

from .kappa import cohen_kappa, fleiss_kappa
from .manifest import load_manifest
from .store import DECISIONS_DIR, StoreError, decisions_path, latest, read_decisions

EXPORT_DIR = "export"
POSITIVE_SHEET = "positive_labeling_sheet.csv"
NEGATIVE_SHEET = "negative_labeling_sheet.csv"
AGREEMENT = "agreement.csv"
DISAGREEMENTS = "disagreements.csv"
RULES = ("unanimous", "majority")
POSITIVE_COLUMNS = (
    "key_id",
    "dicom_id",
    "target",
    "pair_id",
    "mapped_location",
    "segmentation_source",
    "plot_path",
    "optimal?",
)
NEGATIVE_COLUMNS = ("lesion", "key_id", "dicom_id", "optimal?")


def mapped_location(lesion: str, location: list[str]) -> str:
    """The reference's ``mapped_location``: heart for cardiomegaly, else the deduplicated locations
    joined in words (none: 'right lung and left lung')."""
    if lesion == CARDIOMEGALY:
        return "heart"
    seen = list(dict.fromkeys(x for x in location if x))
    if not seen:
        return "right lung and left lung"
    return seen[0] if len(seen) == 1 else f"{', '.join(seen[:-1])} and {seen[-1]}"


def verdict(decisions: list[str], rule: str) -> bool:
    accepts, rejects = decisions.count("accept"), decisions.count("reject")
    if rule == "majority":
        return accepts > rejects
    return accepts > 0 and rejects == 0


@dataclass
class ExportResult:
    out: FsPath
    accepted: int = 0
    rejected: int = 0
    undecided: int = 0
    disagreements: int = 0
    agreement: list[dict] = field(default_factory=list)
    #: what of the decisions folder was not exported, and why (said, never passed over)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"note: {terminal(note)}" for note in self.notes]
        lines += [
            f"wrote {terminal(self.out)}/{POSITIVE_SHEET} and {NEGATIVE_SHEET}: {self.accepted} accepted, "
            f"{self.rejected} not accepted, {self.undecided} without a decision (not accepted)",
            f"  {self.disagreements} disagreement(s) to adjudicate: {terminal(self.out)}/{DISAGREEMENTS}",
        ]
        for row in self.agreement:
            kappa = "n/a" if row["kappa"] == "" else f"{float(row['kappa']):.3f}"
            lines.append(f"  {row['measure']} {row['annotators']}: kappa {kappa} over {row['cases']} case(s)")
        if self.accepted:
            lines.append(
                f"next: chexpercept generate ... --review {shell_word(self.out / POSITIVE_SHEET)} "
                f"{shell_word(self.out / NEGATIVE_SHEET)}"
            )
        else:  # sheets that accept no case would give a release without one (new user, stop 45)
            lines.append(
                "no case is accepted yet: these sheets would give generate no case to keep; export again "
                "once the annotators have decided"
            )
        return "\n".join(lines)


def _csv(rows: list[dict], columns: tuple[str, ...] | list[str]) -> bytes:
    """A CSV of ``rows``; every cell through chexpercept.escape.csv_cell (an annotator's note that
    starts like a formula is not run by a spreadsheet)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue().encode("utf-8")


def _fmt(x: float) -> str:
    return "" if np.isnan(x) else f"{x:.6f}"


def export(review_dir: str | os.PathLike[str], rule: str = "unanimous") -> ExportResult:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}")
    root = FsPath(review_dir)
    manifest = load_manifest(root)
    annotators = manifest["annotators"]
    k = int(manifest["reviews_per_case"])
    # annotator -> key_id -> last record (decisions for cases not in this review are said and left out)
    decided = {a: read_decisions(decisions_path(root, a)) for a in annotators}
    last = {a: latest(records) for a, records in decided.items()}
    out = root / EXPORT_DIR
    result = ExportResult(out, notes=_unexported(root, decided, {i["key_id"] for i in manifest["items"]}))
    positives, negatives, disagreements = [], [], []
    for item in manifest["items"]:
        records = {a: last[a][item["key_id"]] for a in annotators if item["key_id"] in last[a]}
        rated = [r["decision"] for r in records.values() if r["decision"] != "skip"]
        ok = verdict(rated, rule)
        if not rated:
            result.undecided += 1
        elif ok:
            result.accepted += 1
        else:
            result.rejected += 1
        if item["positive"]:
            positives.append(_positive_row(item, ok))
        else:
            negatives.append(_negative_row(item, ok))
        if "accept" in rated and "reject" in rated:
            disagreements.append(_disagreement(item, records, ok))
    result.disagreements = len(disagreements)

    rated_by = {
        a: {key: r["decision"] for key, r in last[a].items() if r["decision"] != "skip"} for a in annotators
    }
    agreement = _cohen_rows(annotators, rated_by)
    if k >= 2:
        agreement += _fleiss_rows(manifest["items"], annotators, rated_by, k)
    result.agreement = agreement

    # the four sheets replace the previous export together (a folder inside the review's own folder)
    with replaced_dir(out, marker=None) as stage:
        write_atomic(stage / POSITIVE_SHEET, _csv(positives, POSITIVE_COLUMNS))
        write_atomic(stage / NEGATIVE_SHEET, _csv(negatives, NEGATIVE_COLUMNS))
        write_atomic(
            stage / AGREEMENT,
            _csv(agreement, ("measure", "annotators", "cases", "observed_agreement", "kappa")),
        )
        write_atomic(
            stage / DISAGREEMENTS,
            _csv(
                disagreements, ("key_id", "lesion", "kind", "accepted_by", "rejected_by", "notes", "verdict")
            ),
        )
    return result


def _unexported(root: FsPath, decided: dict[str, list[dict]], keys: set[str]) -> list[str]:
    """What of ``decisions/`` the export leaves out (``decided``: each annotator's decisions as read),
    one line each: a file of an annotator the review
    does not have, decisions for cases it does not hold, a torn last line (a write cut short: ``review
    serve`` repairs it). A line that names another annotator than its file's is an error
    (StoreError): whose decision it is cannot be told. None was said before (red team, stop 44)."""
    folder = root / DECISIONS_DIR
    notes = []
    if folder.is_dir():
        for path in sorted(folder.glob("*.jsonl")):
            if path.stem not in decided:
                notes.append(
                    f"{path}: annotator {path.stem!r} is not in the review's review.json: not exported"
                )
    for annotator, records in decided.items():
        path = decisions_path(root, annotator)
        for n, record in enumerate(records, 1):
            said = record.get("annotator", annotator)
            if said != annotator:
                raise StoreError(
                    f"{path}: decision {n} (case {record['key_id']!r}) says annotator {said!r}, in "
                    f"{annotator}'s file: whose decision it is cannot be told; move or remove that line"
                )
        strangers = sorted({r["key_id"] for r in records} - keys)
        if strangers:
            notes.append(
                f"{path}: decisions for {len(strangers)} case(s) this review does not hold (e.g. "
                f"{strangers[0]!r}): not exported"
            )
        if path.is_file() and path.stat().st_size and not _ends_a_line(path):  # read_decisions took it
            notes.append(
                f"{path}: its last line is torn (a write was cut short) and is not exported; "
                "chexpercept review serve repairs it"
            )
    if not any(decided.values()):
        notes.append("no annotator has recorded a decision yet: every case is without one (not accepted)")
    return notes


def _ends_a_line(path: FsPath) -> bool:
    """Whether the decisions file's last byte ends a line (its last byte alone, through
    chexpercept.input_files)."""
    with open_input(path, RESULTS, what="decisions file") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _positive_row(item: dict, ok: bool) -> dict:
    """The positive sheet's row of a review item (``optimal?`` y when accepted)."""
    return {
        "key_id": item["key_id"],
        "dicom_id": item["dicom_id"],
        "target": item["lesion"],
        "pair_id": item["pair_id"],
        "mapped_location": mapped_location(item["lesion"], item["location"]),
        "segmentation_source": item["pair_type"],
        "plot_path": "",
        "optimal?": "y" if ok else "",
    }


def _negative_row(item: dict, ok: bool) -> dict:
    """The negative sheet's row of a review item (``optimal?`` y when accepted)."""
    return {
        "lesion": item["lesion"],
        "key_id": item["key_id"],
        "dicom_id": item["dicom_id"],
        "optimal?": "y" if ok else "",
    }


def _disagreement(item: dict, records: dict[str, dict], ok: bool) -> dict:
    """disagreements.csv's row: who accepted, who rejected, their notes and the verdict."""
    return {
        "key_id": item["key_id"],
        "lesion": item["lesion"],
        "kind": "positive" if item["positive"] else "negative",
        "accepted_by": " ".join(a for a, r in records.items() if r["decision"] == "accept"),
        "rejected_by": " ".join(a for a, r in records.items() if r["decision"] == "reject"),
        "notes": " | ".join(f"{a}: {r['note']}" for a, r in records.items() if r.get("note")),
        "verdict": "accepted" if ok else "not accepted",
    }


def _cohen_rows(annotators: list[str], rated_by: dict[str, dict[str, str]]) -> list[dict]:
    """Cohen's kappa for every pair of annotators with cases rated by both."""
    rows = []
    for a, b in itertools.combinations(annotators, 2):
        common = sorted(set(rated_by[a]) & set(rated_by[b]))
        if not common:
            continue
        x = [rated_by[a][key] for key in common]
        y = [rated_by[b][key] for key in common]
        rows.append(
            {
                "measure": "cohen",
                "annotators": f"{a}-{b}",
                "cases": len(common),
                "observed_agreement": f"{np.mean([p == q for p, q in zip(x, y)]):.6f}",
                "kappa": _fmt(cohen_kappa(x, y)),
            }
        )
    return rows


def _fleiss_rows(
    items: list[dict], annotators: list[str], rated_by: dict[str, dict[str, str]], k: int
) -> list[dict]:
    """Fleiss' kappa over the cases with all k ratings (no row when there are none)."""
    table = []
    for item in items:
        votes = [rated_by[a][item["key_id"]] for a in annotators if item["key_id"] in rated_by[a]]
        if len(votes) == k:
            table.append([votes.count("accept"), votes.count("reject")])
    if not table:
        return []
    counts = np.asarray(table)
    observed = float(np.mean((counts == k).any(axis=1)))
    return [
        {
            "measure": "fleiss",
            "annotators": " ".join(annotators),
            "cases": len(table),
            "observed_agreement": f"{observed:.6f}",
            "kappa": _fmt(fleiss_kappa(counts)),
        }
    ]
