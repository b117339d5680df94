"""The run: a plan's oracle settings in turn on one backend, each in its own resumable folder.

``execute(plan, backend, dist, children)`` does, for every oracle setting of the plan:

1. the main process takes the setting's folder (``run.lock``), checks that a previous run there has
   this run's identity (eval/runner/identity.py; any difference is refused, named), repairs a torn last
   line and writes run.json; every process learns the outcome (``FolderOutcome``);
2. before any engine loads, the preflight check of every conversation left against the engine's
   limits (eval/runner/preflight.py);
3. the conversations (eval/engine.py), each finished case appended at once, failed ones apart under
   ``--on-error record``; every process takes cases from the setting's work queue as it goes
   (eval/runner/work_queue.py), so none idles while another has a queue;
4. the main process checks every selected case is there once, orders the file, signs run.json off.

Every early end is one line (eval/runner/outcome.py). The command's options live in eval/run.py.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path as FsPath
from typing import Any

from chexpercept.case import Case
from chexpercept.errors import BundleValidationError, Refused, ReleaseNotFoundError
from chexpercept.escape import shown, terminal
from chexpercept.eval.engine import EngineStats, admission_order, run_conversations
from chexpercept.eval.protocol import Backend, BackendError, RunContext
from chexpercept.eval.runner.distributed import Distributed
from chexpercept.eval.runner.identity import (
    PROMPT_VERSION,
    ServedModelGuard,
    engine_versions,
    setting_folders_mismatch,
    settings_diff,
    weights_identity,
    with_file_contents,
)
from chexpercept.eval.runner.interrupts import ChildProcesses, RunInterrupted, deferred
from chexpercept.eval.runner.outcome import READ_ONLY, Session, count_lines, end_of, os_error_text, say_end
from chexpercept.eval.runner.plan import RunPlan
from chexpercept.eval.runner.provenance import git_commit, now, versions
from chexpercept.eval.runner.store import (
    RunLockedError,
    RunStore,
    StoreError,
    case_line,
    read_json,
    read_records,
    repair_tail,
    rewrite_in_order,
)
from chexpercept.eval.runner.work_queue import (
    Sign,
    WorkQueue,
    beating,
    make_queues,
    queue_path,
    remove_queue,
    remove_queues,
    still_working,
    watch_settings,
)
from chexpercept.fileio import (
    NotOursError,
    exclusive,
    private_dir,
    remove_stale_temporaries,
    write_json_atomic,
)
from chexpercept.input_files import RESULTS, LineTooLong, open_input
from chexpercept.progress import progress_bar
from chexpercept.results import (
    RESULTS_NAME,
    SETTINGS_LOCK_NAME,
    CaseFailure,
    CaseResult,
    ForeignRecordError,
    being_written,
    check_identity,
    read_failures,
    record_usages,
    run_identity,
    served_models,
)
from chexpercept.run_metadata import BundleInfo, RunMetadata, SamplingInfo

#: exit status of a run that ended with cases left unfinished by failed requests (rerun to retry)
EXIT_UNFINISHED = 3
#: errors that are the input's or the setting's (one line naming them), not bugs
EXPECTED_ERRORS = (
    Refused,
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


@dataclass(frozen=True)
class FolderOutcome:
    """What the main process found in one setting's folder, told to every process (as JSON)."""

    #: the folder was taken: there is work to do (or to check)
    ok: bool
    #: when not ok: the command's exit status (0: the run there is complete, checked read-only)
    status: int = 0
    #: bytes of a torn last line cut off
    dropped: int = 0
    #: size of results.jsonl before this session appended to it
    results_size: int = 0
    #: key_ids finished before this session
    finished: tuple[str, ...] = ()
    #: run.json as this session wrote it
    info: dict[str, Any] = field(default_factory=dict)
    #: this session's name (its work queue, eval/runner/work_queue.py)
    session: str = ""
    #: turns per served model among the answers kept before this session (usage.served_model)
    served: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As JSON, for the other processes (``Distributed.broadcast`` sends JSON, never a pickle)."""
        return {**asdict(self), "finished": list(self.finished)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FolderOutcome:
        return cls(**{**data, "finished": tuple(data["finished"])})


@dataclass
class OracleRun:
    """One oracle setting of the command: its folder, identity and run.json header; what the main
    process found there; this session's counts and cases."""

    oracle: str
    folder: RunStore
    settings: dict[str, Any]
    header: RunMetadata
    outcome: FolderOutcome = field(default_factory=lambda: FolderOutcome(ok=False))
    session: Session | None = None
    remaining: list[Case] = field(default_factory=list)
    #: the folders this command made for the setting (main process): removed again when the command
    #: is refused before any setting was taken, so a refusal leaves the output folder as it was
    created: list[FsPath] = field(default_factory=list)


def context_of(plan: RunPlan, dist: Distributed) -> RunContext:
    return RunContext(
        root=plan.bundle.root,
        cases=plan.cases,
        seed=plan.seed,
        process_index=dist.index,
        num_processes=dist.count,
        local_process_index=dist.local_index,
        local_num_processes=dist.local_count,
    )


