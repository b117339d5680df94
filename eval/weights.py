"""Model weights from the Hugging Face Hub: resolved, checked and fetched once before any engine starts.

``chexpercept run`` (vllm and transformers backends) and ``chexpercept download-model`` call this.
A model is a local folder (used as it is), or a Hub id resolved with ``huggingface_hub``:

- ``HF_HUB_OFFLINE`` set: the cache (``HF_HOME`` / ``HF_HUB_CACHE``) must hold the revision, else a
  clear error says how to fetch it first;
- online: the model's info with file metadata names the commit and the file sizes; a gated model
  without a token or without accepted terms, a missing model and a missing revision are errors that
  say what to do; files already in the cache are used; the rest are downloaded after a free-space
  check (how much is needed, where);
- under ``accelerate launch``, the first process of each machine fetches; the others wait at a
  barrier and then read the same snapshot from the cache.

The backends are handed the snapshot folder, so every process loads exactly the resolved commit
and none of them goes to the network again. run.json records the requested revision and the commit.

A model whose own code will run (``trust_remote_code``: the registry's six such models,
``--trust-remote-code``, or ``--engine-args '{"trust_remote_code": true}'``) runs it only from a
pinned commit: the one ``--revision`` names, else the one recorded when its weights were first
fetched into this cache (``REMOTE_CODE_RECORD`` in the model's cache folder). A newer upstream
commit is not taken without an explicit ``--revision`` (which then becomes the record).
``remote_code_commit`` (run.json ``weights.remote_code``) says which commit and why; code that the
model's files fetch from another repository (an ``auto_map`` entry ``other/repo--module.Class``) is
refused, as no revision of it is pinned.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path as FsPath
from typing import Any

from chexpercept.escape import shell_word, terminal
from chexpercept.fileio import write_atomic, write_json_atomic
from chexpercept.input_files import TEXT_FILE, read_input_text
from chexpercept.input_json import read_json
from chexpercept.peer import PeerRefused

#: the backends that load weights; the openai and baseline backends need none
WEIGHT_BACKENDS = ("vllm", "transformers")
#: the package each of them loads weights with
ENGINE_PACKAGES = {"vllm": "vllm", "transformers": "transformers"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
#: room left free beyond the files themselves (file system overhead, temporary files)
DISK_MARGIN = 1 << 20
#: in a model's cache folder: the commit its own code (trust_remote_code) runs from
REMOTE_CODE_RECORD = "chexpercept-remote-code.json"
#: the files whose ``auto_map`` says which code transformers and vLLM load
_CODE_MAPS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")


class HubError(ValueError):
    """A model cannot be resolved or fetched; the message says why and what to do."""


@dataclass(frozen=True)
class Weights:
    """Where a model's files are, and which version they are."""

    model_id: str
    #: the folder the backends load
    path: str
    #: the revision asked for (None: the default branch)
    revision: str | None
    #: the commit the revision resolved to (None for a local folder)
    commit: str | None
    #: "local" (a folder given), "cache" (all files already cached), "download" (fetched now)
    source: str
    #: bytes of all files of the snapshot (None when unknown)
    size: int | None = None
    #: bytes downloaded now
    downloaded: int = 0
    #: when the model's own code runs: {"commit", "pinned_by"} (see ``remote_code_commit``)
    remote_code: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """What run.json keeps (``weights``)."""
        record = {
            "model_id": self.model_id,
            "revision": self.revision,
            "commit": self.commit,
            "source": self.source,
            "size_bytes": self.size,
        }
        if self.remote_code is not None:
            record["remote_code"] = dict(self.remote_code)
        return record


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


