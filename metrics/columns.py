"""The catalogue of metrics: every reported number as a mean of one per-case column.

Each metric is a pair (values, applies) over the cases of a run: its value is the mean of
``values`` over the cases where ``applies`` is true, and None (N/A) when it applies to no case.
Point estimates, bootstrap replicates and paired comparisons all read these same columns, so a
number and its interval cannot disagree. A few metrics are differences of two others (``DERIVED``).

Names (the flat keys of the issue are a subset, see ``FLAT_KEYS``):
- ``e2e/stage<k>/<P>``, ``op/stage<k>/<P>``: stage accuracy; P is RR, RF, LF or ``all`` (Stage 1
  over RR+RF+LF, Stages 2 and 4 over RR+RF, Stage 3 over RR: wherever the stage is asked);
- ``depth/<P>`` (cardiomegaly +1) and ``depth_native/<P>`` (without it);
- ``sub/<task>``: sub-task accuracy (Oracle-Passed);
- ``lesion/<lesion>/...``: the same per lesion;
- ``bias/stage2/<RR|RF>/<yes|no|etc>``, ``bias/stage2/delta``, ``bias/stage2/accuracy``;
- ``bias/stage3/<expansion|contraction>/<none_rate|points|accuracy|gold_none_rate|gold_points>``;
- ``gain/stage<k>``: Oracle-Passed minus End-to-End accuracy (``all``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chexpercept.vocab import CARDIOMEGALY, LESIONS, PATHS, POINT_TASKS, SUB_TASKS, Path, max_depth

from .scoring import STAGE2_CLASSES, TASK_INDEX, CaseScores

Column = tuple[np.ndarray, np.ndarray]  # (values float64, applies bool)


@dataclass
class ColumnMatrix:
    """Per-case columns of every metric, rows sorted by key_id: what bootstrap and comparison read."""

    key_ids: list[str]
    #: stratum of each case: lesion index * 3 + path index
    strata: np.ndarray
    names: list[str]
    #: values where the metric applies, 0 elsewhere (n, K)
    weighted: np.ndarray
    applies: np.ndarray

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}


PATH_KEYS: tuple[str, ...] = (*(p.value for p in PATHS), "all")

#: The flat metrics: stable names used by scripts (fractions in [0, 1], depth in stages; None = N/A).
FLAT_KEYS: tuple[str, ...] = (
    *(f"e2e/stage{k}/{p}" for k in (1, 2, 3, 4) for p in PATH_KEYS),
    *(f"op/stage{k}/{p}" for k in (2, 3, 4) for p in PATH_KEYS),
    *(f"depth/{p.value}" for p in PATHS),
    *(f"sub/{t}" for t in SUB_TASKS),
)

#: metrics defined as a difference of two others: name -> (minuend, subtrahend)
DERIVED: dict[str, tuple[str, str]] = {
    "bias/stage2/delta": ("bias/stage2/RR/yes", "bias/stage2/RF/yes"),
    **{f"gain/stage{k}": (f"op/stage{k}/all", f"e2e/stage{k}/all") for k in (2, 3, 4)},
}
#: metrics that are another metric under a second name
ALIASES: dict[str, str] = {"bias/stage2/accuracy": "op/stage2/all"}


def _path_masks(cs: CaseScores) -> dict[str, np.ndarray]:
    masks = {p.value: cs.path == i for i, p in enumerate(PATHS)}
    masks["all"] = np.ones(len(cs), bool)
    return masks


def _stage_columns(cs: CaseScores, table: np.ndarray, stages: tuple[int, ...], prefix: str, rows: np.ndarray):
    out: dict[str, Column] = {}
    paths = _path_masks(cs)
    for k in stages:
        values = table[:, k - 1].astype(float)
        for p, pmask in paths.items():
            out[f"{prefix}/stage{k}/{p}"] = (values, cs.stage_asked[:, k - 1] & pmask & rows)
    return out


def e2e_columns(cs: CaseScores) -> dict[str, Column]:
    """End-to-End metrics: gated stage accuracy and depth, overall and per lesion."""
    out: dict[str, Column] = {}
    everyone = np.ones(len(cs), bool)
    scopes = {"": everyone} | {f"lesion/{name}/": cs.lesion == i for i, name in enumerate(LESIONS)}
    paths = _path_masks(cs)
    for scope, rows in scopes.items():
        out.update(_stage_columns(cs, cs.e2e, (1, 2, 3, 4), f"{scope}e2e", rows))
        for p in PATHS:
            out[f"{scope}depth/{p.value}"] = (cs.depth, paths[p.value] & rows)
            out[f"{scope}depth_native/{p.value}"] = (cs.depth_native, paths[p.value] & rows)
    return out


def op_columns(cs: CaseScores) -> dict[str, Column]:
    """Oracle-Passed metrics: ungated stage and sub-task accuracy, per lesion, and answer bias."""
    out: dict[str, Column] = {}
    everyone = np.ones(len(cs), bool)
    scopes = {"": everyone} | {f"lesion/{name}/": cs.lesion == i for i, name in enumerate(LESIONS)}
    for scope, rows in scopes.items():
        out.update(_stage_columns(cs, cs.stage_pass, (2, 3, 4), f"{scope}op", rows))
    for task in SUB_TASKS:
        j = TASK_INDEX[task]
        out[f"sub/{task}"] = (cs.task_correct[:, j].astype(float), cs.task_asked[:, j].copy())
    paths = _path_masks(cs)
    stage2 = cs.stage2_class >= 0
    for p in ("RR", "RF"):
        for c, name in enumerate(STAGE2_CLASSES):
            out[f"bias/stage2/{p}/{name}"] = ((cs.stage2_class == c).astype(float), stage2 & paths[p])
    for k, task in enumerate(POINT_TASKS):
        applies = cs.task_asked[:, TASK_INDEX[task]].copy()
        prefix = f"bias/stage3/{task}"
        out[f"{prefix}/none_rate"] = (cs.point_none[:, k].astype(float), applies)
        out[f"{prefix}/points"] = (cs.point_count[:, k].astype(float), applies)
        out[f"{prefix}/accuracy"] = (cs.task_correct[:, TASK_INDEX[task]].astype(float), applies)
        out[f"{prefix}/gold_none_rate"] = (cs.gold_none[:, k].astype(float), applies)
        out[f"{prefix}/gold_points"] = (cs.gold_count[:, k].astype(float), applies)
    return out


def column_mean(values: np.ndarray, applies: np.ndarray) -> float | None:
    n = int(applies.sum())
    if n == 0:
        return None
    return float(values[applies].sum() / n)


def add_derived(values: dict[str, float | None]) -> dict[str, float | None]:
    """Fill DERIVED and ALIASES entries from the base values (None when a part is None)."""
    out = dict(values)
    for name, (a, b) in DERIVED.items():
        va, vb = values.get(a), values.get(b)
        out[name] = None if va is None or vb is None else va - vb
    for name, target in ALIASES.items():
        out[name] = values.get(target)
    return out


def is_share(name: str) -> bool:
    """True when a metric is a mean of 0/1 values (an accuracy or a rate, in [0, 1]; LF's depth);
    False for the other depths, point counts and the differences in ``DERIVED``. Shares get
    intervals that stay inside [0, 1] (metrics/inference.py)."""
    name = ALIASES.get(name, name)
    if name in DERIVED:
        return False
    parts = name.split("/")
    if any(part.startswith("depth") for part in parts):
        return parts[-1] == "LF"  # LF asks one stage: its depth is 0 or 1
    return parts[-1] not in ("points", "gold_points")


def value_range(name: str) -> tuple[float, float] | None:
    """The lowest and highest value one case can have for this metric: (0, 1) for a share, (0, the
    path's maximum depth) for a depth (cardiomegaly's native depth one lower on RR and RF); None
    where unbounded or not known (point counts, differences)."""
    name = ALIASES.get(name, name)
    if is_share(name):
        return 0.0, 1.0
    parts = name.split("/")
    if len(parts) >= 2 and parts[-2] in ("depth", "depth_native"):
        top = max_depth(parts[-1])
        native = parts[-2] == "depth_native" and CARDIOMEGALY in parts and parts[-1] != Path.LF.value
        return 0.0, float(top - 1 if native else top)
    return None


def metric_names() -> frozenset[str]:
    """Every metric name ``ModelScores.values`` can hold: the columns, DERIVED and ALIASES."""
    from .scoring import score_records

    empty = score_records([])
    return frozenset([*e2e_columns(empty), *op_columns(empty), *DERIVED, *ALIASES])
