"""Inspect hooks that tell our solver what the running eval keeps in its log (``rules.SETTINGS``):
an eval's ``--log-images`` setting from its task start, and which eval each sample runs in from its
sample start. Only evals of our tasks are recorded, and each is forgotten at its end.

A run of our tasks also writes Inspect's own files privately (``PrivateRun``): its log holds every
case's key_id, questions and answers, and its trace and cache folders the requests. Inspect writes
them under the process's umask (0644 files in 0755 folders, which another account read: red team,
stop 43), so from the run's start to its end the umask is 077, Inspect's data and cache folders are
made this account's alone, and each log file of the run is made owner-only at its end."""

from __future__ import annotations

import contextlib
import os
import stat

from inspect_ai.hooks import Hooks, RunEnd, RunStart, SampleStart, TaskEnd, TaskStart, hooks

from .rules import SETTINGS

#: registry names of our tasks start with this (``chexpercept/chexpercept``)
TASK_PREFIX = "chexpercept/"


def ours(task: str) -> bool:
    """Whether ``task`` (a registry name) is one of ours."""
    return task.startswith(TASK_PREFIX) or task == "chexpercept"


class PrivateRun:
    """The runs of our tasks under way in this process, and the umask before the first began."""

    runs: set[str] = set()
    umask_before: int | None = None

    @classmethod
    def begin(cls, run_id: str) -> None:
        """From now on Inspect's new files are owner-only, and its folders this account's alone."""
        if not cls.runs:
            cls.umask_before = os.umask(0o077)
        cls.runs.add(run_id)
        from platformdirs import user_cache_path, user_data_path

        for folder in (user_data_path("inspect_ai"), user_cache_path("inspect_ai")):  # traces, caches
            _owner_only(folder)
        _private_trace_file()

    @classmethod
    def end(cls, run_id: str, locations: list[str]) -> None:
        """The run's log files owner-only (one that existed before the run kept its mode till now),
        and the umask as it was once no run of ours is left."""
        for location in locations:
            _owner_only(location)
        cls.runs.discard(run_id)
        if not cls.runs and cls.umask_before is not None:
            os.umask(cls.umask_before)
            cls.umask_before = None


def _private_trace_file() -> None:
    """Inspect's trace file from here on a new one, this account's alone, in a folder this account's
    alone. Inspect makes its trace file when its process starts, before any run of ours (0644 under
    a umask of 022, in a 0755 ``traces/``), and writes each sample's key_id into it: another account
    that opened the file (through a handle on ``traces/`` held from an earlier run) read every
    key_id of the runs (red team, stop 48). The file at its path is replaced by a new owner-only one
    (``O_EXCL``), so a handle on the old one reads nothing of the run, and ``traces/`` is made
    owner-only, so no lookup through an old handle on it opens the new one. A trace file the user
    named (``INSPECT_TRACE_FILE``) is kept, made owner-only."""
    import logging

    from inspect_ai._util import logger as inspect_logger
    from inspect_ai._util.trace import inspect_trace_dir

    from chexpercept.fileio import open_private

    _owner_only(inspect_trace_dir())
    handler = inspect_logger._logHandler.get("handler")
    trace = getattr(handler, "trace_logger", None)
    if not isinstance(trace, logging.FileHandler):
        return
    path = trace.baseFilename
    for named in ("INSPECT_TRACE_FILE", "INSPECT_PY_LOGGER_FILE"):  # files the user named: kept
        if os.environ.get(named):
            _owner_only(os.environ[named])
    if os.environ.get("INSPECT_TRACE_FILE"):
        return
    info = os.lstat(path) if os.path.lexists(path) else None
    if (
        info is not None
        and stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & 0o077
    ):
        return  # already private: an earlier run of ours in this process made it
    # anything else is replaced: a file others may read, and a link or other thing planted there (round
    # 2: a link to another account's file received every key_id)
    with contextlib.suppress(OSError), trace.lock:
        if trace.stream is not None:
            trace.stream.close()
            trace.stream = None  # reopened by its next record (umask 077 now) if what follows fails
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        trace.stream = os.fdopen(fd, "a", encoding=trace.encoding or "utf-8")


def _owner_only(path: str | os.PathLike[str]) -> None:
    """``path`` (a local file or folder of this account) no longer open to other accounts; anything
    else (another account's, a remote log's URL, one not there) is left as it is."""
    with contextlib.suppress(OSError, ValueError):
        info = os.stat(path)  # a link's target is what holds the files, and what is changed
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)


@hooks(name="chexpercept_log_settings", description="CheXpercept: whether the log keeps the images")
class LogSettingsHook(Hooks):
    """Records ``rules.SETTINGS`` for evals of our tasks, and keeps Inspect's files of their runs
    private (``PrivateRun``)."""

    async def on_run_start(self, data: RunStart) -> None:
        if any(ours(name) for name in data.task_names):
            PrivateRun.begin(data.run_id)

    async def on_run_end(self, data: RunEnd) -> None:
        if data.run_id in PrivateRun.runs:
            logs = data.logs or []
            PrivateRun.end(data.run_id, [str(log.location) for log in logs if getattr(log, "location", None)])

    async def on_task_start(self, data: TaskStart) -> None:
        if ours(data.spec.task):
            SETTINGS.log_images[data.eval_id] = data.spec.config.log_images is not False

    async def on_sample_start(self, data: SampleStart) -> None:
        if data.eval_id in SETTINGS.log_images:
            SETTINGS.sample_eval[data.sample_id] = data.eval_id

    async def on_task_end(self, data: TaskEnd) -> None:
        if SETTINGS.log_images.pop(data.eval_id, None) is not None:
            for uuid in [u for u, e in SETTINGS.sample_eval.items() if e == data.eval_id]:
                del SETTINGS.sample_eval[uuid]
