"""The scores dataset repo (``push-results --repo``): its dataset card and the schema of every file in it.

Files (written by ``chexpercept.metrics.hub.push_results.stage``):

- ``models/<model>/metrics.json`` (``METRICS``): the flat metrics, fractions rounded to 6 decimals;
- ``models/<model>/intervals.json`` (``INTERVALS``): the 95% intervals of every metric
  (design-based: metrics/inference.py);
- ``models/<model>/run_oracle_<setting>.json`` (``PROVENANCE``): run.json reduced to known fields;
- ``models/<model>/table<N>.md|csv``, ``tables/table<N>.md|csv`` (``table_schemas``);
- ``leaderboard.md|csv`` (``leaderboard_schemas``); ``README.md`` (``dataset_card``, ``card_schema``).

Every table shape and fixed line is read from the renderers themselves (``render_table``,
``render_leaderboard`` with no rows), so a schema cannot drift from what the stager writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from chexpercept.answers import PARSE_MODES
from chexpercept.eval.registry import BACKENDS
from chexpercept.eval.runner.provenance import PACKAGES
from chexpercept.metrics.leaderboard import CSV_COLUMNS, SETTING_KEYS, render_leaderboard
from chexpercept.results import ORACLE_SETTINGS
from chexpercept.run_metadata import ISO_TIME
from chexpercept.vocab import LESIONS, PATHS

from ..columns import FLAT_KEYS, metric_names
from ..tables import TABLES, render_table, table_rows
from .guard import (
    AGREEMENT,
    NAME_CELL,
    NUM_CELL,
    PCT_CELL,
    RANK_CELL,
    SIGNED_CELL,
    Boolean,
    Cell,
    CsvSchema,
    JsonSchema,
    ListOf,
    MapOf,
    MarkdownSchema,
    Number,
    Obj,
    TableShape,
    Text,
)
from .numbers import check_number

HEX64 = r"[0-9a-f]{64}"
HEX40 = r"[0-9a-f]{40}"
#: the toolkit's own version, as the stagers write it (chexpercept.__version__)
VERSION = r"[0-9A-Za-z.+_-]{1,40}"
#: a table number in CSV: repr of a float rounded to 6 decimals, or a formatted percentage
CSV_NUMBER = Text(pattern=r"([+-]?\d{1,8}(\.\d{1,6})?|\d(\.\d+)?e-0[5-7])?")
#: a model's name: from the registry, a baseline, or the user's label (``names``; never a run's own text)
NAME = Text(names=True)
NAME_OR_EMPTY = Text(choices=("",), names=True)
#: the backends' names, as run.json records them
BACKEND = Text(choices=BACKENDS)
#: a model revision as published: a branch called main, a commit (short or full) or a version tag
REVISION = r"main|[0-9a-f]{7,40}|v?\d{1,4}(\.\d{1,4}){0,3}"
#: a package version as run.json records it (PEP 440 releases, pre-, post- and dev releases, and the
#: local labels of accelerator builds: +cpu, +cu130, +rocm6.2, +xpu)
PACKAGE_VERSION = (
    r"\d{1,4}(\.\d{1,4}){0,3}((a|b|rc)\d{1,3})?(\.post\d{1,3})?(\.dev\d{1,3})?"
    r"(\+(cpu|xpu|cu\d{2,3}|rocm\d{1,2}(\.\d{1,2}){0,2}))?"
)

#: run.json as published: only these fields (``PROVENANCE.project(run_json)``), local paths removed
PROVENANCE = Obj(
    {
        "model": NAME,
        "display_name": NAME,
        "model_id": Text(names=True, nullable=True),
        "backend": BACKEND,
        "oracle": Text(choices=ORACLE_SETTINGS),
        "parse_mode": Text(choices=PARSE_MODES),
        "sampling": Obj(
            {
                "temperature": Number("temperature"),
                "top_p": Number("top_p"),
                "max_tokens": Number("max_tokens"),
                "greedy": Boolean(),
            }
        ),
        "seed": Number("seed"),
        "chat_template_kwargs": Obj({"enable_thinking": Boolean()}),
        "bundle": Obj(
            {
                "fingerprint": Text(pattern=HEX64, nullable=True),
                "synthetic": Boolean(),
                "n_cases": Number("n_cases"),
            }
        ),
        "selection": Obj(
            {
                "lesions": ListOf(Text(choices=LESIONS)),
                "paths": ListOf(Text(choices=[p.value for p in PATHS])),
                "per_cell": Number("per_cell"),
                "limit": Number("limit"),
                "n_selected": Number("n_selected"),
            }
        ),
        "weights": Obj(
            {
                "model_id": Text(names=True, nullable=True),
                "revision": Text(pattern=REVISION, nullable=True),
                "commit": Text(pattern=HEX40, nullable=True),
                "source": Text(choices=("local", "cache", "download"), nullable=True),
                "size_bytes": Number("size_bytes"),
            }
        ),
        "versions": MapOf(Text(choices=("python", *PACKAGES)), Text(pattern=PACKAGE_VERSION, nullable=True)),
        "git_commit": Text(pattern=f"{HEX40}(-dirty)?", nullable=True),
        "started": Text(pattern=ISO_TIME, nullable=True),
        "finished": Text(pattern=ISO_TIME, nullable=True),
        "unfinished_cases": Number("unfinished_cases"),
        "n_results": Number("n_results"),
        "batch_size": Number("batch_size"),
        "num_processes": Number("num_processes"),
    }
)

METRICS = JsonSchema(
    spec=Obj(
        {
            "model": NAME,
            "parse_mode": Text(choices=PARSE_MODES),
            "bundle_fingerprint": Text(pattern=HEX64, nullable=True),
            "sources": Obj({role: Text(choices=ORACLE_SETTINGS, nullable=True) for role in ("e2e", "op")}),
            "flat": Obj(
                {k: Number("depth" if k.startswith("depth") else "fraction") for k in FLAT_KEYS},
                required=FLAT_KEYS,
            ),
        },
        required=("model", "parse_mode", "flat"),
    )
)

INTERVALS = JsonSchema(
    spec=Obj(
        {
            "level": Number("level"),
            "n_resamples": Number("n_resamples"),
            "seed": Number("seed"),
            "stratified_by": ListOf(Text(choices=("lesion", "path"))),
            "values": MapOf(Text(choices=metric_names()), ListOf(Number("interval_bound"))),
        },
        required=("level", "n_resamples", "values"),
    )
)

PROVENANCE_FILE = JsonSchema(spec=PROVENANCE)


# ------------------------------------------------------------------------------------ tables
def _split(markdown: str) -> tuple[set[str], list[tuple[str, ...]]]:
    """(lines that are not table lines, table headers) of markdown rendered with no rows."""
    lines, headers = set(), []
    for line in markdown.split("\n"):
        cells = tuple(c.strip() for c in line.strip("|").split("|"))
        if line.startswith("|") and set(cells) != {"---"}:
            headers.append(cells)
        elif not line.startswith("|"):
            lines.add(line)
    return lines, headers


_KIND_CELL = {"pct": PCT_CELL, "num": NUM_CELL, "signed": SIGNED_CELL}


def _paper_cells(table_id: str, header: Sequence[str], csv_mode: bool) -> tuple[Cell, ...]:
    table = TABLES[table_id]
    labels = Text(choices=[label for label, _ in table.rows])
    cols = {c.header: c for c in table.cols}
    out: list[Cell] = []
    for name in header:
        if name == "Model":
            out.append(NAME_CELL)
        elif name == table.row_header:
            out.append(labels)
        elif csv_mode:
            out.append(CSV_NUMBER)
        else:
            out.append(_KIND_CELL[cols[name].kind])
    return tuple(out)


def table_schemas(table_id: str, *, intervals: bool) -> tuple[MarkdownSchema, CsvSchema]:
    """The schemas of ``render_table(table_id, ..., intervals=intervals)`` in markdown and in CSV."""
    lines, headers = _split(render_table(table_id, {}, intervals=intervals))
    md = MarkdownSchema(
        lines=lines, tables=[TableShape(h, _paper_cells(table_id, h, False)) for h in headers]
    )
    csv_header = tuple(table_rows(table_id, {}, intervals=intervals, csv_mode=True)[0])
    return md, CsvSchema(tables=[TableShape(csv_header, _paper_cells(table_id, csv_header, True))])


_BOARD_CELLS: dict[str, Cell] = {
    "Rank": RANK_CELL,
    "Model": NAME_CELL,
    "Score (%)": Text(pattern=r"–|\d{1,3}\.\d"),
}


def _board_cell(name: str) -> Cell:
    return _BOARD_CELLS.get(name) or (NUM_CELL if name.startswith("Depth") else PCT_CELL)


def leaderboard_shapes() -> tuple[set[str], list[TableShape]]:
    """Lines and tables of ``render_leaderboard``."""
    lines, headers = _split(render_leaderboard([]))
    return lines, [TableShape(h, tuple(_board_cell(n) for n in h)) for h in headers]


def leaderboard_schemas() -> tuple[MarkdownSchema, CsvSchema]:
    lines, shapes = leaderboard_shapes()
    cells = {"setting": Text(choices=SETTING_KEYS), "rank": Text(pattern=r"\d*"), "model": NAME_CELL}
    csv_shape = TableShape(tuple(CSV_COLUMNS), tuple(cells.get(c, CSV_NUMBER) for c in CSV_COLUMNS))
    return MarkdownSchema(lines=lines, tables=shapes), CsvSchema(tables=[csv_shape])


# ------------------------------------------------------------------------------------ the card
CARD_FRONT = (
    "---",
    "pretty_name: CheXpercept scores",
    "tags:",
    "- chexpercept",
    "- benchmark-results",
    "- chest-x-ray",
    "- vision-language-models",
    "---",
)
CARD_INTRO = (
    "Aggregate scores of vision-language models on **CheXpercept**, the chest X-ray lesion-perception "
    "benchmark (detect, judge a contour, revise it, extract attributes; one multi-turn conversation per "
    "case). Made with `chexpercept push-results`."
)
CARD_SCORES_ONLY = "This repository holds scores only. " + AGREEMENT + "."
NO_FINGERPRINT = "- fingerprint: unknown (runs without run.json bundle fields)"
SYNTHETIC = "- synthetic (phantom) bundle: the numbers say nothing about the models"
MODELS_HEADER = (
    "model",
    "model id",
    "backend",
    "oracle runs",
    "temperature",
    "top_p",
    "max tokens",
    "revision (commit)",
)
CARD_FILES = (
    "- `leaderboard.md`, `leaderboard.csv`: models ranked under End-to-End and Oracle-Passed",
    "- `tables/table<N>.md|csv`: the paper's Tables 2, 3, 8, 9, 10, 11 for all models",
    "- `models/<model>/metrics.json`: the flat metrics (fractions; null = N/A); `intervals.json`; "
    "`table<N>.md|csv`; `run_oracle_<setting>.json`: run provenance (local paths removed)",
)
CARD_HEADINGS = ("## Benchmark bundle", "## Models and settings", "## Leaderboard", "## Table 2", "## Files")


def _models_line(cells: Sequence[Any]) -> str:
    return "| " + " | ".join("" if c is None else str(c) for c in cells) + " |"


def _setting(value: Any, field: str, what: str) -> Any:
    """A decoding setting for the card's models table: None, or a number within its range
    (``numbers.check_number``: NumberRefused otherwise)."""
    return None if value is None else check_number(value, field, what)


def dataset_card(
    reports: Mapping[str, Any],
    provenance: Mapping[str, Sequence[Mapping[str, Any]]],
    rows: Sequence[Mapping[str, Any]],
    *,
    parse_mode: str,
    bootstrap: int,
    repo: str | None,
) -> str:
    """The README.md of the scores repo: front matter, bundle, models and settings, leaderboard, Table 2."""
    fingerprints = sorted({r.fingerprint for r in reports.values() if r.fingerprint})
    synthetic = any(
        bool((m.get("bundle") or {}).get("synthetic")) for metas in provenance.values() for m in metas
    )
    heading = f"# CheXpercept scores{f' ({repo})' if repo else ''}"
    lines = [*CARD_FRONT, "", heading, "", CARD_INTRO, "", CARD_SCORES_ONLY, "", CARD_HEADINGS[0], ""]
    lines += [f"- fingerprint `{fp}`" for fp in fingerprints] or [NO_FINGERPRINT]
    lines += [SYNTHETIC] if synthetic else []
    lines.append(
        f"- answers parsed in `{parse_mode}` mode"
        + ("; 95% design-based intervals (the case as the unit, lesion x path strata)" if bootstrap else "")
    )
    lines += [
        "",
        CARD_HEADINGS[1],
        "",
        _models_line(MODELS_HEADER),
        "|" + "|".join(" --- " for _ in MODELS_HEADER) + "|",
    ]
    for name, metas in provenance.items():
        first = metas[0] if metas else {}
        sampling = first.get("sampling") or {}
        weights = first.get("weights") or {}
        oracles = ", ".join(str(m.get("oracle")) for m in metas)
        lines.append(
            _models_line(
                [
                    name,
                    first.get("model_id"),
                    first.get("backend"),
                    oracles,
                    *(
                        _setting(sampling.get(k), k, f"models/{name}: sampling.{k}")
                        for k in ("temperature", "top_p", "max_tokens")
                    ),
                    weights.get("commit"),
                ]
            )
        )
    lines += [
        "",
        CARD_HEADINGS[2],
        "",
        render_leaderboard(rows),
        CARD_HEADINGS[3],
        "",
        render_table(2, reports),
    ]
    lines += [CARD_HEADINGS[4], "", *CARD_FILES, ""]
    return "\n".join(lines)


def card_schema(repo: str | None) -> MarkdownSchema:
    """The README.md's schema: its fixed lines, the lines with a fingerprint, a mode, a count, and the
    models, leaderboard and Table 2 tables."""
    board_lines, board_tables = leaderboard_shapes()
    table_md, _ = table_schemas("2", intervals=False)
    fixed = {
        *CARD_FRONT,
        "",
        CARD_INTRO,
        CARD_SCORES_ONLY,
        NO_FINGERPRINT,
        SYNTHETIC,
        *CARD_FILES,
        *CARD_HEADINGS,
    }
    heading = r"# CheXpercept scores" + (rf" \({re.escape(repo)}\)" if repo else "")
    modes = "|".join(PARSE_MODES)
    patterns = (
        heading,
        rf"- fingerprint `{HEX64}`",
        rf"- answers parsed in `({modes})` mode(; 95% design-based intervals \(the case as the unit, lesion x path strata\))?",
    )
    number = Text(pattern=r"(\d{1,8}(\.\d{1,6})?)?")
    oracles = "|".join(ORACLE_SETTINGS)
    models = TableShape(
        MODELS_HEADER,
        (
            NAME_CELL,
            NAME_OR_EMPTY,
            Text(choices=("", *BACKENDS)),
            Text(pattern=rf"({oracles})(, ({oracles}))*"),
            number,
            number,
            number,
            Text(pattern=f"({HEX40})?"),
        ),
    )
    return MarkdownSchema(
        lines=fixed | board_lines | set(table_md.lines),
        patterns=patterns,
        tables=[models, *board_tables, *table_md.tables],
    )
