"""The benchmark's fixed vocabulary: lesions, paths (routes), stages and tasks.

Every other module names these things through this one place, so a spelling lives once.
"""

from __future__ import annotations

from enum import Enum

#: The seven lesions, in the alphabetical order used for ClassLabel ids and tables.
LESIONS: tuple[str, ...] = (
    "atelectasis",
    "cardiomegaly",
    "consolidation",
    "edema",
    "effusion",
    "opacity",
    "pneumonia",
)

#: Cardiomegaly has no Stage 4 (attribute extraction) and uses its own depth rule.
CARDIOMEGALY = "cardiomegaly"


class Path(str, Enum):
    """The three routes a case can take through the stages."""

    RR = "RR"  # revision required: stages 1, 2, 3, 4
    RF = "RF"  # revision free: stages 1, 2, 4
    LF = "LF"  # lesion free: stage 1

    @property
    def reference_name(self) -> str:
        """The reference implementation's spelling (``qa_path`` in all_results.json)."""
        return _REFERENCE_PATH_NAMES[self]

    def __str__(self) -> str:
        return self.value


PATHS: tuple[Path, ...] = (Path.RR, Path.RF, Path.LF)

_REFERENCE_PATH_NAMES = {
    Path.RR: "revision_required",
    Path.RF: "revision_free",
    Path.LF: "lesion_free",
}
_PATH_ALIASES = {name.lower(): p for p, name in _REFERENCE_PATH_NAMES.items()}
_PATH_ALIASES.update({p.value.lower(): p for p in Path})


def parse_path(value: str | Path) -> Path:
    """Accept ``RR``/``RF``/``LF`` (any case) or the reference names ``revision_required`` etc."""
    if isinstance(value, Path):
        return value
    key = str(value).strip().lower()
    if key not in _PATH_ALIASES:
        raise ValueError(
            f"unknown path {value!r}; expected one of RR, RF, LF "
            "(or revision_required, revision_free, lesion_free)"
        )
    return _PATH_ALIASES[key]


def parse_lesion(value: str) -> str:
    """Normalise a lesion name and reject anything outside the seven."""
    key = str(value).strip().lower()
    if key not in LESIONS:
        raise ValueError(f"unknown lesion {value!r}; expected one of {', '.join(LESIONS)}")
    return key


def lesion_of_key(key_id: str) -> str:
    """The lesion is the key_id's prefix before the first underscore (there is no lesion field)."""
    return key_id.split("_", 1)[0]


#: The nine tasks (one per question turn), in conversation order.
TASKS: tuple[str, ...] = (
    "detection",
    "contour_eval",
    "expansion",
    "contraction",
    "revision_result",
    "distribution",
    "location",
    "severity",
    "comparison",
)

TASK_STAGE: dict[str, int] = {
    "detection": 1,
    "contour_eval": 2,
    "expansion": 3,
    "contraction": 3,
    "revision_result": 3,
    "distribution": 4,
    "location": 4,
    "severity": 4,
    "comparison": 4,
}

STAGES: tuple[int, ...] = (1, 2, 3, 4)
STAGE_NAMES: dict[int, str] = {
    1: "detection",
    2: "contour evaluation",
    3: "contour revision",
    4: "attribute extraction",
}

#: Tasks answered by selecting several options (scored by set equality).
MULTI_SELECT_TASKS: frozenset[str] = frozenset({"expansion", "contraction", "location"})

STAGE3_TASKS: tuple[str, ...] = ("expansion", "contraction", "revision_result")
STAGE4_TASKS: tuple[str, ...] = ("distribution", "location", "severity", "comparison")

#: Stage 4 task -> key inside ``attribute_extraction_qa`` of chexpercept.json.
ATTRIBUTE_KEYS: dict[str, str] = {
    "distribution": "distribution",
    "location": "location",
    "severity": "severity/measurement",
    "comparison": "comparison",
}


def route_tasks(lesion: str, path: Path | str) -> tuple[str, ...]:
    """The tasks asked, in order, for a case of this lesion on this path."""
    path = parse_path(path)
    if path is Path.LF:
        return ("detection",)
    attributes = () if lesion == CARDIOMEGALY else STAGE4_TASKS
    if path is Path.RF:
        return ("detection", "contour_eval", *attributes)
    return ("detection", "contour_eval", *STAGE3_TASKS, *attributes)


def route_stages(lesion: str, path: Path | str) -> tuple[int, ...]:
    """The stages asked for this lesion and path (cardiomegaly: RR 1-3, RF 1-2)."""
    return tuple(sorted({TASK_STAGE[t] for t in route_tasks(lesion, path)}))


def max_depth(path: Path | str) -> int:
    """Depth scale of a path, the same for every lesion (cardiomegaly gets +1, see metrics)."""
    return {Path.RR: 4, Path.RF: 3, Path.LF: 1}[parse_path(path)]


#: Stage 3 point colours, in option order (spec 2.5).
POINT_COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown")
#: RGB in [0, 1] for rendering (spec 1.1).
COLOR_RGB: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "orange": (1.0, 0.5, 0.0),
    "yellow": (1.0, 1.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "purple": (0.5, 0.0, 0.5),
    "pink": (1.0, 0.75, 0.8),
    "brown": (0.6, 0.3, 0.0),
    "cyan": (0.0, 1.0, 1.0),
}
ORDINALS: tuple[str, ...] = ("1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th")
