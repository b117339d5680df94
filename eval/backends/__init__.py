"""Backends: what answers a run's conversations (``chexpercept.eval.backends``).

``BACKENDS`` names each backend's class as ``"module:Class"`` and nothing is imported until a
backend is asked for (``backend_class``), so importing this package costs nothing. A backend is one
module or folder here: ``baselines`` (no model), ``openai`` (any OpenAI-compatible endpoint),
``vllm`` (vLLM's offline engine) and ``transformers/`` (the backend and its helpers: turn cache,
prefill masks, pixel cache, image resize).

What the engine calls on a backend is the ``Backend`` interface of ``chexpercept.eval.protocol``.
What ``eval/run.py`` calls on a backend's class is ``BackendClass`` below: the class owns its
command-line options and builds itself from them. A backend module imports only the standard
library and light modules at its top (torch, vllm, transformers, network clients inside its
methods), because ``chexpercept run --help`` imports every backend's class to list its options.
See ADDING_A_BACKEND.md.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..protocol import Backend, Sampling
    from ..registry import ModelSpec

#: backend name (``--backend``, ``ModelSpec.backend``) -> "module:Class"; the order is the order of
#: ``--backend``'s choices and of the option groups in ``--help``
BACKENDS: dict[str, str] = {
    "vllm": "chexpercept.eval.backends.vllm:VLLMBackend",
    "transformers": "chexpercept.eval.backends.transformers.backend:TransformersBackend",
    "openai": "chexpercept.eval.backends.openai:OpenAIBackend",
    "baseline": "chexpercept.eval.backends.baselines:BaselineBackend",
}


class BackendClass(Protocol):
    """What a class named in ``BACKENDS`` provides besides the ``Backend`` interface."""

    @classmethod
    def add_options(cls, group: argparse._ArgumentGroup) -> None:
        """Add this backend's command-line options to its group of ``chexpercept run``
        (titled "<name> backend"; a backend without options adds nothing)."""

    @classmethod
    def from_options(
        cls, spec: ModelSpec, args: argparse.Namespace, sampling: Sampling, chat_kwargs: dict[str, Any]
    ) -> Backend:
        """The backend for ``spec`` as the parsed options ``args`` ask (``sampling`` and
        ``chat_kwargs`` are already resolved from the registry and the decoding options)."""


def backend_class(name: str) -> type[BackendClass]:
    """The class of backend ``name``, imported now."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def json_object_arg(text: str) -> dict[str, Any]:
    """argparse type of an option that takes a JSON object (engine arguments, request fields...)."""
    from chexpercept.input_json import JsonInputError, loads

    try:
        value = loads(text, source="the option's value")
    except JsonInputError as e:
        raise argparse.ArgumentTypeError(e.reason) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"key\": 1}'")
    return value