def settings_of(plan: RunPlan, backend: Backend, context: RunContext, oracle: str) -> dict[str, Any]:
    """The identity of one setting's run: everything that can change an answer (eval/runner/identity.py);
    a value under a secret key (a header's key in --request-extra) is held as its digest
    (chexpercept.redaction.digest_secrets): a changed secret is a change, the secret is not recorded."""
    from chexpercept.redaction import digest_secrets

    return digest_secrets(
        {
            "model_id": plan.model.model_id,
            "weights": weights_identity(plan.load.model_id, plan.weights),
            "backend": plan.model.backend,
            "backend_identity": with_file_contents(backend.identity(context)),
            "engine_versions": engine_versions(getattr(backend, "engine_packages", ())),
            "oracle": oracle,
            "parse_mode": plan.parse_mode,
            "sampling": plan.sampling.as_dict(),
            "seed": plan.seed,
            "chat_template_kwargs": with_file_contents(plan.chat_kwargs),
            "prompt_version": PROMPT_VERSION,
            "bundle_fingerprint": plan.bundle.fingerprint(),
            "bundle_images": plan.bundle.images_fingerprint(),
        }
    )


def _shared_settings(
    plan: RunPlan, backend: Backend, context: RunContext, dist: Distributed
) -> dict[str, Any]:
    """``settings_of`` made by the main process and told to every process, with what its backend
    learned from outside to make them (``identity_facts``) and the run's folder: each process sends
    what the identity records. The first process of every other machine makes the identity itself,
    from its own copies and its own server (``_machine_difference``), the others of a machine use the
    main process's facts. An error there (an unreadable weight file) ends every process, the main
    process with the error itself."""
    settings: dict[str, Any] | None = None
    facts: Any = None
    error: BaseException | None = None
    if dist.is_main:
        try:
            settings = settings_of(plan, backend, context, "")
            facts = backend.identity_facts()
        except Exception as e:
            error = e
    settings, facts, folder, message = dist.broadcast(
        (
            settings,
            facts,
            plan.model_folder().name,
            None if error is None else f"{type(error).__name__}: {error}",
        )
    )
    if error is not None:
        raise error
    if settings is None:
        raise ValueError(f"the main process could not establish the run's identity ({message})")
    here = _machine_difference(plan, backend, context, dist, settings, folder)
    if not dist.is_main and here is None:  # the first of another machine learned the same itself
        backend.use_identity_facts(facts)
    differences = [d for d in dist.gather(here) if d]
    if differences:
        raise ValueError(
            f"{'; '.join(differences)}. Every machine of a run must hold what the run records (the same "
            "model files, release, engine versions and settings): make the machines' copies the same"
        )
    return settings


def _machine_difference(
    plan: RunPlan,
    backend: Backend,
    context: RunContext,
    dist: Distributed,
    settings: Mapping[str, Any],
    folder: str,
) -> str | None:
    """How this process's run differs from the main process's, or None: its model folder's name
    (``folder``: the main process's; each process names it from its own --model, and a model folder
    at another path took another run folder, where it failed while the main process waited for it);
    and, as the first process of another machine than the main process's, the run's identity as it
    makes it from its own copies of the model, the release and the engine and its own server's
    answers (``settings``: the main process's). The main process hashed only its own copies: a machine
    with another copy of the release ran other questions, and one whose local server served other
    weights answered, under the main process's identity. The other processes of a machine read what
    its first one checked."""
    import socket

    if not dist.is_main and plan.model_folder().name != folder:
        return (
            f"process {dist.index} ({socket.gethostname()}) writes to the model folder "
            f"{terminal(plan.model_folder().name)}, the main process to {terminal(folder)} (each names it from "
            "its own --model): give every machine the same --run-name"
        )
    if dist.is_main or dist.local_index != 0:
        return None
    try:
        diff = settings_diff(settings, settings_of(plan, backend, context, ""))
    except Exception as e:
        return f"process {dist.index} ({socket.gethostname()}) could not make the run's identity: {type(e).__name__}: {e}"
    if not diff:
        return None
    listed = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
    return (
        f"process {dist.index} ({socket.gethostname()}) makes another run identity than the main process "
        f"(from its own copies of the model and the release, its engine and its server's answers): {listed}"
    )


def header_of(plan: RunPlan, dist: Distributed) -> RunMetadata:
    """run.json's fields that every setting of the command shares."""
    bundle = plan.bundle
    return RunMetadata(
        model=plan.model.name,
        display_name=plan.display_name,
        model_id=plan.model.model_id,
        backend=plan.model.backend,
        parse_mode=plan.parse_mode,
        sampling=SamplingInfo(**plan.sampling.as_dict()),
        seed=plan.seed,
        chat_template_kwargs=plan.chat_kwargs,
        bundle=BundleInfo(
            path=str(bundle.root),
            fingerprint=bundle.fingerprint(),
            synthetic=bundle.synthetic,
            n_cases=len(bundle.cases),
        ),
        selection=plan.selection,
        weights=plan.weights,
        batch_size=plan.batch_size,
        num_processes=dist.count,
        versions=versions(),
        git_commit=git_commit(),
        command=list(plan.command),
        started=now(),
    )


