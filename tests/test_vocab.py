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
