"""What the task YAMLs of this folder name (lmms-eval loads this file by its path: ``!function
utils.ChexperceptTask``); the task itself lives in the installed package (task.py)."""

from chexpercept.eval.harnesses.lmms_eval.task import ChexperceptTask

__all__ = ["ChexperceptTask"]
