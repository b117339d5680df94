"""``.eval_results/*.yaml`` for a model repo: the Hub's Eval Results, one file per variant.

Format (Hub docs "Evaluation Results", hub-docs ``eval_results.yaml``; huggingface_hub 2.4's
``EvalResultEntry`` and ``eval_result_entries_to_yaml`` write it): a YAML list of entries, each

    - dataset: {id: <benchmark dataset repo>, task_id: <a task id of its eval.yaml>}
      value: <number>
      date: "<YYYY-MM-DD>"                     # when the run finished
      source: {url: <link>, name: <display name>}
      notes: "<the evaluation setup>"

The Hub's convention is one file per variant, told apart by ``notes``. Here a variant is one oracle
run of the model (oracle setting, answer parsing, thinking on or off), and its file holds the numbers
that run measures, from the public scorer (``score_model``), in percent with two decimals:

- the oracle ``none`` run (or, without one, a greedy oracle run, whose gated chain is exact):
  ``end_to_end`` (the End-to-End score: mean of the four stage accuracies), ``stage1``,
  ``e2e_stage2``, ``e2e_stage3``, ``e2e_stage4``;
- an ``implicit`` or ``explicit`` oracle run: ``oracle_passed`` (mean of Stage 1 and the three
  Oracle-Passed stage accuracies, Stage 1 from the End-to-End run as in ``chexpercept report``),
  ``op_stage2``, ``op_stage3``, ``op_stage4``.

``HUB_TASKS`` is the one list of task ids; ``benchmark_card`` writes the same ids into ``eval.yaml``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, cast

from chexpercept.answers import PARSE_MODES
from chexpercept.metrics.leaderboard import SETTING_KEYS, setting_score
from chexpercept.results import ORACLE_SETTINGS

from .guard import (
    Context,
    ListOf,
    Manifest,
    Number,
    Obj,
    Text,
    YamlSchema,
    round_floats,
    yaml_text,
)
from .identifiers import for_runs
from .names import check_repo_id, check_source_url
from .numbers import check_number
from .scores_repo import HEX40, VERSION

EVAL_RESULTS_DIR = ".eval_results"


@dataclass(frozen=True)
class HubTask:
    """One task id of the benchmark: what it measures and which metrics it averages (fractions)."""

    id: str
    description: str
    #: "e2e": measured by the End-to-End run; "op": by an oracle run
    family: str
    keys: tuple[str, ...]
    #: a headline score (the mean of the four stage accuracies) rather than one stage
    headline: str | None = None

    def value(self, values: Mapping[str, float | None]) -> float | None:
        """The task's value in percent (two decimals), None when N/A."""
        if self.headline:
            v = setting_score(values, self.headline)
        else:
            v = values.get(self.keys[0])
        return None if v is None else round(100 * v, 2)


HUB_TASKS: tuple[HubTask, ...] = (
    HubTask(
        "end_to_end",
        "End-to-End score: mean of the four End-to-End stage accuracies (%), a case failing every stage "
        "after its first failure",
        "e2e",
        SETTING_KEYS["e2e"],
        headline="e2e",
    ),
    HubTask(
        "oracle_passed",
        "Oracle-Passed score: mean of Stage 1 and the three Oracle-Passed stage accuracies (%), wrong "
        "answers replaced by the ground truth before the next turn",
        "op",
        SETTING_KEYS["op"],
        headline="op",
    ),
    HubTask("stage1", "Stage 1, detection: accuracy (%)", "e2e", ("e2e/stage1/all",)),
    *(
        HubTask(f"e2e_stage{k}", f"Stage {k}, {name}: End-to-End accuracy (%)", "e2e", (f"e2e/stage{k}/all",))
        for k, name in ((2, "contour evaluation"), (3, "contour revision"), (4, "attribute extraction"))
    ),
    *(
        HubTask(f"op_stage{k}", f"Stage {k}, {name}: Oracle-Passed accuracy (%)", "op", (f"op/stage{k}/all",))
        for k, name in ((2, "contour evaluation"), (3, "contour revision"), (4, "attribute extraction"))
    ),
)
TASK_IDS: tuple[str, ...] = tuple(t.id for t in HUB_TASKS)

_ORACLES = "|".join(ORACLE_SETTINGS)
_NUMBER = r"\d{1,3}(\.\d{1,6})?"
#: the parts of ``notes``, joined by "; " (the schema allows exactly these)
NOTE_PARTS: tuple[str, ...] = (
    rf"oracle ({_ORACLES})",
    rf"({'|'.join(PARSE_MODES)}) answer parsing",
    r"thinking (on|off)",
    r"greedy decoding",
    rf"sampled \(temperature ({_NUMBER}|server default), top_p ({_NUMBER}|server default)\)",
    r"decoding unknown",
    rf"Stage 1 from the oracle ({_ORACLES}) run",
    r"\d{1,8} cases",
    r"bundle [0-9a-f]{12}",
    rf"chexpercept {VERSION}",
    r"synthetic bundle \(phantom data, not a model score\)",
)
_PART = "|".join(f"(?:{p})" for p in NOTE_PARTS)
NOTES_PATTERN = rf"(?:{_PART})(?:; (?:{_PART}))*"
SOURCE_NAME = "CheXpercept toolkit {version} (chexpercept push-results)"


