"""Schema validation of ``chexpercept.json`` entries (spec 1.3 and 1.4).

Checks run on the raw JSON so that every problem of every case is collected and reported
together; unknown extra fields are tolerated.
"""

from __future__ import annotations

from typing import Any

from . import templates
from .containment import name_problem, relative_problem
from .errors import Problem
from .vocab import ATTRIBUTE_KEYS, CARDIOMEGALY, LESIONS, POINT_TASKS, TASK_INFO, lesion_of_key

_SINGLE = "int"
_MULTI = "list[int]"


class _Checker:
    def __init__(self, key_id: str):
        self.key_id = key_id
        self.problems: list[Problem] = []

    def add(self, where: str, message: str) -> None:
        self.problems.append(Problem(self.key_id, where, message))

    def obj(self, parent: Any, key: str, where: str, *, nullable: bool = False) -> dict[str, Any] | None:
        if not isinstance(parent, dict) or key not in parent:
            self.add(f"{where}{key}", "missing")
            return None
        value = parent[key]
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            self.add(f"{where}{key}", f"expected an object, got {_type(value)}")
            return None
        return value

    def typed(self, parent: dict[str, Any], key: str, where: str, kinds: tuple[type, ...], label: str) -> Any:
        if key not in parent:
            self.add(f"{where}{key}", "missing")
            return None
        value = parent[key]
        if isinstance(value, bool) and bool not in kinds:
            self.add(f"{where}{key}", f"expected {label}, got bool")
            return None
        if not isinstance(value, kinds):
            self.add(f"{where}{key}", f"expected {label}, got {_type(value)}")
            return None
        return value

    def qa(self, qa: dict[str, Any], where: str, index_kind: str, options_kind: str = "str") -> None:
        """question / answer_options / answer / answer_index with indices in range."""
        self.typed(qa, "question", where, (str,), "a string")
        options = self.typed(qa, "answer_options", where, (list,), "a list")
        self.typed(qa, "answer", where, (str,), "a string")
        if options is not None:
            for i, opt in enumerate(options):
                if options_kind == "str" and not isinstance(opt, str):
                    self.add(f"{where}answer_options[{i}]", f"expected a string, got {_type(opt)}")
                elif options_kind == "dict" and not isinstance(opt, dict):
                    self.add(f"{where}answer_options[{i}]", f"expected an object, got {_type(opt)}")
            if not options:
                self.add(f"{where}answer_options", "is empty")
        if "answer_index" not in qa:
            self.add(f"{where}answer_index", "missing")
            return
        idx = qa["answer_index"]
        n = len(options) if options else 0
        if index_kind == _SINGLE:
            if isinstance(idx, bool) or not isinstance(idx, int):
                self.add(f"{where}answer_index", f"expected an int, got {_type(idx)}")
            elif n and not 1 <= idx <= n:
                self.add(f"{where}answer_index", f"{idx} out of range 1..{n}")
            elif options_kind == "str":
                self.answer_named(qa, where, options)
        else:
            if not isinstance(idx, list) or not idx:
                self.add(f"{where}answer_index", f"expected a non-empty list of ints, got {_type(idx)}")
                return
            for j, v in enumerate(idx):
                if isinstance(v, bool) or not isinstance(v, int):
                    self.add(f"{where}answer_index[{j}]", f"expected an int, got {_type(v)}")
                elif n and not 1 <= v <= n:
                    self.add(f"{where}answer_index[{j}]", f"{v} out of range 1..{n}")
            if options_kind == "str":
                self.answer_named(qa, where, options)

    def answer_named(self, qa: dict[str, Any], where: str, labels: Any) -> None:
        """The answer text must be the option text(s) its ``answer_index`` names (``labels``: each
        option's text as the question shows it; several joined by ", ", in the index's order): the
        path follows the text (detection), the gold follows the index, and a release where they
        disagree was scored on a gold that contradicts its own case (red team, stop 48: detection
        answer "No" with index 1 passed, became an LF case with gold "Yes", its later questions
        dropped without a word). Indices already refused, or labels that are not text, say nothing."""
        answer, idx = qa.get("answer"), qa.get("answer_index")
        indices = idx if isinstance(idx, list) else [idx]
        if not (
            isinstance(labels, list) and all(isinstance(t, str) for t in labels) and isinstance(answer, str)
        ):
            return
        if not all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= len(labels) for i in indices):
            return
        named = ", ".join(labels[i - 1] for i in indices)
        if answer != named:
            self.add(
                f"{where}answer", f"{answer!r} is not the option text answer_index {idx} names ({named!r})"
            )

    def path_part(self, value: Any, where: str) -> None:
        """A value used as one path part (key_id, pair_id, dicom_id) must be a safe name."""
        problem = name_problem(value)
        if problem:
            self.add(where, f"refused as a path part: {value!r} {problem}")

    def relative_path(self, qa: dict[str, Any], where: str) -> None:
        """A stored relative_path must stay inside the case's folder (chexpercept.containment)."""
        value = qa.get("relative_path")
        if not isinstance(value, str):
            return  # reported by typed()
        problem = relative_problem(value)
        if problem:
            self.add(f"{where}relative_path", f"refused: {value!r} {problem}")

    def option_block(self, qa: dict[str, Any], labels: list[str] | None, where: str) -> None:
        """The question must end with the option block built from its options (spec 2)."""
        question = qa.get("question")
        if labels is None or not isinstance(question, str):
            return
        block = "\n\nOptions:\n" + templates.option_block(labels)
        if not question.endswith(block):
            self.add(f"{where}question", "does not end with its options block '\\n\\nOptions:\\n(1) ...'")


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def validate_entry(key_id: str, entry: Any) -> list[Problem]:
    """Every schema problem of one entry; an empty list means the entry is usable."""
    c = _Checker(key_id)
    if not isinstance(entry, dict):
        c.add("entry", f"expected an object, got {_type(entry)}")
        return c.problems
    lesion = lesion_of_key(key_id)
    c.path_part(key_id, "key_id")
    if lesion not in LESIONS:
        c.add("key_id", f"unknown lesion prefix {lesion!r}; expected one of {', '.join(LESIONS)}")
    pair_id = entry.get("pair_id")
    if "pair_id" not in entry:
        c.add("pair_id", "missing")
    elif not isinstance(pair_id, str):
        c.add("pair_id", f"expected a string, got {_type(pair_id)}")
    elif key_id != f"{lesion}_{pair_id}":
        c.add("pair_id", f"{pair_id!r} does not match key_id (expected key_id = <lesion>_<pair_id>)")
    else:
        c.path_part(pair_id, "pair_id")
    if "dicom_id" not in entry:
        c.add("dicom_id", "missing")
    elif entry["dicom_id"] is not None and not isinstance(entry["dicom_id"], str):
        c.add("dicom_id", f"expected a string or null, got {_type(entry['dicom_id'])}")
    elif entry["dicom_id"] is not None:
        c.path_part(entry["dicom_id"], "dicom_id")

    det = c.obj(entry, "detection_qa", "")
    if det is None:
        return c.problems
    c.qa(det, "detection_qa.", _SINGLE)
    if det.get("answer_options") != list(templates.YES_NO):
        c.add("detection_qa.answer_options", 'expected ["Yes", "No"]')
    positive = det.get("answer") == "Yes"
    if det.get("answer") not in templates.YES_NO:
        c.add("detection_qa.answer", f"expected 'Yes' or 'No', got {det.get('answer')!r}")
    c.option_block(det, list(templates.YES_NO), "detection_qa.")
    named = "positive" if "_positive_" in key_id else "negative" if "_negative_" in key_id else None
    if named and det.get("answer") in templates.YES_NO and named != ("positive" if positive else "negative"):
        c.add("detection_qa.answer", f"{det.get('answer')!r}, while key_id names a {named} case")
    if not positive:
        for later in ("contour_qa", "attribute_extraction_qa"):  # never asked: the chain ends at "No"
            if entry.get(later) is not None:
                c.add(
                    later, "present in a negative case (detection answer 'No'), which is asked nothing more"
                )
        return c.problems

    contour = c.obj(entry, "contour_qa", "")
    if contour is not None:
        _validate_contour(c, contour)
    is_cardio = lesion == CARDIOMEGALY
    if "attribute_extraction_qa" not in entry:
        c.add("attribute_extraction_qa", "missing (null for cardiomegaly, an object otherwise)")
    elif entry["attribute_extraction_qa"] is None:
        if not is_cardio:
            c.add("attribute_extraction_qa", "is null but only cardiomegaly has no Stage 4")
    else:
        attrs = c.obj(entry, "attribute_extraction_qa", "")
        if attrs is not None:
            _validate_attributes(c, attrs)
    return c.problems


