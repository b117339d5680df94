"""CheXpercept toolkit: load, regenerate and evaluate the CheXpercept benchmark.

Importing the package makes ``datasets.load_dataset("chexpercept", data_dir=...)`` work without
importing datasets itself: the builder is registered when datasets is (or already was) imported, so
``import chexpercept`` and the command line stay fast. The names below are imported on first use.
"""

from __future__ import annotations

from .lazy import lazy_attributes as _lazy_attributes
from .registration import register_when_imported as _register_when_imported

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Bundle": "bundle",
    "read_bundle": "bundle",
    "QA": "case",
    "Case": "case",
    "ContourQA": "case",
    "Turn": "case",
    "BundleValidationError": "errors",
    "Problem": "errors",
    "ReleaseNotFoundError": "errors",
    "LESIONS": "vocab",
    "PATHS": "vocab",
    "TASKS": "vocab",
    "Path": "vocab",
}

__all__ = sorted([*_EXPORTS, "__version__"])

_register_when_imported()


__getattr__, __dir__ = _lazy_attributes(__name__, _EXPORTS, globals())
