"""Inspect hooks that tell our solver what the running eval keeps in its log (``rules.SETTINGS``):
an eval's ``--log-images`` setting from its task start, and which eval each sample runs in from its
sample start. Only evals of our tasks are recorded, and each is forgotten at its end."""

from __future__ import annotations

from inspect_ai.hooks import Hooks, SampleStart, TaskEnd, TaskStart, hooks

from .rules import SETTINGS

#: registry names of our tasks start with this (``chexpercept/chexpercept``)
TASK_PREFIX = "chexpercept/"


@hooks(name="chexpercept_log_settings", description="CheXpercept: whether the log keeps the images")
class LogSettingsHook(Hooks):
    """Records ``rules.SETTINGS`` for evals of our tasks."""

    async def on_task_start(self, data: TaskStart) -> None:
        if data.spec.task.startswith(TASK_PREFIX) or data.spec.task == "chexpercept":
            SETTINGS.log_images[data.eval_id] = data.spec.config.log_images is not False

    async def on_sample_start(self, data: SampleStart) -> None:
        if data.eval_id in SETTINGS.log_images:
            SETTINGS.sample_eval[data.sample_id] = data.eval_id

    async def on_task_end(self, data: TaskEnd) -> None:
        if SETTINGS.log_images.pop(data.eval_id, None) is not None:
            for uuid in [u for u, e in SETTINGS.sample_eval.items() if e == data.eval_id]:
                del SETTINGS.sample_eval[uuid]
