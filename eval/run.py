"""Run a model (or a baseline) on CheXpercept: one conversation per case, results per case on disk.

    python eval/run.py --data-dir DIR --model baseline:prior --oracle implicit --output-dir runs/
    accelerate launch --num_processes 8 eval/run.py --data-dir DIR --model qwen3.6-27b --no-thinking
    chexpercept run --data-dir DIR --model ./tiny-vlm --backend transformers

Results go to ``OUT/<model>/oracle_<setting>/results.jsonl`` (one line per finished case) and
``run.json``. Rerunning the same command resumes; under accelerate every process runs its own
backend on its share of the cases and all of them append to the same results file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path as FsPath
from typing import Any

if (
    __name__ == "__main__"
    and sys.path
    and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__))
):
    # run as a script (python eval/run.py, accelerate launch eval/run.py): this folder's modules
    # must be imported as chexpercept.eval.*, never as top-level names
    sys.path.pop(0)

from chexpercept.answers import PARSE_MODES
from chexpercept.bundle import IMAGE_CHECKS, Bundle, check_release_dir, read_bundle
from chexpercept.case import Case
from chexpercept.cli_options import add_progress_option, progress_enabled
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError
from chexpercept.escape import terminal, terminal_lines
from chexpercept.eval.backends import backend_class, json_object_arg
from chexpercept.eval.distributed import Distributed
from chexpercept.eval.engine import EngineStats, admission_order, run_conversations
from chexpercept.eval.hub import add_revision_option, prepare_model
from chexpercept.eval.interrupts import ChildProcesses, RunInterrupted, stop_on_signals
from chexpercept.eval.outcome import READ_ONLY, Session, end_of, os_error_text, say_end
from chexpercept.eval.protocol import Backend, BackendError, RunContext, Sampling
from chexpercept.eval.provenance import git_commit, now, versions
from chexpercept.eval.registry import BACKENDS, REGISTRY, ModelSpec, resolve
from chexpercept.eval.selection import add_selection_options, select_cases, shard, split_list
from chexpercept.eval.store import (
    RunLockedError,
    RunStore,
    StoreError,
    append_results,
    read_records,
    repair_tail,
    rewrite_in_order,
    write_json_atomic,
)
from chexpercept.results import (
    ORACLE_SETTINGS,
    CaseFailure,
    CaseResult,
    ForeignRecordError,
    check_identity,
    read_failures,
    run_identity,
)
from chexpercept.run_metadata import BundleInfo, RunMetadata, SamplingInfo, Selection

#: exit status of a run that ended with cases left unfinished by failed requests (rerun to retry)
EXIT_UNFINISHED = 3
#: errors that are the input's or the setting's (one line naming them), not bugs
EXPECTED_ERRORS = (
    ValueError,
    PermissionError,
    FileNotFoundError,
    StoreError,
    RunLockedError,
    BackendError,
    BundleValidationError,
    ReleaseNotFoundError,
    ForeignRecordError,
)


def configure(parser: argparse.ArgumentParser) -> None:
    _add_run_options(parser)
    _add_selection_options(parser)
    _add_output_options(parser)
    _add_decoding_options(parser)
    _add_backend_options(parser)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what to run")
    g.add_argument(
        "--data-dir", metavar="DIR", help="folder of the release bundle (chexpercept.json + chexpercept/)"
    )
    g.add_argument(
        "--model",
        help="registry name (see --list-models), Hugging Face id, local folder, or "
        "baseline:random | baseline:constant:<k> | baseline:prior | baseline:oracle",
    )
    g.add_argument(
        "--backend", choices=BACKENDS, help="default: the registry's backend (required for other models)"
    )
    g.add_argument(
        "--model-id", help="load/send this id or folder instead of the registry's (e.g. a local copy)"
    )
    add_revision_option(g)  # Hub (chexpercept.eval.hub)
    g.add_argument(
        "--oracle",
        nargs="+",
        choices=ORACLE_SETTINGS,
        default=["implicit"],
        metavar="SETTING",
        help="oracle setting(s): none, implicit, explicit; several run in turn on one engine, each in its "
        "own folder (default: implicit)",
    )
    g.add_argument(
        "--parse-mode",
        choices=PARSE_MODES,
        default="reference",
        help="how answers are read during the run, which drives oracle triggers (default: reference)",
    )
    g.add_argument(
        "--on-error",
        choices=("stop", "record"),
        default="stop",
        help="when a request fails (after the backend's retries; or the engine refuses it): stop the run "
        "(finished cases are saved; rerun to resume) or record the case as unfinished in failures.jsonl "
        "and go on with the others (exit status 3; a rerun retries them). Default: stop",
    )
    g.add_argument("--list-models", action="store_true", help="print the model registry and exit")


def _add_selection_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("which cases")
    add_selection_options(g)
    g.add_argument(
        "--check-images",
        choices=[c for c in IMAGE_CHECKS if c != "none"],
        default="basic",
        help="image check before the run (default: basic: exists, parses, not truncated)",
    )


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("output")
    g.add_argument(
        "--output-dir", default="runs", metavar="DIR", help="results go to DIR/<model>/oracle_<setting>/"
    )
    g.add_argument("--run-name", help="folder name instead of the model's")
    add_progress_option(g)
    g.add_argument(
        "--no-score",
        action="store_true",
        help="do not score the run at the end (by default the model's Table 2 row is printed)",
    )


def _add_decoding_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("decoding")
    g.add_argument(
        "--batch-size",
        type=int,
        help="most conversations live at once; a finished one's slot goes to the next case at once "
        "(backend default otherwise)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for sampling and baseline:random (default 0)")
    g.add_argument(
        "--temperature", type=float, help="default: 0 (open models), 1 (API models as in the paper)"
    )
    g.add_argument("--top-p", type=float, help="default 1")
    g.add_argument("--max-tokens", type=int, help="most new tokens per answer (default 8192)")
    g.add_argument(
        "--no-thinking", action="store_true", help="chat_template_kwargs enable_thinking=False (Qwen3.5/3.6)"
    )
    g.add_argument(
        "--chat-template-kwargs", type=json_object_arg, help="extra chat template variables as JSON"
    )


def _add_backend_options(parser: argparse.ArgumentParser) -> None:
    """Each backend's own options (chexpercept.eval.backends), one group per backend in the table's order."""
    for name in BACKENDS:
        backend_class(name).add_options(parser.add_argument_group(f"{name} backend"))


# ------------------------------------------------------------------------------------ settings
def sampling_for(spec: ModelSpec, args: argparse.Namespace) -> Sampling:
    """Decoding as sent and recorded: the registry's, then the options, then what --request-extra
    sends instead (the openai backend: a field it sets or removes is what the server gets)."""
    base = spec.sampling
    temperature = base["temperature"] if args.temperature is None else args.temperature
    top_p = base["top_p"] if args.top_p is None else args.top_p
    max_tokens = base["max_tokens"] if args.max_tokens is None else args.max_tokens
    extra = (args.request_extra or {}) if spec.backend == "openai" else {}
    if "temperature" in extra:
        temperature = extra["temperature"]  # None: the server's default, so not known to be greedy
    if "top_p" in extra:
        top_p = 1.0 if extra["top_p"] is None else extra["top_p"]
    for key in ("max_completion_tokens", "max_tokens"):
        if isinstance(extra.get(key), int):
            max_tokens = extra[key]
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {max_tokens}")
    return Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, greedy=temperature == 0)


def chat_kwargs_for(spec: ModelSpec, args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """chat_template_kwargs and, if --no-thinking does not apply to this model, a note saying so."""
    kwargs: dict[str, Any] = {}
    note = None
    if args.no_thinking:
        if spec.thinking_switch or not spec.in_registry:
            kwargs["enable_thinking"] = False
        else:
            note = f"--no-thinking has no effect on {spec.name} (its chat template has no thinking switch)"
    kwargs.update(args.chat_template_kwargs or {})
    return kwargs, note


def make_backend(
    spec: ModelSpec, args: argparse.Namespace, sampling: Sampling, chat_kwargs: dict[str, Any]
) -> Backend:
    """The backend ``spec`` names, built from the parsed options (chexpercept.eval.backends)."""
    return backend_class(spec.backend).from_options(spec, args, sampling, chat_kwargs)


def print_registry() -> None:
    rows = [("name", "backend", "model id", "reference alias")]
    rows += [(s.name, s.backend, s.model_id, s.reference_alias) for s in REGISTRY.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


# ------------------------------------------------------------------------------------ the run
class _Progress:
    """One bar on the main process, counting cases finished by every process (lines appended)."""

    def __init__(self, results: FsPath, total: int, enabled: bool, offset: int):
        self.results = results
        self.bar = None
        #: size of the results file before any process of this run appended to it
        self.offset = offset
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="case", desc="cases", dynamic_ncols=True)

    def refresh(self) -> None:
        if self.bar is None or not self.results.exists():
            return
        with open(self.results, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        lines = chunk.count(b"\n")
        if lines:
            self.offset += chunk.rfind(b"\n") + 1
            self.bar.update(lines)

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()


def _prepare_folder(folder: RunStore, settings: dict[str, Any], header: RunMetadata) -> dict[str, Any]:
    """Main process: take the lock, check resumability, repair a torn tail, write run.json."""
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.lock.acquire()
    try:
        previous = folder.check_settings(settings)
        dropped = repair_tail(folder.results)
        repair_tail(folder.failures)
        size = folder.results.stat().st_size if folder.results.exists() else 0
        identity = run_identity(settings)
        finished = sorted(read_records(folder.results, identity))
        failures = read_failures(folder.failures)
        check_identity(folder.failures, ((i + 1, f.key_id, f.run) for i, f in enumerate(failures)), identity)
        info = replace(header, settings=settings, finished=None)
        if previous:
            info.started = previous.get("started", header.started)
            info.resumed = [*previous.get("resumed", []), header.started]
        write_json_atomic(folder.run_json, info.to_json())
        # run.json's dict, not the record: the outcome is broadcast to every process
        return {
            "ok": True,
            "dropped": dropped,
            "results_size": size,
            "finished": finished,
            "info": info.to_json(),
        }
    except BaseException:
        folder.lock.release()
        raise


def _backend_for(
    args: argparse.Namespace, dist: Distributed
) -> tuple[ModelSpec, Backend, Sampling, dict[str, Any], int]:
    """The model's spec, its backend (not set up yet), the decoding it reports, the chat template
    variables and the batch size."""
    spec = resolve(args.model, backend=args.backend, model_id=args.model_id)
    sampling = sampling_for(spec, args)
    chat_kwargs, note = chat_kwargs_for(spec, args)
    if note and dist.is_main:
        print(f"note: {note}", file=sys.stderr)
    # arguments first: a wrong one fails before the bundle's images are checked
    backend = make_backend(spec, args, sampling, chat_kwargs)
    sampling = backend.sampling()
    batch_size = args.batch_size or backend.default_batch_size
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    return spec, backend, sampling, chat_kwargs, batch_size


def _selected_cases(
    args: argparse.Namespace,
) -> tuple[Bundle, list[str] | None, list[str] | None, list[Case]]:
    """The bundle (images checked), the --lesions and --paths asked for, and the selected cases."""
    lesions, paths = split_list(args.lesions), split_list(args.paths)
    bundle = read_bundle(args.data_dir, lesions=lesions, paths=paths, check_images=args.check_images)
    cases = select_cases(bundle.cases, per_cell=args.per_cell, limit=args.limit)
    if not cases:
        raise ValueError(
            f"no case of {bundle.root} matches the selection (--lesions/--paths/--per-cell/--limit)"
        )
    return bundle, lesions, paths, cases


@dataclass
class _OracleRun:
    """One oracle setting of the command: its run folder, settings and run.json header; what the
    main process found there (``outcome``); this session's counts (``session``)."""

    oracle: str
    folder: RunStore
    settings: dict[str, Any]
    header: RunMetadata
    outcome: dict[str, Any] = field(default_factory=dict)
    session: Session | None = None
    remaining: list[Case] = field(default_factory=list)
    mine: list[Case] = field(default_factory=list)


