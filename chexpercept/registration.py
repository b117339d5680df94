"""Make ``load_dataset("chexpercept", data_dir=...)`` resolve to our builder on datasets 5.x.

datasets 4 removed loading scripts, so the builder is registered the way datasets' own packaged
builders are: an entry in ``datasets.packaged_modules._PACKAGED_DATASETS_MODULES``. datasets would
then list every file under data_dir as a data file and, for a missing or empty folder, raise its own
EmptyDatasetError before our builder runs. A small subclass of its module factory, used for our name
only, checks the folder first (raising our error with the access instructions) and points the data
files at chexpercept.json alone, which keeps resolution fast on a 10,000-file release; a fingerprint
of the image files' sizes and modification times joins the cache key.
Tested with datasets 5.x (pinned in pyproject.toml).
"""

from __future__ import annotations

import inspect
import sys

import datasets.load
from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES, _hash_python_lines

from .bundle import JSON_NAME, check_release_dir, files_fingerprint

NAME = "chexpercept"
MODULE = "chexpercept_dataset"


class _ChexperceptModuleFactory(datasets.load.PackagedDatasetModuleFactory):
    def get_module(self):
        if self.name != NAME or self.data_files is not None:
            return super().get_module()
        root = check_release_dir(self.data_dir)
        self.data_dir = str(root)
        self.data_files = {"train": [str(root / JSON_NAME)]}
        module = super().get_module()
        # the cache is keyed on chexpercept.json (a data file) and on this fingerprint of the image
        # files (a config option): a replaced or damaged image makes load_dataset build again
        module.builder_kwargs["files_fingerprint"] = files_fingerprint(root)
        return module


def register() -> None:
    """Idempotently register the builder with datasets."""
    module = sys.modules.get(MODULE)
    if module is None:
        import chexpercept_dataset as module
    source = inspect.getsource(module).splitlines()
    _PACKAGED_DATASETS_MODULES[NAME] = (MODULE, _hash_python_lines(source))
    factory = datasets.load.PackagedDatasetModuleFactory
    if not issubclass(factory, _ChexperceptModuleFactory):
        datasets.load.PackagedDatasetModuleFactory = _ChexperceptModuleFactory
