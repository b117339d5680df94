"""Make ``load_dataset("chexpercept", data_dir=...)`` resolve to our builder on datasets 5.x.

datasets 4 removed loading scripts, so the builder is registered the way datasets' own packaged
builders are: an entry in ``datasets.packaged_modules._PACKAGED_DATASETS_MODULES``. datasets would
then list every file under data_dir as a data file and, for a missing or empty folder, raise its own
EmptyDatasetError before our builder runs. A small subclass of its module factory, used for our name
only, checks the folder first (raising our error with the access instructions) and points the data
files at chexpercept.json alone, which keeps resolution fast on a 10,000-file release; a fingerprint
of the image files' sizes and modification times joins the cache key.

Registration is lazy: ``import chexpercept`` does not import datasets (which brings pyarrow and pandas,
about a second). ``register_when_imported`` registers at once if datasets is already imported, and
otherwise the moment datasets finishes importing (a finder on ``sys.meta_path`` that wraps the
``datasets`` package's own loader once, then removes itself).
Tested with datasets 5.x (pinned in pyproject.toml).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import warnings
from types import ModuleType

NAME = "chexpercept"
MODULE = "chexpercept_dataset"
_DATASETS = "datasets"

_factory_class: type | None = None


def _module_factory() -> type:
    """The subclass of datasets' packaged-module factory that handles our name (built once)."""
    global _factory_class
    if _factory_class is not None:
        return _factory_class
    import datasets.load

    from .bundle import JSON_NAME, check_release_dir, files_fingerprint

    class ChexperceptModuleFactory(datasets.load.PackagedDatasetModuleFactory):
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

    _factory_class = ChexperceptModuleFactory
    return _factory_class


def register() -> None:
    """Idempotently register the builder with datasets (imports datasets)."""
    import datasets.load
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES, _hash_python_lines

    module = sys.modules.get(MODULE)
    if module is None:
        import chexpercept_dataset as module
    source = inspect.getsource(module).splitlines()
    _PACKAGED_DATASETS_MODULES[NAME] = (MODULE, _hash_python_lines(source))
    factory = _module_factory()
    if not issubclass(datasets.load.PackagedDatasetModuleFactory, factory):
        datasets.load.PackagedDatasetModuleFactory = factory


def is_registered() -> bool:
    """Whether ``load_dataset("chexpercept", ...)`` resolves to our builder now (never imports datasets)."""
    packaged = sys.modules.get("datasets.packaged_modules")
    return packaged is not None and NAME in getattr(packaged, "_PACKAGED_DATASETS_MODULES", {})


def _register_or_warn() -> None:
    try:
        register()
    except Exception as e:  # never break the user's `import datasets`
        warnings.warn(
            f"chexpercept: could not register the 'chexpercept' builder with datasets ({e!r}); "
            'load_dataset("chexpercept", ...) will not find it. Supported: datasets>=5,<6.',
            RuntimeWarning,
            stacklevel=2,
        )


class _AfterDatasetsImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``datasets`` is about to be imported, it asks the other finders for
    its spec and wraps that loader's ``exec_module`` so that registration runs right after."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != _DATASETS:
            return None
        _remove_hook()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _register_or_warn()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_HOOK = _AfterDatasetsImport()


def _remove_hook() -> None:
    while _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def register_when_imported() -> None:
    """Register now if datasets is imported, else as soon as it is (without importing it here)."""
    if _DATASETS in sys.modules:
        _register_or_warn()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
