"""What the ``chexpercept_metric`` evaluate module needs: input conversion, compute, installation.

The module file (``chexpercept_metric/chexpercept_metric.py``) stays thin: evaluate copies it into
its cache, and everything it does lives here, in the installed package.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.answers import PARSE_MODES
from chexpercept.case import Case, Turn
from chexpercept.fileio import private_dir, write_atomic
from chexpercept.registration import METRIC_NAME
from chexpercept.results import CaseResult, judge_turn
from chexpercept.vocab import LESIONS, MULTI_SELECT_TASKS, PATHS, TASK_STAGE

#: the evaluate module's folder: ``evaluate.load(str(METRIC_PATH))`` works from any directory
METRIC_PATH = FsPath(__file__).resolve().parent / METRIC_NAME


def _option_text(option: Any) -> str:
    """Option as text; the bundle's point options are dicts ({"point": ..., "color": ...})."""
    if isinstance(option, dict):
        return "None" if option.get("point") is None else str(option.get("color"))
    return str(option)


def _label(value: Any, names: Sequence[str], field: str, key: str) -> str:
    """A lesion or path given as its name or as the dataset's ClassLabel id."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise ValueError(f"case {key}: {field} id {value} out of range (0..{len(names) - 1})")
        return names[value]
    if isinstance(value, str):
        return value
    raise ValueError(f"case {key}: {field} must be a name or a ClassLabel id, got {value!r}")


def records_from_inputs(
    predictions: Sequence[Sequence[str | None]],
    references: Sequence[dict[str, Any]],
    *,
    oracle: str = "none",
    mode: str = "reference",
    model: str = "",
) -> list[CaseResult]:
    """Turn the metric's inputs into result records (one per case).

    predictions[i]: the raw responses of case i, one per turn, in turn order.
    references[i]: {"key_id", "lesion", "path", "turns": [{"task", "options", "answer_index"}, ...]};
    lesion and path may be names or the dataset's ClassLabel ids; other keys are ignored.
    """
    if mode not in PARSE_MODES:
        raise ValueError(f"unknown parse mode {mode!r}; expected one of {PARSE_MODES}")
    if not isinstance(model, str):
        raise ValueError(
            f"model must be a string (the model's name, '' for none), got {type(model).__name__}"
        )
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:  # red team, stop 48: every metric None, without a word
        raise ValueError("no cases: predictions and references are empty")
    path_names = [p.value for p in PATHS]
    records = []
    for n, (responses, ref) in enumerate(zip(predictions, references)):
        if not isinstance(ref, dict):
            raise ValueError(f"reference {n}: expected a dict with key_id, lesion, path and turns")
        missing = [k for k in ("key_id", "lesion", "path", "turns") if k not in ref]
        if missing:
            raise ValueError(f"reference {n}: missing {', '.join(missing)}")
        if not isinstance(ref["key_id"], str) or not ref["key_id"]:
            raise ValueError(f"reference {n}: key_id must be a non-empty string, got {ref['key_id']!r}")
        key = ref["key_id"]
        ref_turns = ref["turns"]
        if responses is None or len(responses) != len(ref_turns):
            got = "no" if responses is None else len(responses)
            raise ValueError(f"case {key}: {got} responses for {len(ref_turns)} turns")
        turns = []
        for j, (response, t) in enumerate(zip(responses, ref_turns)):
            task = t.get("task")
            if task not in TASK_STAGE:
                raise ValueError(f"case {key}: turn {j} has unknown task {task!r}")
            options = tuple(_option_text(o) for o in t.get("options") or ())
            gold = t.get("answer_index")
            gold = list(gold) if isinstance(gold, (list, tuple)) else [gold]
            if any(isinstance(g, bool) or not isinstance(g, int) for g in gold):  # True read as 1 before
                raise ValueError(f"case {key}: turn {j} ({task}): answer_index {gold!r} must be int(s)")
            if not options or not gold or any(not 1 <= g <= len(options) for g in gold):
                raise ValueError(  # the answer key names options the question has (red team, stop 44)
                    f"case {key}: turn {j} ({task}): answer_index {gold} must name options 1 to "
                    f"{len(options)} of its options"
                )
            multi = bool(t.get("multi_select", task in MULTI_SELECT_TASKS))
            turn = Turn(TASK_STAGE[task], task, "", (), options, tuple(gold), "", multi)
            turns.append(judge_turn(turn, response, mode=mode, model=model))
        records.append(
            CaseResult(
                key_id=key,
                lesion=_label(ref["lesion"], LESIONS, "lesion", key),
                path=_label(ref["path"], path_names, "path", key),
                oracle=oracle,
                turns=turns,
            )
        )
    return records


def references_from_cases(cases: Iterable[Case]) -> list[dict[str, Any]]:
    """The metric's references for bundle cases (``read_bundle(DIR).cases``)."""
    return [
        {
            "key_id": c.key_id,
            "lesion": c.lesion,
            "path": c.path.value,
            "turns": [
                {"task": t.task, "options": list(t.options), "answer_index": list(t.answer_index)}
                for t in c.turns
            ],
        }
        for c in cases
    ]


