"""Errors that name the case and the file or field, and the access instructions for the release."""

from __future__ import annotations

from dataclasses import dataclass

ACCESS_INSTRUCTIONS = """\
CheXpercept is credentialed data derived from MIMIC-CXR-JPG and MIMIC-ILS. To get it:
  1. Become a credentialed PhysioNet user (https://physionet.org/settings/credentialing/).
  2. Complete the CITI 'Data or Specimens Only Research' training and upload the certificate.
  3. Sign the data use agreements of MIMIC-CXR-JPG, MIMIC-ILS and CheXpercept on PhysioNet.
  4. Download the CheXpercept release and pass its folder as data_dir.
The folder must contain chexpercept.json (one object keyed by key_id) and chexpercept/<key_id>/...
images (detection_qa/xray.png, contour_qa/...). Without credentials, `chexpercept synth --output-dir DIR`
writes a phantom bundle in the same format for testing software (never for comparing models)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: which case, which field or file, what."""

    key_id: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.key_id}: {self.where}: {self.message}"


class ReleaseNotFoundError(FileNotFoundError):
    """data_dir is missing, empty, or not a CheXpercept release."""

    def __init__(self, data_dir: object, reason: str):
        self.data_dir = data_dir
        self.reason = reason
        super().__init__(f"{reason}\n\n{ACCESS_INSTRUCTIONS}")


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
            f"{len(self.problems)} problem(s) in the CheXpercept bundle at {bundle_dir}:\n{shown}{tail}"
        )
