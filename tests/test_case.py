"""Case/Turn conversion and turn construction against the spec's example entries (spec 1.6, 3.4)."""

import copy
import json
from pathlib import Path

import pytest

from chexpercept import templates as T
from chexpercept.case import Case
from chexpercept.validate import validate_entry
from chexpercept.vocab import Path as P

EXAMPLES = json.loads((Path(__file__).parent / "data" / "spec_examples.json").read_text())
RR_KEY = "effusion_s51234567_positive_0"
CARDIO_KEY = "cardiomegaly_s50000720_positive_0"
LF_KEY = "effusion_s59990001_negative_1"


@pytest.mark.parametrize("key_id", list(EXAMPLES))
def test_spec_examples_validate_and_round_trip(key_id):
    entry = EXAMPLES[key_id]
    assert validate_entry(key_id, entry) == []
    case = Case.from_entry(key_id, copy.deepcopy(entry))
    back = case.to_entry()
    assert back == entry
    assert list(back) == list(entry)  # key order kept too
    assert json.dumps(back.get("contour_qa", {}), sort_keys=False) == json.dumps(
        entry.get("contour_qa", {}), sort_keys=False
    )


def test_unknown_fields_survive_round_trip():
    entry = copy.deepcopy(EXAMPLES[RR_KEY])
    entry["provenance"] = {"synthetic": True}
    entry["contour_qa"]["my_note"] = [1, 2]
    entry["attribute_extraction_qa"]["location"]["debug"] = "x"
    assert validate_entry(RR_KEY, entry) == []
    assert Case.from_entry(RR_KEY, entry).to_entry() == entry


def test_routes():
    assert Case.from_entry(LF_KEY, EXAMPLES[LF_KEY]).path is P.LF
    assert Case.from_entry(RR_KEY, EXAMPLES[RR_KEY]).path is P.RR
    rf = copy.deepcopy(EXAMPLES[RR_KEY])
    rf["contour_qa"]["no_deformation"] = True
    assert Case.from_entry(RR_KEY, rf).path is P.RF


def test_rr_turns_texts_images_options():
    case = Case.from_entry(RR_KEY, EXAMPLES[RR_KEY])
    turns = case.turns
    assert [t.task for t in turns] == [
        "detection",
        "contour_eval",
        "expansion",
        "contraction",
        "revision_result",
        "distribution",
        "location",
        "severity",
        "comparison",
    ]
    assert [t.stage for t in turns] == [1, 2, 3, 3, 3, 4, 4, 4, 4]
    base = f"chexpercept/{RR_KEY}"
    assert turns[0].images == (f"{base}/detection_qa/xray.png",)
    assert turns[0].text == T.detection_question("effusion")
    assert turns[1].images == (f"{base}/contour_qa/contour_eval_qa/xray_with_mask.png",)
    assert turns[1].text == T.contour_eval_question("effusion")
    assert turns[2].images == (f"{base}/contour_qa/contour_revision_qa/xray_with_mask_and_points.png",)
    assert (
        turns[2].text
        == T.initial_context("effusion")
        + "\n\n"
        + EXAMPLES[RR_KEY]["contour_qa"]["contour_revision_qa_expansion"]["question"]
    )
    assert turns[2].options == (
        "red point",
        "orange point",
        "yellow point",
        "green point",
        "blue point",
        "None",
    )
    assert turns[2].answer_index == (4,) and turns[2].multi_select
    assert turns[3].images == () and turns[3].text.startswith(
        "Which point(s), if any, should be used to contract"
    )
    assert turns[3].answer_index == (2,)
    assert turns[4].images == tuple(
        f"{base}/contour_qa/contour_revision_qa/option_{i}_mask_{'answer' if i == 2 else 'fake'}.png"
        for i in range(1, 5)
    )
    assert turns[4].options == ("1st mask", "2nd mask", "3rd mask", "4th mask")
    assert turns[4].answer_index == (2,) and not turns[4].multi_select
    assert all(t.images == () for t in turns[5:])
    assert turns[6].answer_index == (1, 3) and turns[6].multi_select
    assert turns[7].task == "severity" and turns[7].answer_index == (1,)


def test_cardiomegaly_rr_has_five_turns_without_heart_sentence():
    case = Case.from_entry(CARDIO_KEY, EXAMPLES[CARDIO_KEY])
    assert case.path is P.RR and case.is_cardiomegaly
    turns = case.turns
    assert [t.task for t in turns] == [
        "detection",
        "contour_eval",
        "expansion",
        "contraction",
        "revision_result",
    ]
    assert "heart" not in turns[1].text and "heart" not in turns[2].text
    assert turns[2].text.startswith(T.initial_context("cardiomegaly") + "\n\nWhich point(s)")
    assert turns[4].answer_index == (4,)


