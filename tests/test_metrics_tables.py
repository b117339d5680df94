"""Table rendering: the paper's layouts in markdown and CSV, N/A cells, gains, intervals."""

import csv
import io

import pytest

from chexpercept.metrics import render_table, run_from_records, score_model, table2_row
from chexpercept.metrics.simulate import hand_record

# Table 2 and Table 10 rows of GPT-5.4 and Qwen3.5-122B as printed in the paper (spec/paper.md)
PAPER_T2 = {
    "GPT-5.4": "| GPT-5.4 | 84.3 | 46.4 | 2.6 | 13.4 | 54.7 (+8.4) | 8.6 (+6.0) | 31.5 (+18.1) | 1.14 | 1.81 | 0.83 |",
}
PAPER_T10 = {
    "GPT-5.4": "| GPT-5.4 | 32.4 | 67.6 | 0.0 | 23.0 | 77.0 | 0.0 | +9.4 | 54.7 |",
    "Qwen3.5-122B": "| Qwen3.5-122B | 26.4 | 73.6 | 0.0 | 28.6 | 71.4 | 0.0 | -2.1 | 48.9 |",
}


def _values(**pct):
    return {k.replace("__", "/"): v / 100 for k, v in pct.items()}


GPT = {
    **_values(
        e2e__stage1__all=84.3,
        e2e__stage2__all=46.4,
        e2e__stage3__all=2.6,
        e2e__stage4__all=13.4,
        op__stage2__all=54.7,
        op__stage3__all=8.6,
        op__stage4__all=31.5,
        gain__stage2=8.4,
        gain__stage3=6.0,
        gain__stage4=18.1,
    ),
    "depth/RR": 1.14,
    "depth/RF": 1.81,
    "depth/LF": 0.83,
    **_values(
        bias__stage2__RR__yes=32.4,
        bias__stage2__RR__no=67.6,
        bias__stage2__RR__etc=0.0,
        bias__stage2__RF__yes=23.0,
        bias__stage2__RF__no=77.0,
        bias__stage2__RF__etc=0.0,
        bias__stage2__delta=9.4,
        bias__stage2__accuracy=54.7,
    ),
}
QWEN = _values(
    bias__stage2__RR__yes=26.4,
    bias__stage2__RR__no=73.6,
    bias__stage2__RR__etc=0.0,
    bias__stage2__RF__yes=28.6,
    bias__stage2__RF__no=71.4,
    bias__stage2__RF__etc=0.0,
    bias__stage2__delta=-2.1,
    bias__stage2__accuracy=48.9,
)


def test_rows_look_like_the_paper():
    assert render_table("2", {"GPT-5.4": GPT}).splitlines()[-1] == PAPER_T2["GPT-5.4"]
    lines = render_table(10, {"GPT-5.4": GPT, "Qwen3.5-122B": QWEN}).splitlines()
    assert lines[-2:] == [PAPER_T10["GPT-5.4"], PAPER_T10["Qwen3.5-122B"]]
    assert lines[4] == "| Model | RR Yes | RR No | RR Etc | RF Yes | RF No | RF Etc | Delta | Acc. |"
    assert lines[2].startswith("Share of Stage 2 answers")  # the table's note says what it shows


def test_every_table_has_a_name_and_a_note_on_its_abbreviations():
    from chexpercept.metrics.tables import TABLES, table_choices

    for tid, table in TABLES.items():
        assert table.name and table.note, tid
        assert render_table(tid, {"GPT-5.4": GPT}).splitlines()[2] == table.note
        assert table.note not in render_table(tid, {"GPT-5.4": GPT}, title=False)
        assert f"{tid} {table.name}" in table_choices()
    assert "(+x): OP minus E2E of the same stage" in TABLES["2"].note


def test_na_cells_gains_and_csv():
    report = score_model(
        [run_from_records([hand_record("cardiomegaly", p) for p in ("RR", "RF", "LF")], oracle="none")],
        name="m",
    )
    md = render_table("2", report)
    row = md.splitlines()[-1]
    assert row == "| m | 100.0 | 100.0 | 100.0 | – | – | – | – | 4.00 | 3.00 | 1.00 |"
    assert table2_row(report) == row
    assert table2_row(report, "other name", header=True).splitlines()[2].startswith("| other name | 100.0")
    rows = list(csv.reader(io.StringIO(render_table("2", {"GPT": GPT}, fmt="csv"))))
    assert rows[0][5:8] == ["OP S2", "OP S2 gain", "OP S3"]
    assert rows[1][5:7] == ["54.7", "+8.4"]
    t9 = render_table("9", report, fmt="csv")
    cardio = next(r for r in csv.reader(io.StringIO(t9)) if r[1] == "Cardiomegaly")
    assert cardio[5] == "" and cardio[-3:] == ["3.00", "2.00", "1.00"]  # native depth scale


def test_intervals_in_markdown_and_csv():
    records = [
        hand_record("edema", "RR", {"contour_eval": i % 2 == 0}, key_id=f"edema_{i}_x") for i in range(8)
    ]
    report = score_model([run_from_records(records, oracle="implicit")], name="m").with_intervals(200)
    md = render_table("8", report, intervals=True).splitlines()
    rr = next(line for line in md if line.startswith("| m | RR"))
    assert rr.split(" | ")[3].startswith("50.0 [")  # E2E S2 with its interval
    rows = list(csv.reader(io.StringIO(render_table("8", report, fmt="csv", intervals=True))))
    assert rows[0][2:5] == ["S1", "S1 lo", "S1 hi"]
    lf = next(r for r in rows if r[1] == "LF")
    assert lf[2:5] == ["", "", ""]  # no LF cases: N/A and no interval


def test_unknown_table_or_format():
    with pytest.raises(ValueError, match="unknown table '5'"):
        render_table(5, {"m": GPT})
    with pytest.raises(ValueError, match="unknown format"):
        render_table(2, {"m": GPT}, fmt="html")
