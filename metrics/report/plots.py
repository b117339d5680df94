"""The report's figures (PNG, dpi 150): the reference's four plots (spec 4.4) and a per-lesion heatmap.

Each function takes plain numbers (fractions in [0, 1], or None where a cell does not apply) and writes
one PNG. File names and titles follow the reference; unlike the reference, a cell that does not apply
reads N/A instead of 0.0, and colours follow metrics/report/style.py (one colour per meaning).
matplotlib is imported only here, and only when a figure is drawn (it is in the ``report`` extra);
figures are drawn on their own canvas, so no pyplot state or backend is touched.

Every function draws any non-empty count (one model, one lesion, one route, one case; values that are
all N/A are drawn as N/A, as the reference draws them) and raises ``NothingToPlot`` when there is
nothing to draw (no model, no route, no lesion with a value): its message is the sentence the report
shows in the figure's place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.fileio import atomic_file
from chexpercept.vocab import STAGE3_TASKS, STAGE4_TASKS

from . import style

DPI = 150
STAGE_ACCURACY_PNG = "plot_stage_accuracy.png"
CONTOUR_REVISION_PNG = "plot_contour_revision_detail.png"
ATTRIBUTE_EXTRACTION_PNG = "plot_attribute_extraction_detail.png"
DEPTH_HEATMAP_PNG = "plot_depth_heatmap.png"
LESION_HEATMAP_PNG = "plot_lesion_heatmap.png"

Value = float | None


class NothingToPlot(ValueError):
    """A figure with nothing to draw; the message is the sentence shown instead of it."""


def _require(items: Sequence[Any], sentence: str) -> None:
    """NothingToPlot(``sentence``) when there is nothing to draw (no model, route or lesion); one is
    enough, and values that are all N/A are drawn as N/A (the reference draws them too)."""
    if not items:
        raise NothingToPlot(sentence)


def _private_matplotlib_folders() -> None:
    """matplotlib's settings and font-cache folder, where the user named none (``MPLCONFIGDIR``): a
    folder of the toolkit's private cache (``chexpercept.file_digest.cache_dir``), this account's
    alone. matplotlib makes ``~/.config/matplotlib`` and ``~/.cache/matplotlib`` under the umask (0777
    under umask 000): a settings file another account planted there made the next report fail (red
    team, stop 48). Called before matplotlib is first imported."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return
    from chexpercept.file_digest import cache_dir
    from chexpercept.fileio import PrivacyError, private_dir

    folder = cache_dir() / "matplotlib"
    try:  # the toolkit's cache folder and this one must be this account's (a refusal says so)
        private_dir(folder.parent, own=True)
        private_dir(folder, own=True)
    except PrivacyError:
        raise
    except OSError:  # no cache folder can be made (a read-only home): matplotlib's own place
        return
    os.environ["MPLCONFIGDIR"] = str(folder)


def _figure(width: float, height: float) -> Any:
    _private_matplotlib_folders()
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the report's figures need matplotlib: pip install 'chexpercept[report]' (or pass --no-plots)"
        ) from e
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(fig: Any, path: str | os.PathLike[str]) -> FsPath:
    path = FsPath(path)
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=DPI, facecolor="white")
    return path


def _pct(v: Value) -> str:
    return "N/A" if v is None else f"{100 * v:.1f}"


