"""One commit, or one pull request, of exactly the bytes the guard passed (huggingface_hub's create_commit)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .guard import AGREEMENT, Manifest, PushRefused, check_string


@dataclass(frozen=True)
class Uploaded:
    """Where the files went: the commit's URL and, for a pull request, its URL and number."""

    commit_url: str
    files: list[str]
    pr_url: str | None = None
    pr_num: int | None = None


def hub_api(endpoint: str | None = None, token: str | None = None):  # -> HfApi (imported late)
    """An HfApi for ``endpoint`` (default: $HF_ENDPOINT, else the Hub)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)


def upload(
    manifest: Manifest,
    repo: str,
    *,
    repo_type: str = "dataset",
    message: str,
    description: str | None = None,
    create_pr: bool = False,
    create_repo: bool = True,
    private: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
) -> Uploaded:
    """Check the staging folder once more (``manifest.verify``; the message and description against the
    bundle's identifiers too; PushRefused when a check fails) and commit
    exactly the verified bytes to ``repo``: a new commit on main, or with ``create_pr`` a pull request
    (the repo must exist then; ``create_repo`` makes a missing repo first, for direct commits only).

    Raises the Hub's errors (huggingface_hub.errors.HfHubHTTPError and its kinds) unchanged."""
    from huggingface_hub import CommitOperationAdd

    files = manifest.verify()
    texts = {"the commit message": message, "the pull request description": description or ""}
    problems = [p for where, text in texts.items() for p in check_string(text, where, manifest.context)]
    if problems:
        raise PushRefused("refusing to upload:\n  " + "\n  ".join(problems) + f"\n{AGREEMENT}.")
    api = hub_api(endpoint, token)
    if create_repo and not create_pr:
        api.create_repo(repo, repo_type=repo_type, private=private, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=data) for rel, data in files.items()]
    info = api.create_commit(
        repo,
        operations,
        commit_message=message,
        commit_description=description,
        repo_type=repo_type,
        create_pr=create_pr,
    )
    return Uploaded(str(info.commit_url), list(files), info.pr_url, info.pr_num)
