"""Stage 2 and Stage 3 questions of a positive case: ``contour_qa`` (reference spec 1.3, 2.2-2.6, 5.5).

Point options: the gold points (one centre per deformation step) plus distractor points that are at
least 100 px from every gold point and from each other, at most 8 in all, shuffled, coloured red,
orange, ... in option order, then the None option. A distractor is also dropped when it lies where the
shown mask and the optimal mask disagree, so every answer can be re-derived from the two masks.

Revision-result options: the true combination (every component's optimal mask) plus up to 3 fake
combinations drawn as the reference does (fewest ``default_*`` names first). A combination whose
rendered mask equals the unrevised overlay, the true mask, or another option is skipped; the reference
can offer the unchanged overlay as a distractor (spec 7.3 item 31).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chexpercept import templates
from chexpercept.vocab import CARDIOMEGALY, POINT_COLORS

from .deformation_plan import CaseDeformation, ComponentPlan
from .points import FAKE_POINT_DISTANCE, Point, far_from

MAX_POINTS = len(POINT_COLORS)
MAX_FAKE_COMBINATIONS = 3
MAX_COMBINATIONS = 200_000
CARDIOMEGALY_DEFAULTS = ("default_keep", "default_dilated", "default_eroded")
CONTOUR_EVAL_PATH = "contour_eval_qa/xray_with_mask.png"


class ContourError(ValueError):
    """The case's masks do not allow well-posed Stage 3 questions."""


def point_options(
    gold_expansion: list[Point],
    gold_contraction: list[Point],
    fake_candidates: list[Point],
    rng: np.random.Generator,
    *,
    neutral: Callable[[Point], bool] = lambda p: True,
) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """(answer_options, expansion gold indices, contraction gold indices) per spec 2.5.

    Gold index lists are 1-based, in gold order; an empty list means the None option (the caller maps
    it to ``[len(options)]``).
    """
    gold = [*gold_expansion, *gold_contraction]
    if len(set(gold)) != len(gold):
        raise ContourError("two gold points share coordinates")
    if len(gold) > MAX_POINTS:
        raise ContourError(f"{len(gold)} gold points; at most {MAX_POINTS} can be coloured")
    fakes: list[Point] = []
    for p in fake_candidates:
        if neutral(p) and len(far_from(np.asarray([p]), [*gold, *fakes], FAKE_POINT_DISTANCE)):
            fakes.append(p)
    room = MAX_POINTS - len(gold)
    if len(fakes) > room:
        fakes = [fakes[i] for i in sorted(rng.choice(len(fakes), size=room, replace=False))]
    points = [*gold, *fakes]
    points = [points[i] for i in rng.permutation(len(points))]
    options: list[dict[str, Any]] = [
        {"point": [int(x), int(y)], "color": POINT_COLORS[i]} for i, (x, y) in enumerate(points)
    ]
    options.append({"point": None, "color": "None"})
    index = {p: i + 1 for i, p in enumerate(points)}
    return options, [index[p] for p in gold_expansion], [index[p] for p in gold_contraction]


def _point_qa(
    question: Callable[[list[str]], str], options: list[dict[str, Any]], gold: list[int]
) -> dict[str, Any]:
    labels = templates.point_option_labels([o["color"] for o in options])
    if not gold:
        gold = [len(options)]
    answer = ", ".join(labels[i - 1] for i in gold)
    return templates.qa(question(labels), options, answer, gold)


@dataclass
class MaskResolver:
    """Turns option mask names into pixels: component masks and the ``default_*`` tokens (spec 1.1)."""

    masks: dict[str, np.ndarray]
    defaults: dict[str, np.ndarray]

    def union(self, names: list[str]) -> np.ndarray:
        first = next(iter(self.masks.values()))
        out = np.zeros_like(first, dtype=bool)
        for name in names:
            if name == "default_empty":
                continue
            source = self.defaults if name.startswith("default_") else self.masks
            if name not in source:
                raise ContourError(f"mask {name!r} is not available")
            out |= source[name]
        return out


def revision_options(
    deformation: CaseDeformation,
    lesion: str,
    resolver: MaskResolver,
    rng: np.random.Generator,
    *,
    neutral_names: bool = False,
) -> tuple[dict[str, Any], dict[str, list[str]], list[list[str]]]:
    """(revision-result QA, fake_masks per component, fake combinations used) per spec 2.6."""
    plans = {p.component: p for p in deformation.components}
    component_ids = sorted(plans)
    fake_masks = {
        p.component: [n for s in p.steps for n in [*(name for name, _ in s.fake_masks), s.name]]
        for p in deformation.components
        if p.deformed
    }
    choices = _component_choices(plans, component_ids, lesion, resolver, fake_masks)
    true_combo = [plans[c].after_name for c in component_ids]
    unrevised_combo = [plans[c].before_name for c in component_ids]
    ordered = _fake_combinations(choices, set(unrevised_combo), rng)
    chosen = _distinct_distractors(
        ordered, resolver, [resolver.union(true_combo), resolver.union(unrevised_combo)]
    )
    return _revision_qa(true_combo, chosen, rng, neutral_names), fake_masks, chosen


