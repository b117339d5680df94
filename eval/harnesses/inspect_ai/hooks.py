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
