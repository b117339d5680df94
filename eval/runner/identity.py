"""A run's identity: everything that can change an answer, checked whole on every resume.

A run folder holds answers made under one identity. It is run.json's ``settings``: the model (id,
and the weights: the Hub commit, or a fingerprint of a local folder, every file whole), the backend
and what of it can change an answer (``Backend.identity``: the options declared to, the engine
arguments, the request fields, what a baseline derives from the selected cases; a local file they
name by its content, ``with_file_contents``), a local engine's library versions
(``Backend.engine_packages``), the decoding (``sampling``), the chat template variables, the oracle
setting and parse mode, the seed, the bundle (chexpercept.json and every image whole:
``bundle_images``), and the toolkit's prompt version (``PROMPT_VERSION``: the system message, question templates, oracle texts, how
a conversation is built, and how its replies are read). A resume compares all of it with what this command would run and refuses
any difference, naming it; each record carries a fingerprint of it (``chexpercept.results.
run_identity``), so that no line made under another identity is kept or scored. The served model
(``usage.served_model``, where a server names one) is part of each answer's record: one per run
folder (``ServedModelGuard``).

What does not enter it: where and how fast the work runs (devices, memory, batch size, processes,
concurrency, timeouts, retries, the endpoint's address). Under greedy decoding these change no
answer beyond the floating-point effects of batching, which continuous batching makes
nondeterministic anyway; run.json keeps each session's values in ``sessions``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path as FsPath
from typing import Any

from chexpercept.file_digest import DigestCache, files_digest
from chexpercept.tree_walk import walk_files

#: the toolkit's prompt version: raise it whenever a request the runner sends changes (the system
#: message, a question template, an oracle text, the order of turns or images) or a reply is read
#: otherwise (the parser, which decides the oracle's triggers and the patched histories). The request
#: snapshot test (tests/test_request_snapshot.py) fails, naming this constant, when the requests or
#: the reading of messy replies change and it did not.
PROMPT_VERSION = 1

#: what of a model folder is not the model: the only files a fingerprint leaves out (every other
#: file counts whole, whatever its name: weights, tokenizer.model.v3, chat_template.j2, code)
SKIPPED_NAMES = frozenset(
    {"README.md", "README", "LICENSE", "LICENSE.md", "LICENSE.txt", "NOTICE", ".gitattributes"}
)
#: folders and files whose name starts with a dot (.git, .cache, .huggingface) are skipped too
SKIPPED_PREFIX = "."


def model_files(folder: str | os.PathLike[str]) -> list[str]:
    """The files of a local model folder that count (relative paths, sorted): every file, in
    subfolders too (a processor in ``processor/``), links followed, linked folders entered
    (chexpercept/tree_walk.py), except ``SKIPPED_NAMES`` and
    names starting with a dot."""
    out = []
    for rel in walk_files(folder, skip_folder=lambda name: name.startswith(SKIPPED_PREFIX)):
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(SKIPPED_PREFIX) or name in SKIPPED_NAMES:
            continue
        if os.path.isfile(os.path.join(folder, rel)):
            out.append(rel)
    return out


def folder_fingerprint(folder: str | os.PathLike[str], cache: DigestCache | None = None) -> str:
    """A fingerprint of a local model folder (``sha256:`` + hex) over every file of ``model_files``
    hashed whole (chexpercept/file_digest.py: every file, a Hub blob too, read once by its content and
    its digest cached by device, inode, size and times)."""
    return files_digest(folder, model_files(folder), cache)


def weights_identity(model_id: str, weights: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The weights a run's answers come from: the fingerprint of the folder the backend loads
    (``model_id``: a local folder, or a Hub model's snapshot in the cache), with the Hub commit
    where there is one (``weights`` is ``Weights.record()``); None for an API or a baseline. A
    commit alone does not say what is in the snapshot: a blob rewritten in place, or a
    ``save_pretrained`` into the snapshot (it writes through the links), keeps the commit and changes
    the weights, and a resume kept answers of both (red team, stop 43)."""
    path = os.path.expanduser(model_id)
    folder = {"folder": folder_fingerprint(path)} if os.path.isdir(path) else {}
    if weights and weights.get("commit"):
        return {"commit": weights["commit"], **folder}
    return folder or None