def eval_results_schema(benchmark: str, source_url: str | None = None) -> YamlSchema:
    """The schema of one ``.eval_results/*.yaml`` file for ``benchmark`` (see the module docstring);
    ``source_url``: the one link a source may give (default: the benchmark's Hub page)."""
    source_url = source_url or default_source_url(benchmark)
    entry = Obj(
        {
            "dataset": Obj(
                {
                    "id": Text(choices=(benchmark,)),
                    "task_id": Text(choices=TASK_IDS),
                    "revision": Text(pattern=HEX40),
                },
                required=("id", "task_id"),
                nullable=False,
            ),
            "value": Number("percent", nullable=False),
            "date": Text(pattern=r"\d{4}-\d{2}-\d{2}"),
            "source": Obj(
                {
                    "url": Text(choices=(source_url,)),
                    "name": Text(pattern=re.escape(SOURCE_NAME).replace(r"\{version\}", VERSION)),
                },
                required=("url",),
            ),
            "notes": Text(pattern=NOTES_PATTERN),
        },
        required=("dataset", "value"),
        nullable=False,
    )
    return YamlSchema(spec=ListOf(entry, nullable=False))


@dataclass(frozen=True)
class Variant:
    """One oracle run of a model as the Hub shows it: a file name and its notes."""

    oracle: str
    parse_mode: str
    thinking: bool | None

    @property
    def filename(self) -> str:
        thinking = "" if self.thinking is None else f"_thinking-{'on' if self.thinking else 'off'}"
        return f"{EVAL_RESULTS_DIR}/chexpercept_oracle-{self.oracle}_{self.parse_mode}-parsing{thinking}.yaml"


@dataclass
class StagedEvalResults:
    """What ``stage_eval_results`` wrote: the manifest, per file its entries, and notes for the user."""

    manifest: Manifest
    entries: dict[str, list[dict[str, Any]]]
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return self.manifest.files

    def verify(self) -> dict[str, bytes]:
        return self.manifest.verify()


def _decoding(meta: Any) -> str:
    sampling = meta.sampling
    if sampling is None or (sampling.greedy is None and sampling.temperature is None):
        return "decoding unknown"
    if sampling.greedy or (sampling.greedy is None and sampling.temperature == 0):
        return "greedy decoding"
    temperature, top_p = (
        _checked_setting(sampling.temperature, "temperature"),
        _checked_setting(sampling.top_p, "top_p"),
    )
    return f"sampled (temperature {temperature}, top_p {top_p})"


def _setting(value: float | None) -> str:
    """A decoding setting as sent; None: left to the server, whose default is unknown (never 0)."""
    return "server default" if value is None else str(round(value, 6))


def _checked_setting(value: float | None, field: str) -> str:
    """``_setting`` of a value within its declared range (``numbers.check_number``)."""
    return _setting(None if value is None else check_number(value, field, f"sampling.{field}"))


def _notes(run: Any, variant: Variant, stage1_from: str | None, n_cases: int, version: str) -> str:
    meta = run.meta
    parts = [f"oracle {variant.oracle}", f"{variant.parse_mode} answer parsing"]
    if variant.thinking is not None:
        parts.append(f"thinking {'on' if variant.thinking else 'off'}")
    parts.append(_decoding(meta))
    if stage1_from and stage1_from != variant.oracle:
        parts.append(f"Stage 1 from the oracle {stage1_from} run")
    parts.append(f"{check_number(n_cases, 'n_cases')} cases")
    if run.fingerprint:
        parts.append(f"bundle {run.fingerprint[:12]}")
    parts.append(f"chexpercept {version}")
    if meta.bundle is not None and meta.bundle.synthetic:
        parts.append("synthetic bundle (phantom data, not a model score)")
    return "; ".join(parts)


def _date(meta: Any) -> str | None:
    stamp = meta.finished or meta.started or ""
    return stamp[:10] if re.match(r"\d{4}-\d{2}-\d{2}", stamp) else None


