"""Responses simulated at the paper's published per-path rates reproduce its other tables.

For each of the 14 models, one simulated implicit-oracle run (greedy, so End-to-End comes exactly
from it) is built from Table 8 (per-path stage accuracy, End-to-End and Oracle-Passed) and Table 10
(Stage 2 yes/no/etc), with 100 cases per (lesion, path) cell as in the paper. Scoring it must give
back Table 8 cell for cell, and the arithmetic of paper section 3: Table 2's aggregates are the
means of Table 8 over the paths that ask the stage, Table 10's Acc. is Table 2's Oracle-Passed S2,
and End-to-End never exceeds Oracle-Passed. Depth follows from the same booleans (with the
cardiomegaly +1), and the LF depth equals the published one.
Figures are copied from the paper (spec/paper.md sections 5, 9, 11).
"""

import pytest

from chexpercept.metrics import run_from_records, score_model
from chexpercept.metrics.simulate import hand_record
from chexpercept.vocab import CARDIOMEGALY, LESIONS, STAGE3_TASKS, STAGE4_TASKS

# Table 2: E2E S1 S2 S3 S4, OP S2 S3 S4, depth RR RF LF
TABLE2 = {
    "GPT-5.4": (84.3, 46.4, 2.6, 13.4, 54.7, 8.6, 31.5, 1.14, 1.81, 0.83),
    "GPT-5.4-nano": (76.9, 39.2, 0.0, 2.8, 52.2, 0.3, 9.9, 1.07, 1.28, 0.82),
    "Gemini-3.1-pro": (90.0, 53.5, 8.1, 11.7, 57.1, 10.9, 35.3, 1.59, 1.75, 0.81),
    "Gemini-3.1-flash": (87.1, 47.9, 1.0, 4.9, 52.7, 1.3, 15.6, 1.35, 1.62, 0.79),
    "Qwen3.6-27B": (92.2, 48.6, 0.4, 7.3, 50.6, 2.9, 16.0, 1.09, 2.02, 0.85),
    "Qwen3.5-122B": (91.3, 44.3, 0.0, 9.8, 48.9, 2.0, 25.7, 1.15, 1.79, 0.92),
    "GLM-4.6V": (69.3, 31.9, 0.0, 3.3, 50.0, 1.3, 17.4, 0.64, 1.45, 0.8),
    "InternVL3.5-38B": (89.5, 37.1, 0.0, 6.8, 37.1, 0.1, 16.8, 1.04, 1.85, 0.75),
    "Gemma4-31B": (88.5, 52.7, 1.7, 7.6, 55.3, 2.0, 28.7, 1.65, 1.51, 0.74),
    "MedGemma-27B": (76.8, 36.6, 0.0, 1.8, 50.9, 0.1, 4.0, 0.76, 1.45, 0.86),
    "MedGemma1.5-4B": (66.8, 49.3, 0.0, 0.1, 49.3, 0.0, 0.8, 1.84, 1.17, 0.0),
    "HuatuoGPT-Vision-7B": (66.3, 31.9, 0.0, 0.3, 49.6, 0.0, 1.1, 0.88, 1.04, 0.74),
    "Lingshu-32B": (89.9, 44.0, 0.0, 4.5, 48.4, 0.0, 7.8, 0.98, 1.83, 0.91),
    "Hulu-Med-32B": (91.4, 46.8, 0.0, 1.7, 50.2, 0.0, 4.6, 1.41, 1.46, 0.89),
}
# Table 2's bracketed gains of Oracle-Passed over End-to-End: S2 S3 S4
GAINS = {
    "GPT-5.4": (8.4, 6.0, 18.1),
    "GPT-5.4-nano": (13.0, 0.3, 7.1),
    "Gemini-3.1-pro": (3.6, 2.7, 23.7),
    "Gemini-3.1-flash": (4.9, 0.3, 10.7),
    "Qwen3.6-27B": (2.0, 2.4, 8.7),
    "Qwen3.5-122B": (4.6, 2.0, 15.8),
    "GLM-4.6V": (18.1, 1.3, 14.1),
    "InternVL3.5-38B": (0.0, 0.1, 10.0),
    "Gemma4-31B": (2.6, 0.3, 21.1),
    "MedGemma-27B": (14.3, 0.1, 2.2),
    "MedGemma1.5-4B": (0.0, 0.0, 0.8),
    "HuatuoGPT-Vision-7B": (17.8, 0.0, 0.8),
    "Lingshu-32B": (4.4, 0.0, 3.3),
    "Hulu-Med-32B": (3.4, 0.0, 2.9),
}
# Table 8: RR (S1, E2E S2 S3 S4, OP S2 S3 S4), RF (S1, E2E S2 S4, OP S2 S4), LF S1
TABLE8 = {
    "GPT-5.4": ((85.0, 25.1, 2.6, 1.3, 32.4, 8.6, 30.5), (84.4, 67.6, 25.5, 77.0, 32.5), 83.4),
    "GPT-5.4-nano": ((73.6, 33.4, 0.0, 0.0, 48.6, 0.3, 10.0), (75.3, 45.0, 5.7, 55.9, 9.8), 81.9),
    "Gemini-3.1-pro": ((95.3, 52.1, 8.1, 3.2, 53.0, 10.9, 29.7), (93.1, 54.9, 20.2, 61.1, 41.0), 81.4),
    "Gemini-3.1-flash": ((89.9, 44.1, 1.0, 0.0, 48.7, 1.3, 12.3), (92.6, 51.6, 9.8, 56.7, 18.8), 79.0),
    "Qwen3.6-27B": ((96.1, 12.3, 0.4, 0.0, 12.9, 2.9, 15.7), (95.7, 84.9, 14.7, 88.3, 16.3), 84.7),
    "Qwen3.5-122B": ((91.1, 24.1, 0.0, 0.0, 26.4, 2.0, 24.2), (90.6, 64.4, 19.7, 71.4, 27.2), 92.3),
    "GLM-4.6V": ((64.0, 0.0, 0.0, 0.0, 0.0, 1.3, 17.2), (63.9, 63.9, 6.7, 100.0, 17.7), 80.1),
    "InternVL3.5-38B": ((95.9, 8.1, 0.0, 0.0, 8.1, 0.1, 13.3), (97.1, 66.0, 13.5, 66.0, 20.2), 75.4),
    "Gemma4-31B": ((96.3, 67.1, 1.7, 0.3, 67.4, 2.0, 24.8), (94.9, 38.3, 14.8, 43.1, 32.5), 74.3),
    "MedGemma-27B": ((72.3, 3.9, 0.0, 0.0, 9.3, 0.1, 3.8), (72.0, 69.3, 3.7, 92.4, 4.2), 86.1),
    "MedGemma1.5-4B": ((100.0, 83.7, 0.0, 0.0, 83.7, 0.0, 0.5), (100.0, 14.9, 0.2, 14.9, 1.2), 0.4),
    "HuatuoGPT-Vision-7B": ((62.7, 24.9, 0.0, 0.0, 43.4, 0.0, 1.2), (62.7, 38.9, 0.7, 55.9, 1.0), 73.6),
    "Lingshu-32B": ((89.1, 8.7, 0.0, 0.0, 11.1, 0.0, 5.0), (89.0, 79.3, 9.0, 85.7, 10.7), 91.4),
    "Hulu-Med-32B": ((93.1, 47.7, 0.0, 0.0, 51.3, 0.0, 3.7), (91.9, 45.9, 3.3, 49.1, 5.5), 89.1),
}
# Table 10: RR yes no etc, RF yes no etc, Delta, Acc.
TABLE10 = {
    "GPT-5.4": (32.4, 67.6, 0.0, 23.0, 77.0, 0.0, 9.4, 54.7),
    "GPT-5.4-nano": (48.6, 51.4, 0.0, 44.1, 55.9, 0.0, 4.4, 52.2),
    "Gemini-3.1-pro": (53.0, 47.0, 0.0, 38.9, 61.1, 0.0, 14.1, 57.1),
    "Gemini-3.1-flash": (48.7, 51.3, 0.0, 43.3, 56.7, 0.0, 5.4, 52.7),
    "Qwen3.6-27B": (12.9, 87.1, 0.0, 11.7, 88.3, 0.0, 1.1, 50.6),
    "Qwen3.5-122B": (26.4, 73.6, 0.0, 28.6, 71.4, 0.0, -2.1, 48.9),
    "GLM-4.6V": (0.0, 100.0, 0.0, 0.0, 100.0, 0.0, 0.0, 50.0),
    "InternVL3.5-38B": (8.1, 65.3, 26.6, 9.6, 66.0, 24.4, -1.4, 37.1),
    "Gemma4-31B": (67.4, 32.6, 0.0, 56.9, 43.1, 0.0, 10.6, 55.3),
    "MedGemma-27B": (9.3, 90.7, 0.0, 7.4, 92.4, 0.1, 1.9, 50.9),
    "MedGemma1.5-4B": (83.7, 16.3, 0.0, 85.1, 14.9, 0.0, -1.4, 49.3),
    "HuatuoGPT-Vision-7B": (43.4, 56.6, 0.0, 44.1, 55.9, 0.0, -0.7, 49.6),
    "Lingshu-32B": (11.1, 88.9, 0.0, 14.3, 85.7, 0.0, -3.1, 48.4),
    "Hulu-Med-32B": (51.3, 48.7, 0.0, 50.9, 49.1, 0.0, 0.4, 50.2),
}
PER_CELL = 100
OTHER_LESIONS = [name for name in LESIONS if name != CARDIOMEGALY]
# one rounded published figure is within half a unit of the value it rounds
HALF = 0.05 + 1e-9