def execute(args: argparse.Namespace, dist: Distributed, children: ChildProcesses) -> int:
    """The command: every oracle setting asked for, in turn, on one backend (one engine start)."""
    # arguments first: a wrong one fails before the bundle's images are checked
    spec, backend, sampling, chat_kwargs, batch_size = _backend_for(args, dist)
    check_release_dir(args.data_dir)  # a wrong --data-dir fails before any download
    # Hub: the weights are resolved and checked (gated, missing, disk space), then fetched once per
    # machine, before the bundle's images are read and before any engine starts; the backend then
    # loads that snapshot folder
    load_spec, weights = prepare_model(spec, args.revision, dist)
    if load_spec is not spec:
        backend = make_backend(load_spec, args, sampling, chat_kwargs)
    bundle, lesions, paths, cases = _selected_cases(args)
    header = RunMetadata(
        model=spec.name,
        display_name=spec.display or spec.name,
        model_id=spec.model_id,
        backend=spec.backend,
        parse_mode=args.parse_mode,
        sampling=SamplingInfo(**sampling.as_dict()),
        seed=args.seed,
        chat_template_kwargs=chat_kwargs,
        bundle=BundleInfo(
            path=str(bundle.root),
            fingerprint=bundle.fingerprint(),
            synthetic=bundle.synthetic,
            n_cases=len(bundle.cases),
        ),
        selection=Selection(
            lesions=lesions, paths=paths, per_cell=args.per_cell, limit=args.limit, n_selected=len(cases)
        ),
        weights=weights.record() if weights is not None else None,  # Hub: revision and commit
        batch_size=batch_size,
        num_processes=dist.count,
        versions=versions(),
        git_commit=git_commit(),
        command=sys.argv,
        started=now(),
    )
    runs = [_plan(args, spec, sampling, chat_kwargs, header, oracle) for oracle in oracles_of(args)]
    try:
        status = _take_folders(runs, args, dist, spec, cases)
        if status is not None:
            return status
        return _run_all(args, dist, spec, bundle, cases, backend, batch_size, runs)
    finally:
        if dist.is_main:
            for run in runs:
                run.folder.lock.release()
        children.stop()


