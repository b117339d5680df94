"""Backends: what answers a run's conversations (``chexpercept.eval.backends``).

``BACKENDS`` names each backend's class as ``"module:Class"`` and nothing is imported until a
backend is asked for (``backend_class``), so importing this package costs nothing. A backend is one
module or folder here: ``baselines`` (no model), ``openai`` (any OpenAI-compatible endpoint),
``vllm`` (vLLM's offline engine) and ``transformers/`` (the backend and its helpers: turn cache,
prefill masks, pixel cache, image resize).

What the engine calls on a backend is the ``Backend`` interface of ``chexpercept.eval.protocol``.
What the runner calls on a backend's class is ``BackendClass`` below: the class declares its
command-line options once, as a typed ``Options`` dataclass (``options.py``), and is built from them. A backend module imports only the standard
library and light modules at its top (torch, vllm, transformers, network clients inside its
methods), because ``chexpercept run --help`` imports every backend's class to list its options.
See ADDING_A_BACKEND.md.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from chexpercept.eval.backends.options import BackendOptions
    from chexpercept.eval.protocol import Backend, Sampling
    from chexpercept.eval.registry import ModelSpec

#: backend name (``--backend``, ``ModelSpec.backend``) -> "module:Class"; the order is the order of
#: ``--backend``'s choices and of the option groups in ``--help``
BACKENDS: dict[str, str] = {
    "vllm": "chexpercept.eval.backends.vllm.backend:VLLMBackend",
    "transformers": "chexpercept.eval.backends.transformers.backend:TransformersBackend",
    "openai": "chexpercept.eval.backends.openai.backend:OpenAIBackend",
    "baseline": "chexpercept.eval.backends.baselines:BaselineBackend",
}


class BackendClass(Protocol):
    """What a class named in ``BACKENDS`` provides besides the ``Backend`` interface (see
    ``chexpercept.eval.protocol.BackendBase``, which every backend extends)."""

    name: str
    #: its options, declared once (eval/backends/options.py): flags, help, checks, identity
    Options: type[BackendOptions]

    @classmethod
    def add_options(cls, group: argparse._ArgumentGroup) -> None: ...

    @classmethod
    def from_plan(
        cls,
        spec: ModelSpec,
        options: BackendOptions,
        *,
        sampling: Sampling,
        chat_template_kwargs: dict[str, Any],
        on_error: str = "stop",
    ) -> Backend: ...


def backend_class(name: str) -> type[BackendClass]:
    """The class of backend ``name``, imported now."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def refuse_other_backends_options(args: argparse.Namespace, backend: str) -> None:
    """ValueError naming every option of another backend than ``backend`` that the command line gives
    a value other than its default: ``--dtype float16`` (transformers) on a vllm or baseline run was
    taken and never applied, while run.json's recorded command said it was given (red team, stop 44)."""
    from dataclasses import fields

    from chexpercept.eval.backends.options import option_default

    own = {f.name for f in fields(backend_class(backend).Options)}
    given = []
    for name in BACKENDS:
        if name == backend:
            continue
        options = backend_class(name).Options
        for f in fields(options):
            value = getattr(args, f.name, None)
            if f.name not in own and value is not None and value != option_default(f):
                given.append(f"{options.flag(f.name)} (the {name} backend's)")
    if given:
        raise ValueError(
            f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of another backend: "
            f"this model runs on the {backend} backend, which does not read {'it' if len(given) == 1 else 'them'}, "
            "so the run would not apply what its command says; leave "
            f"{'it' if len(given) == 1 else 'them'} out, or choose that backend with --backend"
        )