def _simulate_path(path, e2e, op, stage2_split, model):
    """Records of one path: e2e/op map stage -> published %, stage2_split = (etc %, other wrong answer)."""
    n = 7 * PER_CELL
    cardio = [i % 7 == 6 for i in range(n)]  # 100 cardiomegaly cases, interleaved
    stages = {"RR": (1, 2, 3, 4), "RF": (1, 2, 4), "LF": (1,)}[path]
    chain = set(range(n))  # cases that passed every earlier stage End-to-End
    passed, e2e_sets = {}, {}
    for k in stages:
        members = [i for i in range(n) if not (k == 4 and cardio[i])]
        in_chain = [i for i in members if i in chain]
        e_k = round(e2e[k] * len(members) / 100)
        o_k = round(op.get(k, e2e[k]) * len(members) / 100)
        outside = [i for i in members if i not in chain]
        assert e_k <= len(in_chain) and o_k - e_k <= len(outside), (model, path, k)
        e2e_sets[k] = set(in_chain[:e_k])
        passed[k] = e2e_sets[k] | set(outside[: o_k - e_k])
        chain = e2e_sets[k]
    etc_count = round(stage2_split[0] * n / 100)
    wrong_stage2 = [i for i in range(n) if 2 in stages and i not in passed[2]]
    etc_cases = set(wrong_stage2[:etc_count])
    records = []
    for i in range(n):
        lesion = CARDIOMEGALY if cardio[i] else OTHER_LESIONS[i % len(OTHER_LESIONS)]
        answers = {"detection": i in passed[1]}
        if 2 in stages:
            answers["contour_eval"] = (
                True if i in passed[2] else ("Answer: No" if i in etc_cases else stage2_split[1])
            )
        if 3 in stages and i not in passed[3]:
            answers[STAGE3_TASKS[i % 3]] = False
        if 4 in stages and not cardio[i] and i not in passed[4]:
            answers[STAGE4_TASKS[i % 4]] = False
        records.append(
            hand_record(lesion, path, answers, key_id=f"{lesion}_s{i:05d}_{path}", oracle="implicit")
        )
    last = 3 if path == "RR" else 2
    bonus = sum(1 for i in range(n) if cardio[i] and path != "LF" and i in e2e_sets[last])
    depth = (sum(len(s) for s in e2e_sets.values()) + bonus) / n
    return records, depth