def plot_stage_accuracy(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, oracle: str
) -> FsPath:
    """Table figure, one panel per route; rows are the summary CSV's rows (model x setting).

    rows: dicts with ``path`` (RR/RF/LF), ``model``, ``setting`` (``e2e``/``op``), ``stage1``..``stage4``
    and ``depth`` (fractions, None for N/A). Rows are tinted by setting: every E2E row blue, every
    Oracle-Passed row orange (the reference tinted by row parity).
    """
    routes = [p for p in ("RR", "RF", "LF") if any(r["path"] == p for r in rows)]
    _require(routes, "No stage accuracy to plot: no path has a scored case in these runs.")
    n_rows = max((sum(1 for r in rows if r["path"] == p) for p in routes), default=1)
    fig = _figure(11, 0.9 + len(routes) * (0.55 + 0.28 * (n_rows + 1)))
    axes = fig.subplots(len(routes), 1, squeeze=False)[:, 0]
    columns = ["Model", "Setting", *[style.STAGE_TITLES[k] for k in (1, 2, 3, 4)], "Depth"]
    for ax, route in zip(axes, routes):
        ax.axis("off")
        ax.set_title(style.PATH_TITLES[route], fontsize=11, fontweight="bold", loc="left")
        chosen = sorted(
            (r for r in rows if r["path"] == route), key=lambda r: (r["model"], r["setting"] != "e2e")
        )
        cells = [
            [
                r["model"],
                style.SETTING_LABELS[r["setting"]],
                *[_pct(r[f"stage{k}"]) for k in (1, 2, 3, 4)],
                "N/A" if r["depth"] is None else f"{r['depth']:.2f}",
            ]
            for r in chosen
        ]
        # column widths from the longest text (measuring every cell's extent is slow)
        longest = [max(len(str(c)) for c in col) + 3 for col in zip(columns, *cells)]
        widths = [n / sum(longest) for n in longest]
        table = ax.table(
            cellText=cells or [[""] * len(columns)], colLabels=columns, colWidths=widths, loc="upper center"
        )
        table.auto_set_font_size(False)
        table.set_fontsize(8.5)
        table.scale(1, 1.3)
        for (i, _j), cell in table.get_celld().items():
            if i == 0:
                cell.set_facecolor(style.HEADER_COLOR)
                cell.set_text_props(color=style.HEADER_TEXT, fontweight="bold")
                continue
            if i - 1 >= len(chosen):
                continue
            text = cell.get_text().get_text()
            if text == "N/A":
                cell.set_facecolor(style.NA_COLOR)
                cell.get_text().set_color("#777777")
            else:
                cell.set_facecolor(style.SETTING_TINTS[chosen[i - 1]["setting"]])
    fig.suptitle(f"Stage Accuracy by Model  [oracle: {oracle}]", fontsize=13, fontweight="bold")
    return _save(fig, path)


def _tick_style(labels: Sequence[str], angle: int) -> dict[str, Any]:
    """Tilt the x labels when they would run into each other (many models, or long names)."""
    if len(labels) > 4 or max((len(label) for label in labels), default=0) > 9:
        return {"rotation": angle, "ha": "right", "rotation_mode": "anchor"}
    return {"rotation": 0, "ha": "center"}


