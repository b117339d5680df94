import pytest

from chexpercept.vocab import (
    LESIONS,
    Path,
    lesion_of_key,
    max_depth,
    parse_lesion,
    parse_path,
    route_stages,
    route_tasks,
)


def test_seven_lesions():
    assert len(LESIONS) == 7 and "cardiomegaly" in LESIONS and "effusion" in LESIONS


@pytest.mark.parametrize(
    "name,expected",
    [
        ("RR", Path.RR),
        ("rf", Path.RF),
        ("LF", Path.LF),
        ("revision_required", Path.RR),
        ("revision_free", Path.RF),
        ("lesion_free", Path.LF),
        (Path.RF, Path.RF),
    ],
)
def test_parse_path_accepts_reference_names(name, expected):
    assert parse_path(name) is expected


def test_parse_path_and_lesion_reject_unknown():
    with pytest.raises(ValueError, match="unknown path"):
        parse_path("RX")
    with pytest.raises(ValueError, match="unknown lesion"):
        parse_lesion("nodule")


def test_reference_names_round_trip():
    for p in Path:
        assert parse_path(p.reference_name) is p


@pytest.mark.parametrize(
    "lesion,path,n_turns,stages",
    [
        ("effusion", "LF", 1, (1,)),
        ("effusion", "RF", 6, (1, 2, 4)),
        ("effusion", "RR", 9, (1, 2, 3, 4)),
        ("cardiomegaly", "LF", 1, (1,)),
        ("cardiomegaly", "RF", 2, (1, 2)),
        ("cardiomegaly", "RR", 5, (1, 2, 3)),
    ],
)
def test_route_tasks_and_stages(lesion, path, n_turns, stages):
    assert len(route_tasks(lesion, path)) == n_turns
    assert route_stages(lesion, path) == stages


def test_route_task_order_rr():
    assert route_tasks("edema", "RR") == (
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


def test_full_release_question_count():
    """100 cases per cell give the README's 10,400 questions."""
    total = sum(100 * len(route_tasks(lesion, p)) for lesion in LESIONS for p in Path)
    assert total == 10_400


def test_lesion_of_key_and_depth():
    assert lesion_of_key("cardiomegaly_s58956720_positive_0") == "cardiomegaly"
    assert [max_depth(p) for p in ("RR", "RF", "LF")] == [4, 3, 1]


def test_task_table_is_the_one_source_of_per_task_facts():
    from chexpercept.vocab import (
        ATTRIBUTE_KEYS,
        MULTI_SELECT_TASKS,
        POINT_TASKS,
        STAGE3_TASKS,
        STAGE4_TASKS,
        TASK_INFO,
        TASK_STAGE,
        TASKS,
    )

    assert tuple(TASK_INFO) == TASKS
    # the paper's facts (spec 2, 4.2), read back through the derived views
    assert TASK_STAGE == {
        "detection": 1, "contour_eval": 2, "expansion": 3, "contraction": 3, "revision_result": 3,
        "distribution": 4, "location": 4, "severity": 4, "comparison": 4,
    }  # fmt: skip
    assert {"expansion", "contraction", "location"} == MULTI_SELECT_TASKS
    assert POINT_TASKS == ("expansion", "contraction")
    assert STAGE3_TASKS == ("expansion", "contraction", "revision_result")
    assert STAGE4_TASKS == ("distribution", "location", "severity", "comparison")
    assert ATTRIBUTE_KEYS["severity"] == "severity/measurement"
    # the reference's chat-history names (all_results.json _chat_history_idx)
    assert [TASK_INFO[t].history_name for t in TASKS] == [
        "detection_qa",
        "contour_evaluation_qa",
        "contour_revision_qa_expansion",
        "contour_revision_qa_contraction",
        "contour_revision_qa_revision_result",
        "attribute_extraction_qa_distribution",
        "attribute_extraction_qa_location",
        "attribute_extraction_qa_severity/measurement",
        "attribute_extraction_qa_comparison",
    ]
    # every sub-task has its own report colour
    colors = [TASK_INFO[t].color for t in (*STAGE3_TASKS, *STAGE4_TASKS)]
    assert None not in colors and len(set(colors)) == len(colors)
