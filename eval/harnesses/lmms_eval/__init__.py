"""CheXpercept as lmms-eval tasks: the folder to pass to ``lmms-eval --include_path``.

The folder holds one YAML per oracle setting (``chexpercept_none``, ``chexpercept_implicit``,
``chexpercept_explicit``; the tag ``chexpercept`` runs all three), their shared template, and
``utils.py``, which lmms-eval loads by file name and which only names ``task.ChexperceptTask``. The
task reads the release with our bundle reader (``CHEXPERCEPT_DATA_DIR`` or ``dataset_kwargs.data_dir``;
nothing is downloaded), drives ``Conversation`` for every round, and scores with
``chexpercept.metrics`` (docs/lmms-eval.md). ``python -m chexpercept.eval.harnesses.lmms_eval``
prints the folder.

Nothing here imports lmms-eval except ``task.py``, which lmms-eval itself loads.
"""

from __future__ import annotations

from pathlib import Path as FsPath

#: the task folder (``lmms-eval --include_path``), installed with the package
TASK_DIR = FsPath(__file__).resolve().parent
#: the lmms-eval release these tasks are tested against (scripts/setup_lmms_eval.sh installs it)
LMMS_EVAL_VERSION = "0.7.3"
#: the environment variable that names the release folder when the YAML does not
DATA_DIR_ENV = "CHEXPERCEPT_DATA_DIR"
