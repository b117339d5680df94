"""Stage 3 options: point options (at most 8, 100 px apart, None last, colours in order) and revision results."""

import numpy as np
import pytest

from chexpercept import templates
from chexpercept.builder.contour import (
    ContourError,
    MaskResolver,
    contour_qa,
    point_options,
    revision_options,
)
from chexpercept.builder.deformation_plan import CaseDeformation, ComponentPlan, Step
from chexpercept.vocab import POINT_COLORS


def test_point_options_rules():
    gold_exp = [(100, 100)]
    gold_con = [(400, 400), (700, 100)]
    fakes = [
        (150, 100),
        (100, 300),
        (100, 340),
        (600, 600),
        (900, 900),
        (300, 800),
        (800, 500),
        (50, 900),
        (500, 50),
    ]
    for seed in range(20):
        options, exp_idx, con_idx = point_options(gold_exp, gold_con, fakes, np.random.default_rng(seed))
        assert options[-1] == {"point": None, "color": "None"}
        points = [tuple(o["point"]) for o in options[:-1]]
        assert len(points) <= 8
        assert [o["color"] for o in options[:-1]] == list(POINT_COLORS[: len(points)])
        assert set(gold_exp + gold_con) <= set(points)
        # (150, 100) is 50 px from a gold point and (100, 340) 40 px from a kept distractor: never both kept
        assert (150, 100) not in points
        assert not {(100, 300), (100, 340)} <= set(points)
        for i, p in enumerate(points):
            for q in points[i + 1 :]:
                if p in gold_exp + gold_con and q in gold_exp + gold_con:
                    continue
                assert (p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2 >= 100**2
        assert [points[i - 1] for i in exp_idx] == gold_exp
        assert [points[i - 1] for i in con_idx] == gold_con


def test_point_options_keep_all_gold_when_trimming_to_eight():
    gold = [(100 * i, 100) for i in range(1, 4)]
    fakes = [(120 * i, 600) for i in range(1, 9)] + [(120 * i, 900) for i in range(1, 9)]
    options, exp_idx, con_idx = point_options(gold, [], fakes, np.random.default_rng(0))
    assert len(options) == 9 and len(exp_idx) == 3 and con_idx == []


def test_point_options_reject_duplicate_gold_and_drop_non_neutral_fakes():
    with pytest.raises(ContourError):
        point_options([(5, 5)], [(5, 5)], [], np.random.default_rng(0))
    options, _, _ = point_options(
        [(0, 0)], [], [(500, 500), (800, 800)], np.random.default_rng(0), neutral=lambda p: p != (500, 500)
    )
    assert [o["point"] for o in options] == [[0, 0], [800, 800], None] or [o["point"] for o in options] == [
        [800, 800],
        [0, 0],
        None,
    ]


def _box(y0, y1, x0, x1, shape=(200, 200)):
    m = np.zeros(shape, dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def _case():
    optimal = _box(50, 150, 50, 150)
    grown = optimal | _box(50, 150, 150, 170)
    fake_a = grown | _box(30, 50, 60, 100)
    fake_b = grown & ~_box(120, 150, 50, 80)
    step = Step(
        component="suboptimal_component_0",
        kind="expansion",
        index=1,
        anatomy="right lateral lung & right mid zone lung",
        points=[(160, 100), (165, 110)],
        name="suboptimal_component_0_exp1",
        mask=grown,
        center=(162, 105),
        fake_masks=[
            ("suboptimal_component_0_exp1_fake_contraction_1", fake_b),
            ("suboptimal_component_0_exp1_fake_expansion_1", fake_a),
        ],
        fake_points_expansion=[(20, 20)],
        fake_points_contraction=[(100, 60)],
    )
    plan = ComponentPlan(
        "suboptimal_component_0", 0, "optimal_component_0", optimal, anatomy=step.anatomy, steps=[step]
    )
    masks = {"optimal_component_0": optimal, step.name: grown, **dict(step.fake_masks)}
    deformation = CaseDeformation([plan], masks)
    defaults = {
        "default_keep": grown,
        "default_right_lung_chex": _box(10, 190, 10, 190),
    }
    return deformation, MaskResolver(masks, defaults)


def test_revision_options_exclude_the_unrevised_mask_and_mark_the_true_one():
    deformation, resolver = _case()
    for seed in range(10):
        qa, fake_masks, combos = revision_options(
            deformation, "effusion", resolver, np.random.default_rng(seed)
        )
        options = qa["answer_options"]
        assert 2 <= len(options) <= 4
        assert [o["type"] for o in options].count("true") == 1
        true_i = qa["answer_index"]
        assert options[true_i - 1] == {
            "type": "true",
            "masks": ["optimal_component_0"],
            "relative_path": f"option_{true_i}_mask_answer.png",
        }
        assert qa["answer"] == templates.mask_option_labels(len(options))[true_i - 1]
        assert qa["question"] == templates.revision_result_question(len(options))
        names = [o["masks"] for o in options if o["type"] == "fake"]
        assert ["suboptimal_component_0_exp1"] not in names  # the unrevised overlay
        assert ["default_keep"] not in names  # renders exactly like the unrevised overlay
        assert fake_masks == {
            "suboptimal_component_0": [
                "suboptimal_component_0_exp1_fake_contraction_1",
                "suboptimal_component_0_exp1_fake_expansion_1",
                "suboptimal_component_0_exp1",
            ]
        }
        # fewest default_* names first: both generated fakes are used before the lung default
        assert ["suboptimal_component_0_exp1_fake_contraction_1"] in combos
        assert ["suboptimal_component_0_exp1_fake_expansion_1"] in combos
        assert (
            combos.index(["default_right_lung_chex"]) == 2 if ["default_right_lung_chex"] in combos else True
        )
        for o in options:
            assert o["relative_path"].endswith("_fake.png") == (o["type"] == "fake")


def test_neutral_option_names():
    deformation, resolver = _case()
    qa, _, _ = revision_options(
        deformation, "effusion", resolver, np.random.default_rng(0), neutral_names=True
    )
    assert [o["relative_path"] for o in qa["answer_options"]] == [
        f"option_{i}_mask.png" for i in range(1, len(qa["answer_options"]) + 1)
    ]


def test_contour_qa_object():
    deformation, resolver = _case()
    rr = contour_qa(deformation, "effusion", True, resolver, np.random.default_rng(0))
    rf = contour_qa(deformation, "effusion", False, resolver, np.random.default_rng(0))
    assert rr["no_deformation"] is False and rf["no_deformation"] is True
    assert rr["contour_eval_qa"]["answer_index"] == 1 and rf["contour_eval_qa"]["answer_index"] == 2
    assert rr["revision_before_masks"] == ["suboptimal_component_0_exp1"]
    assert rr["revision_after_masks"] == ["optimal_component_0"]
    assert rr["true_masks"] == {"suboptimal_component_0": ["optimal_component_0"]}
    assert rr["initial_context"] == templates.initial_context("effusion")
    exp, con = rr["contour_revision_qa_expansion"], rr["contour_revision_qa_contraction"]
    assert exp["answer_options"] == con["answer_options"]
    # the step grew the mask: its centre is the contraction answer; no expansion answer
    assert exp["answer_index"] == [len(exp["answer_options"])] and exp["answer"] == "None"
    (ci,) = con["answer_index"]
    assert con["answer_options"][ci - 1]["point"] == [162, 105]
    labels = templates.point_option_labels([o["color"] for o in con["answer_options"]])
    assert con["question"] == templates.contraction_question("effusion", labels)
    assert exp["question"] == templates.expansion_question("effusion", labels)
