"""Prompt strings compared against literal texts copied from the spec (spec/reference.md 1.6, 2, 3.3)."""

from chexpercept import templates as T

EFFUSION_EXPANSION = (
    "Which point(s), if any, should be used to expand the mask toward areas of the effusion that are not "
    "currently covered? Select all points where expansion is needed. If no expansion is needed, select "
    "'None'.\n\nOptions:\n(1) red point\n(2) orange point\n(3) yellow point\n(4) green point\n(5) blue point\n(6) None"
)
CARDIO_CONTRACTION = (
    "Which point(s), if any, should be used to contract the mask away from areas that are not part of the "
    "cardiomegaly? Select all points where contraction is needed. If no contraction is needed, select "
    "'None'.\n\nOptions:\n(1) red point\n(2) orange point\n(3) yellow point\n(4) None"
)


def test_system_message():
    assert T.SYSTEM_MESSAGE == (
        "You are an expert radiologist. Analyze the given chest X-ray image and the question. Provide the "
        "final answer in the following format: 'Answer: [Option Number]'. Only the option number(s) should be "
        "included in the final answer part. (e.g., 'Answer: 1', 'Answer: 2', 'Answer: 1,3')."
    )


def test_detection_variants():
    assert T.detection_question("effusion") == (
        "Is any finding suggestive of effusion visible in the image?\n\nOptions:\n(1) Yes\n(2) No"
    )
    assert (
        T.detection_question("opacity") == "Is any opacity visible in the image?\n\nOptions:\n(1) Yes\n(2) No"
    )
    assert T.detection_question("consolidation").startswith("Is any consolidation visible")


def test_contour_eval_heart_sentence_only_for_lung_lesions():
    assert T.contour_eval_question("effusion") == (
        "The image shows a chest X-ray with a predicted mask for the effusion (shown in the overlay). Is any "
        "major revision needed? Note that lesions overlapping with the heart do not need to be considered."
        "\n\nOptions:\n(1) Yes\n(2) No"
    )
    assert T.contour_eval_question("cardiomegaly") == (
        "The image shows a chest X-ray with a predicted mask for the cardiomegaly (shown in the overlay). Is any "
        "major revision needed?\n\nOptions:\n(1) Yes\n(2) No"
    )


def test_initial_context():
    base = (
        "The colored points indicate potential locations where the mask may need to be adjusted. The mask may "
        "need to be expanded towards these points, contracted at these locations, or both."
    )
    assert T.initial_context("cardiomegaly") == base
    assert (
        T.initial_context("edema")
        == base + " Note that lesions overlapping with the heart do not need to be considered."
    )


def test_point_questions():
    labels = T.point_option_labels(["red", "orange", "yellow", "green", "blue", None])
    assert T.expansion_question("effusion", labels) == EFFUSION_EXPANSION
    assert T.contraction_question(
        "cardiomegaly", T.point_option_labels(["red", "orange", "yellow", "None"])
    ) == (CARDIO_CONTRACTION)


def test_revision_result_question():
    assert T.revision_result_question(4) == (
        "Choose the mask that reflects the modifications.\n\nOptions:\n(1) 1st mask\n(2) 2nd mask\n(3) 3rd mask\n(4) 4th mask"
    )


def test_attribute_questions():
    assert T.distribution_question("effusion") == (
        "In how many zones is the effusion present in the image? Consider the following zones: right upper zone "
        "lung, right mid zone lung, right lower zone lung, left upper zone lung, left mid zone lung, left lower "
        "zone lung.\n\nOptions:\n(1) 1 zone\n(2) 2 zones\n(3) 3 zones\n(4) 4 zones or more"
    )
    assert T.severity_question("effusion", "right lung") == (
        "What proportion of the right lung area does the effusion occupy? Note that the lung area excludes the "
        "heart area.\n\nOptions:\n(1) Less than 1/3 of the right lung area\n(2) 1/3 or more but less than 2/3 of "
        "the right lung area\n(3) 2/3 or more of the right lung area"
    )
    assert T.comparison_question() == (
        "Assess and compare the sizes of the lesion across both lungs. If the lesion is present in only one lung, "
        "select the corresponding option. Note that the lung area excludes the heart area. A lesion is considered "
        "larger if it is 1.5 times or more the size of the other.\n\nOptions:\n(1) Both lesions are similar in "
        "size.\n(2) The left lung lesion is larger than the right lung lesion.\n(3) The right lung lesion is "
        "larger than the left lung lesion.\n(4) The lesion is present in only one lung (left or right)."
    )
    opts = ["the right costophrenic angle", "b", "c", T.LOCATION_NONE]
    assert T.location_question("effusion", opts) == (
        "Where is the effusion located in the image? Select all locations where the lesion is present from the "
        "options.\n\nOptions:\n(1) the right costophrenic angle\n(2) b\n(3) c\n(4) None of the above (options 1-3)"
    )


def test_ordinals():
    assert [T.ordinal(i) for i in (1, 2, 3, 4, 11)] == ["1st", "2nd", "3rd", "4th", "11th"]