def session_record(header: RunMetadata, plan: RunPlan) -> dict[str, Any]:
    """One session's settings that are not part of the identity (run.json ``sessions``)."""
    return {
        "started": header.started,
        "command": header.command,
        "batch_size": header.batch_size,
        "num_processes": header.num_processes,
        "backend_options": plan.options.record(),
        "versions": header.versions,
        "git_commit": header.git_commit,
    }


def execute(plan: RunPlan, backend: Backend, dist: Distributed, children: ChildProcesses) -> int:
    """Every oracle setting of ``plan``, in turn, on ``backend`` (one engine start); the exit status."""
    context = context_of(plan, dist)
    header = header_of(plan, dist)
    # weights and images are hashed once per command, by the main process only (every process of an
    # accelerate run would otherwise read a model not yet in the digest cache whole at once)
    try:
        shared = _shared_settings(plan, backend, context, dist)
    except BaseException:
        _close_unused(backend)
        raise
    runs = [
        OracleRun(
            oracle,
            RunStore(plan.run_folder(oracle)),
            {**shared, "oracle": oracle},
            replace(header, oracle=oracle),
        )
        for oracle in plan.oracles
    ]
    taken = False
    try:
        status = _take_folders(plan, runs, dist)
        taken = status is None
        if taken:
            status = _run_all(plan, backend, context, dist, runs)
    except BaseException as error:
        try:
            _forget_unsaved(runs, dist, ran=taken)
            _let_go(runs, dist, children)
        except RunInterrupted:
            if isinstance(error, RunInterrupted):
                raise
            # the error that ended the run is the one to tell (a folder of other settings, a lock)
        finally:
            _remove_created(runs)
        raise
    finally:
        if not taken:  # refused, or every setting complete: the backend never ran (_run_all closes it)
            _close_unused(backend)
    try:
        _forget_unsaved(runs, dist, ran=taken)
        _let_go(runs, dist, children)
    except RunInterrupted as e:
        return stopped_after_the_end(plan, e, status)
    finally:
        _remove_created(runs)
    return status


def _close_unused(backend: Backend) -> None:
    """Close a backend that never ran (what it started to make the run's identity: the openai
    backend's question of what its server is); a close that fails is not the error to tell."""
    with contextlib.suppress(Exception):
        backend.close()


def _forget_unsaved(runs: list[OracleRun], dist: Distributed, *, ran: bool) -> None:
    """A command that saved nothing in a settings folder it made leaves no trace there: the run.json
    it wrote is removed while its lock is still held (a run that takes the folder next writes its
    own), and ``_remove_created`` then removes the folders. A refused resume under other settings
    left an empty ``oracle_none/`` beside the run it was refused for; a start that failed (an engine
    that would not load, a wrong --attn-implementation, a stop signal before the first case) left a
    folder with a run.json and no results, which ``score`` and ``report`` then met. After conversations
    (``ran``), only where one process ran them: with several, another may still be appending when the
    main process looks."""
    if ran and dist.count != 1:
        return
    for run in runs:
        folder = run.folder
        if dist.count == 1 and folder.lock.held and run.outcome.session:  # its queue, used by no other
            with contextlib.suppress(OSError):
                remove_queue(queue_path(folder.path, run.outcome.session))
        if folder.path in run.created and folder.lock.held and not folder.holds_records():
            with contextlib.suppress(OSError):
                for path in (folder.run_json, folder.results, folder.failures):
                    path.unlink(missing_ok=True)
                remove_queues(folder.path)  # this session's work queue: nothing is left to take


def _remove_created(runs: list[OracleRun]) -> None:
    """The folders the command made removed again where they hold nothing (``_forget_unsaved`` has
    removed what it wrote there when it saved nothing), deepest first. A folder that holds anything
    else stays."""
    for run in reversed(runs):
        for folder in reversed(run.created):
            with contextlib.suppress(OSError):
                if folder == run.folder.path:
                    folder.rmdir()
                    continue
                lock = folder / SETTINGS_LOCK_NAME  # the model folder: its settings lock alone left
                with exclusive(lock):
                    if {p.name for p in folder.iterdir()} == {SETTINGS_LOCK_NAME}:
                        lock.unlink()
                        folder.rmdir()


def _let_go(runs: list[OracleRun], dist: Distributed, children: ChildProcesses) -> None:
    """The run folders' locks released, every process the run started stopped (a stop signal
    waits until both are done)."""
    with deferred():
        if dist.is_main:
            for run in runs:
                run.folder.lock.release()
        children.stop()


