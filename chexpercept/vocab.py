"""The benchmark's fixed vocabulary: lesions, paths (routes), stages and tasks.

Every other module names these things through this one place, so a spelling lives once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

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


OptionKind = Literal["text", "points", "masks"]


@dataclass(frozen=True)
class TaskInfo:
    """Everything the toolkit knows about one task (one question turn). The one table of per-task
    facts: the bundle format, the conversation, parsing, scoring, the reference's result layout and
    the report all read it (``TASK_INFO``), so adding or changing a task touches this table."""

    #: the task's name (results, metrics keys ``sub/<name>``, ``--details``)
    name: str
    stage: int
    #: answered by selecting several options, scored by set equality (spec 4.2)
    multi_select: bool
    #: where its QA sits in chexpercept.json: ``detection_qa``, ``contour_qa`` or
    #: ``attribute_extraction_qa``, and its key inside that section (None: the section itself)
    section: str
    key: str | None
    #: the options shown to the model: the stored texts, point labels (``red point``) or mask labels
    #: (``1st mask``) made from the stored options (spec 2.5)
    options: OptionKind
    #: the reference's all_results.json: the stage entry holding this task, and the sub-key of its
    #: ``responses``/``ground_truth`` (None: the stage entry holds the task alone)
    result_section: str
    result_key: str | None
    #: the report's short label and colour (Stages 3 and 4; Okabe-Ito and Tol colours)
    label: str
    color: str | None = None

    @property
    def history_name(self) -> str:
        """The reference's chat-history name of the turn (``contour_revision_qa_expansion``...)."""
        return self.result_section if self.result_key is None else f"{self.result_section}_{self.result_key}"


def _stage3(name: str, options: OptionKind, label: str, color: str) -> TaskInfo:
    return TaskInfo(
        name=name,
        stage=3,
        multi_select=options == "points",
        section="contour_qa",
        key=f"contour_revision_qa_{name}",
        options=options,
        result_section="contour_revision_qa",
        result_key=name,
        label=label,
        color=color,
    )


def _stage4(name: str, key: str, multi_select: bool, label: str, color: str) -> TaskInfo:
    return TaskInfo(
        name=name,
        stage=4,
        multi_select=multi_select,
        section="attribute_extraction_qa",
        key=key,
        options="text",
        result_section="attribute_extraction_qa",
        result_key=key,
        label=label,
        color=color,
    )


#: The nine tasks (one per question turn), in conversation order.
TASK_INFO: dict[str, TaskInfo] = {
    t.name: t
    for t in (
        TaskInfo(
            name="detection",
            stage=1,
            multi_select=False,
            section="detection_qa",
            key=None,
            options="text",
            result_section="detection_qa",
            result_key=None,
            label="Detection",
        ),
        TaskInfo(
            name="contour_eval",
            stage=2,
            multi_select=False,
            section="contour_qa",
            key="contour_eval_qa",
            options="text",
            result_section="contour_evaluation_qa",
            result_key=None,
            label="Contour Eval.",
        ),
        _stage3("expansion", "points", "Expansion", "#E69F00"),
        _stage3("contraction", "points", "Contraction", "#56B4E9"),
        _stage3("revision_result", "masks", "Rev. Result", "#009E73"),
        _stage4("distribution", "distribution", False, "Distribution", "#CC79A7"),
        _stage4("location", "location", True, "Location", "#882255"),
        _stage4("severity", "severity/measurement", False, "Severity/Meas.", "#999933"),
        _stage4("comparison", "comparison", False, "Comparison", "#44AA99"),
    )
}

TASKS: tuple[str, ...] = tuple(TASK_INFO)
TASK_STAGE: dict[str, int] = {t.name: t.stage for t in TASK_INFO.values()}

STAGES: tuple[int, ...] = (1, 2, 3, 4)
STAGE_NAMES: dict[int, str] = {
    1: "detection",
    2: "contour evaluation",
    3: "contour revision",
    4: "attribute extraction",
}

#: Tasks answered by selecting several options (scored by set equality).
MULTI_SELECT_TASKS: frozenset[str] = frozenset(t.name for t in TASK_INFO.values() if t.multi_select)
#: Tasks whose options are coloured points on the image (Stage 3 expansion and contraction).
POINT_TASKS: tuple[str, ...] = tuple(t.name for t in TASK_INFO.values() if t.options == "points")

STAGE3_TASKS: tuple[str, ...] = tuple(t.name for t in TASK_INFO.values() if t.stage == 3)
STAGE4_TASKS: tuple[str, ...] = tuple(t.name for t in TASK_INFO.values() if t.stage == 4)
#: the sub-tasks scored on their own (``sub/<task>``): Stages 3 and 4
SUB_TASKS: tuple[str, ...] = (*STAGE3_TASKS, *STAGE4_TASKS)

#: Stage 4 task -> key inside ``attribute_extraction_qa`` of chexpercept.json.
ATTRIBUTE_KEYS: dict[str, str] = {t: TASK_INFO[t].key for t in STAGE4_TASKS}  # type: ignore[misc]


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
