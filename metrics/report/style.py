"""One colour per meaning, shared by every figure and by the HTML report.

A reader who learns that blue means End-to-End in one figure must be able to trust it in all of them,
so every plot and the report's stylesheet take their colours from here. The reference's figures reuse
the same four colours for Stage 3 and Stage 4 sub-tasks; here each sub-task has its own.
"""

from __future__ import annotations

from chexpercept.vocab import SUB_TASKS, TASK_INFO

#: the two scoring settings (bars, legends, table tints)
SETTING_COLORS: dict[str, str] = {"e2e": "#0072B2", "op": "#D55E00"}
#: light tints of the setting colours, for table rows
SETTING_TINTS: dict[str, str] = {"e2e": "#D6E4F7", "op": "#FBE3D6"}
SETTING_LABELS: dict[str, str] = {"e2e": "End-to-End", "op": "Oracle-Passed"}

#: the seven sub-tasks of Stages 3 and 4 (Okabe-Ito and Tol colours, none shared with the settings)
SUBTASK_COLORS: dict[str, str] = {t: TASK_INFO[t].color or "" for t in SUB_TASKS}
SUBTASK_LABELS: dict[str, str] = {t: TASK_INFO[t].label for t in SUB_TASKS}

#: an answer judged correct or wrong (case viewer)
CORRECT_COLOR = "#1B7837"
WRONG_COLOR = "#B2182B"
#: cells that do not apply (N/A)
NA_COLOR = "#E6E6E6"
#: table header background and text
HEADER_COLOR = "#2C3E50"
HEADER_TEXT = "#FFFFFF"

#: colormaps: accuracy (0-100 %) and depth (0-max) are different quantities, so different maps
ACCURACY_CMAP = "viridis"
DEPTH_CMAP = "YlGn"

PATH_TITLES: dict[str, str] = {"RR": "Rev. Required", "RF": "Rev. Free", "LF": "Lesion Free"}
STAGE_TITLES: dict[int, str] = {
    1: "Stage 1 (Detection)",
    2: "Stage 2 (Contour Eval)",
    3: "Stage 3 (Revision)",
    4: "Stage 4 (Attribute)",
}


def css_variables() -> str:
    """The palette as CSS custom properties, so the HTML report uses the figures' colours."""
    pairs = {
        "--e2e": SETTING_COLORS["e2e"],
        "--op": SETTING_COLORS["op"],
        "--e2e-tint": SETTING_TINTS["e2e"],
        "--op-tint": SETTING_TINTS["op"],
        "--correct": CORRECT_COLOR,
        "--wrong": WRONG_COLOR,
        "--na": NA_COLOR,
        "--header": HEADER_COLOR,
        "--header-text": HEADER_TEXT,
        **{f"--sub-{k.replace('_', '-')}": v for k, v in SUBTASK_COLORS.items()},
    }
    body = "\n".join(f"  {k}: {v};" for k, v in pairs.items())
    return f":root {{\n{body}\n}}\n"