def _component_choices(
    plans: dict[str, ComponentPlan],
    component_ids: list[str],
    lesion: str,
    resolver: MaskResolver,
    fake_masks: dict[str, list[str]],
) -> list[list[tuple[str, str]]]:
    """Per component: ("true", its revised mask), then ("fake", name) for each distractor and default."""
    seen_side: set[str] = set()
    choices: list[list[tuple[str, str]]] = []
    for cid in component_ids:
        plan = plans[cid]
        if lesion == CARDIOMEGALY:
            defaults = list(CARDIOMEGALY_DEFAULTS)
        else:
            side = "right" if "right" in plan.anatomy else "left" if "left" in plan.anatomy else None
            if side is None:
                raise ContourError(f"{cid}: anatomy {plan.anatomy!r} names no lung side")
            if side in seen_side:
                defaults = ["default_keep"]
            else:
                defaults = ["default_keep", f"default_{side}_lung_chex", f"default_{side}_lung_cxas"]
                seen_side.add(side)
        defaults = [d for d in defaults if d in resolver.defaults]
        comp_choices = [("true", plan.after_name)]
        comp_choices += [("fake", m) for m in [*fake_masks.get(cid, []), *defaults]]
        choices.append(comp_choices)
    return choices


def _fake_combinations(
    choices: list[list[tuple[str, str]]], unrevised: set[str], rng: np.random.Generator
) -> list[list[str]]:
    """Every combination but the true and the unrevised one: fewest default_* names first, shuffled
    within each group (the reference samples the overflowing group)."""
    total = 1
    for c in choices:
        total *= len(c)
    if total > MAX_COMBINATIONS:
        raise ContourError(f"{total} mask combinations; too many components or distractors")
    groups: dict[int, list[list[str]]] = {}
    for combo in itertools.product(*choices):
        if all(kind == "true" for kind, _ in combo):
            continue
        names = [name for _, name in combo]
        if set(names) == unrevised:
            continue
        groups.setdefault(sum(n.startswith("default_") for n in names), []).append(names)
    return [
        combo for k in sorted(groups) for combo in (groups[k][i] for i in rng.permutation(len(groups[k])))
    ]


def _distinct_distractors(
    ordered: list[list[str]], resolver: MaskResolver, taken: list[np.ndarray]
) -> list[list[str]]:
    """The first combinations (at most MAX_FAKE_COMBINATIONS) whose masks are non-empty and differ
    from each other and from ``taken`` (the true and the unrevised masks)."""
    taken = list(taken)
    chosen: list[list[str]] = []
    for names in ordered:
        if len(chosen) == MAX_FAKE_COMBINATIONS:
            break
        mask = resolver.union(names)
        if not mask.any() or any(np.array_equal(mask, t) for t in taken):
            continue
        taken.append(mask)
        chosen.append(names)
    if not chosen:
        raise ContourError("no distractor mask differs from the true and the unrevised masks")
    return chosen


def _revision_qa(
    true_combo: list[str], chosen: list[list[str]], rng: np.random.Generator, neutral_names: bool
) -> dict[str, Any]:
    """The revision-result question: the true and the chosen fake combinations in a random order."""
    entries = [("true", true_combo)] + [("fake", c) for c in chosen]
    entries = [entries[i] for i in rng.permutation(len(entries))]
    options = []
    for i, (kind, names) in enumerate(entries, start=1):
        if neutral_names:
            rel = f"option_{i}_mask.png"
        else:
            rel = f"option_{i}_mask_{'answer' if kind == 'true' else 'fake'}.png"
        options.append({"type": kind, "masks": list(names), "relative_path": rel})
    answer_index = next(i for i, o in enumerate(options, start=1) if o["type"] == "true")
    labels = templates.mask_option_labels(len(options))
    return templates.qa(
        templates.revision_result_question(len(options)), options, labels[answer_index - 1], answer_index
    )


def contour_qa(
    deformation: CaseDeformation,
    lesion: str,
    revision_required: bool,
    resolver: MaskResolver,
    rng: np.random.Generator,
    *,
    neutral_names: bool = False,
) -> dict[str, Any]:
    """The whole ``contour_qa`` object of a positive entry (same for RF and RR except the Stage 2 answer)."""
    plans = sorted(deformation.components, key=lambda p: p.index)
    before_union = resolver.union([p.before_name for p in plans])
    after_union = resolver.union([p.after_name for p in plans])
    steps = deformation.steps
    gold_exp = [s.center for s in steps if s.revision == "expansion"]
    gold_con = [s.center for s in steps if s.revision == "contraction"]
    fake_cands = [p for s in steps for p in s.fake_points_expansion] + [
        p for s in steps for p in s.fake_points_contraction
    ]

    def neutral(p: Point) -> bool:
        x, y = p
        return bool(before_union[y, x]) == bool(after_union[y, x])

    options, exp_idx, con_idx = point_options(gold_exp, gold_con, fake_cands, rng, neutral=neutral)
    revision, fake_masks, fake_combos = revision_options(
        deformation, lesion, resolver, rng, neutral_names=neutral_names
    )
    return {
        "no_deformation": not revision_required,
        "initial_context": templates.initial_context(lesion),
        "revision_before_masks": [p.before_name for p in plans],
        "revision_after_masks": [p.after_name for p in plans],
        "true_masks": {p.component: [p.after_name] for p in plans},
        "fake_masks": fake_masks,
        "true_combination": [p.after_name for p in sorted(plans, key=lambda p: p.component)],
        "fake_combinations": fake_combos,
        "contour_eval_qa": templates.yes_no_qa(
            templates.contour_eval_question(lesion), revision_required, relative_path=CONTOUR_EVAL_PATH
        ),
        "contour_revision_qa_expansion": _point_qa(
            lambda labels: templates.expansion_question(lesion, labels), options, exp_idx
        ),
        "contour_revision_qa_contraction": _point_qa(
            lambda labels: templates.contraction_question(lesion, labels), [dict(o) for o in options], con_idx
        ),
        "contour_revision_qa_revision_result": revision,
    }
