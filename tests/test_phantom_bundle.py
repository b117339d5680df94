"""Issue 2 acceptance on the phantom bundle: exact turn texts per lesion and images on the right turns."""

from chexpercept import templates as T
from chexpercept.bundle import read_bundle
from chexpercept.vocab import CARDIOMEGALY, LESIONS, Path


def test_turn_texts_follow_the_templates(phantom_bundle):
    bundle = read_bundle(phantom_bundle)
    seen_detection = set()
    for case in bundle:
        lesion = case.lesion
        by_task = {t.task: t for t in case.turns}
        det = by_task["detection"].text
        assert det == T.detection_question(lesion)
        seen_detection.add(det.split(" visible")[0].startswith("Is any finding suggestive"))
        if case.path is Path.LF:
            assert list(by_task) == ["detection"]
            continue
        assert by_task["contour_eval"].text == T.contour_eval_question(lesion)
        assert ("heart" in by_task["contour_eval"].text) == (lesion != CARDIOMEGALY)
        if case.path is Path.RR:
            exp, con = by_task["expansion"], by_task["contraction"]
            assert exp.text == T.initial_context(lesion) + "\n\n" + T.expansion_question(lesion, exp.options)
            assert con.text == T.contraction_question(lesion, con.options)
            assert exp.options[-1] == "None" and exp.options == con.options
            assert by_task["revision_result"].text == T.revision_result_question(
                len(by_task["revision_result"].options)
            )
        if lesion != CARDIOMEGALY:
            assert by_task["distribution"].text == T.distribution_question(lesion)
            assert by_task["location"].text == T.location_question(lesion, by_task["location"].options)
            lung = "left lung" if "left lung" in by_task["severity"].text else "right lung"
            assert by_task["severity"].text == T.severity_question(lesion, lung)
            assert by_task["comparison"].text == T.comparison_question()
    assert seen_detection == {True, False}  # both detection variants occur (opacity/consolidation vs others)
    assert {c.lesion for c in bundle} == set(LESIONS)


def test_images_ride_on_the_spec_turns(phantom_bundle):
    bundle = read_bundle(phantom_bundle)
    for case in bundle:
        base = f"chexpercept/{case.key_id}"
        for turn in case.turns:
            if turn.task == "detection":
                assert turn.images == (f"{base}/detection_qa/xray.png",)
            elif turn.task == "contour_eval":
                assert turn.images == (f"{base}/contour_qa/contour_eval_qa/xray_with_mask.png",)
            elif turn.task == "expansion":
                assert turn.images == (
                    f"{base}/contour_qa/contour_revision_qa/xray_with_mask_and_points.png",
                )
            elif turn.task == "revision_result":
                names = [img.rsplit("/", 1)[1] for img in turn.images]
                assert len(names) == len(turn.options) >= 2
                assert [n.startswith(f"option_{i}_mask_") for i, n in enumerate(names, 1)] == [True] * len(
                    names
                )
                assert names[turn.answer_index[0] - 1].endswith("_answer.png") or all(
                    "_answer" not in n for n in names
                )  # neutral option names are allowed
            else:
                assert turn.images == ()
            for rel in turn.images:
                assert (phantom_bundle / rel).is_file()
