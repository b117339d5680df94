"""Conversation construction (spec 3.3-3.5): oracle texts and triggers, turn texts, images, patched history."""

from __future__ import annotations

import random

import pytest

from chexpercept.case import Case
from chexpercept.eval import oracle
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import Response
from chexpercept.testing import fixture_entry
from chexpercept.vocab import Path

# Literal strings copied from spec/reference.md section 3.5 (not built from the module under test).
SPEC_DETECTION = (
    "Ground Truth Provided: The lesion is definitively present in this image. This is an absolute fact. "
    "Disregard your previous answer and evaluate the following questions strictly based on the confirmed "
    "presence of the lesion."
)
SPEC_REVISION_NEEDED = (
    "Ground Truth Provided: The lesion mask is definitively needed to be revised in this image. This is an "
    "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on "
    "the confirmed need of revision."
)
SPEC_NO_REVISION = (
    "Ground Truth Provided: The lesion mask is definitively not needed to be revised in this image. This is "
    "an absolute fact. Disregard your previous answer and evaluate the following questions strictly based on "
    "the confirmed no need of revision of the lesion mask."
)
SPEC_TAIL = (
    "\nThese are the absolute facts. Disregard your previous answer and evaluate the following questions "
    "strictly based on these facts."
)


def make_case(
    lesion: str = "effusion",
    path: Path = Path.RR,
    *,
    expansion: list[int] | None = None,
    contraction: list[int] | None = None,
    revision: int | None = None,
    colors: tuple[str, ...] = ("red", "orange", "yellow", "green"),
) -> Case:
    """A case with chosen Stage 3 gold answers (options: the given colours, then None)."""
    key = f"{lesion}_s1_{'negative' if path is Path.LF else 'positive'}_0"
    entry = fixture_entry(key, path, random.Random(0))
    if path is not Path.LF:
        cq = entry["contour_qa"]
        opts = [{"point": [10 * i, 10 * i], "color": c} for i, c in enumerate(colors)]
        opts.append({"point": None, "color": "None"})
        none = len(opts)
        for name, gold in (
            ("contour_revision_qa_expansion", expansion),
            ("contour_revision_qa_contraction", contraction),
        ):
            gold = gold or [none]
            cq[name]["answer_options"] = opts
            cq[name]["answer_index"] = gold
            cq[name]["answer"] = (
                "None" if gold == [none] else ", ".join(f"{colors[i - 1]} point" for i in gold)
            )
        if revision is not None:
            rr = cq["contour_revision_qa_revision_result"]
            n = max(len(rr["answer_options"]), revision)
            rr["answer_options"] = [
                {
                    "type": "true" if i == revision else "fake",
                    "masks": [],
                    "relative_path": f"option_{i}_mask.png",
                }
                for i in range(1, n + 1)
            ]
            rr["answer_index"] = revision
    return Case.from_entry(key, entry)


def test_fixed_texts_are_the_spec_strings():
    assert oracle.DETECTION_ORACLE == SPEC_DETECTION
    assert oracle.REVISION_NEEDED_ORACLE == SPEC_REVISION_NEEDED
    assert oracle.NO_REVISION_ORACLE == SPEC_NO_REVISION
    assert oracle.ORACLE_SEPARATOR == "\n\n"


@pytest.mark.parametrize(
    ("colours", "phrase"),
    [
        (["red"], "red point"),
        (["red", "blue"], "red and blue points"),
        (["red", "blue", "green"], "red, blue, and green points"),
        (["red", "orange", "yellow", "green"], "red, orange, yellow, and green points"),
    ],
)
def test_colour_phrase(colours, phrase):
    assert oracle.colour_phrase(colours) == phrase


