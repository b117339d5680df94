"""The per-case result record: what the runner writes (one JSON line per case) and the scorer reads.

Layout of a run: ``OUT/<model>/oracle_<setting>/results.jsonl`` (one line per finished case) and
``run.json`` (run metadata: model, backend, sampling, seed, versions, bundle fingerprint, times).

A record keeps the raw response of every turn, so a run can be re-scored later under another parse
mode; the parsed answer and correctness stored beside it are those of the run's own parse mode
(they drove the oracle during the run). Images appear only as paths relative to the bundle root.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any

from .escape import shown, terminal
from .input_files import RESULTS, iter_lines, open_input
from .input_json import JsonInputError, loads

if TYPE_CHECKING:
    from .case import Turn

RESULTS_NAME = "results.jsonl"
RUN_NAME = "run.json"
#: cases a run could not finish because a request failed (one line per failure; never scored)
FAILURES_NAME = "failures.jsonl"
#: the lock a run holds on its folder for as long as it writes there (chexpercept.eval.runner.store.RunLock)
LOCK_NAME = "run.lock"
#: in a model folder: held while a run checks its settings folders and writes its run.json
SETTINGS_LOCK_NAME = ".settings.lock"
#: where lines of a run folder's results.jsonl that carry no run identity are moved (eval/runner/store.py)
QUARANTINE_NAME = "quarantine.jsonl"
#: the reference implementation's results file, which score reads as a run (metrics/runs.py)
REFERENCE_RESULTS_NAME = "all_results.json"
#: every file name a folder of runs gives a meaning of its own: never a model's folder name
#: (eval/registry.py) nor an output file's (chexpercept/cli_options.py), wherever it would be
RUN_FILE_NAMES = frozenset(
    {
        RESULTS_NAME,
        RUN_NAME,
        FAILURES_NAME,
        LOCK_NAME,
        SETTINGS_LOCK_NAME,
        QUARANTINE_NAME,
        REFERENCE_RESULTS_NAME,
    }
)
ORACLE_SETTINGS: tuple[str, ...] = ("none", "implicit", "explicit")
SCHEMA_VERSION = 3  # 2: full_response and refusal per turn; failed requests kept apart; 3: run identity


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short hash of a run's settings (run.json's ``settings``: model, backend, oracle, parse mode,
    sampling, seed, chat template variables, bundle fingerprint)."""
    canonical = json.dumps(settings, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def run_identity(settings: Mapping[str, Any]) -> dict[str, str]:
    """What each record carries of the run that made it: the model and the settings fingerprint."""
    return {"model": str(settings.get("model_id", "")), "fingerprint": settings_fingerprint(settings)}


def check_identity(
    path: str | FsPath,
    lines: Iterable[tuple[int, str, Mapping[str, Any] | None]],
    identity: Mapping[str, str],
) -> None:
    """Raise ForeignRecordError when a (line number, key_id, record's ``run``) of ``path`` belongs to
    another run than ``identity`` (run.json's ``settings``), or carries no run identity: a run.json
    with settings was written by a version that stamps every line, so a line without one was
    appended by hand or by another tool, and the settings that made it cannot be established. Such
    a line is never scored; a resume moves it to quarantine.jsonl (``RunStore.quarantine_unverified``)
    and runs its case again. Only a folder whose run.json has no settings at all (an older version)
    is read without this check."""
    lines = list(lines)
    unverified = [(n, key_id) for n, key_id, theirs in lines if not theirs]
    if unverified:
        n, key_id = unverified[0]
        more = f" and {len(unverified) - 1} more" if len(unverified) > 1 else ""
        raise ForeignRecordError(
            f"{path}: line {n} (case {terminal(key_id)}){more} carries no run identity, while the "
            "run.json beside it records the settings every line of this version carries, so the settings "
            "that made it cannot be established; it is not scored. Remove it, or rerun the same run "
            "command (a resume moves such lines to quarantine.jsonl and runs their cases again)."
        )
    foreign = [
        f"line {n} (case {terminal(key_id)}: model {theirs.get('model')!r}, settings "
        f"{terminal(theirs.get('fingerprint'))})"
        for n, key_id, theirs in lines
        if theirs and theirs.get("fingerprint") != identity.get("fingerprint")
    ]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ForeignRecordError(
            f"{path}: {len(foreign)} record(s) were made by another run than the one its run.json "
            f"describes (model {identity.get('model')!r}, settings {identity.get('fingerprint')}): "
            f"{'; '.join(foreign[:3])}{more}. They would change the scores. Remove those lines (or move "
            "the folder away) and rerun."
        )


def check_one_identity(
    path: str | FsPath, lines: Iterable[tuple[int, str, Mapping[str, Any] | None]]
) -> None:
    """Where no run.json records the settings (none beside the file, or one of an older version):
    ForeignRecordError unless the (line number, key_id, record's ``run``) lines of ``path`` carry one
    run identity. Lines of several runs (a results.jsonl concatenated from two, its run.json removed)
    were scored as one model without a word (red team, stop 43); a file none of whose lines carry an
    identity (an older version's) is read as it is."""
    lines = list(lines)
    stamped = {(str(r.get("model")), str(r.get("fingerprint"))) for _n, _k, r in lines if r}
    if len(stamped) <= 1 and (not stamped or all(r for _n, _k, r in lines)):
        return
    first: dict[Any, tuple[int, str]] = {}
    for n, key_id, theirs in lines:
        first.setdefault(
            (str(theirs.get("model")), str(theirs.get("fingerprint"))) if theirs else None, (n, key_id)
        )
    said = "; ".join(
        f"line {n} (case {terminal(key_id)}): "
        + (f"model {who[0]!r}, settings {terminal(who[1])}" if who else "no run identity")
        for who, (n, key_id) in list(first.items())[:4]
    )
    raise ForeignRecordError(
        f"{path}: its lines were made by {len(first)} different runs ({said}), and no run.json says "
        "which is this folder's: scored together they would be one model's numbers. Keep one run's "
        "lines per folder (each line's run field names its run)."
    )


#: the served model of a turn whose reply named none (unknown, never taken as the one named elsewhere)
UNKNOWN_SERVED = "(not said by the server)"


def served_model_of(usage: Any) -> str:
    """The model a server said answered a turn (``usage.served_model``), else ``UNKNOWN_SERVED``."""
    served = usage.get("served_model") if isinstance(usage, Mapping) else None
    return served if isinstance(served, str) and served else UNKNOWN_SERVED


def served_models(turn_usages: Iterable[Mapping[str, Any]], *, unknown_alone: bool = False) -> dict[str, int]:
    """Turns per served model (``served_model_of``) over the usages of records' turns, the turns whose
    server named none counted apart (``UNKNOWN_SERVED``): they were counted as the named model's
    before (red team, stop 43). Empty when no turn names one (a local engine never does), unless
    ``unknown_alone``."""
    out: dict[str, int] = {}
    for usage in turn_usages:
        served = served_model_of(usage)
        out[served] = out.get(served, 0) + 1
    if not unknown_alone and set(out) <= {UNKNOWN_SERVED}:
        return {}
    return dict(sorted(out.items()))


def record_usages(records: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """The usage of every turn of results records read as dicts (``read_records``)."""
    for record in records:
        for turn in record.get("turns") or ():
            if isinstance(turn, Mapping):
                yield turn.get("usage") or {}


class RecordFieldError(ValueError):
    """A field of a results or failures line holds a value of the wrong type (or is missing, or
    unknown): the message names the file, the line and the field."""


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as JSON decodes it) is of the annotated type ``hint`` (str, int, float,
    bool, None, Any, list[X], dict[K, V] and unions of them; a dataclass: an object)."""
    import dataclasses
    import types
    import typing

    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        key, val = typing.get_args(hint) or (Any, Any)
        return isinstance(value, dict) and all(_fits(k, key) and _fits(v, val) for k, v in value.items())
    if hint is list or hint is dict:
        return isinstance(value, hint)
    raise TypeError(f"no reader for the annotation {hint!r}")  # a new field type: teach _fits


def read_typed(cls: type, data: Any, where: str, field_prefix: str = "") -> dict[str, Any]:
    """The one typed reader of a record's fields: ``data`` (a results or failures line as decoded)
    checked field by field against the dataclass ``cls``'s annotations; nested records (a
    ``list[TurnResult]``) are read the same way. RecordFieldError naming ``where`` (the file and
    line) and the field for a missing, unknown or wrongly typed field; returns ``data``."""
    import dataclasses
    import typing

    what = field_prefix.rstrip(".") or "the line"
    if not isinstance(data, dict):
        raise RecordFieldError(f"{where}: {what}: expected a JSON object, got {_shown(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RecordFieldError(f"{where}: field {field_prefix}{terminal(str(unknown[0]))!s}: unknown field")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in data:
            if required:
                raise RecordFieldError(f"{where}: field {field_prefix}{name}: missing")
            continue
        hint, value = hints[name], data[name]
        if not _fits(value, hint):
            raise RecordFieldError(
                f"{where}: field {field_prefix}{name}: expected {_type_name(hint)}, got {_shown(value)}"
            )
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
            for i, item in enumerate(value):
                read_typed(args[0], item, where, f"{field_prefix}{name}[{i}].")
    return data


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return shown(text, 80)


class ForeignRecordError(ValueError):
    """A run folder holds records of another run (appended from another model or other settings)."""


#: (device, inode) of every run.lock this process holds (eval/runner/store.py's RunLock): a
#: process's own run is not "another writer" of the folder it reads back (its scores at the end)
OWN_LOCKS: set[tuple[int, int]] = set()


def being_written(folder: str | FsPath) -> bool:
    """Whether another run is writing to ``folder`` now (it holds the folder's lock): what is read
    there is partial. A lock this process holds (``OWN_LOCKS``) is not another run's.

    The probe takes a shared lock for an instant; a run that meets it retries (RunLock.acquire), so
    a probe can never make a run refuse to start."""
    import fcntl
    import os

    from .input_files import JSON_FILE, open_checked

    try:  # non-blocking, never through a link, a regular file (a FIFO there is refused, never waited on)
        fd = open_checked(FsPath(folder) / LOCK_NAME, JSON_FILE, what="run lock")
    except FileNotFoundError:
        return False
    try:
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) in OWN_LOCKS:
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def check_oracle(value: str, where: str = "") -> str:
    """``value`` if it is an oracle setting; else a ValueError naming ``where`` it came from."""
    if value not in ORACLE_SETTINGS:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}unknown oracle setting {value!r}; expected one of {', '.join(ORACLE_SETTINGS)}"
        )
    return value


@dataclass
class TurnResult:
    """One asked turn of one case."""

    task: str
    stage: int
    #: the model's raw text for this turn (before any oracle patch)
    response: str
    #: option indices read by the run's parse mode ([-1] when nothing could be read)
    parsed: list[int]
    parse_status: str
    #: gold option indices (1-based)
    gold: list[int]
    correct: bool
    n_options: int
    multi_select: bool
    #: 1-based index of the None option (points: last option; location: 4), else None
    none_index: int | None = None
    #: oracle text prepended to this turn's user message (explicit setting), if any
    oracle_text: str | None = None
    #: the text that replaced this turn's answer in the history (implicit setting), if it was patched
    patched_to: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    #: the whole reply as parsed, where ``response`` (the reply as the reference records it) lost
    #: part of it: reasoning markers that are special tokens, an API's separate reasoning field
    full_response: str | None = None
    #: the model or the service declined to answer (refusal, content filter); scored as unparsed
    refusal: str | None = None
    #: results written before failed requests were kept apart (schema 1) could hold a turn whose
    #: request failed; it is read, and counted, as such
    error: str | None = None

    @property
    def parsed_text(self) -> str:
        """What the parser reads: the whole reply where it was kept, else the recorded one; nothing
        for a refusal (a declined or filtered reply is no answer, whatever text came with it)."""
        if self.refusal:
            return ""
        return self.full_response if self.full_response is not None else self.response


def judge_turn(
    turn: Turn,
    response: str | None,
    *,
    mode: str = "reference",
    model: str = "",
    correct: bool | None = None,
    **fields: Any,
) -> TurnResult:
    """Parse a response to ``turn``, judge it against the gold answer and record both.

    ``correct`` overrides the verdict (e.g. a stored one); ``fields`` fill the optional fields
    (oracle_text, patched_to, usage, full_response, refusal). The parser reads ``full_response``
    where it is given.
    """
    from .answers import is_correct, parse_answer

    full = fields.get("full_response")
    text = "" if fields.get("refusal") else (full if full is not None else response)
    parsed = parse_answer(text, mode=mode, none_index=turn.none_index, model=model)
    if correct is None:
        correct = is_correct(parsed, turn.answer_index, multi_select=turn.multi_select, mode=mode)
    return TurnResult(
        task=turn.task,
        stage=turn.stage,
        response=response or "",
        parsed=list(parsed.indices),
        parse_status=parsed.status,
        gold=list(turn.answer_index),
        correct=correct,
        n_options=len(turn.options),
        multi_select=turn.multi_select,
        none_index=turn.none_index,
        **fields,
    )


@dataclass
class CaseResult:
    """One finished case: every turn asked, and the conversation as the model last saw it."""

    key_id: str
    lesion: str
    path: str
    oracle: str
    turns: list[TurnResult]
    #: [{"role": "system"|"user"|"assistant", "text": str, "images": [relative paths]}...]
    conversation: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION
    #: the run that made this record (``run_identity``): resume, score and report refuse a record
    #: of another run in a run folder; None in records written before schema 3
    run: dict[str, str] | None = None

    def turn(self, task: str) -> TurnResult | None:
        for t in self.turns:
            if t.task == task:
                return t
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "a result record") -> CaseResult:
        """A record as read from results.jsonl, every field read by ``read_typed`` (``where``, the
        file and line, is named on a bad value); its key_id must be a safe name (ValueError otherwise)."""
        read_typed(cls, d, where)
        check_record_key(d)
        for i, turn in enumerate(d["turns"]):
            check_turn_answers(turn, f"{where}: field turns[{i}]")
        turns = [TurnResult(**t) for t in d["turns"]]
        return cls(**{**d, "turns": turns})


def check_turn_answers(turn: Mapping[str, Any], where: str) -> None:
    """RecordFieldError unless a turn's options add up: ``n_options`` at least 1, ``gold`` one or more
    distinct options among them, ``none_index`` (where there is one) one of them. A gold of 9 on a
    question of 2 options was scored as the run's answer key (red team, stop 44); ``parsed`` may be
    anything a model wrote."""
    n = turn["n_options"]
    if n < 1:
        raise RecordFieldError(f"{where}.n_options: expected at least 1 option, got {n}")
    gold = turn["gold"]
    if not gold or len(set(gold)) != len(gold) or any(not 1 <= g <= n for g in gold):
        raise RecordFieldError(
            f"{where}.gold: expected distinct options from 1 to n_options {n}, got {_shown(gold)}"
        )
    none = turn.get("none_index")
    if none is not None and not 1 <= none <= n:
        raise RecordFieldError(f"{where}.none_index: expected an option from 1 to n_options {n}, got {none}")


def check_record_key(record: Mapping[str, Any]) -> str:
    """The ``key_id`` of a record read from a results or failures file, which must be a safe name
    (``chexpercept.containment.name_problem``, as the bundle's are): a key_id holding control
    characters or a newline never reaches a message, a table or a path. ValueError (the value
    shown escaped) or KeyError otherwise."""
    from .containment import name_problem

    key = record["key_id"]
    problem = name_problem(key)
    if problem:
        raise ValueError(f"key_id {key!r} {problem}")
    return key


@dataclass
class CaseFailure:
    """A case whose conversation stopped because a request failed (transport, a rejected request).

    There is no answer to score: the case has no line in results.jsonl, the run is incomplete and
    a rerun retries it. Kept in failures.jsonl so that the run's end, ``score`` and the report can
    say how many cases that is, and why.
    """

    key_id: str
    lesion: str
    path: str
    #: the turn whose request failed, and its position in the case's conversation (0-based)
    task: str
    turn_index: int
    error: str
    time: str = ""
    #: the run that made this record (``run_identity``); None before schema 3
    run: dict[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))


def read_failures(path: str | FsPath) -> list[CaseFailure]:
    """The failures of a run folder's failures.jsonl (empty when there is none); a torn last
    line is left out."""
    path = FsPath(path)
    if not path.exists():  # anything else by that name (a FIFO, a folder) is refused by complete_lines
        return []
    out = []
    for n, line in complete_lines(path):
        try:
            record = read_typed(CaseFailure, loads(line, source=f"{path}:{n}"), f"{path}:{n}")
            check_record_key(record)
            out.append(CaseFailure(**record))
        except JsonInputError as e:
            raise ValueError(f"{path}:{n}: not a CheXpercept case failure: {e.reason}") from None
        except RecordFieldError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a CheXpercept case failure: {e}") from e
    return out


def complete_lines(path: str | FsPath) -> Iterator[tuple[int, str]]:
    """(line number, line) of every non-blank line of a results.jsonl that ends in a newline:
    anything after the last newline is a line torn by a crash mid-write, and is not a result. The
    file must be a regular file within chexpercept.input_files.RESULTS, each line within MAX_LINE
    (InputFileError otherwise); it is streamed, one line in memory at a time."""
    for n, line in iter_lines(path, RESULTS, what="results file"):  # streamed, bounded lines
        if line.strip():
            yield n, line


def torn_tail(path: str | FsPath) -> int:
    """Bytes after the last newline of a results.jsonl or failures.jsonl (a line torn by a crash
    mid-write, which ``complete_lines`` leaves out); 0 when it ends in a newline or is absent."""
    import os

    try:
        with open_input(path, RESULTS, what="results file") as f:  # a regular file within its limit
            end = f.seek(0, os.SEEK_END)
            pos, torn = end, 0
            while pos > 0:
                step = min(65536, pos)
                pos -= step
                f.seek(pos)
                chunk = f.read(step)
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    return torn + len(chunk) - cut - 1
                torn += len(chunk)
            return torn
    except FileNotFoundError:
        return 0


def not_a_result(path: str | FsPath, n: int, reason: str) -> str:
    """The message for line ``n`` of a results file that is not a case result, with what to do
    (the run, score and report all say it so)."""
    return (
        f"{path}:{n}: not a CheXpercept case result ({reason}). The other lines are intact: delete or "
        f"repair line {n} (e.g. sed -i '{n}d' FILE) and rerun; a deleted case is run again"
    )


def iter_results(path: str | FsPath) -> Iterator[CaseResult]:
    """Read a results.jsonl; a torn last line (crash mid-write) is ignored, any other bad line raises."""
    for _n, result in iter_numbered_results(path):
        yield result


def iter_numbered_results(path: str | FsPath) -> Iterator[tuple[int, CaseResult]]:
    """(line number, result) of every result of a results.jsonl (as ``iter_results``)."""
    path = FsPath(path)
    for n, line in complete_lines(path):
        try:
            yield n, CaseResult.from_dict(loads(line, source=f"{path}:{n}"), f"{path}:{n}")
        except JsonInputError as e:
            raise ValueError(not_a_result(path, n, e.reason)) from None
        except RecordFieldError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(not_a_result(path, n, str(e))) from e
