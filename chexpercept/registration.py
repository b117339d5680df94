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
``datasets`` package's own loader once, then removes itself). The same is done for evaluate:
``evaluate.load("chexpercept_metric")`` then loads the module that ships with this package (no
``chexpercept install-metric`` needed). In a fresh interpreter, the start-up hook
(chexpercept/startup.py, installed as a .pth file) calls ``spec_after_import`` in the same way, so
nothing needs to be imported first.
Tested with datasets 5.x (pinned in pyproject.toml) and evaluate 0.4.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

NAME = "chexpercept"
MODULE = "chexpercept_dataset"
_DATASETS = "datasets"
_EVALUATE = "evaluate"
_HUB = "huggingface_hub"
#: the metric's name for ``evaluate.load`` (the module folder metrics/chexpercept_metric/)
METRIC_NAME = "chexpercept_metric"

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
    import inspect

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


def register_metric() -> None:
    """Idempotently make ``evaluate.load("chexpercept_metric")`` load the metric module that ships
    with this package (imports evaluate). A folder or file of that name in the current folder still
    wins, as evaluate's own rule says; any other name goes to evaluate unchanged."""
    import evaluate
    import evaluate.loading as loading

    original = loading.evaluation_module_factory
    if getattr(original, "chexpercept_metric", False):
        return

    def evaluation_module_factory(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == METRIC_NAME and not os.path.exists(path) and not os.path.exists(f"{path}.py"):
            from chexpercept.metrics.evaluate_support import METRIC_PATH

            path = str(METRIC_PATH)
        return original(path, *args, **kwargs)

    evaluation_module_factory.chexpercept_metric = True  # type: ignore[attr-defined]
    evaluation_module_factory.__doc__ = original.__doc__
    loading.evaluation_module_factory = evaluation_module_factory
    if getattr(evaluate, "evaluation_module_factory", None) is original:
        evaluate.evaluation_module_factory = evaluation_module_factory


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
            'load_dataset("chexpercept", ...) will not find it. Supported: datasets>=5,<6. '
            "Without it, the release loads as typed cases: chexpercept.read_bundle(DIR).",
            RuntimeWarning,
            stacklevel=2,
        )


def _register_metric_or_warn() -> None:
    try:
        register_metric()
    except Exception as e:  # never break the user's `import evaluate`
        warnings.warn(
            f"chexpercept: could not make evaluate.load({METRIC_NAME!r}) find the CheXpercept metric "
            f"({e!r}); run `chexpercept install-metric` once, or load it from its folder: "
            "evaluate.load(str(chexpercept.metrics.METRIC_PATH)). Supported: evaluate 0.4.",
            RuntimeWarning,
            stacklevel=2,
        )


def _guard_hub_or_warn() -> None:
    try:
        from .peer_http import guard_hub

        guard_hub()
    except Exception as e:  # never break the user's `import huggingface_hub`
        warnings.warn(
            f"chexpercept: could not route huggingface_hub's requests through chexpercept.peer ({e!r}): "
            "a loopback HF_ENDPOINT is not checked for another account's socket, and proxies from the "
            "environment apply to it. Supported: huggingface_hub>=1.0.",
            RuntimeWarning,
            stacklevel=2,
        )


#: what to do right after each watched library has been imported
_AFTER: dict[str, Callable[[], None]] = {
    _DATASETS: _register_or_warn,
    _EVALUATE: _register_metric_or_warn,
    # every HTTP request of huggingface_hub follows chexpercept.peer's rule (docs/data-protection.md)
    _HUB: _guard_hub_or_warn,
}


def spec_after_import(fullname: str, path: Any, target: Any = None) -> Any:
    """The spec the other finders give ``fullname`` (datasets or evaluate), its loader wrapped so that
    our registration for it runs right after the module has executed; None when none finds it."""
    _HOOK.waiting.discard(fullname)
    if not _HOOK.waiting:
        _remove_hook()
    spec = None
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if find is None or getattr(finder, "chexpercept_hook", False):
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            break
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    original = spec.loader.exec_module
    after = _AFTER[fullname]

    def exec_module(module: ModuleType) -> None:
        original(module)
        after()

    spec.loader.exec_module = exec_module  # type: ignore[method-assign]
    return spec


class _AfterImport:
    """A meta path finder that finds nothing itself: when a watched library is about to be imported,
    it hands back the real spec with registration run right after (``spec_after_import``)."""

    chexpercept_hook = True

    def __init__(self) -> None:
        self.waiting: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.waiting:
            return None
        return spec_after_import(fullname, path, target)


_HOOK = _AfterImport()


def _remove_hook() -> None:
    while _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def register_when_imported() -> None:
    """Register now with each of datasets and evaluate that is imported, else as soon as it is
    (without importing either here); the same for guarding huggingface_hub's HTTP client."""
    for name, after in _AFTER.items():
        if sys.modules.get(name) is not None:  # None: imports of it are halted (not installed, as it were)
            after()
        else:
            _HOOK.waiting.add(name)
    if _HOOK.waiting and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
