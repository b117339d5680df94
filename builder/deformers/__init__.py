"""Mask deformers behind ``--deformer morphology|sam3``, built by name.

    from chexpercept.builder.deformers import make_deformer

    deformer = make_deformer("morphology")
    deformer = make_deformer("sam3", checkpoint="/models/sam3", device="cuda")
    deformer = make_deformer("sam3", impl="meta", checkpoint="/models/sam3.pt")  # Meta's sam3 package

``base`` holds the protocol and the request types every deformer shares; each implementation lives in
its own module and is imported only when it is built, so importing this package (or building the
morphology deformer) never imports torch. A deformer may have several implementations (SAM 3:
transformers' ``Sam3TrackerModel``, the default, and Meta's ``sam3`` package); ``impl=`` picks one, the first listed being the default, and a new
implementation is one more entry in ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from .base import Deformer, DeformRequest, Prompt, center_of, satisfies

#: deformer name -> implementation name -> "module:attribute" in this package (first = default)
IMPLEMENTATIONS: dict[str, dict[str, str]] = {
    "morphology": {"numpy": "morphology:MorphologyDeformer"},
    "sam3": {"transformers": "sam3:Sam3Deformer", "meta": "sam3_meta:MetaSam3Deformer"},
}
#: the names ``--deformer`` accepts
DEFORMERS: tuple[str, ...] = tuple(IMPLEMENTATIONS)


def implementations(name: str) -> tuple[str, ...]:
    """The implementations of deformer ``name``, the default first."""
    return tuple(_table(name))


def deformer_class(name: str, impl: str | None = None) -> Callable[..., Deformer]:
    """The class (or factory) of deformer ``name``, implementation ``impl``; imports its module."""
    table = _table(name)
    if impl is None:
        impl = next(iter(table))
    if impl not in table:
        raise ValueError(f"unknown {name} implementation {impl!r}; expected one of {', '.join(table)}")
    module, attribute = table[impl].split(":")
    return getattr(import_module(f"{__name__}.{module}"), attribute)


def make_deformer(name: str, *, impl: str | None = None, **options: object) -> Deformer:
    """Build deformer ``name`` with ``options`` (e.g. sam3: checkpoint, device, dtype)."""
    return deformer_class(name, impl)(**options)


def _table(name: str) -> dict[str, str]:
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown deformer {name!r}; expected one of {', '.join(DEFORMERS)}")
    return IMPLEMENTATIONS[name]


__all__ = [
    "DEFORMERS",
    "IMPLEMENTATIONS",
    "DeformRequest",
    "Deformer",
    "Prompt",
    "center_of",
    "deformer_class",
    "implementations",
    "make_deformer",
    "satisfies",
]