def test_point_operations_text_lists_both_operations_in_gold_order():
    case = make_case(expansion=[3, 1], contraction=None)
    assert oracle.point_operations_text(case) == (
        "Ground Truth Provided: The lesion mask is definitively needed to be revised using expansion operation "
        "at yellow and red points.\n"
        "Ground Truth Provided: The lesion mask is definitively not needed to be revised using contraction "
        "operation." + SPEC_TAIL
    )
    case = make_case(expansion=None, contraction=[2])
    assert oracle.point_operations_text(case) == (
        "Ground Truth Provided: The lesion mask is definitively not needed to be revised using expansion "
        "operation.\n"
        "Ground Truth Provided: The lesion mask is definitively needed to be revised using contraction "
        "operation at orange point." + SPEC_TAIL
    )


@pytest.mark.parametrize(("k", "word"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th")])
def test_revised_mask_text(k, word):
    case = make_case(revision=k)
    assert oracle.revised_mask_text(case) == (
        f"Ground Truth Provided: The lesion mask reflecting the modifications is the {word} mask.\n"
        "This is an absolute fact. Disregard your previous answer and evaluate the following questions "
        "strictly based on this fact."
    )


def test_triggers_and_patch_targets_rr():
    case = make_case(expansion=[1, 3], contraction=[2], revision=2)
    assert oracle.intervention(case, "detection", {}) is None
    assert oracle.intervention(case, "contour_eval", {"detection": True}) is None
    iv = oracle.intervention(case, "contour_eval", {"detection": False})
    assert iv.text == SPEC_DETECTION and iv.patches == {"detection": "Answer: 1"}
    # a missing correctness counts as incorrect
    assert oracle.intervention(case, "contour_eval", {}).patches == {"detection": "Answer: 1"}
    iv = oracle.intervention(case, "expansion", {"contour_eval": False})
    assert iv.text == SPEC_REVISION_NEEDED and iv.patches == {"contour_eval": "Answer: 1"}
    assert oracle.intervention(case, "contraction", {"expansion": False}) is None
    assert oracle.intervention(case, "revision_result", {"expansion": True, "contraction": True}) is None
    iv = oracle.intervention(case, "revision_result", {"expansion": True, "contraction": False})
    assert iv.patches == {"contraction": "Answer: 2"}
    iv = oracle.intervention(case, "revision_result", {"expansion": False, "contraction": True})
    assert iv.patches == {"expansion": "Answer: 1,3"}
    iv = oracle.intervention(case, "revision_result", {"expansion": False, "contraction": False})
    assert iv.patches == {"expansion": "Answer: 1,3", "contraction": "Answer: 2"}
    # before Stage 4 on RR only the revision result matters (not the contour evaluation)
    assert oracle.intervention(case, "distribution", {"revision_result": True, "contour_eval": False}) is None
    iv = oracle.intervention(case, "distribution", {"revision_result": False})
    assert iv.patches == {"revision_result": "Answer: 2"} and "2nd mask" in iv.text
    for later in ("location", "severity", "comparison"):
        assert oracle.intervention(case, later, {}) is None


def test_triggers_rf():
    case = make_case(path=Path.RF)
    assert oracle.intervention(case, "distribution", {"contour_eval": True, "revision_result": False}) is None
    iv = oracle.intervention(case, "distribution", {"contour_eval": False})
    assert iv.text == SPEC_NO_REVISION and iv.patches == {"contour_eval": "Answer: 2"}


def test_implicit_patch_sorts_multi_select_gold():
    case = make_case(expansion=[3, 1, 2])
    iv = oracle.intervention(case, "revision_result", {"expansion": False, "contraction": True})
    assert iv.patches == {"expansion": "Answer: 1,2,3"}


def test_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="unknown oracle setting"):
        Conversation(make_case(), oracle="sometimes")


# ------------------------------------------------------------------------------ conversations
SPEC_SYSTEM = (
    "You are an expert radiologist. Analyze the given chest X-ray image and the question. Provide the final "
    "answer in the following format: 'Answer: [Option Number]'. Only the option number(s) should be included "
    "in the final answer part. (e.g., 'Answer: 1', 'Answer: 2', 'Answer: 1,3')."
)
SPEC_CONTEXT = (
    "The colored points indicate potential locations where the mask may need to be adjusted. The mask may need "
    "to be expanded towards these points, contracted at these locations, or both."
)
SPEC_HEART = " Note that lesions overlapping with the heart do not need to be considered."
STAGE4 = ["distribution", "location", "severity", "comparison"]
STAGE3 = ["expansion", "contraction", "revision_result"]


def wrong_text(turn) -> str:
    """A valid option that is not the gold answer, in a verbose reply."""
    pick = 2 if list(turn.answer_index) == [1] else 1
    return f"Let me look.\nAnswer: {pick}"


def right_text(turn) -> str:
    return "Looking carefully.\nAnswer: " + ",".join(map(str, turn.answer_index))


def drive(case: Case, setting: str, right=()):
    """Run a conversation to its end; tasks in ``right`` are answered correctly, the rest wrongly."""
    conv = Conversation(case, oracle=setting)
    sent = []
    while not conv.done:
        request = conv.pending
        sent.append(request)
        turn = request.turn
        conv.answer(Response(right_text(turn) if turn.task in right else wrong_text(turn)))
    return sent, conv


def user_texts(requests):
    return [r.messages[-1].text for r in requests]


@pytest.mark.parametrize(
    ("lesion", "path", "tasks"),
    [
        ("effusion", Path.RR, ["detection", "contour_eval", *STAGE3, *STAGE4]),
        ("effusion", Path.RF, ["detection", "contour_eval", *STAGE4]),
        ("effusion", Path.LF, ["detection"]),
        ("cardiomegaly", Path.RR, ["detection", "contour_eval", *STAGE3]),
        ("cardiomegaly", Path.RF, ["detection", "contour_eval"]),
        ("cardiomegaly", Path.LF, ["detection"]),
    ],
)
def test_route_turns_texts_and_images(lesion, path, tasks):
    case = make_case(lesion, path, expansion=[2], contraction=[1, 3], revision=3)
    sent, conv = drive(case, "none")
    assert [r.task for r in sent] == tasks
    key = case.key_id
    base = f"chexpercept/{key}"
    expected_images = {
        "detection": [f"{base}/detection_qa/xray.png"],
        "contour_eval": [f"{base}/contour_qa/contour_eval_qa/xray_with_mask.png"],
        "expansion": [f"{base}/contour_qa/contour_revision_qa/xray_with_mask_and_points.png"],
        "contraction": [],
        "revision_result": [f"{base}/contour_qa/contour_revision_qa/option_{i}_mask.png" for i in (1, 2, 3)],
    }
    for request in sent:
        first = request.messages[0]
        assert first.role == "system" and first.text == SPEC_SYSTEM and first.images == ()
        new = request.messages[-1]
        assert new.role == "user"
        assert list(new.images) == expected_images.get(request.task, [])
        if request.task == "expansion":
            context = SPEC_CONTEXT + ("" if lesion == "cardiomegaly" else SPEC_HEART)
            assert new.text == context + "\n\n" + case.qa_for("expansion").question
            assert new.text.count("Which point(s), if any, should be used to expand") == 1
        else:
            assert new.text == case.qa_for(request.task).question
    # every request re-sends the whole history, images staying on their own turn
    last = sent[-1].messages
    assert [m.role for m in last] == ["system"] + ["user", "assistant"] * (len(tasks) - 1) + ["user"]
    for i, request in enumerate(sent):
        assert request.messages == last[: 2 + 2 * i]
    result = conv.result()
    assert result.path == path.value and result.lesion == lesion
    assert [t.task for t in result.turns] == tasks
    assert len(result.conversation) == 1 + 2 * len(tasks)


def test_every_setting_is_identical_when_every_answer_is_right():
    case = make_case(expansion=[1, 2], contraction=None, revision=2)
    every = ["detection", "contour_eval", *STAGE3, *STAGE4]
    runs = {s: drive(case, s, right=every)[0] for s in ("none", "implicit", "explicit")}
    assert runs["none"] == runs["implicit"] == runs["explicit"]
    assert all(r.messages[-1].text == case.turn(r.task).text for r in runs["explicit"])


def test_none_setting_never_injects():
    case = make_case(revision=1)
    sent, conv = drive(case, "none")
    assert user_texts(sent) == [case.turn(t.task).text for t in case.turns]
    assert all(m.text.startswith("Let me look.") for m in sent[-1].messages if m.role == "assistant")
    assert all(r.patched_to is None and r.oracle_text is None for r in conv.records)


def test_explicit_rr_all_wrong_exact_texts():
    case = make_case(expansion=[1, 3], contraction=None, revision=3)
    sent, conv = drive(case, "explicit")
    by_task = {r.task: r.messages[-1].text for r in sent}
    turn = case.turn
    assert by_task["detection"] == turn("detection").text
    assert by_task["contour_eval"] == SPEC_DETECTION + "\n\n" + turn("contour_eval").text
    assert by_task["expansion"] == (
        SPEC_REVISION_NEEDED + "\n\n" + SPEC_CONTEXT + SPEC_HEART + "\n\n" + case.qa_for("expansion").question
    )
    assert by_task["contraction"] == turn("contraction").text
    assert by_task["revision_result"] == (
        "Ground Truth Provided: The lesion mask is definitively needed to be revised using expansion operation "
        "at red and yellow points.\n"
        "Ground Truth Provided: The lesion mask is definitively not needed to be revised using contraction "
        "operation." + SPEC_TAIL + "\n\n" + turn("revision_result").text
    )
    assert by_task["distribution"] == (
        "Ground Truth Provided: The lesion mask reflecting the modifications is the 3rd mask.\nThis is an "
        "absolute fact. Disregard your previous answer and evaluate the following questions strictly based on "
        "this fact.\n\n" + turn("distribution").text
    )
    for later in ("location", "severity", "comparison"):
        assert by_task[later] == turn(later).text
    # explicit leaves the model's own (wrong) answers in the history, and the oracle text stays in it
    final = conv.result().conversation
    assert all(m["text"].startswith("Let me look.") for m in final if m["role"] == "assistant")
    assert final[3]["text"].startswith(SPEC_DETECTION)
    records = {r.task: r for r in conv.records}
    assert records["contour_eval"].oracle_text == SPEC_DETECTION
    assert records["contraction"].oracle_text is None
    assert all(r.patched_to is None for r in conv.records)


def test_implicit_rr_all_wrong_patches_history_before_each_trigger():
    case = make_case(expansion=[3, 1], contraction=[2], revision=2)
    sent, conv = drive(case, "implicit")
    assert user_texts(sent) == [case.turn(r.task).text for r in sent]  # no text is injected

    def answers(request):
        return [m.text for m in request.messages if m.role == "assistant"]

    req = {r.task: r for r in sent}

    def raw(task):
        return wrong_text(case.turn(task))

    assert answers(req["contour_eval"]) == ["Answer: 1"]
    assert answers(req["expansion"]) == ["Answer: 1", "Answer: 1"]
    assert answers(req["contraction"]) == ["Answer: 1", "Answer: 1", raw("expansion")]
    # both point answers wrong: both replaced by their gold (sorted)
    assert answers(req["revision_result"]) == ["Answer: 1", "Answer: 1", "Answer: 1,3", "Answer: 2"]
    assert answers(req["distribution"]) == ["Answer: 1", "Answer: 1", "Answer: 1,3", "Answer: 2", "Answer: 2"]
    # no later patches: the wrong distribution answer stays
    assert answers(req["location"])[-1] == raw("distribution")
    records = {r.task: r for r in conv.records}
    assert (
        records["detection"].response == raw("detection") and records["detection"].patched_to == "Answer: 1"
    )
    assert (
        records["expansion"].response == raw("expansion") and records["expansion"].patched_to == "Answer: 1,3"
    )
    assert records["revision_result"].patched_to == "Answer: 2"
    assert records["distribution"].patched_to is None
    assert all(r.oracle_text is None for r in conv.records)
    final = [m["text"] for m in conv.result().conversation if m["role"] == "assistant"]
    assert final[:5] == ["Answer: 1", "Answer: 1", "Answer: 1,3", "Answer: 2", "Answer: 2"]


def test_implicit_patches_only_the_wrong_point_answer_but_explicit_lists_both():
    case = make_case(expansion=[2], contraction=[1, 4], revision=1)
    right = ["detection", "contour_eval", "expansion"]
    sent, _ = drive(case, "implicit", right=right)
    rr = next(r for r in sent if r.task == "revision_result")
    answers = [m.text for m in rr.messages if m.role == "assistant"]
    assert answers[2] == right_text(case.turn("expansion"))  # right: untouched
    assert answers[3] == "Answer: 1,4"
    sent, _ = drive(case, "explicit", right=right)
    text = next(r for r in sent if r.task == "revision_result").messages[-1].text
    assert text.startswith(
        "Ground Truth Provided: The lesion mask is definitively needed to be revised using expansion operation "
        "at orange point.\nGround Truth Provided: The lesion mask is definitively needed to be revised using "
        "contraction operation at red and green points.\nThese are the absolute facts."
    )


@pytest.mark.parametrize("setting", ["implicit", "explicit"])
def test_rf_oracles(setting):
    case = make_case(path=Path.RF)
    sent, conv = drive(case, setting)
    req = {r.task: r for r in sent}
    if setting == "explicit":
        assert (
            req["contour_eval"].messages[-1].text == SPEC_DETECTION + "\n\n" + case.turn("contour_eval").text
        )
        assert (
            req["distribution"].messages[-1].text
            == SPEC_NO_REVISION + "\n\n" + case.turn("distribution").text
        )
        assert req["location"].messages[-1].text == case.turn("location").text
    else:
        answers = [m.text for m in req["distribution"].messages if m.role == "assistant"]
        assert answers == ["Answer: 1", "Answer: 2"]
        assert {r.task: r.patched_to for r in conv.records}["contour_eval"] == "Answer: 2"


@pytest.mark.parametrize("setting", ["implicit", "explicit"])
def test_cardiomegaly_rr_ends_after_stage_3_without_a_stage_4_oracle(setting):
    case = make_case("cardiomegaly", Path.RR, revision=2)
    sent, conv = drive(case, setting)
    assert [r.task for r in sent] == ["detection", "contour_eval", *STAGE3]
    assert conv.result().turns[-1].patched_to is None  # nothing after revision result to patch for
    if setting == "explicit":
        assert sent[2].messages[-1].text == SPEC_REVISION_NEEDED + "\n\n" + SPEC_CONTEXT + "\n\n" + (
            case.qa_for("expansion").question
        )


def test_unparsed_answer_counts_as_wrong_and_fires_the_oracle():
    case = make_case(path=Path.RF)
    conv = Conversation(case, oracle="explicit")
    conv.answer(Response("I cannot tell from this image."))
    record = conv.records[0]
    assert record.parse_status == "unparsed" and record.parsed == [-1] and not record.correct
    assert conv.pending.messages[-1].text.startswith(SPEC_DETECTION)


def test_record_keeps_raw_text_parse_and_relative_image_paths_only():
    case = make_case(revision=1)
    _, conv = drive(case, "implicit", right=["detection"])
    result = conv.result()
    first = result.turns[0]
    assert first.correct and first.parsed == [1] and first.gold == [1] and first.parse_status == "answer"
    assert first.n_options == 2 and not first.multi_select
    exp = result.turn("expansion")
    assert exp.multi_select and exp.none_index == 5 and exp.n_options == 5
    line = result.to_json()
    assert "base64" not in line and "/tmp" not in line
    images = [p for m in result.conversation for p in m["images"]]
    assert images and all(p.startswith(f"chexpercept/{case.key_id}/") for p in images)
