"""The static HTML report: one folder, opened from disk, nothing fetched from anywhere.

``index.html`` has two tabs: a summary (leaderboard, the paper's tables, the figures, the runs) and the
case viewer (metrics/report/assets/report.js over the data written by metrics/report/cases.py). The
tables arrive as the markdown the metric library renders; this module only turns that markdown into
HTML, it does not compute or lay out any table itself.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path as FsPath

from chexpercept.escape import terminal
from chexpercept.fileio import private_dir, write_atomic

from .style import css_variables


def _escape(text: str) -> str:
    """Text for HTML: control characters shown as escapes (``chexpercept.escape.terminal``: the page is
    also read with cat and less), then ``html.escape``."""
    return html.escape(terminal(text))


ASSETS = ("report.js", "report.css")
_NA_CELLS = {"N/A", "–", "-", "—", "null", ""}
_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")
_NUMERIC = re.compile(r"^[-+]?\d")
_INTERVAL = re.compile(r"\[[-+]?\d[\d.]*, [-+]?\d[\d.]*\]")


@dataclass
class Section:
    """One block of the summary tab."""

    id: str
    title: str
    body_html: str


@dataclass
class Figure:
    """A plot in the summary tab (path relative to the report folder)."""

    src: str
    caption: str
    #: the sentence shown instead of an image when the figure had nothing to draw (``src`` is then "")
    note: str | None = None


def _inline(text: str) -> str:
    """Escape text, keeping **bold** and `code` from markdown."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_escape(text[pos : m.start()]))
        if m.group(1) is not None:
            out.append(f"<strong>{_escape(m.group(1))}</strong>")
        else:
            out.append(f"<code>{_escape(m.group(2))}</code>")
        pos = m.end()
    out.append(_escape(text[pos:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()))


def _cell_html(text: str) -> str:
    """A table cell; a trailing interval ``[lo, hi]`` is set smaller so the value stands out."""
    m = _INTERVAL.search(text)
    if not m:
        return _inline(text)
    return (
        _inline(text[: m.start()])
        + f'<span class="ci">{_escape(m.group(0))}</span>'
        + _inline(text[m.end() :])
    )


def _table_html(rows: list[list[str]]) -> str:
    head, body = rows[0], rows[1:]
    parts = ['<table class="md"><thead><tr>']
    parts += [f"<th>{_inline(c)}</th>" for c in head]
    parts.append("</tr></thead><tbody>")
    for row in body:
        group = len(row) > 1 and all(c == "" for c in row[1:])
        parts.append('<tr class="group">' if group else "<tr>")
        for i, c in enumerate(row):
            if i > 0 and c in _NA_CELLS and not group:
                cls = ' class="na"'
            elif _NUMERIC.match(c):
                cls = ' class="num"'
            else:
                cls = ""
            parts.append(f"<td{cls}>{_cell_html(c)}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def markdown_to_html(text: str) -> str:
    """Pipe tables, headings, bullet lists and paragraphs: the markdown our tables are written in."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            rows = [_cells(line)]
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append(_table_html(rows))
            continue
        heading = re.match(r"(#{1,6})\s+(.*)", line)
        if heading:
            level = min(6, len(heading.group(1)) + 2)
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
            continue
        if re.match(r"\s*[-*]\s+", line):
            items = []
            while i < len(lines) and re.match(r"\s*[-*]\s+", lines[i]):
                item = re.sub(r"^\s*[-*]\s+", "", lines[i])
                items.append(f"<li>{_inline(item)}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        para = []
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(("|", "#")):
            para.append(lines[i].strip())
            i += 1
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
        else:
            out.append(f"<p>{_inline(line)}</p>")
            i += 1
    return "\n".join(out)


def figures_html(figures: Sequence[Figure]) -> str:
    items = [
        f'<figure><p class="no-figure">{_escape(f.note)}</p><figcaption>{_escape(f.caption)}</figcaption></figure>'
        if f.note
        else f'<figure><a href="{_escape(f.src)}" target="_blank"><img src="{_escape(f.src)}" '
        f'alt="{_escape(f.caption)}"></a><figcaption>{_escape(f.caption)}</figcaption></figure>'
        for f in figures
    ]
    return '<div class="plots">' + "".join(items) + "</div>"


def copy_assets(out: FsPath) -> None:
    target = out / "assets"
    package = resources.files("chexpercept.metrics.report") / "assets"
    for name in ASSETS:
        write_atomic(target / name, (package / name).read_bytes())


def write_index_html(
    out: str | os.PathLike[str],
    *,
    title: str,
    sections: Sequence[Section],
    banners: Sequence[str] = (),
    subtitle: str = "",
) -> FsPath:
    """Write ``index.html`` and its assets into ``out``; return the page's path."""
    out = private_dir(out)
    copy_assets(out)
    banner_html = "".join(f'<div class="banner">{_inline(b)}</div>' for b in banners)
    blocks = "\n".join(
        f'<section class="block" id="{_escape(s.id)}"><h2>{_escape(s.title)}</h2>{s.body_html}</section>'
        for s in sections
    )
    page = _PAGE.format(
        title=_escape(title),
        subtitle=_escape(subtitle),
        palette=css_variables(),
        banners=banner_html,
        blocks=blocks,
        viewer=_VIEWER,
    )
    return write_atomic(out / "index.html", page)


_VIEWER = """
<div id="tab-cases" hidden>
  <div class="filters">
    <label>Model run <select id="f-run"></select></label>
    <label>Compare with <select id="f-cmp"></select></label>
    <label>Lesion <select id="f-lesion"></select></label>
    <label>Path <select id="f-path"></select></label>
    <label>First failing stage <select id="f-fail"></select></label>
    <span id="case-count"></span>
  </div>
  <div class="viewer">
    <div><ul id="case-list"></ul><button id="more" hidden>Show more</button></div>
    <div id="case-detail"><p class="meta">Choose a case on the left. The filters apply to the model
    run chosen first; "Compare with" shows a second run's answers beside it.</p></div>
  </div>
</div>
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{palette}</style>
<link rel="stylesheet" href="assets/report.css">
<script src="assets/report.js"></script>
<script src="data/index.js"></script>
</head>
<body>
<header class="top"><h1>{title}</h1><nav class="tabs"><a href="#" data-tab="summary" class="active">Summary</a><a href="#" data-tab="cases">Cases</a></nav>
<span class="meta" style="color:#ddd">{subtitle}</span></header>
<main>
{banners}
<div id="tab-summary">
{blocks}
</div>
{viewer}
</main>
</body>
</html>
"""
