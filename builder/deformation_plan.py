"""The deformation plan of a positive case (reference spec 5.4.6-5.4.8).

1. Per component, find plausible deformations: per overlapping zone pick one overlapping sub-region and
   grow or shrink the mask there (grow where the lesion covers <= 1/2 of the region, shrink where >= 3/4
   or where it covers >= 70 % of its lung, otherwise at random); collect point prompts; keep the first
   attempt whose deformation satisfies its prompts (up to 10 attempts).
2. Sequential deformation: pick 1-3 of those sub-regions; per component apply the expansions first,
   then the contractions, one step at a time, each step deforming the *optimal* mask with all points
   so far. Each step's centre point is the gold point of the opposite revision.
3. Distractors per step: fake points on the dilated and eroded contours of the step mask, and up to 4
   fake masks per operation (the step mask deformed at other places).

Cardiomegaly uses zones instead of sub-regions and depth 1. Cases that cannot be deformed raise
``Rejected`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .deformers.base import Deformer, DeformRequest, Prompt, satisfies
from .morph import MaskGeometry
from .overlap import ComponentOverlap
from .points import (
    WIDTHS,
    WIDTHS_DEEP,
    Point,
    collect_prompt,
    fake_points,
    radius_for,
)
from .regions import REGION_NAMES, ZONE_NAMES, side_of

PLAN_ATTEMPTS = 10
SEQUENCE_ATTEMPTS = 10
POINT_RETRIES = 3
MAX_SELECTED = 3
PROMPT_SEPARATION = 50  # px between expansion and contraction prompts of a component
FAKE_MASKS_PER_OPERATION = 4
FAKE_MASK_MAX_FAILURES = 10
FAKE_MASK_DEPTH_INCREASES = 3
FAKE_PROMPT_DISTANCE = 100
EXPAND_AT_MOST = Fraction(1, 2)
CONTRACT_AT_LEAST = Fraction(3, 4)
LUNG_FORCES_CONTRACTION = Fraction(7, 10)
OPPOSITE = {"expansion": "contraction", "contraction": "expansion"}


class Rejected(Exception):
    """The case cannot be used; the message says why (reported, and the next candidate is taken)."""


@dataclass
class Step:
    """One sequential deformation step of a component."""

    component: str  # suboptimal_component_<k>
    kind: str  # what was done to the mask: expansion | contraction
    index: int  # exp<index> / cont<index>
    anatomy: str
    points: list[Point]
    name: str
    mask: np.ndarray = field(repr=False)
    center: Point = (0, 0)
    fake_masks: list[tuple[str, np.ndarray]] = field(default_factory=list, repr=False)
    fake_points_expansion: list[Point] = field(default_factory=list)
    fake_points_contraction: list[Point] = field(default_factory=list)

    @property
    def revision(self) -> str:
        """The operation needed to undo this step (the answer kind of its centre point)."""
        return OPPOSITE[self.kind]


@dataclass
class ComponentPlan:
    component: str
    index: int
    optimal_name: str
    optimal: np.ndarray = field(repr=False)
    anatomy: str = ""  # side anatomy for the revision-result defaults
    steps: list[Step] = field(default_factory=list)

    @property
    def deformed(self) -> bool:
        return bool(self.steps)

    @property
    def before_name(self) -> str:
        if not self.steps:
            return f"{self.component}_no_contraction"
        return self.steps[-1].name

    @property
    def after_name(self) -> str:
        return self.optimal_name if self.steps else f"{self.component}_no_contraction"

    @property
    def before_mask(self) -> np.ndarray:
        return self.steps[-1].mask if self.steps else self.optimal


@dataclass
class CaseDeformation:
    components: list[ComponentPlan]
    masks: dict[str, np.ndarray] = field(repr=False)

    @property
    def steps(self) -> list[Step]:
        """Steps in the reference's order: expansion steps, then contraction steps, by component."""
        exp = [s for c in self.components for s in c.steps if s.kind == "expansion"]
        con = [s for c in self.components for s in c.steps if s.kind == "contraction"]
        return exp + con


@dataclass
class Anatomies:
    """Region masks a component can be deformed in, and how the lesion covers them."""

    masks: dict[str, np.ndarray]
    lungs: np.ndarray  # lung union (where distractor edits may go)
    cardiomegaly: bool

    @property
    def depth(self) -> int:
        """Contour levels a prompt starts at: 1 for the heart, 2 for a lung lesion (reference)."""
        return 1 if self.cardiomegaly else 2


