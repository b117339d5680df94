"""Typed Case and Turn objects, converted from and back to a ``chexpercept.json`` entry without loss.

A ``Case`` mirrors one entry of the release (spec 1.3). ``Case.turns`` derives the ordered question
turns a model sees on the case's route: the exact user text, the images riding on that turn (paths
relative to the bundle root), the option texts and the gold answer.
"""

from __future__ import annotations

import copy as _copy_module
from dataclasses import dataclass, field
from typing import Any

from . import templates
from .vocab import (
    ATTRIBUTE_KEYS,
    CARDIOMEGALY,
    MULTI_SELECT_TASKS,
    TASK_INFO,
    TASK_STAGE,
    Path,
    lesion_of_key,
    route_tasks,
)

_QA_CORE = ("question", "answer_options", "answer", "answer_index")
_CONTOUR_TURN_KEYS = {t.name: t.key for t in TASK_INFO.values() if t.section == "contour_qa"}
#: contour_qa keys in the order the reference writes them (unknown keys keep their place at the end).
_CONTOUR_ORDER = (
    "no_deformation",
    "initial_context",
    "revision_before_masks",
    "revision_after_masks",
    "true_masks",
    "fake_masks",
    "true_combination",
    "fake_combinations",
    "contour_eval_qa",
    "contour_revision_qa_expansion",
    "contour_revision_qa_contraction",
    "contour_revision_qa_revision_result",
)
POINTS_IMAGE = "contour_revision_qa/xray_with_mask_and_points.png"
DETECTION_IMAGE = "detection_qa/xray.png"


@dataclass
class QA:
    """One stored question: text, options, gold answer, and any extra fields (relative_path, zones...)."""

    question: str
    answer_options: list[Any]
    answer: str
    answer_index: int | list[int]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, copy: bool = True) -> QA:
        dup = _deepcopy if copy else _same
        return cls(
            question=d["question"],
            answer_options=dup(d["answer_options"]),
            answer=d["answer"],
            answer_index=dup(d["answer_index"]),
            extra={k: dup(v) for k, v in d.items() if k not in _QA_CORE},
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "question": self.question,
            "answer_options": _copy_module.deepcopy(self.answer_options),
            "answer": self.answer,
            "answer_index": _copy_module.deepcopy(self.answer_index),
        }
        out.update(_copy_module.deepcopy(self.extra))
        return out

    @property
    def gold(self) -> list[int]:
        """Gold option indices (1-based) as a list, whether stored as int or list."""
        ai = self.answer_index
        return list(ai) if isinstance(ai, list) else [int(ai)]


@dataclass
class ContourQA:
    """Stage 2 and Stage 3 material of a positive case."""

    no_deformation: bool
    initial_context: str
    contour_eval: QA
    expansion: QA
    contraction: QA
    revision_result: QA
    #: mask bookkeeping (revision_before_masks, true_masks, ...) and unknown keys, in stored order
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, copy: bool = True) -> ContourQA:
        known = {"no_deformation", "initial_context", *_CONTOUR_TURN_KEYS.values()}
        dup = _deepcopy if copy else _same
        return cls(
            no_deformation=bool(d["no_deformation"]),
            initial_context=d["initial_context"],
            **{task: QA.from_dict(d[key], copy=copy) for task, key in _CONTOUR_TURN_KEYS.items()},
            extra={k: dup(v) for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "no_deformation": self.no_deformation,
            "initial_context": self.initial_context,
            **{key: getattr(self, task).to_dict() for task, key in _CONTOUR_TURN_KEYS.items()},
        }
        values.update(_copy_module.deepcopy(self.extra))
        ordered = {k: values.pop(k) for k in _CONTOUR_ORDER if k in values}
        ordered.update(values)
        return ordered


@dataclass(frozen=True)
class Turn:
    """One question turn as the model sees it (without any oracle text)."""

    stage: int
    task: str
    text: str
    #: image paths relative to the bundle root, in the order the model sees them
    images: tuple[str, ...]
    options: tuple[str, ...]
    answer_index: tuple[int, ...]
    answer: str
    multi_select: bool

    @property
    def none_index(self) -> int | None:
        """1-based index of the question's None option (points: ``None``; location: none of the above)."""
        if self.options and self.options[-1] in ("None", templates.LOCATION_NONE):
            return len(self.options)
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "task": self.task,
            "text": self.text,
            "images": list(self.images),
            "options": list(self.options),
            "answer_index": list(self.answer_index),
            "answer": self.answer,
            "multi_select": self.multi_select,
        }


_MISSING = object()


def _deepcopy(value: Any) -> Any:
    return _copy_module.deepcopy(value)


def _same(value: Any) -> Any:
    return value