def oracles_of(args: argparse.Namespace) -> list[str]:
    """The oracle settings asked for, each once, in the order given."""
    given = args.oracle if isinstance(args.oracle, list) else [args.oracle]
    return list(dict.fromkeys(given))


def _plan(
    args: argparse.Namespace,
    spec: ModelSpec,
    sampling: Sampling,
    chat_kwargs: dict[str, Any],
    header: RunMetadata,
    oracle: str,
) -> _OracleRun:
    folder = RunStore(FsPath(args.output_dir) / (args.run_name or spec.name) / f"oracle_{oracle}")
    settings = {
        "model_id": spec.model_id,
        "backend": spec.backend,
        "oracle": oracle,
        "parse_mode": args.parse_mode,
        "sampling": sampling.as_dict(),
        "seed": args.seed,
        "chat_template_kwargs": chat_kwargs,
        "bundle_fingerprint": header.bundle.fingerprint if header.bundle else None,
    }
    return _OracleRun(oracle, folder, settings, replace(header, oracle=oracle))


def _take_folders(
    runs: list[_OracleRun], args: argparse.Namespace, dist: Distributed, spec: ModelSpec, cases: list[Case]
) -> int | None:
    """1. The main process takes every setting's folder (or, read-only, checks a finished run);
    everyone learns whether it could. Returns the exit status when the command ends here."""
    outcomes: list[dict[str, Any]] = []
    error: Exception | None = None
    if dist.is_main:
        for run in runs:
            try:
                outcome = _prepare_folder(run.folder, run.settings, run.header)
            except OSError as e:
                if e.errno not in READ_ONLY:
                    raise
                status = recheck_read_only(run, cases, e, args, spec)
                outcome = {"ok": False, "status": status}
            except EXPECTED_ERRORS as e:
                error, outcome = e, {"ok": False, "status": 2, "error": str(e)}
            outcomes.append(outcome)
            if not outcome["ok"] and outcome["status"] != 0:
                break
    outcomes = dist.broadcast(outcomes)
    for run, outcome in zip(runs, outcomes):
        run.outcome = outcome
    failed = [o for o in outcomes if not o["ok"] and o["status"] != 0]
    if failed or len(outcomes) < len(runs):
        if error is not None:
            raise error
        return int(failed[0]["status"]) if failed else 2
    if not any(o["ok"] for o in outcomes):
        return 0  # every setting was complete (checked read-only)
    return None