def stopped_after_the_end(plan: RunPlan, stop: RunInterrupted, status: int) -> int:
    """A stop signal after the run's own end (its engine closing, its locks let go); ``status``: the
    run's. A run that ended well: one line (the cases are saved), 128 + the signal. One that did
    not has said why already: its status stays, and the line says only that it was stopped; one
    that a stop ended has said so (the launcher's copy of a stop told in the work queue): nothing
    more."""
    if status >= 128:
        return status
    if status != 0:
        print(f"chexpercept run: stopped by {stop.name} while closing, after the end above", file=sys.stderr)
        return status
    print(
        f"chexpercept run: stopped by {stop.name} after every setting had ended; the results are saved in "
        f"{terminal(str(plan.model_folder()))} (see above)",
        file=sys.stderr,
    )
    return stop.exit_status


# ------------------------------------------------------------------------------- 1. the folders
def _take_folders(plan: RunPlan, runs: list[OracleRun], dist: Distributed) -> int | None:
    """The main process takes every setting's folder (or, read-only, checks a finished run);
    everyone learns whether it could. Returns the exit status when the command ends here."""
    outcomes: list[FolderOutcome] = []
    error: Exception | None = None
    if dist.is_main:
        watched = watch_settings([run.folder.path for run in runs])  # one watch for every setting
        for run in runs:
            try:
                outcome = _prepare_folder(plan, run, watched)
            except OSError as e:
                if e.errno not in READ_ONLY:
                    raise
                outcome = FolderOutcome(ok=False, status=recheck_read_only(plan, run, e))
            except EXPECTED_ERRORS as e:
                error, outcome = e, FolderOutcome(ok=False, status=2)
            outcomes.append(outcome)
            if not outcome.ok and outcome.status != 0:
                break
    outcomes = [FolderOutcome.from_json(o) for o in dist.broadcast([o.to_json() for o in outcomes])]
    for run, outcome in zip(runs, outcomes):
        run.outcome = outcome
        if outcome.ok and outcome.info:  # every process goes on under the identity the folder holds
            run.settings = outcome.info["settings"]
    failed = [o for o in outcomes if not o.ok and o.status != 0]
    if failed or len(outcomes) < len(runs):
        if error is not None:
            raise error
        return failed[0].status if failed else 2
    if not any(o.ok for o in outcomes):  # every setting was complete (checked read-only)
        if dist.is_main and plan.score:
            return print_scores(plan)  # once, for every setting
        return 0
    return None


def _check_setting_folders(folder: RunStore, settings: dict[str, Any]) -> None:
    """StoreError when another settings folder of this model folder holds a run of another model or
    other settings (a second model given the same --run-name, another bundle, another temperature):
    the folder's settings are scored together, so they must share one identity but the oracle."""
    siblings = {}
    for other in sorted(folder.path.parent.glob("oracle_*/run.json")):
        if other.parent == folder.path:
            continue
        if not RunStore(other.parent).holds_records() and not being_written(other.parent):
            continue  # a setting that saved nothing is scored with nothing; one being run now counts
        previous = read_json(other)
        if isinstance(previous, dict) and isinstance(previous.get("settings"), dict):
            siblings[other.parent.name] = previous["settings"]
    diff = setting_folders_mismatch(settings, siblings)
    if diff:
        shown = "\n  ".join(terminal(line) for line in diff[:12])
        raise StoreError(
            f"{folder.path.parent} already holds another run under other settings, and its settings "
            f"folders are scored together (End-to-End from one, Oracle-Passed from another):\n  {shown}\n"
            "Use another --run-name or --output-dir for this one."
        )


def _prepare_folder(plan: RunPlan, run: OracleRun, watched: Mapping[FsPath, Sign]) -> FolderOutcome:
    """Main process: take the lock, check the identity, repair a torn tail, write run.json
    (``watched``: signs of life of earlier sessions already watched, ``watch_settings``)."""
    folder = run.folder
    # identifiers and answers: every folder the toolkit names (the model's, the setting's) this
    # account's and owner-only (chexpercept/fileio.py); --output-dir itself may be a shared one
    for named in (folder.path.parent, folder.path):  # never written through a link to elsewhere
        if named.is_symlink():
            raise NotOursError(
                f"{terminal(str(named))} is a link (to {terminal(str(named.readlink()))}): a run writes its "
                "model and settings folders only where they are named; remove the link or use another "
                "--output-dir. Nothing was written"
            )
    run.created = [p for p in (folder.path.parent, folder.path) if not p.exists()]
    private_dir(folder.path.parent, own=True)
    private_dir(folder.path, own=True)
    folder.lock.acquire()
    try:
        # one run at a time checks the model's settings folders and writes its run.json: two runs
        # started at once into oracle_none and oracle_implicit of one model under other settings
        # would each find the other's folder empty, and both run to the end before scoring refused
        with exclusive(folder.path.parent / SETTINGS_LOCK_NAME):
            return _prepare_locked(plan, run, watched)
    except BaseException:
        folder.lock.release()
        raise