@dataclass
class Case:
    """One benchmark case (one CXR, one conversation)."""

    key_id: str
    pair_id: str
    dicom_id: str | None
    detection: QA
    contour: ContourQA | None = None
    #: attribute QA keyed by the stored names (``severity/measurement``); None when null or absent
    attributes: dict[str, QA] | None = None
    #: whether ``attribute_extraction_qa`` was present in the entry (null for cardiomegaly positives)
    has_attribute_key: bool = False
    #: unknown top-level fields (e.g. revision_sequential_qa, synthetic markers), in stored order
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lesion(self) -> str:
        return lesion_of_key(self.key_id)

    @property
    def path(self) -> Path:
        """Route as the reference derives it (spec 3.2)."""
        if self.detection.answer != "Yes":
            return Path.LF
        if self.contour is not None and self.contour.no_deformation:
            return Path.RF
        return Path.RR

    @property
    def is_cardiomegaly(self) -> bool:
        return self.lesion == CARDIOMEGALY

    @property
    def image_dir(self) -> str:
        """Folder of this case's images, relative to the bundle root."""
        return f"chexpercept/{self.key_id}"

    @property
    def cxr_image(self) -> str:
        return f"{self.image_dir}/{DETECTION_IMAGE}"

    @classmethod
    def from_entry(cls, key_id: str, entry: dict[str, Any], *, copy: bool = True) -> Case:
        """Build from a chexpercept.json entry; copy=False shares the entry's objects (faster, less memory)."""
        dup = _deepcopy if copy else _same
        known = {"detection_qa", "contour_qa", "attribute_extraction_qa", "pair_id", "dicom_id"}
        attrs_raw = entry.get("attribute_extraction_qa", _MISSING)
        attributes = None
        if isinstance(attrs_raw, dict):
            attributes = {k: QA.from_dict(v, copy=copy) for k, v in attrs_raw.items()}
        contour_raw = entry.get("contour_qa")
        return cls(
            key_id=key_id,
            pair_id=entry.get("pair_id", key_id.split("_", 1)[-1]),
            dicom_id=entry.get("dicom_id"),
            detection=QA.from_dict(entry["detection_qa"], copy=copy),
            contour=ContourQA.from_dict(contour_raw, copy=copy) if isinstance(contour_raw, dict) else None,
            attributes=attributes,
            has_attribute_key=attrs_raw is not _MISSING,
            extra={k: dup(v) for k, v in entry.items() if k not in known},
        )

    def to_entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"detection_qa": self.detection.to_dict()}
        if self.contour is not None:
            out["contour_qa"] = self.contour.to_dict()
        if self.has_attribute_key:
            out["attribute_extraction_qa"] = (
                None if self.attributes is None else {k: v.to_dict() for k, v in self.attributes.items()}
            )
        extra = _copy_module.deepcopy(self.extra)
        sequential = extra.pop("revision_sequential_qa", _MISSING)
        if sequential is not _MISSING:
            out["revision_sequential_qa"] = sequential
        out["pair_id"] = self.pair_id
        out["dicom_id"] = self.dicom_id
        out.update(extra)
        return out

    # ------------------------------------------------------------------ turns
    def qa_for(self, task: str) -> QA:
        """The stored QA behind a task."""
        if task == "detection":
            return self.detection
        if task in _CONTOUR_TURN_KEYS:
            if self.contour is None:
                raise KeyError(f"{self.key_id}: no contour_qa for task {task!r}")
            return getattr(self.contour, task)
        if self.attributes is None:
            raise KeyError(f"{self.key_id}: no attribute_extraction_qa for task {task!r}")
        return self.attributes[ATTRIBUTE_KEYS[task]]

    def turn_images(self, task: str) -> tuple[str, ...]:
        """Images riding on a task's turn (spec 3.4), relative to the bundle root."""
        base = self.image_dir
        if task == "detection":
            return (f"{base}/{DETECTION_IMAGE}",)
        if task == "contour_eval":
            rel = self.qa_for(task).extra.get("relative_path", "contour_eval_qa/xray_with_mask.png")
            return (f"{base}/contour_qa/{rel}",)
        if task == "expansion":
            return (f"{base}/contour_qa/{POINTS_IMAGE}",)
        if task == "revision_result":
            return tuple(
                f"{base}/contour_qa/contour_revision_qa/{opt['relative_path']}"
                for opt in self.qa_for(task).answer_options
            )
        return ()

    def turn_options(self, task: str) -> tuple[str, ...]:
        qa = self.qa_for(task)
        kind = TASK_INFO[task].options
        if kind == "points":
            return tuple(templates.point_option_labels([o.get("color") for o in qa.answer_options]))
        if kind == "masks":
            return tuple(templates.mask_option_labels(len(qa.answer_options)))
        return tuple(str(o) for o in qa.answer_options)

    def turn_text(self, task: str) -> str:
        qa = self.qa_for(task)
        if task == "expansion":
            assert self.contour is not None
            return f"{self.contour.initial_context}\n\n{qa.question}"
        return qa.question

    def turn(self, task: str) -> Turn:
        qa = self.qa_for(task)
        return Turn(
            stage=TASK_STAGE[task],
            task=task,
            text=self.turn_text(task),
            images=self.turn_images(task),
            options=self.turn_options(task),
            answer_index=tuple(qa.gold),
            answer=qa.answer,
            multi_select=task in MULTI_SELECT_TASKS,
        )

    @property
    def tasks(self) -> tuple[str, ...]:
        """Tasks asked on this case's route. Stage 4 is asked only when attribute QA is stored."""
        tasks = route_tasks(self.lesion, self.path)
        if self.attributes is None:
            tasks = tuple(t for t in tasks if TASK_STAGE[t] != 4)
        return tasks

    @property
    def turns(self) -> list[Turn]:
        return [self.turn(t) for t in self.tasks]