def _run_all(
    args: argparse.Namespace,
    dist: Distributed,
    spec: ModelSpec,
    bundle: Bundle,
    cases: list[Case],
    backend: Backend,
    batch_size: int,
    runs: list[_OracleRun],
) -> int:
    """2. preflight for every setting, 3. the conversations of each setting in turn on one backend,
    4. each setting signed off; the exit status (the worst of the settings')."""
    todo = [run for run in runs if run.outcome.get("ok")]
    prefix = f"process {dist.index} of {dist.count}: " if dist.count > 1 else ""
    for run in todo:
        run.session = Session(run.folder.path, run.folder.results, selected=len(cases), prefix=prefix)
        run.remaining, run.mine = _shares(dist, cases, run.folder, run.outcome)
        run.session.remaining = len(run.remaining)
    context = RunContext(
        root=bundle.root,
        cases=cases,
        seed=args.seed,
        process_index=dist.index,
        num_processes=dist.count,
        local_process_index=dist.local_index,
        local_num_processes=dist.local_count,
    )
    current: _OracleRun | None = None
    statuses: list[int] = []
    try:
        # before any engine loads: does every conversation left fit the engine's limits?
        for run in todo:
            verdict = _preflight(args, spec, backend, context, run) if dist.is_main else ""
            verdict = dist.broadcast(verdict)
            if verdict:
                raise ValueError(verdict)
        ready = False
        for run in todo:
            current = run
            if run.mine and not ready:
                backend.setup(context)
                ready = True
            statuses.append(_run_one(args, dist, spec, bundle, cases, backend, batch_size, run))
    except (Exception, RunInterrupted) as e:  # every early end is one line (eval/outcome.py)
        run = current or todo[0]
        error: BaseException = e
        try:  # the engine's own shutdown log goes before that line
            backend.close()
        except RunInterrupted as stop:  # a signal while closing: the run ends by it
            error = stop
        except Exception:
            pass  # the error that ended the run is the one to tell; the process stops what is left
        return end_of(error, run.session, run.folder.path, main=dist.is_main, expected=EXPECTED_ERRORS)
    finally:
        backend.close()
    if dist.is_main and not args.no_score:
        print_scores(runs[0].folder.path.parent, spec.display or spec.name, args.parse_mode)
    return max(statuses, default=0)