def _prepare_locked(plan: RunPlan, run: OracleRun, watched: Mapping[FsPath, Sign]) -> FolderOutcome:
    """``_prepare_folder`` once its locks are held."""
    folder = run.folder
    folder.tighten()
    # a write of a previous session killed between its temporary file and the rename (its lock is ours)
    written = (folder.run_json, folder.results, folder.failures, folder.quarantine)
    remove_stale_temporaries(folder.path, [p.name for p in written])
    working = still_working(
        folder.path, watched=watched
    )  # before the results are read: no other writer is left
    if working:
        raise RunLockedError(
            f"{folder.path}: {', '.join(working)} still works (its sign of life changed just now; a "
            "process whose run another process stopped ends at its next case, one whose main process was "
            "killed goes on with the cases left): wait until it has ended, then rerun the same command. "
            "Nothing was written"
        )
    remove_queues(folder.path)  # of sessions that ended: none of their processes appends after this
    previous = folder.check_settings(run.settings)
    if previous:  # the identity it continues, equal by settings_diff (a model folder however spelled):
        run.settings = previous["settings"]  # its new lines carry the earlier lines' fingerprint
    _check_setting_folders(folder, run.settings)
    dropped = repair_tail(folder.results)
    repair_tail(folder.failures)
    identity = run_identity(run.settings)
    quarantined = folder.quarantine_unverified(identity)
    if quarantined:
        print(
            f"note: {quarantined} line(s) of {folder.results} carried no run identity (written by an "
            f"older version, or appended by hand), so the settings that made them cannot be checked: "
            f"moved to {folder.quarantine} and their cases run again",
            file=sys.stderr,
        )
    size = folder.results.stat().st_size if folder.results.exists() else 0
    kept = read_records(folder.results, identity)
    finished = tuple(sorted(kept))
    _note_other_selection(folder.path, finished, plan)
    failures = read_failures(folder.failures)
    check_identity(folder.failures, ((i + 1, f.key_id, f.run) for i, f in enumerate(failures)), identity)
    info = replace(run.header, settings=run.settings, finished=None)
    session = session_record(run.header, plan)
    info.sessions = [session]
    if previous:
        _note_session_changes(folder.path, previous, session)
        info.started = previous.get("started", run.header.started)
        info.resumed = [*previous.get("resumed", []), run.header.started]
        info.sessions = [*(previous.get("sessions") or []), session]
    write_json_atomic(folder.run_json, info.to_json())
    return FolderOutcome(
        ok=True,
        dropped=dropped,
        results_size=size,
        finished=finished,
        info=info.to_json(),
        session=secrets.token_hex(6),
        served=served_models(record_usages(kept.values()), unknown_alone=True),
    )


def _note_other_selection(folder: FsPath, finished: Sequence[str], plan: RunPlan) -> None:
    """One line when the folder holds finished cases that this command did not select (a resume
    with other --lesions/--paths/--per-cell/--limit): they stay, and the folder's scores cover them
    too (a larger selection that holds them all says nothing)."""
    selected = {case.key_id for case in plan.cases}
    outside = [k for k in finished if k not in selected]
    if outside:
        from chexpercept.bundle import iter_entries

        every = {key for key, _entry, _span in iter_entries(plan.bundle.root)}
        strangers = [k for k in outside if k not in every]
        if strangers:  # the identity names this bundle: such a line was written by hand or by a tool
            more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
            raise StoreError(
                f"{folder / RESULTS_NAME}: case {terminal(strangers[0])}{more} is not a case of the bundle "
                f"{plan.bundle.root}, while the line's run identity says it was made on this bundle: it "
                "was written by hand or by another tool and would be scored as a case. Remove it, then rerun"
            )
        print(
            f"note: {len(outside)} of the {len(finished)} finished case(s) in {folder} are outside this "
            f"command's selection (an earlier run with other --lesions/--paths/--per-cell/--limit); they are "
            "kept and its scores cover them too: use another --run-name or --output-dir to keep selections apart",
            file=sys.stderr,
        )


def _note_session_changes(folder: FsPath, previous: dict[str, Any], session: dict[str, Any]) -> None:
    """One line on a resume whose backend options outside the identity changed since the last
    session (another --base-url: for a local server that may be other weights under the same name;
    the served model, where the server names one, is checked per answer)."""
    from chexpercept.redaction import redact_text

    sessions = previous.get("sessions") or []
    last = sessions[-1].get("backend_options") if sessions and isinstance(sessions[-1], dict) else None
    if not isinstance(last, dict):
        return
    changed = settings_diff(last, session.get("backend_options") or {})
    if changed:
        print(
            f"note: resuming {folder} with options changed since its last session ("
            + redact_text("; ".join(changed))
            + "): they are not part of the run's identity, so its answers are kept; if the endpoint now "
            "serves other weights under the same model name, delete the folder to start over",
            file=sys.stderr,
        )