def references_from_dataset(ds: Any) -> list[dict[str, Any]]:
    """The metric's references for a ``load_dataset("chexpercept")`` sequences split, without decoding images."""
    lesions = ds.features["lesion"].names
    paths = ds.features["path"].names
    out = []
    for batch in ds.select_columns(["key_id", "lesion", "path", "turns"]).with_format("arrow").iter(256):
        for row in batch.to_pylist():
            out.append(
                {
                    "key_id": row["key_id"],
                    "lesion": lesions[row["lesion"]],
                    "path": paths[row["path"]],
                    "turns": [
                        {"task": t["task"], "options": t["options"], "answer_index": t["answer_index"]}
                        for t in row["turns"]
                    ],
                }
            )
    return out


def compute_metric(
    predictions: Sequence[Sequence[str | None]],
    references: Sequence[dict[str, Any]],
    *,
    mode: str = "reference",
    oracle: str = "none",
    greedy: bool | None = True,
    model: str = "",
    return_details: bool = False,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    return_cases: bool = False,
) -> dict[str, Any]:
    """What ``chexpercept_metric.compute`` returns: the flat metrics, or with details everything."""
    from .model_scores import score_model
    from .runs import run_from_records

    if greedy is not None and not isinstance(greedy, bool):  # "no" read as greedy before (red team, stop 48)
        raise ValueError(f"greedy must be True, False or None (unknown), got {greedy!r}")
    records = records_from_inputs(predictions, references, oracle=oracle, mode=mode, model=model)
    run = run_from_records(records, oracle=oracle, greedy=greedy, model=model)
    report = score_model([run], mode=mode, name=model or None)
    if not return_details:
        return report.flat
    if n_resamples:  # 0: no intervals; they are design-based (metrics/inference.py), nothing resampled
        report.with_intervals(level=level)
    return report.to_dict(cases=return_cases)


def evaluate_modules_cache(modules_cache: str | os.PathLike[str] | None = None) -> FsPath:
    """The folder where evaluate keeps its dynamic modules, found the way evaluate 0.4 finds it
    (``evaluate.config.HF_MODULES_CACHE`` / ``evaluate_modules``) without importing evaluate, which
    imports datasets and, when installed, torch: ``modules_cache``, else ``$HF_MODULES_CACHE``,
    else ``$HF_HOME/modules``, else ``$XDG_CACHE_HOME/huggingface/modules`` (``~/.cache``)."""
    if modules_cache is None:
        home = os.path.expanduser(
            os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
        )
        modules_cache = os.getenv("HF_MODULES_CACHE", os.path.join(home, "modules"))
    return FsPath(modules_cache) / "evaluate_modules"


def install_metric(modules_cache: str | os.PathLike[str] | None = None) -> FsPath:
    """Make ``evaluate.load("chexpercept_metric")`` work offline from any folder (one-time step).

    evaluate resolves a bare name through the Hub and, failing that (offline), through its module
    cache (``$HF_MODULES_CACHE/evaluate_modules/metrics/evaluate-metric--<name>/<hash>/``, by default
    under ``$HF_HOME/modules``). This copies the module there. Run it again after upgrading the
    package (the newest copy wins). Returns the installed file.
    """
    source = METRIC_PATH / f"{METRIC_NAME}.py"
    root = evaluate_modules_cache(modules_cache)
    code = source.read_bytes()
    digest = hashlib.sha256(code).hexdigest()
    target = root / "metrics" / f"evaluate-metric--{METRIC_NAME}" / digest
    private_dir(target)
    for folder in (root.parent, root, root / "metrics", target.parent, target):
        init = folder / "__init__.py"
        if not init.exists():
            write_atomic(init, b"")
    return write_atomic(target / f"{METRIC_NAME}.py", code)