def recheck_read_only(
    run: _OracleRun, cases: list[Case], error: OSError, args: argparse.Namespace, spec: ModelSpec
) -> int:
    """A folder that cannot be written: a finished run with these settings is checked without
    writing (0); anything else is one line saying why it cannot go on (2)."""
    folder = run.folder
    what, advice = os_error_text(error, folder.path)
    if not folder.run_json.is_file():
        say_end(None, f"error: {what}", advice)
        return 2
    folder.check_settings(run.settings)  # reads only; names any difference
    records = read_records(folder.results, run_identity(run.settings))
    missing = [c.key_id for c in cases if c.key_id not in records]
    if missing:
        say_end(
            None,
            f"error: {what}; {len(missing)} of the {len(cases)} selected cases are not done (e.g. {missing[0]})",
            advice,
        )
        return 2
    print(
        f"{len(cases)} cases of {spec.name} (oracle {run.oracle}) in {folder.path}: the run is complete "
        "(checked read-only: nothing was written)"
    )
    if not args.no_score:
        print_scores(folder.path.parent, spec.display or spec.name, args.parse_mode)
    return 0


def _run_one(
    args: argparse.Namespace,
    dist: Distributed,
    spec: ModelSpec,
    bundle: Bundle,
    cases: list[Case],
    backend: Backend,
    batch_size: int,
    run: _OracleRun,
) -> int:
    """One oracle setting: this process's share of its conversations, then (main process) every
    selected case checked there once, the file ordered, run.json signed off."""
    assert run.session is not None
    stats, progress = EngineStats(), None
    enabled = dist.is_main and progress_enabled(args)
    progress = _Progress(run.folder.results, len(run.remaining), enabled, run.outcome["results_size"])
    try:
        if run.mine:
            new_session = getattr(backend, "new_session", None)
            if callable(new_session):  # run.json's counts are this setting's
                new_session()
            stats = _converse(args, spec, backend, batch_size, run, progress)
        dist.barrier()
    finally:
        progress.close()
    if not dist.is_main:
        return 0
    return _sign_off(args, spec, bundle, cases, backend, run, stats)