def recheck_read_only(plan: RunPlan, run: OracleRun, error: OSError) -> int:
    """A folder that cannot be written: a finished run with this identity is checked without
    writing (0); anything else is one line saying why it cannot go on (2)."""
    folder = run.folder
    what, advice = os_error_text(error, folder.path, saved=count_lines(folder.results) > 0)
    if not folder.run_json.is_file():
        say_end(None, f"error: {what}", advice)
        return 2
    previous = folder.check_settings(run.settings)  # reads only; names any difference
    records = read_records(folder.results, run_identity(previous["settings"] if previous else run.settings))
    missing = [c.key_id for c in plan.cases if c.key_id not in records]
    if missing:
        say_end(
            None,
            f"error: {what}; {len(missing)} of the {len(plan.cases)} selected cases are not done (e.g. {missing[0]})",
            advice,
        )
        return 2
    print(
        f"{len(plan.cases)} cases of {plan.model.name} (oracle {run.oracle}) in {folder.path}: the run is "
        "complete (checked read-only: nothing was written)"
    )
    return 0


# ------------------------------------------------------------------------ 2.-4. the conversations
def _run_all(
    plan: RunPlan, backend: Backend, context: RunContext, dist: Distributed, runs: list[OracleRun]
) -> int:
    """Preflight for every setting, the conversations of each setting in turn on one backend, each
    setting signed off; the exit status (the worst of the settings')."""
    todo = [run for run in runs if run.outcome.ok]
    prefix = f"process {dist.index} of {dist.count}: " if dist.count > 1 else ""
    for run in todo:
        run.session = Session(run.folder.path, run.folder.results, selected=len(plan.cases), prefix=prefix)
        run.remaining = _remaining(plan, run, dist)
        run.session.remaining = len(run.remaining)
    current: OracleRun | None = None
    statuses: list[int] = []
    try:
        queues = [queue_path(run.folder.path, run.outcome.session) for run in todo]
        if dist.is_main:  # before the processes meet below: the others never make a queue
            make_queues(queues)
        # before any engine loads: does every conversation left fit the engine's limits?
        for run in todo:
            verdict = _preflight(plan, backend, context, run) if dist.is_main else ""
            verdict = dist.broadcast(verdict)
            if verdict:
                raise ValueError(verdict)
        ready = False
        # every process gives signs of life from before its engine loads (work_queue.beating)
        with beating(queues, dist.index) if dist.active else contextlib.nullcontext() as beats:
            for run, queue in zip(todo, queues, strict=True):
                current = run
                if run.remaining and not ready:
                    set_up(backend, context, plan)
                    ready = True
                statuses.append(_run_one(plan, backend, dist, run, queue))
                if beats is not None:
                    beats.finished(queue)
    except (Exception, RunInterrupted) as e:  # every early end is one line (eval/runner/outcome.py)
        run = current or todo[0]
        error: BaseException = e
        try:  # the engine's own shutdown log goes before that line
            backend.close()
        except RunInterrupted as stop:  # a signal while closing: the run ends by it
            error = stop
        except Exception:
            pass  # the error that ended the run is the one to tell; the process stops what is left
        # the main process, and the first of every other machine, speak for their machine's
        # processes that finished nothing (red team, stop 47: machine 1's log had torch's lines only)
        speaks = dist.is_main or dist.local_index == 0
        return end_of(error, run.session, run.folder.path, main=speaks, expected=EXPECTED_ERRORS)
    except BaseException:
        backend.close()
        raise
    status = max(statuses, default=0)
    try:
        backend.close()
    except RunInterrupted as stop:  # every setting has ended: the engine's shutdown was cut short
        return stopped_after_the_end(plan, stop, status)
    if dist.is_main and plan.score:
        status = print_scores(plan) or status
    return status


def set_up(backend: Backend, context: RunContext, plan: RunPlan) -> None:
    """``backend.setup``, with a package the model needs and this environment lacks named (a model's
    processor that needs torchvision, a model class that needs a library): one line, not a bug."""
    try:
        backend.setup(context)
    except ImportError as e:
        package = f" ({e.name})" if getattr(e, "name", None) else ""
        raise BackendError(
            f"the {plan.model.backend} backend cannot load {plan.model.name}: a package it needs is not "
            f"installed in this environment{package}: {shown(str(e).rstrip('.'), 400, one_line=True)}. Install it (pip "
            "install <package>; torchvision on a CPU-only torch: docs/install.md), then rerun"
        ) from e


def _remaining(plan: RunPlan, run: OracleRun, dist: Distributed) -> list[Case]:
    """The cases left to do: every process takes the main process's snapshot (reading the file here
    could already see another process's first results)."""
    outcome = run.outcome
    if dist.is_main and outcome.dropped:
        print(
            f"note: removed a torn last line ({outcome.dropped} bytes) left by an interrupted run",
            file=sys.stderr,
        )
    finished = set(outcome.finished)
    remaining = [c for c in plan.cases if c.key_id not in finished]
    if dist.is_main and finished:
        done = len(plan.cases) - len(remaining)
        print(
            f"resuming {run.folder.path}: {done} of {len(plan.cases)} selected cases already done",
            file=sys.stderr,
        )
    return remaining


