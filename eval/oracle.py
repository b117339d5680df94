"""Oracle settings: when ground truth is injected into a conversation, with which text, and where.

The paper's Oracle-Passed numbers depend on these strings byte for byte (spec 3.5), so they are
written once here. An oracle fires before a turn only when the step it depends on was answered
incorrectly (an unparsed answer counts as incorrect):

========================  ==========================================  ===============================
before turn               fires when                                  implicit patch
========================  ==========================================  ===============================
contour_eval              detection wrong                             detection -> gold
expansion                 contour_eval wrong                          contour_eval -> gold
revision_result           expansion wrong or contraction wrong        each wrong one of them -> gold
distribution (RF)         contour_eval wrong                          contour_eval -> gold
distribution (RR)         revision_result wrong                       revision_result -> gold
========================  ==========================================  ===============================

``explicit`` prepends the text (plus a blank line) to that turn's user message and leaves the
history alone; ``implicit`` overwrites the named earlier answers with ``Answer: <gold>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chexpercept.answers import oracle_answer_text
from chexpercept.case import Case
from chexpercept.templates import ordinal
from chexpercept.vocab import Path

DETECTION_ORACLE = (
    "Ground Truth Provided: The lesion is definitively present in this image. This is an absolute fact. "
    "Disregard your previous answer and evaluate the following questions strictly based on the confirmed "
    "presence of the lesion."
)
REVISION_NEEDED_ORACLE = (
    "Ground Truth Provided: The lesion mask is definitively needed to be revised in this image. "
    "This is an absolute fact. Disregard your previous answer and evaluate the following questions "
    "strictly based on the confirmed need of revision."
)
NO_REVISION_ORACLE = (
    "Ground Truth Provided: The lesion mask is definitively not needed to be revised in this image. "
    "This is an absolute fact. Disregard your previous answer and evaluate the following questions "
    "strictly based on the confirmed no need of revision of the lesion mask."
)
_OP_NOT_NEEDED = (
    "Ground Truth Provided: The lesion mask is definitively not needed to be revised using {op} operation."
)
_OP_NEEDED = "Ground Truth Provided: The lesion mask is definitively needed to be revised using {op} operation at {colours}."
_OPS_TAIL = (
    "\nThese are the absolute facts. Disregard your previous answer and evaluate the following questions "
    "strictly based on these facts."
)
_REVISED_MASK = (
    "Ground Truth Provided: The lesion mask reflecting the modifications is the {ord} mask.\n"
    "This is an absolute fact. Disregard your previous answer and evaluate the following questions "
    "strictly based on this fact."
)
#: separator between an explicit oracle text and the question it precedes
ORACLE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Intervention:
    """What an oracle does before one turn: the explicit text, or the implicit history patches."""

    text: str
    #: task -> replacement answer text for the implicit setting, in the order they are applied
    patches: dict[str, str] = field(default_factory=dict)


def colour_phrase(colours: Sequence[str]) -> str:
    """``red point`` / ``red and blue points`` / ``red, blue, and green points`` (spec 3.5)."""
    if len(colours) == 1:
        return f"{colours[0]} point"
    if len(colours) == 2:
        return f"{colours[0]} and {colours[1]} points"
    return ", ".join(colours[:-1]) + f", and {colours[-1]} points"


def point_operations_text(case: Case) -> str:
    """The text before the revision-result turn: one line per operation, both always listed."""
    lines = []
    for op in ("expansion", "contraction"):
        qa = case.qa_for(op)
        if qa.answer == "None":
            lines.append(_OP_NOT_NEEDED.format(op=op))
        else:
            colours = [qa.answer_options[i - 1]["color"] for i in qa.gold]
            lines.append(_OP_NEEDED.format(op=op, colours=colour_phrase(colours)))
    return "\n".join(lines) + _OPS_TAIL


def revised_mask_text(case: Case) -> str:
    return _REVISED_MASK.format(ord=ordinal(case.qa_for("revision_result").gold[0]))


def _patch(case: Case, task: str) -> dict[str, str]:
    return {task: oracle_answer_text(case.qa_for(task).gold)}


def intervention(case: Case, task: str, correct: Mapping[str, bool]) -> Intervention | None:
    """The oracle intervention before ``task``, given the correctness of the turns answered so far.

    Returns None when no oracle fires (the prerequisite was answered correctly, or the turn is not
    an injection point). A task missing from ``correct`` counts as incorrect.
    """

    def wrong(t: str) -> bool:
        return not correct.get(t, False)

    if task == "contour_eval":
        return Intervention(DETECTION_ORACLE, _patch(case, "detection")) if wrong("detection") else None
    if task == "expansion":
        return (
            Intervention(REVISION_NEEDED_ORACLE, _patch(case, "contour_eval"))
            if wrong("contour_eval")
            else None
        )
    if task == "revision_result":
        wrong_ops = [op for op in ("expansion", "contraction") if wrong(op)]
        if not wrong_ops:
            return None
        patches: dict[str, str] = {}
        for op in wrong_ops:
            patches.update(_patch(case, op))
        return Intervention(point_operations_text(case), patches)
    if task == "distribution":
        if case.path is Path.RF:
            return (
                Intervention(NO_REVISION_ORACLE, _patch(case, "contour_eval"))
                if wrong("contour_eval")
                else None
            )
        if case.path is Path.RR:
            if wrong("revision_result"):
                return Intervention(revised_mask_text(case), _patch(case, "revision_result"))
            return None
    return None


#: ``--oracle paper``: the settings the paper's numbers need for a model, whatever its decoding
PAPER = "paper"
ORACLE_CHOICES: tuple[str, ...] = (PAPER, "none", "implicit", "explicit")


def oracles_for(given: Sequence[str], *, greedy: bool) -> tuple[str, ...]:
    """The oracle settings to run for ``given`` (``--oracle``), each once, in order. ``paper`` is the
    paper's protocol: a greedy model needs only the ``implicit`` run (its End-to-End numbers come
    exactly from it, the histories being identical up to the first error); a sampling model (API
    models run at temperature 1) needs ``none`` for End-to-End and ``implicit`` for Oracle-Passed."""
    out: list[str] = []
    for setting in given:
        out += (["implicit"] if greedy else ["none", "implicit"]) if setting == PAPER else [setting]
    return tuple(dict.fromkeys(out))


def end_to_end_note(model: str, *, greedy: bool, temperature: float | None, settings: Sequence[str]) -> str:
    """What to say before a sampling model's run (or estimate) that will give no End-to-End numbers:
    "" when it will."""
    if greedy or "none" in settings or not settings:
        return ""
    how = f"temperature {temperature:g}" if temperature is not None else "the server's default temperature"
    return (
        f"{model} samples ({how}), so an oracle run gives its Oracle-Passed numbers only; End-to-End numbers "
        "need an oracle none run as well: --oracle paper (chexpercept run's default) runs both in one command"
    )