def _preflight(
    args: argparse.Namespace, spec: ModelSpec, backend: Backend, context: RunContext, run: _OracleRun
) -> str:
    """Main process: the preflight report (eval/preflight.py) of one setting's cases left, before
    the engine loads; returns the reason to stop ("" to go on). Cases that cannot run stop the run
    under --on-error stop; under record they are reported and fail one by one."""
    limits_of = getattr(backend, "context_limits", None)
    model_dir = getattr(getattr(backend, "spec", None), "model_id", spec.model_id)  # the local snapshot
    if not run.remaining or not callable(limits_of) or not FsPath(model_dir).is_dir():
        return ""
    limits = limits_of(context)
    if limits.max_model_len is None and limits.max_images is None:
        return ""
    from chexpercept.eval.local_tokens import ProcessorCounter
    from chexpercept.eval.preflight import check_fit

    try:
        counter = ProcessorCounter(context.root, model_dir, getattr(backend, "chat_template_kwargs", None))
    except Exception as e:  # no processor to count with: the engine will say what it refuses
        print(
            f"note: preflight check skipped (cannot load the processor of {model_dir}: {e})", file=sys.stderr
        )
        return ""
    try:
        report = check_fit(
            run.remaining, counter, limits, oracle=run.oracle, max_tokens=backend.sampling().max_tokens
        )
    except Exception as e:  # e.g. an image that no longer decodes: the backend names it when it meets it
        print(f"note: preflight check skipped ({type(e).__name__}: {e})", file=sys.stderr)
        return ""
    print(f"oracle {run.oracle}: " + "\n".join(report.lines()), file=sys.stderr)
    if report.cannot and args.on_error == "stop":
        return (
            f"{len(report.cannot)} selected case(s) cannot run within the engine's limits (listed above); "
            "nothing was started"
        )
    return ""


def _shares(
    dist: Distributed, cases: list[Case], folder: RunStore, outcome: dict[str, Any]
) -> tuple[list[Case], list[Case]]:
    """(cases left to do, this process's share of them). Everyone takes its share of what the main
    process found left to do: one snapshot for all (reading the file here could already see another
    process's first results)."""
    if dist.is_main and outcome.get("dropped"):
        print(
            f"note: removed a torn last line ({outcome['dropped']} bytes) left by an interrupted run",
            file=sys.stderr,
        )
    finished = set(outcome["finished"])
    remaining = [c for c in cases if c.key_id not in finished]
    if dist.is_main and finished:
        done_here = len(cases) - len(remaining)
        print(
            f"resuming {folder.path}: {done_here} of {len(cases)} selected cases already done",
            file=sys.stderr,
        )
    return remaining, shard(remaining, dist.index, dist.count)