def test_lf_single_turn():
    case = Case.from_entry(LF_KEY, EXAMPLES[LF_KEY])
    assert [t.task for t in case.turns] == ["detection"]
    assert case.turns[0].answer_index == (2,) and case.turns[0].answer == "No"


def test_fixture_bundle_turn_counts(fixture_bundle):
    from chexpercept.bundle import read_bundle

    bundle = read_bundle(fixture_bundle)
    counts = {(c.lesion, c.path.value): len(c.turns) for c in bundle}
    assert (
        counts[("effusion", "RR")] == 9
        and counts[("effusion", "RF")] == 6
        and counts[("effusion", "LF")] == 1
    )
    assert counts[("cardiomegaly", "RR")] == 5 and counts[("cardiomegaly", "RF")] == 2
    for case in bundle:
        assert case.to_entry() == json.loads((fixture_bundle / "chexpercept.json").read_text())[case.key_id]


def test_none_index():
    case = Case.from_entry(RR_KEY, EXAMPLES[RR_KEY])
    by_task = {t.task: t for t in case.turns}
    assert by_task["expansion"].none_index == 6 and by_task["contraction"].none_index == 6
    assert by_task["location"].none_index == 4
    assert by_task["detection"].none_index is None and by_task["distribution"].none_index is None


def _edited(key_id, edit):
    entry = copy.deepcopy(EXAMPLES[key_id])
    edit(entry)
    return [f"{p.where}: {p.message}" for p in validate_entry(key_id, entry)]


@pytest.mark.parametrize(
    ("key_id", "edit", "said"),
    [
        # red team, stop 48: each passed validation, and the numbers were wrong without a word
        (RR_KEY, lambda e: e["detection_qa"].update(answer="No"), "detection_qa.answer: 'No' is not the option text"),
        (RR_KEY, lambda e: e["detection_qa"].update(answer_index=2), "detection_qa.answer: 'Yes' is not the option text"),
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_eval_qa"].update(answer="No"),
            "contour_qa.contour_eval_qa.answer: 'No' is not the option text answer_index 1 names ('Yes')",
        ),
        (
            RR_KEY,
            lambda e: e["attribute_extraction_qa"]["distribution"].update(answer="bogus"),
            "attribute_extraction_qa.distribution.answer: 'bogus' is not the option text",
        ),
        (
            RR_KEY,
            lambda e: e["attribute_extraction_qa"]["location"].update(answer="bogus"),
            "attribute_extraction_qa.location.answer: 'bogus' is not the option text",
        ),
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_revision_qa_revision_result"].update(answer="bogus"),
            "contour_qa.contour_revision_qa_revision_result.answer: 'bogus' is not the option text",
        ),
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_revision_qa_revision_result"].update(answer="1st mask", answer_index=1),
            "contour_qa.contour_revision_qa_revision_result.answer_index: 1 names a mask of type 'fake'",
        ),
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_revision_qa_expansion"].update(answer="red point"),
            "contour_qa.contour_revision_qa_expansion.answer: 'red point' is not the option text",
        ),
        # round 2 (helper-53): stage 2's gold against the route, and points named with None
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_eval_qa"].update(answer="No", answer_index=2),
            "contour_qa.contour_eval_qa.answer: 'No', while no_deformation false says the mask needs a revision",
        ),
        (
            RR_KEY,
            lambda e: e["contour_qa"]["contour_revision_qa_expansion"].update(
                answer_index=[4, len(e["contour_qa"]["contour_revision_qa_expansion"]["answer_options"])]
            ),
            "names points and the None option together",
        ),
        # a negative case holding later stages (never asked), and a key that names the other route
        (LF_KEY, lambda e: e.update(contour_qa=EXAMPLES[RR_KEY]["contour_qa"]), "contour_qa: present in a negative case"),
        (
            LF_KEY,
            lambda e: e.update(attribute_extraction_qa=EXAMPLES[RR_KEY]["attribute_extraction_qa"]),
            "attribute_extraction_qa: present in a negative case",
        ),
        (
            RR_KEY,
            lambda e: e["detection_qa"].update(answer="No", answer_index=2),
            "detection_qa.answer: 'No', while key_id names a positive case",
        ),
        (
            LF_KEY,
            lambda e: e["detection_qa"].update(answer="Yes", answer_index=1),
            "detection_qa.answer: 'Yes', while key_id names a negative case",
        ),
    ],
    ids=["det-text", "det-index", "eval-text", "distribution", "location", "revision-result", "revision-fake",
         "expansion", "eval-vs-route", "points-and-none", "negative-contour",
         "negative-attributes", "positive-key-no", "negative-key-yes"],
)  # fmt: skip
def test_an_answer_that_contradicts_its_case_is_named_by_validation(key_id, edit, said):
    problems = _edited(key_id, edit)
    assert any(said in p for p in problems), problems
