"""The one place that marks numbers partial: numbers from records that are not the whole run (a run
writing them now, a run that has not finished, lines torn or missing against run.json) say so in
every format they are written in.

``Run.partial`` (metrics/runs.py) holds the reasons of one run, ``ModelScores.partial`` those of a
model's runs. Every writer of numbers (``render_table``: ``score --table``, the report's
``tables.md`` and ``tables/``; the leaderboard's markdown and CSV; the reference CSVs) asks this
module: markdown gets a heading line before the numbers (``markdown_line``), CSV a ``partial``
column naming the reason on each row of a partial model (``csv_columns``, ``csv_value``). Complete
numbers are written exactly as before: no line, no column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chexpercept.escape import markdown_cell

#: the CSV column that says why a row's numbers are partial (present only when one is)
PARTIAL_COLUMN = "partial"


def reasons(item: Any) -> list[str]:
    """Why one model's numbers are partial: a ModelScores' ``partial``; [] for anything without
    one (a plain {metric: value} map)."""
    return list(getattr(item, "partial", None) or [])


def partial_models(reports: Any) -> dict[str, list[str]]:
    """{model name: reasons} of the partial models among ``reports`` (a ModelScores, or a {name:
    ModelScores or values} map)."""
    if isinstance(reports, Mapping):
        items = list(reports.items())
    else:
        items = [(getattr(reports, "name", "model"), reports)]
    return {str(name): reasons(item) for name, item in items if reasons(item)}


def markdown_line(reports: Any) -> str:
    """The heading line a markdown file of these numbers starts its table with ("" when none is
    partial and every model was scored on the same cases): ``**Partial numbers**: model X:
    <reason>. Rerun ... for the whole run.``, then ``different_cases``."""
    return heading(partial_models(reports)) + different_cases_markdown(reports)


def different_cases_markdown(reports: Any) -> str:
    """``different_cases`` as a markdown paragraph ("" when the cases are the same)."""
    line = different_cases(reports)
    return f"**Note**: {markdown_cell(line)}\n\n" if line else ""


def bundle_difference(items: Mapping[str, Any]) -> str:
    """The one rule of "made on the same bundle" for models or runs side by side: "" when every item
    of ``items`` ({name: a Run or ModelScores}, each with ``fingerprint`` and ``images_fingerprint``)
    was made on the same questions (chexpercept.json's fingerprint) and the same images (where
    recorded); else what differs, naming each item's fingerprint: "different bundles (...)" or
    "the same questions with different images (...)". Images replaced under an unchanged
    chexpercept.json were ranked beside the first images without a word (red team, stop 44)."""
    for attribute, what, field_name in (
        ("fingerprint", "different bundles", "run.json's bundle_fingerprint"),
        (
            "images_fingerprint",
            "the same questions with different images",
            "run.json's settings.bundle_images",
        ),
    ):
        groups: dict[str, list[str]] = {}
        for name, item in items.items():
            value = getattr(item, attribute, None)
            if value:
                groups.setdefault(str(value), []).append(str(name))
        if len(groups) > 1:
            said = "; ".join(
                f"{', '.join(names)}: {value.removeprefix('sha256:')[:16]}" for value, names in groups.items()
            )
            return f"{what} ({said}, {field_name})"
    return ""


def different_cases(reports: Any) -> str:
    """ "" when every model among ``reports`` (a {name: ModelScores} map) was scored on the same
    cases of the same bundle; else a line naming the bundles (their fingerprints differ: scored on
    the same key ids, a corrected release was ranked beside the first without a word, red team stop
    43), or how many cases each was scored on: numbers of different cases (a run with ``--limit``,
    or one whose other cases failed) side by side are not comparable."""
    if not isinstance(reports, Mapping):
        return ""
    differ = bundle_difference(reports)
    if differ:  # the same key ids may hold other questions, answers or images (a release fixed)
        return (
            f"the models were run on {differ}; the same case may hold other questions, answers or "
            "images in each, so their numbers are not comparable"
        )
    cases = {
        str(name): frozenset(item.matrix.key_ids)
        for name, item in reports.items()
        if getattr(item, "matrix", None) is not None
    }
    if len(set(cases.values())) < 2:
        return ""
    every = frozenset().union(*cases.values())
    said = "; ".join(f"{name}: {len(keys)} of {len(every)}" for name, keys in cases.items())
    return (
        f"the models were scored on different cases ({said}); numbers of different cases are not "
        "comparable (chexpercept score A B --compare compares two models on the cases both have)"
    )


def partial_reasons(partial: Mapping[str, Sequence[str]]) -> str:
    """{model name: reasons} as one line: ``model: reason; reason; model: reason`` ("" when none)."""
    return "; ".join(f"{name}: {'; '.join(why)}" for name, why in partial.items() if why)


def heading(partial: Mapping[str, Sequence[str]]) -> str:
    """``markdown_line`` of {model name: reasons} (models without reasons are complete)."""
    said = partial_reasons(partial)
    if not said:
        return ""
    return (
        f"**Partial numbers** (not the whole run; rerun the same `chexpercept run` command to complete "
        f"it, then score again): {markdown_cell(said)}\n\n"
    )


def csv_columns(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``columns``, with ``PARTIAL_COLUMN`` last when a row is partial (rows carry it as a key)."""
    if any(row.get(PARTIAL_COLUMN) for row in rows):
        return [*columns, PARTIAL_COLUMN]
    return list(columns)


def csv_value(item: Any) -> str:
    """The ``PARTIAL_COLUMN`` cell of one model's rows: its reasons, or "" when complete."""
    return "; ".join(reasons(item))


class PartialNumbers(ValueError):
    """Numbers that are partial were to be published (the Hub): they are not."""


def refuse_partial(item: Any, where: str) -> None:
    """Raise PartialNumbers when ``item`` (a ModelScores, a Run) is partial: what is published
    stays published, so only whole runs are (``where``: the folder, for the message)."""
    why = reasons(item)
    if why:
        raise PartialNumbers(
            f"{where}: these numbers are partial ({'; '.join(why)}), so nothing was published. Complete "
            "the run (rerun the same `chexpercept run` command), then publish again"
        )


def refuse_not_own(item: Any, where: str) -> None:
    """Raise PartialNumbers when ``item`` (a ModelScores) holds numbers that are not its runs' own
    (``not_own``: an oracle run re-read in another parse mode than the one its oracle acted on): what
    is published stays published, and says it is the run's (red team, stop 48: a strict run was
    published with reference parsing, End-to-End 0.0 as 66.7)."""
    why = list(getattr(item, "not_own", None) or [])
    if why:
        raise PartialNumbers(
            f"{where}: these are not the runs' own numbers ({'; '.join(w.removeprefix('WARNING: ') for w in why)}), "
            "so nothing was published. Leave --parse-mode out to publish them as made"
        )
