"""The Hub's leaderboard of a benchmark, read back (``chexpercept leaderboard``, ``report --hub-leaderboard``).

``read_leaderboard(repo)`` calls huggingface_hub's ``HfApi.get_dataset_leaderboard`` (huggingface_hub
2.4: ``GET /api/datasets/<repo>/leaderboard``; entries with ``rank``, ``modelId``, ``value``,
``verified``, ``filename``, ``source``, ``author``, ``pullRequest``, ``notes``). By default the Hub
lists only models without a declared ``base_model`` (its leaderboard page's view);
``all_models=True`` asks for every submitted result. Neither the endpoint's documentation nor
huggingface_hub 2.4 names a task parameter: a benchmark with several tasks is returned as the Hub
chooses (its page shows the first task of eval.yaml by default); a task id the Hub adds to an entry
is shown.

``side_by_side`` puts the Hub's rows beside the End-to-End leaderboard of local runs, each marked
with where it comes from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chexpercept.escape import markdown_cell, terminal


class LeaderboardError(RuntimeError):
    """The Hub could not give the leaderboard (no such repo, no leaderboard, offline, network)."""


@dataclass(frozen=True)
class HubEntry:
    """One row of the Hub's leaderboard, as the Hub gives it."""

    rank: int
    model: str
    value: float
    verified: bool
    filename: str = ""
    notes: str | None = None
    #: the source's name or URL, when the entry has one
    source: str | None = None
    pull_request: int | None = None
    task: str | None = None

    @property
    def status(self) -> str:
        """verified / community (an open pull request) / submitted."""
        if self.verified:
            return "verified"
        return "community" if self.pull_request is not None else "submitted"


def _entry(raw: Any, repo: str, n: int) -> HubEntry:
    """One row of the Hub's leaderboard, its rank a whole number from 1 and its value a finite number
    (LeaderboardError naming the row otherwise: a value of 1e400, read as infinity, ended
    ``leaderboard`` in a traceback and was written as ``Infinity`` into its JSON; red team, stop 43)."""
    from chexpercept.domains import COUNT

    value = getattr(raw, "value", None)
    rank = getattr(raw, "rank", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LeaderboardError(
            f"{repo}: entry {n} of the Hub's leaderboard has the value {terminal(repr(value))}, not a finite number"
        )
    if not COUNT.contains(rank):
        raise LeaderboardError(
            f"{repo}: entry {n} of the Hub's leaderboard has the rank {terminal(repr(rank))}, not {COUNT.describe()}"
        )
    source = raw.source if isinstance(raw.source, dict) else None
    task = getattr(raw, "taskId", None) or getattr(raw, "task_id", None)
    return HubEntry(
        rank=int(rank),
        model=str(raw.model_id),
        value=float(value),
        verified=bool(raw.verified),
        filename=str(raw.filename or ""),
        notes=raw.notes,
        source=(source.get("name") or source.get("url")) if source else None,
        pull_request=raw.pull_request,
        task=str(task) if task else None,
    )


def read_leaderboard(
    repo: str, *, all_models: bool = False, endpoint: str | None = None, token: str | None = None
) -> list[HubEntry]:
    """The leaderboard of the benchmark dataset ``repo``, best first.

    Raises LeaderboardError naming the repo when the Hub has none, cannot be reached or is switched
    off (HF_HUB_OFFLINE=1)."""
    try:  # huggingface_hub reads HF_ENDPOINT as it is imported: a malformed one raises there
        from huggingface_hub import constants
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError
    except ValueError as e:
        raise LeaderboardError(f"{repo}: HF_ENDPOINT is not a URL the Hub's client takes ({e})") from None

    from chexpercept import peer_http
    from chexpercept.errors import Refused

    from .commit import hub_api

    if constants.HF_HUB_OFFLINE:
        raise LeaderboardError(
            f"{repo}: the leaderboard is read from the Hub, and HF_HUB_OFFLINE=1 keeps it offline; unset it"
        )
    try:
        api = hub_api(endpoint, token)  # a port out of range raises here (red team, stop 44)
        raw = api.get_dataset_leaderboard(  # a deadline: a Hub that never answers ended no call
            repo, base_model_only=False if all_models else None, timeout=peer_http.HUB_TIMEOUT
        )
    except RepositoryNotFoundError as e:
        raise LeaderboardError(
            f"{repo}: no such dataset repo on {api.endpoint} (or it is private and the token cannot see it)"
        ) from e
    except HfHubHTTPError as e:
        raise LeaderboardError(f"{repo}: the Hub gave no leaderboard ({str(e).splitlines()[0]})") from e
    except (OfflineModeIsEnabled, OSError) as e:
        raise LeaderboardError(f"{repo}: the Hub could not be reached ({type(e).__name__}: {e})") from e
    except RecursionError:  # huggingface_hub decodes the reply: JSON nested deeper than Python parses
        raise LeaderboardError(
            f"{repo}: the Hub's reply is JSON nested too deeply to read (not a leaderboard)"
        ) from None
    except Refused:  # refused on purpose (another account's server on the Hub's port): its own line
        raise
    except Exception as e:  # the Hub's HTTP client (httpx2's ConnectError, a timeout...): one line, as
        # push-results says it (red team, stop 44: no DNS printed a traceback)
        raise LeaderboardError(
            f"{repo}: the Hub could not be reached ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no reason given'})"
        ) from e
    return sorted((_entry(r, repo, n) for n, r in enumerate(raw, start=1)), key=lambda e: (e.rank, e.model))


# ------------------------------------------------------------------------------------ rendering
def _value(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v)}"


