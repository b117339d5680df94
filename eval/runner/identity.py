"""A run's identity: everything that can change an answer, checked whole on every resume.

A run folder holds answers made under one identity. It is run.json's ``settings``: the model (id,
and the weights: the Hub commit, or a fingerprint of a local folder), the backend and what of it
can change an answer (``Backend.identity``: the options declared to, the engine arguments, the
request fields, what a baseline derives from the selected cases), the decoding (``sampling``), the
chat template variables, the oracle setting and parse mode, the seed, the bundle, and the toolkit's
prompt version (``PROMPT_VERSION``: the system message, question templates, oracle texts, and how
a conversation is built). A resume compares all of it with what this command would run and refuses
any difference, naming it; each record carries a fingerprint of it (``chexpercept.results.
run_identity``), so that no line made under another identity is kept or scored.

What does not enter it: where and how fast the work runs (devices, memory, batch size, processes,
concurrency, timeouts, retries, the endpoint's address). Under greedy decoding these change no
answer beyond the floating-point effects of batching, which continuous batching makes
nondeterministic anyway; run.json keeps each session's values in ``sessions``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path as FsPath
from typing import Any

from chexpercept.input_files import MODEL_FILE, WEIGHTS, open_input, read_input

#: the toolkit's prompt version: raise it whenever a request the runner sends changes (the system
#: message, a question template, an oracle text, the order of turns or images). The request snapshot
#: test (tests/test_request_snapshot.py) fails, naming this constant, when the requests change and
#: it did not.
PROMPT_VERSION = 1

#: small files of a model folder that decide how a prompt is built and decoded (hashed whole)
_SMALL_FILES = (".json", ".jinja", ".txt", ".model", ".py", ".tiktoken", ".yaml")
#: weight files (hashed by size, header and the first and last MiB: a changed checkpoint changes
#: them, and a 50 GB model is fingerprinted in milliseconds)
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz", ".msgpack", ".h5")
_PROBE = 1 << 20


def folder_fingerprint(folder: str | os.PathLike[str]) -> str:
    """A fingerprint of a local model folder (``sha256:`` + hex): its configuration, tokenizer,
    chat template and code files whole, its weight files by name, size and their first and last
    MiB. Links are followed; files in subfolders count (a processor in ``processor/``). Every file is
    read as inputs are (chexpercept.input_files: a regular file within ``MODEL_FILE`` or ``WEIGHTS``),
    so a FIFO, a device or a huge file in the folder is refused, never read without end."""
    root = FsPath(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue  # .cache, .git: not the model
        suffix = path.suffix.lower()
        if suffix in _SMALL_FILES:
            digest.update(f"{rel}\0".encode())
            digest.update(read_input(path, MODEL_FILE, what="model file"))
        elif suffix in _WEIGHT_FILES:
            with open_input(path, WEIGHTS, what="model weight file") as f:
                size = os.fstat(f.fileno()).st_size
                digest.update(f"{rel}\0{size}\0".encode())
                digest.update(f.read(_PROBE))
                if size > _PROBE:
                    f.seek(max(size - _PROBE, _PROBE))
                    digest.update(f.read(_PROBE))
    return "sha256:" + digest.hexdigest()


def weights_identity(model_id: str, weights: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The weights a run's answers come from: the Hub commit where there is one (``weights`` is
    ``Weights.record()``), else the fingerprint of a local folder; None for an API or a baseline."""
    if weights and weights.get("commit"):
        return {"commit": weights["commit"]}
    path = os.path.expanduser(model_id)
    if os.path.isdir(path):
        return {"folder": folder_fingerprint(path)}
    return None


def settings_diff(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every setting that differs, nested objects compared key by key
    (``backend.engine_args.dtype: 'bfloat16' -> 'float16'``)."""
    from chexpercept.eval.registry import same_model_id

    out: list[str] = []

    def walk(prefix: str, a: Any, b: Any) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in sorted(set(a) | set(b), key=str):
                walk(f"{prefix}.{key}" if prefix else str(key), a.get(key), b.get(key))
            return
        if prefix == "model_id" and same_model_id(a, b):
            return  # the same folder however spelled
        if a != b:
            out.append(f"{prefix}: {a!r} -> {b!r}")

    walk("", before, now)
    return out
