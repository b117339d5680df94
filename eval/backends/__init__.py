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


#: the command line's options that reach a model (argparse destination -> flag): which model is
#: loaded or asked for, and how it decodes; what a backend that ``reads_model_options`` applies
MODEL_OPTIONS = {
    "model_id": "--model-id",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "max_tokens": "--max-tokens",
    "no_thinking": "--no-thinking",
    "chat_template_kwargs": "--chat-template-kwargs",
}


def refuse_unread_options(args: argparse.Namespace, backend: str) -> None:
    """ValueError naming every option the command line gives (a value other than its default) that
    the ``backend`` the model runs on does not read, so that no run's recorded command says what it
    did not apply: another backend's options (``--dtype float16`` on a vllm or baseline run, red team
    stop 44), and the model options (``MODEL_OPTIONS``: which model, how it decodes) on a backend that writes its
    answers itself (``--temperature 0.7`` on a baseline: its run.json said temperature 0)."""
    from dataclasses import fields

    from chexpercept.eval.backends.options import option_default

    chosen = backend_class(backend)
    own = {f.name for f in fields(chosen.Options)}
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
    unread = [flag for dest, flag in MODEL_OPTIONS.items() if _given(getattr(args, dest, None))]
    if unread and not chosen.reads_model_options:
        raise ValueError(
            f"{', '.join(unread)}: a {backend} model writes its answers itself, loading and decoding no "
            f"model, so the run would not apply {'it' if len(unread) == 1 else 'them'}; leave "
            f"{'it' if len(unread) == 1 else 'them'} out"
        )


def _given(value: object) -> bool:
    """An option's value as the command line gave it: None is not given, nor a switch left off
    (``False``); ``0`` is (``--temperature 0``)."""
    return value is not None and value is not False