def _preflight(plan: RunPlan, backend: Backend, context: RunContext, run: OracleRun) -> str:
    """Main process: the preflight report (eval/runner/preflight.py) of one setting's cases left, before
    the engine loads; returns the reason to stop ("" to go on). Cases that cannot run stop the run
    under --on-error stop; under record they are reported and fail one by one."""
    if not run.remaining:
        return ""
    limits = backend.context_limits(context)
    if limits is None or (limits.max_model_len is None and limits.max_images is None):
        return ""
    from chexpercept.eval.estimate.local_tokens import ProcessorCounter
    from chexpercept.eval.runner.preflight import check_fit

    model_dir = backend.model_dir()
    counter, uncounted = None, ""
    if limits.max_model_len is None:
        uncounted = "no known context length"
    elif model_dir is None or not FsPath(model_dir).is_dir():
        uncounted = f"no local processor of {model_dir} to count with"
    else:
        try:
            counter = ProcessorCounter(context.root, model_dir, plan.chat_kwargs)
        except Exception as e:  # images are still checked; the engine says what else it refuses
            uncounted = f"cannot load the processor of {model_dir}: {e}"
    try:
        report = check_fit(
            run.remaining,
            counter,
            limits,
            oracle=run.oracle,
            max_tokens=plan.sampling.max_tokens,
            uncounted=uncounted,
        )
    except Exception as e:  # e.g. an image that no longer decodes: the backend names it when it meets it
        print(f"note: preflight check skipped ({type(e).__name__}: {terminal(e)})", file=sys.stderr)
        return ""
    print(f"oracle {run.oracle}: " + "\n".join(report.lines()), file=sys.stderr)
    if report.cannot and plan.on_error == "stop":
        return (
            f"{len(report.cannot)} selected case(s) cannot run within the engine's limits (listed above); "
            "nothing was started"
        )
    return ""


def _run_one(plan: RunPlan, backend: Backend, dist: Distributed, run: OracleRun, queue_file: FsPath) -> int:
    """One oracle setting: the conversations this process takes from the setting's work queue
    (``queue_file``, as slots free up, eval/runner/work_queue.py), then (main process, once every process is done) every
    selected case checked there once, the file ordered, run.json signed off."""
    stats = EngineStats()
    queue = WorkQueue(queue_file, admission_order(run.remaining), dist.index)
    progress = Progress(
        run.folder.results, len(run.remaining), dist.is_main and plan.progress, run.outcome.results_size
    )
    try:
        if run.remaining:  # signs of life and a failure are said by _run_all's ``beating``
            backend.new_session()  # run.json's counts are this setting's
            stats = _converse(
                plan, backend, run, queue, progress, queue.live_limit(plan.batch_size, dist.count)
            )
        queue.done()
        if dist.is_main:
            queue.wait_for(dist.count, on_wait=_waiting(dist))
    finally:
        progress.close()
    if not dist.is_main:
        return 0
    taken = queue.taken_by()
    remove_queue(queue.path)
    return _sign_off(plan, backend, run, stats, taken)


def _waiting(dist: Distributed) -> Callable[[set[int], float], None]:
    """What the main process says while it waits for the other processes' last conversations."""

    def say(done: set[int], seconds: float) -> None:
        busy = [str(p) for p in range(dist.count) if p not in done]
        print(
            f"process 0 of {dist.count}: done; waiting {seconds / 60:.0f} min for process(es) "
            f"{', '.join(busy)} to finish their last conversations (no case is left to take)",
            file=sys.stderr,
        )

    return say


def _converse(
    plan: RunPlan, backend: Backend, run: OracleRun, cases: WorkQueue, progress: Progress, live: int
) -> EngineStats:
    """This process's conversations of one setting, at most ``live`` at once, each finished case
    appended at once (failed ones apart), each record marked with the run that made it. Every
    append holds the setting's work queue (``WorkQueue.holding``): once a rerun has taken the
    folder over, nothing more is appended (red team, stop 47: a process paused past the rerun's
    watch saved its held cases into the finished run, twice over)."""
    identity = run_identity(run.settings)
    folder, session = run.folder, run.session
    assert session is not None
    served = ServedModelGuard(str(folder.path), run.outcome.served)

    def on_finished(results: list[CaseResult]) -> None:
        for r in results:  # every answer checked before any is appended
            served.check(r.key_id, (t.usage for t in r.turns))
        for r in results:
            r.run = identity
        lines, too_long = [], []
        for r in results:  # each case made into its line once
            try:
                lines.append(case_line(r, what="the case"))
            except LineTooLong as e:  # the case's failure: a line its reader would refuse is never written
                too_long.append(_unwritable(r, e))
        if too_long:
            if plan.on_error != "record":
                first = too_long[0]
                raise BackendError(
                    f"{terminal(first.key_id)}: {first.error}. --on-error record records such a case as "
                    "unfinished and goes on with the others"
                )
            on_failed(too_long)
        with deferred(), cases.holding():  # a stop signal waits until the cases are saved and counted
            folder.append(lines)
            session.finished_now += len(lines)
        progress.refresh()

    def on_failed(failures: list[CaseFailure]) -> None:
        for f in failures:
            f.run = identity
        with deferred(), cases.holding():
            folder.append_failures(failures)
            session.failed_now += len(failures)
        for f in failures:
            print(f"warning: {f.key_id} ({f.task}) left unfinished: {terminal(f.error)}", file=sys.stderr)

    return run_conversations(
        cases,
        backend,
        oracle=run.oracle,
        parse_mode=plan.parse_mode,
        model=plan.model.model_id,
        batch_size=live,
        on_finished=on_finished,
        on_failed=on_failed if plan.on_error == "record" else None,
        on_empty=EmptyAnswerWarning(plan.model.model_id),
    )