def _simulate(model):
    rr, rf, lf = TABLE8[model]
    t10 = TABLE10[model]
    rr_records, rr_depth = _simulate_path(
        "RR",
        {1: rr[0], 2: rr[1], 3: rr[2], 4: rr[3]},
        {2: rr[4], 3: rr[5], 4: rr[6]},
        (t10[2], "Answer: 2"),  # RR wrong answers: etc, else "No" (option 2)
        model,
    )
    rf_records, rf_depth = _simulate_path(
        "RF", {1: rf[0], 2: rf[1], 4: rf[2]}, {2: rf[3], 4: rf[4]}, (t10[5], "Answer: 1"), model
    )
    lf_records, lf_depth = _simulate_path("LF", {1: lf}, {}, (0.0, ""), model)
    run = run_from_records(rr_records + rf_records + lf_records, oracle="implicit", greedy=True, model=model)
    return score_model([run], name=model), {"RR": rr_depth, "RF": rf_depth, "LF": lf_depth}


def _pct(value):
    return 100 * value


@pytest.mark.parametrize("model", list(TABLE2))
def test_published_rates_reproduce_the_paper_arithmetic(model):
    report, depth = _simulate(model)
    v = report.values
    rr, rf, lf = TABLE8[model]
    t2, gains, t10 = TABLE2[model], GAINS[model], TABLE10[model]
    assert report.sources["e2e"].exact and "greedy" in report.sources["e2e"].description

    # Table 8 back, cell for cell
    table8 = {
        "RR": dict(
            zip(
                [
                    "e2e/stage1",
                    "e2e/stage2",
                    "e2e/stage3",
                    "e2e/stage4",
                    "op/stage2",
                    "op/stage3",
                    "op/stage4",
                ],
                rr,
            )
        ),
        "RF": dict(zip(["e2e/stage1", "e2e/stage2", "e2e/stage4", "op/stage2", "op/stage4"], rf)),
        "LF": {"e2e/stage1": lf},
    }
    for path, cells in table8.items():
        for key, published in cells.items():
            assert abs(_pct(v[f"{key}/{path}"]) - published) <= HALF, (path, key)

    # Table 2 = means of Table 8 over the paths asking each stage (S1: RR RF LF; S2, S4: RR RF; S3: RR)
    keys = ["e2e/stage1", "e2e/stage2", "e2e/stage3", "e2e/stage4", "op/stage2", "op/stage3", "op/stage4"]
    for key, published in zip(keys, t2[:7]):
        assert abs(_pct(v[f"{key}/all"]) - published) <= HALF, key
    assert v["e2e/stage1/all"] == pytest.approx(
        (v["e2e/stage1/RR"] + v["e2e/stage1/RF"] + v["e2e/stage1/LF"]) / 3
    )
    for k in (2, 4):
        for setting in ("e2e", "op"):
            mean = (v[f"{setting}/stage{k}/RR"] + v[f"{setting}/stage{k}/RF"]) / 2
            assert v[f"{setting}/stage{k}/all"] == pytest.approx(mean)
    for k, published in zip((2, 3, 4), gains):
        assert abs(_pct(v[f"gain/stage{k}"]) - published) <= 2 * HALF, k

    # Table 10 rates back; Acc. = (RR yes + RF no) / 2 = Table 2's Oracle-Passed S2
    t10_keys = [f"bias/stage2/{p}/{c}" for p in ("RR", "RF") for c in ("yes", "no", "etc")]
    for key, published in zip(t10_keys, t10[:6]):
        assert abs(_pct(v[key]) - published) <= HALF, key
    assert abs(_pct(v["bias/stage2/delta"]) - t10[6]) <= 2 * HALF
    acc = v["bias/stage2/accuracy"]
    assert acc == pytest.approx((v["bias/stage2/RR/yes"] + v["bias/stage2/RF/no"]) / 2)
    assert acc == v["op/stage2/all"]
    assert abs(_pct(acc) - t10[7]) <= HALF and abs(_pct(acc) - t2[4]) <= HALF

    # End-to-End never exceeds Oracle-Passed
    for k in (2, 3, 4):
        for p in ("RR", "RF", "all"):
            e, o = v[f"e2e/stage{k}/{p}"], v[f"op/stage{k}/{p}"]
            assert (e is None) == (o is None) and (e is None or e <= o + 1e-12), (k, p)

    # depth: the gated booleans with the cardiomegaly +1; LF depth is LF Stage 1
    for p in ("RR", "RF", "LF"):
        assert v[f"depth/{p}"] == pytest.approx(depth[p])
    assert v["depth/LF"] == v["e2e/stage1/LF"]
    assert abs(v["depth/LF"] - t2[9]) <= 0.005 + 1e-9