def _converse(
    args: argparse.Namespace,
    spec: ModelSpec,
    backend: Backend,
    batch_size: int,
    run: _OracleRun,
    progress: _Progress,
) -> EngineStats:
    """This process's conversations of one setting, each finished case appended at once (failed
    ones apart), each record marked with the run that made it."""
    identity = run_identity(run.settings)
    folder, session = run.folder, run.session
    assert session is not None

    def on_finished(results: list[CaseResult]) -> None:
        for r in results:
            r.run = identity
        append_results(folder.results, results)
        session.finished_now += len(results)
        progress.refresh()

    def on_failed(failures: list[CaseFailure]) -> None:
        for f in failures:
            f.run = identity
        append_results(folder.failures, failures)
        session.failed_now += len(failures)
        for f in failures:
            print(f"warning: {f.key_id} ({f.task}) left unfinished: {terminal(f.error)}", file=sys.stderr)

    return run_conversations(
        admission_order(run.mine),
        backend,
        oracle=run.oracle,
        parse_mode=args.parse_mode,
        model=spec.model_id,
        batch_size=batch_size,
        on_finished=on_finished,
        on_failed=on_failed if args.on_error == "record" else None,
        on_empty=EmptyAnswerWarning(spec.model_id),
    )


def _sign_off(
    args: argparse.Namespace,
    spec: ModelSpec,
    bundle: Bundle,
    cases: list[Case],
    backend: Backend,
    run: _OracleRun,
    stats: EngineStats,
) -> int:
    """Main process: every selected case there once (or failed), results in bundle order, run.json
    completed; the exit status of this setting."""
    folder = run.folder
    records = read_records(folder.results)
    failed = {f.key_id: f for f in read_failures(folder.failures) if f.key_id not in records}
    missing = [c.key_id for c in cases if c.key_id not in records and c.key_id not in failed]
    if missing:
        raise StoreError(f"{len(missing)} selected case(s) have no result after the run, e.g. {missing[:5]}")
    rewrite_in_order(folder.results, records, {c.key_id: i for i, c in enumerate(bundle.cases)})
    info = RunMetadata.from_json(run.outcome["info"], source=str(folder.run_json))
    info.finished = None if failed else now()
    info.unfinished_cases = len(failed)
    info.backend_settings = backend.describe()
    info.n_results = len(records)
    info.last_session = {
        "cases": len(run.remaining),
        "model_calls_main_process": stats.requests,
        "rounds_main_process": stats.rounds,  # each time the backend handed back answers
        "most_live_main_process": stats.max_live,
        "seconds_main_process": round(stats.seconds, 3),
    }
    if spec.backend == "openai" and records:
        info.estimate = usage_estimate(spec, bundle, cases, records, run.oracle, args.parse_mode)
    write_json_atomic(folder.run_json, info.to_json())
    if failed:
        first = next(iter(failed.values()))
        print(
            f"chexpercept run: {len(failed)} of {len(cases)} cases are unfinished because a request "
            f"failed (e.g. {first.key_id} ({first.task}): {terminal(first.error)}); they are listed in "
            f"{folder.failures} and are not scored. Fix the cause and rerun the same command: it "
            "retries them.",
            file=sys.stderr,
        )
        return EXIT_UNFINISHED
    print(
        f"{len(cases)} cases of {spec.name} (oracle {run.oracle}) in {folder.path} "
        f"({len(run.remaining)} run now, {len(cases) - len(run.remaining)} from before)"
    )
    occupancy = schedule_line((info.backend_settings or {}).get("schedule"))
    if occupancy:
        print(occupancy)
    return 0


def usage_estimate(
    spec: ModelSpec,
    bundle: Bundle,
    cases: list[Case],
    records: dict[str, dict[str, Any]],
    oracle: str,
    parse_mode: str,
) -> dict[str, Any] | None:
    """run.json's ``estimate``: what ``chexpercept estimate`` counts for the conversations this run had
    (its answers replayed) beside the usage the API reported, so the estimator's error is visible in
    ``chexpercept score --details``. A failure here never fails the run: it is a warning."""
    from chexpercept.eval.estimate import ApiCounter, compare, estimate_recorded
    from chexpercept.eval.pricing import rules_for

    try:
        results = [CaseResult.from_dict(r) for r in records.values()]
        counter = ApiCounter(bundle.root, rules_for(spec.model_id))
        estimate = estimate_recorded(
            cases,
            results,
            oracle,
            counter,
            model_id=spec.model_id,
            parse_mode=parse_mode,
            model=spec.model_id,
        )
        comparison = compare(estimate, results)
    except Exception as e:  # the estimate is a by-product; the run's results are what matter
        print(f"warning: could not estimate this run's tokens for comparison ({e!r})", file=sys.stderr)
        return None
    return {
        "counter": counter.name,
        "exact": counter.exact,
        "estimated": comparison.estimated,
        "actual": comparison.actual,
        "relative_error": comparison.relative_error,
    }