def _validate_contour(c: _Checker, contour: dict[str, Any]) -> None:
    w = "contour_qa."
    c.typed(contour, "no_deformation", w, (bool,), "a bool")
    c.typed(contour, "initial_context", w, (str,), "a string")
    for key in ("revision_before_masks", "revision_after_masks"):
        if key in contour:
            c.typed(contour, key, w, (list,), "a list")
    ev = c.obj(contour, "contour_eval_qa", w)
    if ev is not None:
        c.qa(ev, f"{w}contour_eval_qa.", _SINGLE)
        c.typed(ev, "relative_path", f"{w}contour_eval_qa.", (str,), "a string")
        c.relative_path(ev, f"{w}contour_eval_qa.")
        c.option_block(ev, list(templates.YES_NO), f"{w}contour_eval_qa.")
        # the route follows no_deformation, the gold follows this answer: they must agree (round 2,
        # helper-53: a case that asks the revision questions with a stage 2 gold of "No" validated)
        fixed = contour.get("no_deformation")
        if isinstance(fixed, bool) and ev.get("answer") in templates.YES_NO:
            needed = "No" if fixed else "Yes"
            if ev["answer"] != needed:
                c.add(
                    f"{w}contour_eval_qa.answer",
                    f"{ev['answer']!r}, while no_deformation {str(fixed).lower()} says the mask "
                    f"{'needs no' if fixed else 'needs a'} revision ({needed!r})",
                )
    for key in (TASK_INFO[task].key for task in POINT_TASKS):
        qa = c.obj(contour, key, w)
        if qa is None:
            continue
        where = f"{w}{key}."
        c.qa(qa, where, _MULTI, options_kind="dict")
        labels = None
        options = qa.get("answer_options")
        if isinstance(options, list) and all(isinstance(o, dict) for o in options):
            labels = []
            for i, opt in enumerate(options):
                color, point = opt.get("color"), opt.get("point", "missing")
                if not isinstance(color, str):
                    c.add(f"{where}answer_options[{i}].color", f"expected a string, got {_type(color)}")
                if point == "missing":
                    c.add(f"{where}answer_options[{i}].point", "missing")
                elif point is not None and not (
                    isinstance(point, list)
                    and len(point) == 2
                    and all(isinstance(v, int | float) for v in point)
                ):
                    c.add(f"{where}answer_options[{i}].point", "expected [x, y] or null")
                labels.append(templates.point_option_labels([color])[0] if isinstance(color, str) else "?")
            if options and options[-1].get("point") is not None:
                c.add(f"{where}answer_options", "the last option must be the None option (point null)")
        c.option_block(qa, labels, where)
        c.answer_named(qa, where, labels)
        idx = qa.get("answer_index")
        if isinstance(options, list) and isinstance(idx, list) and len(idx) > 1 and len(options) in idx:
            c.add(f"{where}answer_index", f"{idx} names points and the None option together")
    rr = c.obj(contour, "contour_revision_qa_revision_result", w)
    if rr is not None:
        where = f"{w}contour_revision_qa_revision_result."
        c.qa(rr, where, _SINGLE, options_kind="dict")
        options = rr.get("answer_options")
        if isinstance(options, list):
            for i, opt in enumerate(options):
                if isinstance(opt, dict) and not isinstance(opt.get("relative_path"), str):
                    c.add(f"{where}answer_options[{i}].relative_path", "missing or not a string")
                elif isinstance(opt, dict):
                    c.relative_path(opt, f"{where}answer_options[{i}].")
            if len(options) > len(templates.mask_option_labels(8)):
                c.add(f"{where}answer_options", f"{len(options)} options; at most 8 are supported")
            else:
                c.option_block(rr, templates.mask_option_labels(len(options)), where)
                c.answer_named(rr, where, templates.mask_option_labels(len(options)))
            idx = rr.get("answer_index")
            chosen = options[idx - 1] if isinstance(idx, int) and 1 <= idx <= len(options) else None
            if isinstance(chosen, dict) and "type" in chosen and chosen["type"] != "true":
                c.add(
                    f"{where}answer_index", f"{idx} names a mask of type {chosen['type']!r}, not the true one"
                )


def _validate_attributes(c: _Checker, attrs: dict[str, Any]) -> None:
    w = "attribute_extraction_qa."
    for task, key in ATTRIBUTE_KEYS.items():
        qa = c.obj(attrs, key, w)
        if qa is None:
            continue
        where = f"{w}{key}."
        c.qa(qa, where, _MULTI if TASK_INFO[task].multi_select else _SINGLE)
        options = qa.get("answer_options")
        if isinstance(options, list) and all(isinstance(o, str) for o in options):
            c.option_block(qa, options, where)
