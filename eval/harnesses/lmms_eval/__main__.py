"""``python -m chexpercept.eval.harnesses.lmms_eval``: print the task folder for ``--include_path``."""

from chexpercept.eval.harnesses.lmms_eval import TASK_DIR

print(TASK_DIR)