def render_hub_leaderboard(entries: Sequence[HubEntry], repo: str) -> str:
    """The Hub's rows as a markdown table (rank, model, value, verified or not, notes)."""
    with_task = any(e.task for e in entries)
    head = ["Rank", "Model", "Value", "Verified", *(["Task"] if with_task else []), "Notes"]
    lines = [
        f"**Leaderboard of {repo} on the Hub** (values as the Hub gives them; not recomputed)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(" --- " for _ in head) + "|",
    ]
    for e in entries:
        task = [markdown_cell(e.task or "")] if with_task else []
        cells = [str(e.rank), markdown_cell(e.model), _value(e.value), e.status, *task]
        cells.append(markdown_cell(e.notes or ""))
        lines.append("| " + " | ".join(cells) + " |")
    if not entries:
        lines.append("| – | no entries | – | – |" + (" – |" if with_task else "") + " – |")
    return "\n".join(lines) + "\n"


HUB_CSV_COLUMNS = (
    "rank",
    "model",
    "value",
    "verified",
    "status",
    "task",
    "notes",
    "source",
    "filename",
    "pull_request",
)


def hub_leaderboard_csv(entries: Sequence[HubEntry]) -> str:
    """The Hub's rows as CSV (``HUB_CSV_COLUMNS``)."""
    from ..csv_files import csv_text

    rows = [{**asdict(e), "status": e.status} for e in entries]
    return csv_text(HUB_CSV_COLUMNS, rows)


def hub_leaderboard_json(entries: Sequence[HubEntry]) -> str:
    return json.dumps([{**asdict(e), "status": e.status} for e in entries], indent=2) + "\n"


@dataclass(frozen=True)
class HubBoard:
    """A leaderboard read from the Hub, for the report."""

    repo: str
    entries: tuple[HubEntry, ...]


def side_by_side(board_rows: Sequence[Mapping[str, Any]], hub: HubBoard) -> list[dict[str, Any]]:
    """Local End-to-End rows (``leaderboard_rows``, score as %) and the Hub's rows in one ranking:
    model, value (%), and ``from`` ("local run" or "Hub, <status>"), highest value first."""
    rows: list[dict[str, Any]] = [
        {"model": r["model"], "value": 100 * r["score"], "from": "local run"}
        for r in board_rows
        if r["setting"] == "e2e" and r["score"] is not None
    ]
    rows += [{"model": e.model, "value": e.value, "from": f"Hub, {e.status}"} for e in hub.entries]
    rows.sort(key=lambda r: (-r["value"], r["from"] != "local run", r["model"]))
    return rows


def render_side_by_side(rows: Sequence[Mapping[str, Any]], repo: str) -> str:
    lines = [
        f"**End-to-End, local runs beside the Hub's leaderboard of {repo}** (local: the End-to-End score "
        "in %; Hub: the value its leaderboard gives, for a benchmark made by `chexpercept benchmark-card` "
        "the first task, `end_to_end`, in %)",
        "",
        "| Rank | Model | Score (%) | From |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {i} | {markdown_cell(r['model'])} | {r['value']:.1f} | {r['from']} |"
        for i, r in enumerate(rows, start=1)
    ]
    return "\n".join(lines) + "\n"