class EmptyAnswerWarning:
    """Warns once when most answers so far came back empty: a model that says nothing is usually
    a setting (a reasoning parser whose replies land outside ``message.content``, a stop string,
    a chat template), not a model's answer."""

    #: answers seen before judging, and the empty share that warns
    MIN_ANSWERS = 16
    SHARE = 0.5

    def __init__(self, model: str):
        self.model = model
        self.warned = False

    def __call__(self, empty: int, answered: int) -> None:
        if self.warned or answered < self.MIN_ANSWERS or empty < self.SHARE * answered:
            return
        self.warned = True
        print(
            f"warning: {empty} of the {answered} answers of {self.model} so far came back empty "
            "(no text, no reasoning, no refusal); they are scored as unparsed. Check the backend's "
            "settings (for vllm serve: where its reasoning parser puts the reply; --max-tokens; the "
            "chat template) before spending more on this run.",
            file=sys.stderr,
        )


def print_scores(model_dir: FsPath, name: str, parse_mode: str) -> None:
    """Score every run of this model folder (e.g. oracle_none and oracle_implicit) and print Table 2."""
    from chexpercept.metrics import render_table, score_path
    from chexpercept.metrics.answer_warnings import warning_lines

    report = score_path(model_dir, mode=parse_mode)
    print()
    print(render_table(2, {name: report}))
    for kind, source in report.sources.items():
        where = source.description if source is not None else "no run measures it yet (N/A)"
        print(f"{kind.upper()} from: {where}")
    for note in report.notes:
        print(f"note: {terminal(note)}", file=sys.stderr)
    for line in warning_lines(report):
        print(line, file=sys.stderr)
    print(f"all numbers: chexpercept score {model_dir} --details")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``chexpercept run`` and of this script."""
    if args.list_models:
        print_registry()
        return 0
    missing = [name for name, value in (("--data-dir", args.data_dir), ("--model", args.model)) if not value]
    if missing:
        print(f"chexpercept run: error: {' and '.join(missing)} required", file=sys.stderr)
        return 2
    dist = Distributed()
    try:
        with stop_on_signals() as children:
            return execute(args, dist, children)
    except RunInterrupted as e:
        print(
            f"chexpercept run: stopped by {e.name} before any case ran; nothing was written", file=sys.stderr
        )
        return e.exit_status
    except EXPECTED_ERRORS as e:
        print(f"chexpercept run: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # before the run folder was taken (e.g. a full disk writing run.json)
        if e.errno is None:
            raise
        what, advice = os_error_text(e, FsPath(args.output_dir))
        say_end(None, f"error: {what}", advice)
        return 2
    finally:
        dist.close()


def schedule_line(schedule: dict[str, Any] | None) -> str:
    """The run summary's occupancy figure: the backend's span against the floor for its work."""
    if not schedule:
        return ""
    if schedule.get("iterations_over_floor") is not None:
        return (
            f"engine: {schedule['iterations']:,} scheduler iterations for {schedule['generated_tokens']:,} "
            f"generated tokens; the floor is {schedule['floor_iterations']:,} "
            f"({schedule['iterations_over_floor']:.2f}x; up to {schedule['most_sequences_at_once']} "
            "sequences at once)"
        )
    if schedule.get("span_over_floor") is not None:
        limit = schedule.get("in_flight_limit") or {}
        cut = f"; the limit was cut {limit['decreases']} time(s) by 429s" if limit.get("decreases") else ""
        return (
            f"requests: {schedule['span_seconds']:.1f} s in all against a floor of {schedule['floor_seconds']:.1f} s "
            f"({schedule['span_over_floor']:.2f}x; {schedule['mean_in_flight']:.1f} of {limit.get('ceiling')} "
            f"allowed in flight on average{cut})"
        )
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eval/run.py", description=__doc__.split("\n\n")[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
