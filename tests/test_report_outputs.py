"""Reference-compatible CSVs and the report's figures, from hand-made score values."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from chexpercept.metrics.report import plots, style
from chexpercept.metrics.report.reference_csv import write_all_models_csvs, write_run_csvs
from chexpercept.vocab import LESIONS


def _flat(s1: float, s2: float, depth_rr: float) -> dict[str, float | None]:
    """A flat metric dict as the metric library writes it (None where a cell does not apply)."""
    flat: dict[str, float | None] = {}
    for p in ("RR", "RF", "LF", "all"):
        flat[f"e2e/stage1/{p}"] = s1
    for setting, bonus in (("e2e", 0.0), ("op", 0.1)):
        for p in ("RR", "RF", "all"):
            flat[f"{setting}/stage2/{p}"] = s2 + bonus
            flat[f"{setting}/stage4/{p}"] = 0.25 + bonus
        flat[f"{setting}/stage2/LF"] = None
        flat[f"{setting}/stage4/LF"] = None
        flat[f"{setting}/stage3/RR"] = flat[f"{setting}/stage3/all"] = 0.05 + bonus
        flat[f"{setting}/stage3/RF"] = flat[f"{setting}/stage3/LF"] = None
    flat.update({"depth/RR": depth_rr, "depth/RF": 1.5, "depth/LF": s1})
    flat.update({f"sub/{t}": 0.1 * (i + 1) for i, t in enumerate(style.SUBTASK_COLORS)})
    return flat


def _read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_run_csvs_have_the_reference_names_columns_and_rows(tmp_path):
    folder = tmp_path / "tiny" / "oracle_implicit"
    written = write_run_csvs(folder, "tiny", _flat(0.9, 0.5, 2.25))
    assert [p.name for p in written] == [
        "model_performance_summary.csv",
        "model_performance_detail_contour_revision.csv",
        "model_performance_detail_attribute_extraction.csv",
    ]
    summary = _read(written[0])
    assert summary[0] == [
        "path", "model", "setting", "acc(stage1)", "acc(stage2)", "acc(stage3)", "acc(stage4)", "depth",
    ]  # fmt: skip
    assert [(r[0], r[2]) for r in summary[1:]] == [
        ("revision_required", "end_to_end"),
        ("revision_required", "oracle_passed"),
        ("revision_free", "end_to_end"),
        ("revision_free", "oracle_passed"),
        ("lesion_free", "end_to_end"),
        ("lesion_free", "oracle_passed"),
    ]
    assert summary[1] == ["revision_required", "tiny", "end_to_end", "0.9", "0.5", "0.05", "0.25", "2.25"]
    assert summary[2] == [
        "revision_required",
        "tiny",
        "oracle_passed",
        "0.9",
        "0.6",
        "0.15000000000000002",
        "0.35",
        "2.25",
    ]
    assert summary[3][5] == "" and summary[5][4:7] == ["", "", ""]  # RF Stage 3, LF Stages 2-4: N/A
    assert _read(written[1]) == [
        ["path", "model", "acc(expansion)", "acc(contraction)", "acc(revision_result)"],
        ["revision_required", "tiny", "0.1", "0.2", "0.30000000000000004"],
    ]
    assert _read(written[2]) == [
        [
            "path",
            "model",
            "acc(distribution)",
            "acc(location)",
            "acc(severity/measurement)",
            "acc(comparison)",
        ],
        ["revision_required+revision_free", "tiny", "0.4", "0.5", "0.6000000000000001", "0.7000000000000001"],
    ]


def test_na_as_zero_reproduces_the_reference_zeros(tmp_path):
    (summary, *_) = write_run_csvs(tmp_path, "tiny", _flat(0.9, 0.5, 2.0), na_as_zero=True)
    rows = _read(summary)
    assert rows[5][4:7] == ["0.0", "0.0", "0.0"]


def test_all_models_csvs_stack_the_models(tmp_path):
    flats = {"a": _flat(0.9, 0.5, 2.0), "b": _flat(0.6, 0.4, 1.0)}
    written = write_all_models_csvs(tmp_path / "all_models_oracle_implicit", flats)
    assert [p.name for p in written] == [
        "all_models_summary.csv",
        "all_models_contour_revision_detail.csv",
        "all_models_attribute_extraction_detail.csv",
    ]
    summary = _read(written[0])
    assert len(summary) == 1 + 2 * 6 and [r[1] for r in summary[1:]] == ["a"] * 6 + ["b"] * 6
    assert [r[1] for r in _read(written[1])[1:]] == ["a", "b"]


def _colours(path) -> set[tuple[int, int, int]]:
    arr = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3).astype(np.uint32)
    packed = np.unique((arr[:, 0] << 16) | (arr[:, 1] << 8) | arr[:, 2])
    return {(int(v >> 16), int((v >> 8) & 255), int(v & 255)) for v in packed}


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def test_palette_gives_each_meaning_its_own_colour():
    colours = [
        *style.SETTING_COLORS.values(),
        *style.SUBTASK_COLORS.values(),
        style.CORRECT_COLOR,
        style.WRONG_COLOR,
        style.NA_COLOR,
        style.HEADER_COLOR,
    ]
    assert len({c.lower() for c in colours}) == len(colours)
    assert style.ACCURACY_CMAP != style.DEPTH_CMAP
    css = style.css_variables()
    assert "--e2e: #0072B2;" in css and "--sub-revision-result: #009E73;" in css


def test_figures_are_written_with_their_meanings_colours(tmp_path):
    models = ["oracle", "steady", "guesser"]
    revision = {
        m: {"expansion": 0.5, "contraction": 0.4, "revision_result": None if m == "guesser" else 0.7}
        for m in models
    }
    attributes = {
        m: {"distribution": 0.6, "location": 0.3, "severity": 0.5, "comparison": 0.8} for m in models
    }
    rows = [
        {"path": p, "model": m, "setting": s, "stage1": 0.9, "stage2": None if p == "LF" else 0.5,
         "stage3": 0.1 if p == "RR" else None, "stage4": None if p == "LF" else 0.2, "depth": 1.2}
        for m in models for p in ("RR", "RF", "LF") for s in ("e2e", "op")
    ]  # fmt: skip
    lesion_values = {
        m: {lesion: {key: (None if (lesion == "cardiomegaly" and key == "op/stage4") else 0.5) for key, _ in plots.LESION_PANELS} for lesion in LESIONS}
        for m in models
    }  # fmt: skip
    written = {
        "table": plots.plot_stage_accuracy(rows, tmp_path / plots.STAGE_ACCURACY_PNG, oracle="implicit"),
        "revision": plots.plot_contour_revision_detail(revision, tmp_path / plots.CONTOUR_REVISION_PNG),
        "attributes": plots.plot_attribute_extraction_detail(attributes, tmp_path / plots.ATTRIBUTE_EXTRACTION_PNG),
        "depth": plots.plot_depth_heatmap({m: {"RR": 2.0, "RF": 1.0, "LF": None} for m in models}, tmp_path / plots.DEPTH_HEATMAP_PNG),
        "lesion": plots.plot_lesion_heatmap(lesion_values, tmp_path / plots.LESION_HEATMAP_PNG),
    }  # fmt: skip
    for path in written.values():
        with Image.open(path) as im:
            assert im.format == "PNG" and im.width >= 600 and im.height >= 400
    seen = {name: _colours(path) for name, path in written.items()}
    for task in ("expansion", "contraction", "revision_result"):
        assert _rgb(style.SUBTASK_COLORS[task]) in seen["revision"]
        assert _rgb(style.SUBTASK_COLORS[task]) not in seen["attributes"]
    for task in ("distribution", "location", "severity", "comparison"):
        assert _rgb(style.SUBTASK_COLORS[task]) in seen["attributes"]
        assert _rgb(style.SUBTASK_COLORS[task]) not in seen["revision"]
    assert {_rgb(style.SETTING_TINTS["e2e"]), _rgb(style.SETTING_TINTS["op"])} <= seen["table"]
    assert _rgb(style.NA_COLOR) in seen["table"] and _rgb(style.NA_COLOR) in seen["lesion"]


def test_missing_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install 'chexpercept\[report\]'"):
        plots.plot_depth_heatmap({"m": {"RR": 1.0}}, tmp_path / "x.png")


ONE_ROW = {"path": "LF", "model": "m", "setting": "e2e", "stage1": 1.0, "stage2": None, "stage3": None,
           "stage4": None, "depth": 1.0}  # fmt: skip
#: each figure with a count of one (one model, one route, one lesion, one value), and with nothing
FIGURES = {
    "stage accuracy": (lambda p: plots.plot_stage_accuracy([ONE_ROW], p, oracle="none"),
                       lambda p: plots.plot_stage_accuracy([], p, oracle="none"), "No stage accuracy"),
    "revision": (lambda p: plots.plot_contour_revision_detail({"m": {"expansion": 0.5}}, p),
                 lambda p: plots.plot_contour_revision_detail({}, p), "no model was scored"),
    "attributes": (lambda p: plots.plot_attribute_extraction_detail({"m": {}}, p),  # all N/A: drawn
                   lambda p: plots.plot_attribute_extraction_detail({}, p), "no model was scored"),
    "depth": (lambda p: plots.plot_depth_heatmap({"m": {"LF": 1.0}}, p),
              lambda p: plots.plot_depth_heatmap({}, p), "No mean depth"),
    "lesion": (lambda p: plots.plot_lesion_heatmap({"m": {"effusion": {"stage1": 1.0}}}, p),
               lambda p: plots.plot_lesion_heatmap({"m": {}}, p), "No per-lesion accuracy"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_figure_takes_a_count_of_one_and_says_when_it_has_nothing(name, tmp_path):
    """Red team #20: one lesion, one case or one model draws its figure; nothing to draw (the per-lesion
    heatmap of runs without lesion values crashed matplotlib with a TypeError) is a sentence instead."""
    one, none, sentence = FIGURES[name]
    with Image.open(one(tmp_path / "one.png")) as im:
        assert im.format == "PNG"
    with pytest.raises(plots.NothingToPlot, match=sentence):
        none(tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_matplotlib_keeps_its_settings_in_a_folder_of_this_account_alone(tmp_path):
    """Red team, stop 48: under umask 000 the report's matplotlib made ~/.config/matplotlib and
    ~/.cache/matplotlib 0777; a settings file another account planted there made the next report
    fail. matplotlib's folder is now one of the toolkit's private cache (0700), unless the user named
    one (MPLCONFIGDIR)."""
    import os
    import subprocess
    import sys

    code = (
        "import os; os.umask(0); from chexpercept.metrics.report.plots import _figure; _figure(1, 1); "
        "import matplotlib; matplotlib.get_cachedir(); print(os.environ['MPLCONFIGDIR'])"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "CHEXPERCEPT_CACHE")
    }
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = done.stdout.strip().splitlines()[-1]
    assert folder == str(tmp_path / ".cache" / "chexpercept" / "matplotlib")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert (
        not (tmp_path / ".config" / "matplotlib").exists()
        and not (tmp_path / ".cache" / "matplotlib").exists()
    )
    if os.geteuid() == 0:  # round 2 (helper-54): another account's cache folder is refused, never used
        other = tmp_path / "other-home"
        (other / ".cache" / "chexpercept").mkdir(parents=True)
        os.chown(other / ".cache" / "chexpercept", 65534, 65534)
        refused = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "HOME": str(other)},
            timeout=120,
        )
        assert refused.returncode != 0 and "PrivacyError" in refused.stderr, refused.stderr[-2000:]