def is_local(model_id: str) -> bool:
    return os.path.isdir(os.path.expanduser(model_id))


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> FsPath:
    from huggingface_hub import constants

    return FsPath(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()


def _storage(cache_dir: FsPath, model_id: str) -> FsPath:
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir / repo_folder_name(repo_id=model_id, repo_type="model")


def _gated_message(model_id: str, endpoint: str, token: str | None) -> str:
    page = f"{endpoint}/{model_id}"
    from huggingface_hub import get_token

    if token is None and get_token() is None:
        return (
            f"{model_id} is a gated model and this machine has no Hugging Face token: accept the model's "
            f"terms at {page} (logged in), then run `hf auth login` (or set HF_TOKEN) with that account"
        )
    return (
        f"{model_id} is a gated model and the Hugging Face account of this machine's token has no access "
        f"to it: accept the model's terms at {page} (access may need approval), check that `hf auth "
        "whoami` names that account, and retry"
    )


def _not_found(
    model_id: str, revision: str | None, endpoint: str, error: Exception, token: str | None
) -> HubError:
    from huggingface_hub.errors import GatedRepoError, RevisionNotFoundError

    if isinstance(error, GatedRepoError):
        return HubError(_gated_message(model_id, endpoint, token))
    if isinstance(error, RevisionNotFoundError):
        return HubError(
            f"revision {revision!r} of {model_id} does not exist on {terminal(endpoint)}: check --revision "
            f"(a branch, tag or commit of {terminal(endpoint)}/{model_id})"
        )
    return HubError(
        f"model {model_id} was not found on {terminal(endpoint)}: check the name (`chexpercept run --list-models` "
        "lists the registry) or, for a private model, run `hf auth login` with an account that can read it"
    )


def _from_cache(model_id: str, revision: str | None, cache: FsPath) -> str | None:
    """The cached snapshot folder of this revision, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(model_id, revision=revision, cache_dir=cache, local_files_only=True)
    except LocalEntryNotFoundError:  # IncompleteSnapshotError is one
        return None


def _free_space(folder: FsPath) -> tuple[int, FsPath]:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe


def _write_ref(storage: FsPath, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, so that offline runs find the snapshot by branch or tag name."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    if ref.exists() and read_input_text(ref, TEXT_FILE, what="Hub cache ref").strip() == commit:
        return
    write_atomic(ref, commit)


def resolve_weights(
    model_id: str,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    local_only: bool = False,
    remote_code: bool = False,
    processor_only: bool = False,
) -> Weights:
    """Resolve ``model_id`` at ``revision`` to a folder of files, downloading what is missing.

    ``local_only``: never go to the network (as with ``HF_HUB_OFFLINE``). ``remote_code``: the
    model's own code will run, so the revision is pinned (``remote_code_commit``).
    ``processor_only``: every file but the weights (configuration, tokenizer, chat template,
    processor: what counting tokens needs; ``chexpercept estimate``). Raises HubError with a message
    for the user (gated, not found, no such revision, not cached offline, not enough disk, code from
    another repository).
    """
    expanded = os.path.expanduser(model_id)
    if os.path.isdir(expanded):
        if revision is not None:
            raise HubError(f"--revision applies to Hugging Face ids; {model_id} is a local folder")
        path = os.path.abspath(expanded)
        pinned = None
        if remote_code:  # the user's own files: they are what runs
            check_code_references(path, model_id)
            pinned = {"commit": None, "pinned_by": "local folder"}
        return Weights(model_id, path, None, None, "local", remote_code=pinned)
    if not _REPO_ID.match(model_id):
        raise HubError(
            f"model {model_id!r} is neither a local folder nor a Hugging Face id (organisation/name)"
        )
    if remote_code:
        return remote_code_commit(
            model_id,
            revision,
            _storage(_cache_dir(cache_dir), model_id),
            lambda rev: resolve_weights(
                model_id,
                rev,
                cache_dir=cache_dir,
                endpoint=endpoint,
                token=token,
                local_only=local_only,
                processor_only=processor_only,
            ),
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    cache = _cache_dir(cache_dir)
    storage = _storage(cache, model_id)
    url = _endpoint(endpoint)
    if local_only or _offline():
        weights = _offline_weights(model_id, revision, cache, processor_only)
        _record_first_fetch(storage, weights)
        return weights

    api = HfApi(endpoint=url, token=token)
    try:
        info = api.model_info(model_id, revision=revision, files_metadata=True)
        if info.gated:
            api.auth_check(model_id)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:  # GatedRepoError is one
        raise _not_found(model_id, revision, url, e, token) from None
    except PeerRefused as e:  # a loopback HF_ENDPOINT served by another account (chexpercept.peer)
        raise HubError(str(e)) from None
    except Exception as e:  # the Hub cannot be reached or answered (HTTP, connection): the cache may do
        weights = _unreachable_weights(model_id, revision, cache, url, e, processor_only)
    else:
        weights = _snapshot_weights(model_id, revision, info, cache, storage, url, token, processor_only)
    _record_first_fetch(storage, weights)
    return weights


#: files that hold a model's weights (everything else: configuration, tokenizer, processor, code)
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".npz",
)


def is_weight_file(name: str) -> bool:
    return name.lower().endswith(WEIGHT_SUFFIXES)


# ------------------------------------------------------------------------------------ remote code
def read_remote_code_record(storage: FsPath) -> dict[str, Any] | None:
    """The record of the commit a model's own code runs from (None when there is none); HubError
    when the file is not one we wrote."""
    path = storage / REMOTE_CODE_RECORD
    try:
        record = read_json(path, what="remote-code record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise HubError(
            f"{terminal(path)} cannot be read ({terminal(e)}): delete it, then pass --revision to pin a commit"
        ) from e
    if not isinstance(record, dict) or not _COMMIT.match(str(record.get("commit"))):
        raise HubError(f"{path} names no commit: delete it, then pass --revision to pin a commit")
    return record


def _write_remote_code_record(storage: FsPath, weights: Weights, pinned_by: str) -> None:
    """Record ``weights.commit`` as the commit the model's code runs from (written aside, then swapped)."""
    record = {
        "model_id": weights.model_id,
        "commit": weights.commit,
        "pinned_by": pinned_by,
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        write_json_atomic(storage / REMOTE_CODE_RECORD, record, indent=1)
    except OSError as e:  # a read-only shared cache: this run still uses the commit
        print(
            f"warning: cannot record commit {weights.commit} of {weights.model_id} as the one its own code "
            f"runs from ({e.strerror or e}: {storage}); pass --revision {weights.commit} to pin it",
            file=sys.stderr,
        )


def _record_first_fetch(storage: FsPath, weights: Weights) -> None:
    """The first time a Hub model is resolved into this cache, record its commit (what its code will
    run from, should it ever be trusted, until a --revision says otherwise)."""
    if weights.commit and not (storage / REMOTE_CODE_RECORD).exists():
        _write_remote_code_record(storage, weights, "first fetch")


def remote_code_commit(model_id: str, revision: str | None, storage: FsPath, resolve: Any) -> Weights:
    """The weights of ``model_id`` whose own code will run, at a pinned commit: ``revision``'s
    when given (recorded as the new pin), else the recorded one (``REMOTE_CODE_RECORD``), else, at
    the first fetch, what the default branch is now (recorded). ``resolve(revision)`` resolves
    without pinning. The Weights carry ``remote_code`` = {"commit", "pinned_by"}; HubError when the
    files load code from another repository."""
    record = read_remote_code_record(storage) if revision is None else None
    if revision is not None:
        weights = resolve(revision)
        pinned_by = f"--revision {revision}"
        _write_remote_code_record(storage, weights, pinned_by)
    elif record is not None:
        weights = replace(resolve(record["commit"]), revision=None)
        pinned_by = f"recorded ({record.get('pinned_by')}, {record.get('recorded')})"
        print(
            f"{model_id} runs its own code (trust_remote_code) from commit {weights.commit}, {pinned_by} in "
            f"{storage / REMOTE_CODE_RECORD}; newer commits of the repository are not taken: pass "
            "--revision (a branch, tag or commit) to run another revision's code",
            file=sys.stderr,
        )
    else:  # the first fetch: resolve_weights records it
        weights = resolve(None)
        pinned_by = "first fetch"
    check_code_references(weights.path, model_id)
    return replace(weights, remote_code={"commit": weights.commit, "pinned_by": pinned_by})


def check_code_references(folder: str, model_id: str) -> None:
    """HubError when the model's files load code from another repository (``auto_map`` values such
    as ``other/repo--modeling.Class``): transformers would fetch it from that repository's default
    branch, a revision nobody pinned."""
    for name in _CODE_MAPS:
        path = os.path.join(folder, name)
        try:
            data = read_json(path, what=name)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:  # a file the model's loader would choke on too: refuse it
            raise HubError(
                f"{model_id}: {path} cannot be read ({e}), so where its code comes from is unknown"
            ) from e
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for key, value in auto_map.items():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and "--" in ref:
                    raise HubError(
                        f"{model_id}: {name} auto_map.{key} loads code from another repository ({ref!r}), "
                        "whose revision is not pinned; the toolkit runs remote code only from the model's "
                        "own pinned commit. Use a copy of the model whose code is in its own files (a local "
                        "folder)"
                    )


def _snapshot_weights(
    model_id: str,
    revision: str | None,
    info: Any,
    cache: FsPath,
    storage: FsPath,
    url: str,
    token: str | None,
    processor_only: bool = False,
) -> Weights:
    """The snapshot of the commit the Hub's model info names (``processor_only``: every file but the
    weights): from the cache when all its files are there, else downloaded after a free-space
    check."""
    wanted = revision or "main"
    commit = info.sha
    if not commit or not _COMMIT.match(commit):
        raise HubError(f"the Hub at {terminal(url)} gave no commit for {model_id} (revision {wanted})")
    files = {s.rfilename: s.size or 0 for s in (info.siblings or [])}
    if processor_only:
        files = {name: size for name, size in files.items() if not is_weight_file(name)}
    total = sum(files.values())
    snapshot = storage / "snapshots" / commit
    missing = {name: size for name, size in files.items() if not (snapshot / name).exists()}
    if not missing and snapshot.is_dir():
        _write_ref(storage, wanted, commit)
        return Weights(model_id, str(snapshot), revision, commit, "cache", total)
    needed = sum(missing.values())
    _check_free_space(model_id, commit, len(missing), needed, storage)
    print(
        f"downloading {model_id} (commit {commit[:12]}): {len(missing)} file(s), {human_size(needed)} "
        f"into {storage}",
        file=sys.stderr,
    )
    path = _download(
        model_id, revision, commit, cache, storage, url, token, list(files) if processor_only else None
    )
    _write_ref(storage, wanted, commit)
    return Weights(model_id, path, revision, commit, "download", total, needed)


def fetch_hint(model_id: str, revision: str | None, cache: FsPath, processor_only: bool) -> str:
    """The download-model command that fetches what is missing (``processor_only``: no weights)."""
    return (
        f"`chexpercept download-model {shell_word(model_id)}"
        + (f" --revision {shell_word(revision)}" if revision else "")
        + (" --processor-only" if processor_only else "")
        + f" --cache-dir {shell_word(cache)}`"
        + (" (the processor's files only: a few MB, not the weights)" if processor_only else "")
    )


def _offline_weights(
    model_id: str, revision: str | None, cache: FsPath, processor_only: bool = False
) -> Weights:
    """The cached snapshot when the Hub may not be used; HubError saying how to fetch it otherwise."""
    wanted = revision or "main"
    path = _from_cache(model_id, wanted, cache)
    if path is None:
        raise HubError(
            f"{model_id} (revision {wanted}) is not in the Hugging Face cache {cache} and the Hub may "
            "not be used (offline mode: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): fetch it first "
            f"where there is network access with {fetch_hint(model_id, revision, cache, processor_only)}, "
            "or unset the offline variable"
        )
    return Weights(model_id, path, revision, FsPath(path).name, "cache")


def _unreachable_weights(
    model_id: str,
    revision: str | None,
    cache: FsPath,
    url: str,
    error: Exception,
    processor_only: bool = False,
) -> Weights:
    """The cached snapshot (with a warning) when the Hub could not be reached; HubError when none."""
    wanted = revision or "main"
    path = _from_cache(model_id, wanted, cache)
    if path is None:
        raise HubError(
            f"cannot reach the Hugging Face Hub at {terminal(url)} ({type(error).__name__}: {terminal(error)}) "
            f"and {model_id} (revision {wanted}) is not in the cache {cache}: fetch it where there is "
            f"network access with {fetch_hint(model_id, revision, cache, processor_only)}"
        ) from None
    print(
        f"warning: the Hub at {terminal(url)} could not be reached ({type(error).__name__}); using the "
        f"cached {model_id} at {terminal(path)}",
        file=sys.stderr,
    )
    return Weights(model_id, path, revision, FsPath(path).name, "cache")


def _check_free_space(model_id: str, commit: str, n_files: int, needed: int, storage: FsPath) -> None:
    """HubError when the disk under ``storage`` cannot hold ``needed`` bytes (plus DISK_MARGIN)."""
    free, where = _free_space(storage)
    if needed + DISK_MARGIN > free:
        raise HubError(
            f"not enough free disk for {model_id} (commit {commit[:12]}): {n_files} file(s) need "
            f"{human_size(needed)} in {storage}, but only {human_size(free)} is free on {where}; free "
            "some space or point HF_HOME (or HF_HUB_CACHE) at a larger disk"
        )


def _download(
    model_id: str,
    revision: str | None,
    commit: str,
    cache: FsPath,
    storage: FsPath,
    url: str,
    token: str | None,
    names: list[str] | None = None,
) -> str:
    """Fetch the snapshot of ``commit`` into the cache (its folder; only ``names`` where given);
    HubError saying what went wrong."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return snapshot_download(
            model_id,
            revision=commit,
            cache_dir=cache,
            endpoint=url,
            token=token,
            allow_patterns=names,
        )
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _not_found(model_id, revision, url, e, token) from None
    except Exception as e:  # network, disk, a file the Hub no longer serves
        raise HubError(
            f"downloading {model_id} (commit {commit[:12]}) into {terminal(storage)} failed "
            f"({type(e).__name__}: {terminal(e)}); "
            "the files already fetched stay in the cache: run the same command again to continue"
        ) from e


# ------------------------------------------------------------------------------------ the run
def add_revision_option(parser: Any) -> None:
    """``--revision R`` for commands that load a Hub model."""
    parser.add_argument(
        "--revision",
        help="Hugging Face branch, tag or commit of the model (default: main); run.json records the commit",
    )


def runs_remote_code(backend: Any) -> bool:
    """Whether ``backend`` will run the model's own code (its ``trust_remote_code``: the registry's,
    ``--trust-remote-code``, or vLLM's ``--engine-args``)."""
    return bool(getattr(backend, "trust_remote_code", False))


def prepare_model(
    spec: Any, revision: str | None, dist: Any, *, remote_code: bool = False
) -> tuple[Any, Weights | None]:
    """Before any engine starts: resolve (and fetch once per machine) the weights of ``spec``.

    Returns the spec the backend should load (``model_id`` replaced by the snapshot folder for a Hub
    model) and the Weights (None for backends that need no weights). The first process of each
    machine resolves and downloads; the others wait at a barrier, then read the cache. A failure on
    the main process is raised there; the other processes exit quietly with status 2.
    ``remote_code``: the model's own code will run, so its commit is pinned (``remote_code_commit``).
    """
    if spec.backend not in WEIGHT_BACKENDS:
        if revision is not None:
            raise HubError(f"--revision applies to the vllm and transformers backends, not {spec.backend}")
        return spec, None
    if is_local(spec.model_id):
        weights = resolve_weights(spec.model_id, revision, remote_code=remote_code)
        return spec, weights
    if importlib.util.find_spec(ENGINE_PACKAGES[spec.backend]) is None:
        # no engine to load them: the backend says what to install when it starts; fetching
        # gigabytes first would only delay that
        return spec, None
    # 1. the main process resolves the revision to one commit (and fetches it on its machine)
    outcome: dict[str, Any] = {"ok": True}
    error: HubError | None = None
    weights = None
    if dist.is_main:
        try:
            weights = resolve_weights(spec.model_id, revision, remote_code=remote_code)
            outcome = {"ok": True, "commit": weights.commit}
        except HubError as e:
            error, outcome = e, {"ok": False}
    first = dist.broadcast(outcome)
    if error is not None:
        raise error
    if not first["ok"]:
        raise SystemExit(2)  # the main process said why
    # 2. the first process of every other machine fetches that commit; the rest wait
    if weights is None and dist.local_index == 0:
        try:
            weights = resolve_weights(spec.model_id, first["commit"])
        except HubError as e:
            error = e
    dist.barrier()
    if error is not None:
        raise error
    # 3. everyone else reads the cache
    if weights is None:
        weights = resolve_weights(spec.model_id, first["commit"], local_only=True)
    weights = replace(weights, revision=revision)
    return replace(spec, model_id=weights.path), weights
