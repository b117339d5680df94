"""Inspect's entry point (pyproject ``[project.entry-points.inspect_ai]``): the task
``chexpercept/chexpercept`` and the hook that reads each eval's log settings."""

from .hooks import LogSettingsHook
from .task import chexpercept

__all__ = ["LogSettingsHook", "chexpercept"]