def stage_eval_results(
    model_dir: str | os.PathLike[str],
    staging: str | os.PathLike[str],
    *,
    benchmark: str,
    source_url: str,
    parse_mode: str | None = None,
    bundle: str | os.PathLike[str] | None = None,
    allow_synthetic: bool = False,
    model_repo: str | None = None,
) -> StagedEvalResults:
    """Score the oracle runs of one model folder (``<model>/oracle_<setting>/``) and write one
    ``.eval_results/`` file per run into ``staging`` (new or empty), through the guard's manifest.

    benchmark: the benchmark dataset repo (``chexpercept benchmark-card``); source_url: the link each
    entry's ``source`` gives. bundle: the bundle the runs were made on (default: the one run.json
    names), whose case identifiers the files are checked against. model_repo: where the files go (its
    page may be the source). Raises ValueError when the bundle is not on this disk, when the runs were
    made on a synthetic bundle (unless ``allow_synthetic``), when no run measures anything, and
    (NameRefused) when ``benchmark`` is not a Hub repo id or ``source_url`` not the Hub page of the
    benchmark or of ``model_repo`` (``chexpercept.metrics.hub.names``: nothing free is published)."""
    from huggingface_hub import EvalResultEntry, eval_result_entries_to_yaml

    import chexpercept
    from chexpercept.metrics import load_runs, score_model
    from chexpercept.metrics.partial import refuse_not_own, refuse_partial

    repos = [check_repo_id(benchmark, "--benchmark")]
    if model_repo is not None:
        repos.append(check_repo_id(model_repo, "--model-repo"))
    check_source_url(source_url, repos, os.environ.get("HF_ENDPOINT"))

    runs = load_runs(model_dir, bundle=bundle)  # each line's answer key checked against it
    if not runs:
        raise ValueError(f"{model_dir}: no runs")
    for run in runs:
        refuse_partial(run, str(run.path or model_dir))
    recorded = [
        (r.meta.bundle.path if r.meta.bundle else None, r.fingerprint, r.meta.images_fingerprint)
        for r in runs
    ]
    identifiers = for_runs(bundle, recorded)
    synthetic = any(r.meta.bundle is not None and r.meta.bundle.synthetic for r in runs)
    if synthetic and not allow_synthetic:
        raise ValueError(
            f"{model_dir}: the runs were made on a synthetic (phantom) bundle; their scores say nothing about "
            "the model, and the Hub would show them on its page. Pass --allow-synthetic to stage them anyway "
            "(tests, demos: the notes then say so)"
        )
    version = chexpercept.__version__
    by_oracle = {r.oracle: r for r in runs}
    none_run = by_oracle.get("none")
    staged: dict[str, list[dict[str, Any]]] = {}
    texts: dict[str, str] = {}
    notes: list[str] = []
    for run in runs:
        thinking = (run.meta.chat_template_kwargs or {}).get("enable_thinking")
        mode = cast(Any, parse_mode)
        if run.oracle == "none":
            scores, families = score_model([run], mode=mode), {"e2e"}
        else:
            scores = score_model(([none_run] if none_run else []) + [run], mode=mode)
            e2e = scores.sources.get("e2e")
            families = {"op"} | ({"e2e"} if e2e is not None and e2e.oracle == run.oracle else set())
        refuse_not_own(scores, str(run.path or model_dir))
        variant = Variant(run.oracle, scores.mode, thinking if isinstance(thinking, bool) else None)
        for key_id in scores.matrix.key_ids:
            identifiers.add("key_id", key_id)
        e2e_source = scores.sources.get("e2e")
        entries = [
            EvalResultEntry(
                dataset_id=benchmark,
                task_id=task.id,
                value=value,
                date=_date(run.meta),
                source_url=source_url,
                source_name=SOURCE_NAME.format(version=version),
                notes=_notes(
                    run, variant, e2e_source.oracle if e2e_source else None, len(run.records), version
                ),
            )
            for task in HUB_TASKS
            if task.family in families and (value := task.value(scores.values)) is not None
        ]
        if not entries:
            notes.append(f"oracle {run.oracle} run: no number is measured (all N/A); no file for it")
            continue
        data = round_floats(eval_result_entries_to_yaml(entries))
        staged[variant.filename] = data
        texts[variant.filename] = yaml_text(data)
    if not staged:
        raise ValueError(f"{model_dir}: none of the runs measures a number the Hub could show")
    manifest = Manifest(staging, Context(identifiers))
    schema = eval_results_schema(benchmark, source_url)
    for rel, text in texts.items():
        manifest.write(rel, text, schema)
    return StagedEvalResults(manifest, staged, notes)


def default_source_url(benchmark: str, endpoint: str | None = None) -> str:
    """The benchmark's page on the Hub (``<endpoint>/datasets/<benchmark>``)."""
    base = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    return f"{base}/datasets/{benchmark}"


def pr_description(staged: StagedEvalResults, benchmark: str) -> str:
    """The pull request's text: fixed sentences, the benchmark and the file names only."""
    lines = [
        f"CheXpercept evaluation results for the benchmark [{benchmark}](/datasets/{benchmark}), in the Hub's "
        "`.eval_results/` format: one file per variant (oracle setting, answer parsing, thinking on or off).",
        "",
        "Values are percentages from the CheXpercept toolkit's public scorer. The files hold aggregate "
        "scores only: no image, question, answer or case identifier (the benchmark is PhysioNet-credentialed).",
        "",
        *(f"- `{rel}`" for rel in staged.files),
        "",
        "Made with `chexpercept push-results --model-repo`.",
    ]
    return "\n".join(lines)


def model_folder(runs_dir: str | os.PathLike[str]) -> FsPath:
    """The one model folder under ``runs_dir`` (or ``runs_dir`` itself); ValueError when there are several."""
    from chexpercept.metrics.hub.push_results import model_folders

    folders = model_folders(runs_dir)
    if len(folders) != 1:
        raise ValueError(
            f"--model-repo takes one model's runs, but {runs_dir} holds {len(folders)} models "
            f"({', '.join(folders)}); pass one of their folders"
        )
    return next(iter(folders.values()))