def _grouped_bars(
    values: Mapping[str, Mapping[str, Value]],
    tasks: Sequence[str],
    title: str,
    path: str | os.PathLike[str],
) -> FsPath:
    models = list(values)
    _require(models, f"Nothing to plot for the {title.split(' (')[0].lower()}: no model was scored.")
    fig = _figure(max(6.0, 1.2 + 0.55 * len(tasks) * max(1, len(models))), 4.6)
    ax = fig.subplots()
    width = 0.8 / len(tasks)
    for j, task in enumerate(tasks):
        xs = [i + (j - (len(tasks) - 1) / 2) * width for i in range(len(models))]
        ys = [values[m].get(task) for m in models]
        heights = [0.0 if y is None else 100 * y for y in ys]
        bars = ax.bar(xs, heights, width, label=style.SUBTASK_LABELS[task], color=style.SUBTASK_COLORS[task])
        for bar, y in zip(bars, ys):
            ax.annotate(
                "N/A" if y is None else f"{100 * y:.1f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(models)), models, **_tick_style(models, 20))
    ax.set_ylim(0, 110)
    ax.set_ylabel("Accuracy (%)")
    ax.set_xlabel("Model")
    ax.set_title(title, fontsize=12, fontweight="bold")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=len(tasks), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return _save(fig, path)


def plot_contour_revision_detail(
    values: Mapping[str, Mapping[str, Value]], path: str | os.PathLike[str]
) -> FsPath:
    """Grouped bars per model: expansion, contraction, revision-result accuracy (Oracle-Passed, RR)."""
    return _grouped_bars(
        values,
        STAGE3_TASKS,
        "Contour Revision Detail (oracle-passed)",
        path,
    )


def plot_attribute_extraction_detail(
    values: Mapping[str, Mapping[str, Value]], path: str | os.PathLike[str]
) -> FsPath:
    """Grouped bars per model: distribution, location, severity, comparison (Oracle-Passed, RR+RF)."""
    return _grouped_bars(
        values,
        STAGE4_TASKS,
        "Attribute Extraction Detail (oracle-passed)",
        path,
    )


def _heatmap(
    ax: Any,
    matrix: Sequence[Sequence[Value]],
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    cmap: str,
    vmax: float,
    fmt: str,
    scale: float = 1.0,
) -> Any:
    import numpy as np

    data = np.array([[np.nan if v is None else v * scale for v in row] for row in matrix], dtype=float)
    masked = np.ma.masked_invalid(data)
    colormap = _cmap(cmap)
    image = ax.imshow(masked, cmap=colormap, vmin=0, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, **_tick_style(cols, 30))
    ax.set_yticks(range(len(rows)), rows)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = data[i, j]
            if np.isnan(v):
                text, color = "N/A", "#666666"
            else:
                text = format(v, fmt)
                r, g, b, _ = colormap(min(1.0, v / vmax) if vmax else 0.0)
                color = "white" if (0.299 * r + 0.587 * g + 0.114 * b) < 0.5 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    return image


def _cmap(name: str) -> Any:
    from matplotlib import colormaps

    return colormaps[name].with_extremes(bad=style.NA_COLOR)


def plot_depth_heatmap(values: Mapping[str, Mapping[str, Value]], path: str | os.PathLike[str]) -> FsPath:
    """Mean End-to-End depth, routes (RR, RF, LF) x models; values are depths (not fractions)."""
    models = list(values)
    routes = ["RR", "RF", "LF"]
    _require(models, "No mean depth to plot: no model was scored.")
    fig = _figure(max(5.0, 1.8 + 1.0 * len(models)), 3.4)
    ax = fig.subplots()
    matrix = [[values[m].get(r) for m in models] for r in routes]
    image = _heatmap(
        ax,
        matrix,
        [f"{r} (0-{4 if r == 'RR' else 3 if r == 'RF' else 1})" for r in routes],
        models,
        cmap=style.DEPTH_CMAP,
        vmax=4.0,
        fmt=".2f",
    )
    fig.colorbar(image, ax=ax, label="Mean depth (stages passed)")
    ax.set_xlabel("Model")
    ax.set_ylabel("QA path")
    ax.set_title("Avg. Depth (end-to-end) per Model × QA-Path", fontsize=12, fontweight="bold")
    return _save(fig, path)


#: the per-lesion heatmap's panels: (key in the values, panel title)
LESION_PANELS: tuple[tuple[str, str], ...] = (
    ("stage1", "Stage 1 (Detection)"),
    ("op/stage2", "Stage 2 (Contour Eval), OP"),
    ("op/stage3", "Stage 3 (Revision), OP"),
    ("op/stage4", "Stage 4 (Attribute), OP"),
)


def plot_lesion_heatmap(
    values: Mapping[str, Mapping[str, Mapping[str, Value]]],
    path: str | os.PathLike[str],
    *,
    panels: Sequence[tuple[str, str]] = LESION_PANELS,
    title: str = "Stage Accuracy per Lesion × Model",
) -> FsPath:
    """Accuracy (%) per lesion (rows) and model (columns), one panel per stage.

    values: ``{model: {lesion: {panel key: fraction or None}}}``.
    """
    models = list(values)
    lesions = sorted({lesion for per_model in values.values() for lesion in per_model})
    _require(
        [lesion for lesion in lesions if models],
        "No per-lesion accuracy to plot: no lesion has a scored value in these runs.",
    )
    cols = 2 if len(panels) > 1 else 1
    n_rows = (len(panels) + cols - 1) // cols
    fig = _figure(cols * max(4.2, 1.8 + 0.9 * len(models)), n_rows * (1.0 + 0.38 * len(lesions)) + 0.6)
    axes = fig.subplots(n_rows, cols, squeeze=False).ravel()
    image = None
    for ax, (key, panel_title) in zip(axes, panels):
        matrix = [[values[m].get(lesion, {}).get(key) for m in models] for lesion in lesions]
        image = _heatmap(
            ax, matrix, lesions, models, cmap=style.ACCURACY_CMAP, vmax=100.0, fmt=".1f", scale=100
        )
        ax.set_title(panel_title, fontsize=10, fontweight="bold")
        ax.set_xlabel("Model")
        ax.set_ylabel("Lesion")
    for ax in axes[len(panels) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=list(axes[: len(panels)]), label="Accuracy (%)", shrink=0.8)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return _save(fig, path)