def _unwritable(result: CaseResult, error: LineTooLong) -> CaseFailure:
    """The failure of a finished case whose record is longer than a results line may hold
    (``error``, from ``case_line``): its answers are that long (a server's replies of megabytes are
    no model's answers), and a line no reader takes would leave the run unable to resume or be scored."""
    last = result.turns[-1] if result.turns else None
    return CaseFailure(
        key_id=result.key_id,
        lesion=result.lesion,
        path=result.path,
        task=last.task if last is not None else "",
        turn_index=max(0, len(result.turns) - 1),
        error=f"{error} (its answers are that long: not a model's answers; --max-tokens bounds them)",
        time=now(),
        run=result.run,
    )


def _sign_off(
    plan: RunPlan, backend: Backend, run: OracleRun, stats: EngineStats, taken: dict[int, int]
) -> int:
    """Main process: every selected case there once (or failed), results in bundle order, run.json
    completed; the exit status of this setting."""
    folder, cases = run.folder, plan.cases
    records = read_records(folder.results, run_identity(run.settings))
    failed = {f.key_id: f for f in read_failures(folder.failures) if f.key_id not in records}
    missing = [c.key_id for c in cases if c.key_id not in records and c.key_id not in failed]
    if missing:
        raise StoreError(f"{len(missing)} selected case(s) have no result after the run, e.g. {missing[:5]}")
    rewrite_in_order(folder.results, records, {c.key_id: i for i, c in enumerate(plan.bundle.cases)})
    info = RunMetadata.from_json(run.outcome.info, source=str(folder.run_json))
    info.finished = None if failed else now()
    info.unfinished_cases = len(failed)
    info.backend_settings = backend.describe()
    counts = served_models(record_usages(records.values()))
    if counts:  # every session's answers, not this session's alone
        info.backend_settings = {**(info.backend_settings or {}), "served_models": counts}
    info.n_results = len(records)
    info.last_session = {
        "cases": len(run.remaining),
        "model_calls_main_process": stats.requests,
        "rounds_main_process": stats.rounds,  # each time the backend handed back answers
        "most_live_main_process": stats.max_live,
        "seconds_main_process": round(stats.seconds, 3),
        # cases each process took from the work queue (str keys: JSON)
        "cases_per_process": {str(p): n for p, n in sorted(taken.items())},
    }
    counter = backend.token_counter(plan.bundle.root) if records else None
    if counter is not None:
        from chexpercept.eval.estimate.count import usage_estimate

        info.estimate = usage_estimate(counter, plan, records, run.oracle)
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
        f"{len(cases)} cases of {plan.model.name} (oracle {run.oracle}) in {folder.path} "
        f"({len(run.remaining)} run now, {len(cases) - len(run.remaining)} from before)"
    )
    usage = backend.usage_summary(records)
    if usage:
        print(usage)
    occupancy = schedule_line((info.backend_settings or {}).get("schedule"))
    if occupancy:
        print(occupancy)
    return 0


def print_scores(plan: RunPlan) -> int:
    """The model's Table 2 from every run of its folder (metrics' ``print_model_scores``), printed
    once every case is saved; returns 0, or 128 + a stop signal that cut the printing short (said in
    one line: the cases are saved, a rerun prints the table)."""
    from chexpercept.metrics.api import print_model_scores
    from chexpercept.metrics.runs import NoFinishedCases

    try:
        print_model_scores(plan.model_folder(), plan.display_name, plan.parse_mode)
    except NoFinishedCases:  # every request failed: the lines above say why, and the status is 3
        print(
            f"chexpercept run: no case of {terminal(str(plan.model_folder()))} has finished: nothing to score",
            file=sys.stderr,
        )
    except RunInterrupted as e:
        print(
            f"chexpercept run: stopped by {e.name} while printing the scores; every selected case is "
            f"saved in {terminal(str(plan.model_folder()))}: rerun the same command to print them",
            file=sys.stderr,
        )
        return e.exit_status
    return 0


# ------------------------------------------------------------------------------------ reporting
class Progress:
    """One bar on the main process, counting cases finished by every process (lines appended)."""

    def __init__(self, results: FsPath, total: int, enabled: bool, offset: int):
        self.results = results
        self.bar = None
        #: size of the results file before any process of this run appended to it
        self.offset = offset
        if enabled:
            self.bar = progress_bar(total=total, unit="case", desc="cases", dynamic_ncols=True)

    def refresh(self) -> None:
        if self.bar is None or not self.results.exists():
            return
        with open_input(self.results, RESULTS, what="results file") as f:  # bounded, never a FIFO
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
