"""Errors that name the case and the file or field, and the access instructions for the release."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path as FsPath

from .escape import terminal

#: where the release comes from, in one line (a data_dir that does not exist)
WHERE_TO_GET = (
    "The CheXpercept release is downloaded from PhysioNet (credentialed access: "
    "https://physionet.org/content/chexpercept/); `chexpercept synth --output-dir DIR` writes a phantom one "
    "for testing software."
)
ACCESS_INSTRUCTIONS = """\
CheXpercept is credentialed data derived from MIMIC-CXR-JPG and MIMIC-ILS. To get it:
  1. Become a credentialed PhysioNet user (https://physionet.org/settings/credentialing/).
  2. Complete the CITI 'Data or Specimens Only Research' training and upload the certificate.
  3. Sign the data use agreements of MIMIC-CXR-JPG, MIMIC-ILS and CheXpercept on PhysioNet.
  4. Download the CheXpercept release and pass its folder as data_dir.
The folder must contain chexpercept.json (one object keyed by key_id) and chexpercept/<key_id>/...
images (detection_qa/xray.png, contour_qa/...). Without credentials, `chexpercept synth --output-dir DIR`
writes a phantom bundle in the same format for testing software (never for comparing models)."""


class Refused(Exception):
    """The toolkit refused on purpose (data protection, publishing rules): the message says what was
    refused, why, and what to do. Every command prints it as one line and exits with status 2
    (``chexpercept.cli.main``, ``eval/run.py``), never as a traceback."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: which case, which field or file, what.

    The fields may quote the bundle's own text (a key_id with control characters or a newline is
    exactly what a problem line reports), so ``str`` shows each through ``chexpercept.escape.terminal``:
    a problem is one line, and writes nothing to a terminal but what it shows."""

    key_id: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{terminal(self.key_id)}: {terminal(self.where)}: {terminal(self.message)}"


def no_such_path(path: str | os.PathLike[str], what: str = "folder") -> str:
    """ "PATH: no such folder", with the nearest names beside it when the parent exists (a typo), or
    the first missing folder on the way; for error messages about a path the user typed."""
    p = FsPath(os.path.expanduser(str(path)))
    message = f"{path}: no such {what}"
    parent = p.absolute().parent
    if parent.is_dir():
        try:
            names = [e.name for e in os.scandir(parent) if not e.name.startswith(".")]
        except OSError:
            names = []
        close = difflib.get_close_matches(p.name, names, n=3, cutoff=0.6)
        if close:
            typed = os.path.dirname(str(path).rstrip("/"))
            shown = " or ".join(os.path.join(typed, c) for c in close)
            message += f" (did you mean {shown}?)"
        return message
    missing = parent
    while not missing.parent.is_dir() and missing.parent != missing:
        missing = missing.parent
    return f"{message}: {missing} does not exist either"


class ContainmentError(ValueError):
    """A path or name would leave its tree, or a file is not an allowed image or not a regular file of
    bounded size; the message says which and why (``chexpercept.containment``, ``chexpercept.input_files``)."""


class ReleaseNotFoundError(FileNotFoundError):
    """data_dir is missing, empty, or not a CheXpercept release.

    The access instructions (PhysioNet credentialing) follow the reason only where they help: a
    folder that exists but holds no release. A folder that does not exist is most likely a typo,
    so its message is the path and the nearest names (``instructions=False``).
    """

    def __init__(self, data_dir: object, reason: str, *, instructions: bool = True):
        self.data_dir = data_dir
        self.reason = reason
        super().__init__(f"{reason}\n\n{ACCESS_INSTRUCTIONS}" if instructions else reason)


class BundleValidationError(ValueError):
    """A release bundle failed validation; every problem found is listed, not just the first."""

    MAX_SHOWN = 50

    def __init__(self, bundle_dir: object, problems: list[Problem]):
        self.bundle_dir = bundle_dir
        self.problems = list(problems)
        shown = "\n".join(f"  - {p}" for p in self.problems[: self.MAX_SHOWN])
        more = len(self.problems) - self.MAX_SHOWN
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(
            f"{len(self.problems)} problem(s) in the CheXpercept bundle at {terminal(bundle_dir)}:\n{shown}{tail}"
        )