#: a key one side of a comparison lacks (not the same as a null)
_ABSENT = object()


def settings_diff(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every setting that differs, nested objects compared key by key
    (``backend.engine_args.dtype: 'bfloat16' -> 'float16'``); a value under a secret key is shown
    as ``***`` or its digest, never itself (chexpercept.redaction.redact_field)."""
    from chexpercept.eval.registry import same_model_id
    from chexpercept.redaction import redact_field

    out: list[str] = []
    # a local model is its files: two spellings of one folder, or the same folder named from another
    # working folder (a recorded relative name is read against the current one), whose whole
    # fingerprint is the same (red team, stop 44: such a resume was refused)
    weights = [side.get("weights") if isinstance(side, Mapping) else None for side in (before, now)]
    same_files = (
        weights[0] == weights[1] and isinstance(weights[0], Mapping) and bool(weights[0].get("folder"))
    )

    def walk(prefix: str, a: Any, b: Any) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in sorted(set(a) | set(b), key=str):
                walk(f"{prefix}.{key}" if prefix else str(key), a.get(key, _ABSENT), b.get(key, _ABSENT))
            return
        if prefix == "model_id" and (same_files or same_model_id(a, b)):
            return  # the same folder however spelled, or the same files
        # as the identity's JSON tells them apart: 1, 1.0 and true differ, and so do null and absent
        if json.dumps(a, sort_keys=True, default=repr) != json.dumps(b, sort_keys=True, default=repr):
            key = prefix.rpartition(".")[2]
            shown = [("(absent)" if v is _ABSENT else repr(redact_field(key, v))) for v in (a, b)]
            out.append(f"{prefix}: {shown[0]} -> {shown[1]}")

    walk("", before, now)
    return out


#: identity parts that may differ between the settings folders of one model folder
PER_SETTING = frozenset({"oracle"})


def setting_folders_mismatch(
    settings: Mapping[str, Any], siblings: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The differences (``settings_diff`` lines, each after its folder) between this setting's
    identity and those of the other settings folders of the same model folder (``siblings``: folder
    name -> its run.json settings), every part but ``PER_SETTING`` compared: one model folder holds one
    model's answers under one set of settings, since its settings are scored together (End-to-End
    from one, Oracle-Passed from another)."""
    mine = {k: v for k, v in settings.items() if k not in PER_SETTING}
    out = []
    for name, theirs in sorted(siblings.items()):
        diff = settings_diff({k: v for k, v in theirs.items() if k not in PER_SETTING}, mine)
        out += [f"{name}: {line}" for line in diff]
    return out


#: a folder named by an option is fingerprinted when it holds one of these at its top
MODEL_FOLDER_MARKERS = (
    "config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "preprocessor_config.json",
    "processor_config.json",
    "adapter_config.json",
    "generation_config.json",
    # a tokenizer folder of another format (sentencepiece, Mistral's tekken, BPE's vocabulary files)
    "tokenizer.model",
    "tekken.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "params.json",
)
#: engine arguments whose string names files the engine reads, however it is spelled (a bare folder
#: name too: the vllm backend checks that it exists): the file, or every file of the folder, counts
ENGINE_ARGS_NAMING_FILES = ("tokenizer", "hf_config_path")


def with_file_contents(value: Any, cache: DigestCache | None = None) -> Any:
    """``value`` (a backend's identity, the chat template variables) with every string that names a
    local file or folder (absolute, ``~/`` or relative to the working directory, as the engine opens
    it, and spelled as a path: ``_names_a_path``; a tokenizer, a chat template file, an adapter
    given in --engine-args) replaced by ``{"path": ..., "content": fingerprint}``: the content counts, not
    the name alone (a file whole through the digest cache; a folder by ``folder_fingerprint`` when
    it is a model, tokenizer, processor or adapter folder (``MODEL_FOLDER_MARKERS``), so that a
    cache folder such as vLLM's ``download_dir`` is never read whole)."""
    own = cache is None
    cache = cache or DigestCache()
    try:
        return _contents(value, cache)
    finally:
        if own:
            cache.save()


#: the endings of the files an option names by a bare name (a chat template, a tokenizer's files)
PATH_SUFFIXES = (".jinja", ".jinja2", ".json", ".model", ".tiktoken", ".txt", ".safetensors", ".bin")


def _names_a_path(value: str) -> bool:
    """Whether an option's string is spelled as a path (absolute, ``~/``, with a ``/``, or a file
    name with a file's ending), rather than a word such as ``medium`` or ``auto`` that a file in the
    working directory may happen to be called."""
    if not value or len(value) >= 4096 or "\n" in value or "\x00" in value:
        return False
    return "/" in value or value.startswith("~") or value.lower().endswith(PATH_SUFFIXES)


def _contents(value: Any, cache: DigestCache, key: Any = None) -> Any:
    if isinstance(value, Mapping):
        return {k: _contents(v, cache, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_contents(v, cache) for v in value]
    if not isinstance(value, str):
        return value
    named = key in ENGINE_ARGS_NAMING_FILES  # a file or folder whatever its spelling: read whole
    if named or _names_a_path(value):
        path = FsPath(os.path.expanduser(value))
        if path.is_dir() and (named or any((path / name).is_file() for name in MODEL_FOLDER_MARKERS)):
            return {"path": value, "content": folder_fingerprint(path, cache)}
        if path.is_file():
            return {"path": value, "content": "sha256:" + cache.digest(path)}
    return value


def engine_versions(packages: Iterable[str]) -> dict[str, str | None]:
    """The installed version of each library of a backend's ``engine_packages`` (None: not
    installed); read from package metadata, nothing is imported."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class ServedModelGuard:
    """The served model is part of each answer's record (``usage.served_model``, where the server
    names one): every answer of a run folder must come from one served model. The first answers
    kept in the folder (or, in a new folder, this session's first) fix it; an answer from another
    (an API alias moved to a new snapshot between sessions or during one) stops the run before it
    is appended, with the difference named (``check``)."""

    def __init__(self, folder: str, kept: Mapping[str, int]):
        self.folder = folder
        #: turns per served model among the answers kept before this session
        self.kept = dict(kept)
        self.allowed = set(self.kept)

    def check(self, key_id: str, usages: Iterable[Mapping[str, Any]]) -> None:
        """Raise ServedModelChanged when a turn of case ``key_id`` was served by another model."""
        from chexpercept.results import served_model_of

        for usage in usages:  # a turn whose server named no model is its own kind: unknown
            served = served_model_of(usage)
            if not self.allowed:
                self.allowed = {served}
            if served in self.allowed:
                continue
            before = ", ".join(f"{m!r} ({n} turns)" for m, n in self.kept.items()) or ", ".join(
                map(repr, sorted(self.allowed))
            )
            raise ServedModelChanged(
                f"{self.folder}: the server now answers as {served!r} (case {key_id}), while the answers "
                f"of this run so far were made by {before}: the model asked for is an alias that the "
                "server now resolves to another snapshot, and mixing them would change the scores. This "
                f"case was not recorded and nothing more runs.\n  served_model: "
                f"{' / '.join(map(repr, sorted(self.allowed)))} -> {served!r}\nPin the snapshot with "
                "--model and use another --output-dir or --run-name, or delete the folder to start over."
            )


class ServedModelChanged(ValueError):
    """An answer came from another served model than the run folder's other answers."""
