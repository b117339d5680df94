"""CheXpercept toolkit: load, regenerate and evaluate the CheXpercept benchmark.

Importing the package registers the ``chexpercept`` builder with datasets, so that
``datasets.load_dataset("chexpercept", data_dir=...)`` works.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .bundle import Bundle, read_bundle
from .case import QA, Case, ContourQA, Turn
from .errors import BundleValidationError, Problem, ReleaseNotFoundError
from .registration import register as _register
from .vocab import LESIONS, PATHS, TASKS, Path

_register()

__all__ = [
    "LESIONS",
    "PATHS",
    "QA",
    "TASKS",
    "Bundle",
    "BundleValidationError",
    "Case",
    "ContourQA",
    "Path",
    "Problem",
    "ReleaseNotFoundError",
    "Turn",
    "__version__",
    "read_bundle",
]
