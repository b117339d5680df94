"""Which cases a run asks: --lesions and --paths (applied by read_bundle), --per-cell and --limit.

``--per-cell N`` takes N cases from every (lesion, path) cell, chosen by a hash of the key_id (not by
file order, which the reference uses and which can follow how the sheet was sorted, spec 7.1 item
12), so the choice is deterministic and does not change when cases are added to other cells.
The selected cases keep bundle order; ``--limit N`` then keeps the first N.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from chexpercept.case import Case
from chexpercept.domains import COUNT


def _rank(key_id: str) -> str:
    return hashlib.sha256(key_id.encode("utf-8")).hexdigest()


def _cells(cases: Sequence[Case]) -> dict[tuple[str, str], list[Case]]:
    """The cases of each (lesion, path) cell, in their order."""
    cells: dict[tuple[str, str], list[Case]] = {}
    for case in cases:
        cells.setdefault((case.lesion, case.path.value), []).append(case)
    return cells


def select_cases(
    cases: Sequence[Case], *, per_cell: int | None = None, limit: int | None = None
) -> list[Case]:
    for value, name in ((per_cell, "--per-cell"), (limit, "--limit")):
        if value is not None:
            COUNT.require(value, name)
    chosen = list(cases)
    if per_cell is not None:
        keep = {
            c.key_id
            for members in _cells(chosen).values()
            for c in sorted(members, key=lambda c: _rank(c.key_id))[:per_cell]
        }
        chosen = [c for c in chosen if c.key_id in keep]
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


def selection_notes(cases: Sequence[Case], *, per_cell: int | None, limit: int | None) -> list[str]:
    """A note for each of --per-cell and --limit that selects nothing less than what it is given
    (``cases``: before either): a selection bigger than the bundle is taken whole, and said so (new
    user, stop 45: --per-cell 5 on a bundle of 2 per cell ran all its 42 cases without a word)."""
    notes = []
    if per_cell is not None:
        most = max(map(len, _cells(cases).values()), default=0)
        if per_cell > most:
            notes.append(
                f"--per-cell {per_cell}: no (lesion, path) cell holds more than {most} case(s); each is taken whole"
            )
    if limit is not None:
        left = len(select_cases(cases, per_cell=per_cell))
        if limit > left:
            notes.append(f"--limit {limit}: the selection holds {left} case(s); all are taken")
    return notes


def shard(cases: Sequence[Case], index: int, count: int) -> list[Case]:
    """Cases of process ``index`` out of ``count``: every count-th case, so paths and lesions mix."""
    return list(cases[index::count])


def add_selection_options(group: Any) -> None:
    """The options that choose a run's cases (``run``, ``estimate``): --lesions, --paths, --per-cell,
    --limit. Read them with ``selection_of``."""
    from chexpercept.vocab import LESIONS

    group.add_argument("--lesions", nargs="+", help=f"only these lesions ({', '.join(LESIONS)})")
    group.add_argument("--paths", nargs="+", help="only these paths (RR RF LF)")
    group.add_argument("--per-cell", type=COUNT, help="N cases per (lesion, path) cell, chosen by key hash")
    group.add_argument("--limit", type=COUNT, help="only the first N selected cases")


def split_list(values: Sequence[str] | None) -> list[str] | None:
    """``--lesions a b`` and ``--lesions a,b`` alike; None when not given."""
    if not values:
        return None
    return [v for item in values for v in item.split(",") if v]
