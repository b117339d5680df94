"""One commit, or one pull request, of exactly the bytes the guard passed (huggingface_hub's create_commit)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from chexpercept.escape import terminal_lines

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


def preview_then_commit(
    files: dict[str, bytes],
    heading: str,
    *,
    dry_run: bool,
    commit: Callable[[], str],
    contents: bool = True,
    prog: str = "chexpercept",
) -> int:
    """The one way a command publishes: say what would go (``heading``, then every file: its text
    with ``contents``, else its name), stop there under ``--dry-run``, else ``commit()`` (it returns
    what to print after ``done:``: a commit or pull-request URL); the command's exit status (1 when
    the Hub refused or could not be reached, said in one line). ``files``: the guard's verified bytes
    (``Manifest.verify``). A PushRefused is the guard's verdict and is raised, not turned into 1."""
    print(heading)
    for rel, data in files.items():
        if contents:
            print(f"--- {rel}")
            print(data.decode("utf-8"), end="")
        else:
            print(f"  {rel}")
    if dry_run:
        return 0
    try:
        where = commit()
    except (PushRefused, ValueError, FileNotFoundError):
        raise
    except Exception as e:  # the Hub's errors (auth, network, a refused file) as one line
        print(f"{prog}: upload failed: {type(e).__name__}: {terminal_lines(e)}", file=sys.stderr)
        return 1
    print(f"done: {where}")
    return 0