def choose_anatomies(
    overlap: ComponentOverlap, cardiomegaly: bool, rng: np.random.Generator
) -> list[tuple[str, str]]:
    """(anatomy, operation) pairs to try for one component (spec 5.4.6 step 1)."""
    zones = [z for z in ZONE_NAMES if overlap.zones[z].has_overlap]
    if cardiomegaly:
        if not zones:
            return []
        n = min(int(rng.integers(1, MAX_SELECTED + 1)), len(zones))
        picked = [zones[i] for i in sorted(rng.choice(len(zones), size=n, replace=False))]
        return [(z, ("expansion", "contraction")[int(rng.integers(2))]) for z in picked]
    choices = []
    for zone in zones:
        side = side_of(zone)
        cands = [r for r in REGION_NAMES if " & " in r and zone in r and overlap.regions[r].has_overlap]
        cpa = f"{side} costophrenic angle"  # same side only (the reference ignores the side)
        if zone.endswith("lung base") and overlap.regions[cpa].has_overlap:
            cands.append(cpa)
        if not cands:
            continue
        region = cands[int(rng.integers(len(cands)))]
        cov = overlap.regions[region]
        if cov.at_most(EXPAND_AT_MOST):
            op = "expansion"
        elif cov.at_least(CONTRACT_AT_LEAST):
            op = "contraction"
        else:
            op = ("expansion", "contraction")[int(rng.integers(2))]
        if overlap.lungs[f"{side} lung"].at_least(LUNG_FORCES_CONTRACTION):
            op = "contraction"
        choices.append((region, op))
    return choices


def _prompt(
    geom: MaskGeometry,
    anatomy: str,
    operation: str,
    region: np.ndarray,
    depth: int,
    avoid: list[Point],
    rng: np.random.Generator,
) -> Prompt | None:
    for _ in range(POINT_RETRIES):
        levels = collect_prompt(
            geom, operation, region, depth, rng, avoid=avoid, avoid_distance=PROMPT_SEPARATION
        )
        if levels:
            points = [p for level in levels for p in level]
            return Prompt(anatomy, operation, points, radius_for(operation, len(levels)), region)
    return None


def plan_component(
    geom: MaskGeometry,
    overlap: ComponentOverlap,
    anatomies: Anatomies,
    deformer: Deformer,
    rng: np.random.Generator,
) -> dict[str, Prompt]:
    """Plausible deformations of one component keyed by anatomy, or {} when none was found."""
    depth = anatomies.depth
    for _ in range(PLAN_ATTEMPTS):
        prompts: list[Prompt] = []
        for anatomy, op in choose_anatomies(overlap, anatomies.cardiomegaly, rng):
            avoid = [p for q in prompts if q.operation != op for p in q.points]
            prompt = _prompt(geom, anatomy, op, anatomies.masks[anatomy], depth, avoid, rng)
            if prompt is not None:
                prompts.append(prompt)
        if not prompts:
            continue
        mask = deformer.deform(DeformRequest(geom, prompts, anatomies.lungs), rng)
        if satisfies(mask, prompts):
            return {p.anatomy: p for p in prompts}
    return {}


def _fake_masks(
    step: Step,
    geom: MaskGeometry,
    operation: str,
    used: list[Point],
    anatomies: Anatomies,
    deformer: Deformer,
    rng: np.random.Generator,
) -> list[tuple[str, np.ndarray]]:
    """Up to 4 distractor masks: the step mask deformed by ``operation`` elsewhere (spec 5.4.8)."""
    out: list[tuple[str, np.ndarray]] = []
    depth = anatomies.depth
    failures = 0
    increases = 0
    while len(out) < FAKE_MASKS_PER_OPERATION and failures < FAKE_MASK_MAX_FAILURES:
        widths = WIDTHS_DEEP if depth > 2 else WIDTHS
        levels = collect_prompt(
            geom,
            operation,
            anatomies.lungs,
            depth,
            rng,
            avoid=used,
            avoid_distance=FAKE_PROMPT_DISTANCE,
            widths=widths,
        )
        if not levels:
            if increases >= FAKE_MASK_DEPTH_INCREASES:
                break
            depth += 1
            increases += 1
            continue
        points = [p for level in levels for p in level]
        prompt = Prompt("lungs", operation, points, radius_for(operation, len(levels)), anatomies.lungs)
        mask = deformer.deform(DeformRequest(geom, [prompt], anatomies.lungs, fake=True), rng)
        if not satisfies(mask, [prompt]) or np.array_equal(mask, step.mask):
            failures += 1
            continue
        failures = 0
        used.extend(points)
        out.append((f"{step.name}_fake_{operation}_{len(out) + 1}", mask))
    return out


