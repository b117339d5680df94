"""Package attributes imported on first use, so that importing a package stays light."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str,
    exports: Mapping[str, str],
    namespace: dict[str, Any],
    deprecated: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``exports`` maps a name to the submodule that
    defines it (imported on first access, then kept in ``namespace``, the package's globals());
    ``deprecated`` maps an old name to its new one (returned with a DeprecationWarning)."""
    deprecated = deprecated or {}

    def __getattr__(name: str) -> Any:
        if name in deprecated:
            new = deprecated[name]
            warnings.warn(
                f"{package}.{name} is deprecated; use {package}.{new}", DeprecationWarning, stacklevel=2
            )
            return __getattr__(new)
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
