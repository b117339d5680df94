"""The one walker of a folder tree whose files count for a run's identity: links followed.

A folder of a bundle or of a model may be a link to a folder elsewhere (a case folder linked to
another case's, a model's ``processor/`` linked to a shared one); its files count like any other
(``Path.rglob`` on Python 3.11 does not enter linked folders, and a walk that does not follow links
sees only the link). Used by ``Bundle.images_fingerprint`` (chexpercept/bundle.py) and
``model_files`` (eval/runner/identity.py).

Links are followed with ``os.walk(followlinks=True)``; a linked folder that leads back to one of
the folders it sits in (a loop) is not entered again. The same folder reached by two paths (not a
loop) is walked under both: each path is what a reader of the tree sees.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def walk_files(
    root: str | os.PathLike[str], *, skip_folder: Callable[[str], bool] | None = None
) -> list[str]:
    """Every entry under ``root`` that is not a folder (regular files, links to files, dangling
    links, FIFOs: the caller decides what each counts as), as ``/``-separated paths relative to
    ``root``, sorted. Linked folders are entered (loops are not); folders whose name
    ``skip_folder`` accepts are left out. An absent ``root`` has no files."""
    top = os.fspath(root)
    out: list[str] = []
    #: real paths of each walked folder and of the folders it sits in (by the path walked)
    seen: dict[str, frozenset[str]] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        above = seen.pop(dirpath, frozenset()) | {os.path.realpath(dirpath)}
        kept = []
        for name in sorted(dirnames):
            if skip_folder is not None and skip_folder(name):
                continue
            child = os.path.join(dirpath, name)
            if os.path.realpath(child) in above:
                continue  # a link back to a folder it sits in: a loop
            seen[child] = above
            kept.append(name)
        dirnames[:] = kept
        rel = os.path.relpath(dirpath, top)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        out.extend(prefix + name for name in filenames)
    return sorted(out)