def _sequence(
    plans: list[ComponentPlan],
    recorded: dict[str, dict[str, Prompt]],
    geoms: dict[str, MaskGeometry],
    anatomies: Anatomies,
    deformer: Deformer,
    rng: np.random.Generator,
) -> bool:
    """One try of the sequential deformation (spec 5.4.7); fills ``plan.steps``; False when a step fails."""
    possible: list[str] = []
    for plan in plans:
        for name in recorded[plan.component]:
            if name not in possible:
                possible.append(name)
    n = min(int(rng.integers(1, MAX_SELECTED + 1)), len(possible))
    selected = {possible[i] for i in rng.choice(len(possible), size=n, replace=False)}
    for plan in plans:
        plan.steps = []
        prompts = recorded[plan.component]
        order = [list(prompts)[i] for i in rng.permutation(len(prompts))]
        exps = [a for a in order if prompts[a].operation == "expansion" and a in selected]
        cons = [a for a in order if prompts[a].operation == "contraction" and a in selected]
        used_points = [p for a in exps + cons for p in prompts[a].points]
        accumulated: list[Prompt] = []
        counters = {"expansion": 0, "contraction": 0}
        for anatomy in exps + cons:
            prompt = prompts[anatomy]
            accumulated.append(prompt)
            mask = deformer.deform(
                DeformRequest(geoms[plan.component], list(accumulated), anatomies.lungs), rng
            )
            if not satisfies(mask, accumulated):
                return False
            counters[prompt.operation] += 1
            tag = "exp" if prompt.operation == "expansion" else "cont"
            step = Step(
                component=plan.component,
                kind=prompt.operation,
                index=counters[prompt.operation],
                anatomy=anatomy,
                points=list(prompt.points),
                name=f"{plan.component}_{tag}{counters[prompt.operation]}",
                mask=mask,
                center=prompt.center,
            )
            step_geom = MaskGeometry(mask)
            region = None if anatomies.cardiomegaly else anatomies.lungs
            step.fake_points_expansion = fake_points(
                step_geom, "expansion", region, anatomies.depth, step.center, used_points, rng
            )
            step.fake_points_contraction = fake_points(
                step_geom, "contraction", region, anatomies.depth, step.center, used_points, rng
            )
            used = [*used_points]
            for operation in (step.revision, step.kind):
                step.fake_masks.extend(
                    _fake_masks(step, step_geom, operation, used, anatomies, deformer, rng)
                )
            plan.steps.append(step)
            selected.discard(anatomy)
    return True


def _gold_consistent(plans: list[ComponentPlan]) -> bool:
    """Every centre point lies where the shown mask and the optimal mask disagree in its direction."""
    before = np.zeros_like(plans[0].optimal)
    after = np.zeros_like(plans[0].optimal)
    for plan in plans:
        before |= plan.before_mask
        after |= plan.optimal
    centers: list[Point] = []
    for plan in plans:
        for step in plan.steps:
            x, y = step.center
            if step.revision == "contraction" and not (before[y, x] and not after[y, x]):
                return False
            if step.revision == "expansion" and not (after[y, x] and not before[y, x]):
                return False
            centers.append(step.center)
    return len(set(centers)) == len(centers)


def side_anatomy(overlap: ComponentOverlap, steps: list[Step]) -> str:
    """The anatomy string that decides a component's lung-side distractors (spec 2.6 step 2)."""
    if steps:
        return steps[0].anatomy
    left = overlap.lungs["left lung"].fraction
    right = overlap.lungs["right lung"].fraction
    if left == 0 and right == 0:
        raise Rejected(f"component {overlap.component_id} covers neither lung")
    # the reference prefers the left lung whenever it is touched at all; we take the more covered one
    return "left lung" if left > right else "right lung"


def deform_case(
    components: list[np.ndarray],
    overlaps: list[ComponentOverlap],
    anatomies: Anatomies,
    deformer: Deformer,
    rng: np.random.Generator,
) -> CaseDeformation:
    """Plan and apply the deformations of all components of a positive case."""
    plans: list[ComponentPlan] = []
    geoms: dict[str, MaskGeometry] = {}
    recorded: dict[str, dict[str, Prompt]] = {}
    for k, (component, overlap) in enumerate(zip(components, overlaps)):
        sid = f"suboptimal_component_{k}"
        geom = MaskGeometry(component)
        prompts = plan_component(geom, overlap, anatomies, deformer, rng)
        if not prompts:
            raise Rejected(f"component {k}: no plausible deformation found in {PLAN_ATTEMPTS} attempts")
        plans.append(ComponentPlan(sid, k, f"optimal_component_{k}", component))
        geoms[sid] = geom
        recorded[sid] = prompts
    for _ in range(SEQUENCE_ATTEMPTS):
        ok = _sequence(plans, recorded, geoms, anatomies, deformer, rng)
        if ok and any(p.steps for p in plans) and _gold_consistent(plans):
            break
    else:
        for plan in plans:
            plan.steps = []
        raise Rejected(f"sequential deformation failed {SEQUENCE_ATTEMPTS} times")
    masks: dict[str, np.ndarray] = {}
    for plan, overlap in zip(plans, overlaps):
        plan.anatomy = side_anatomy(overlap, plan.steps)
        masks[plan.optimal_name] = plan.optimal
        if not plan.steps:
            masks[f"{plan.component}_no_contraction"] = plan.optimal
        for step in plan.steps:
            masks[step.name] = step.mask
            masks.update(dict(step.fake_masks))
    return CaseDeformation(plans, masks)
