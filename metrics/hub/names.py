"""The names an upload may carry: no free text, ever.

Everything a stager writes for the Hub is a number, a fixed word, a strict format (a fingerprint, a
date, a version) or a *name* from this module. A name is one of

1. **the vocabulary**: the model registry's entries (``chexpercept.eval.registry.REGISTRY``: each
   model's registry name, display name, model id and reference alias), the baselines
   (``baseline:random``, ``baseline:prior``, ``baseline:oracle``, ``baseline:constant:<k>`` and their
   folder names ``baseline-random`` ...), and the marker of a removed local path;
2. **a label the user typed** on the push command line (``push-results --name FOLDER=LABEL``) for a
   model outside the registry: a letter, then letters, digits, ``.`` and ``-`` (never two in a row,
   never at the end), at most ``MAX_LABEL`` characters (``LABEL_RULE``). The shortest key_id of the
   benchmark is longer (``edema_s<8 digits>_negative_0``, 26 characters) and ``_`` is not allowed, so
   no key_id fits in a label in any spelling or encoding of it; the guard's identifier search
   (``identifiers``) still reads every label for the shorter study, subject and dicom ids.

A model's name is never taken from its run folder (run.json's ``model``, ``display_name`` or
``model_id``, the folder's name): a run made with ``--model <anything>`` is published under its
registry or baseline name, or under the label given for it, or not at all (``published_model``
refuses it, saying how to name it).

Hub repo ids (``--repo``, ``--model-repo``, ``--benchmark``: where the files go, or the benchmark they
are for) follow the Hub's own rule (``REPO_ID_RULE``) and the shape rule (``SHAPE_RULE``: no word
longer than a label, no run of six digits), and ``--source-url`` must be the Hub page of one of them
(``check_source_url``); ``benchmark-card --evaluation-framework`` is a short slug of the same shape.
Numbers have their own declared ranges (``numbers.RANGES``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from chexpercept.errors import Refused
from chexpercept.escape import shell_word, terminal

#: the marker ``push_results.scrub`` puts where a run.json held a local path
LOCAL = "<local path removed>"
MAX_LABEL = 24
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[.-][A-Za-z0-9]+)*")
LABEL_RULE = (
    f"a letter, then letters, digits, '.' and '-' (not two in a row, not at the end), at most {MAX_LABEL} "
    "characters, e.g. tiny-gemma3 or qwen2.5-vl-7b"
)
MAX_REPO_PART = 96
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
REPO_ID_RULE = (
    f"ORG/NAME, each part letters, digits, '.', '_' and '-' (starting and ending with a letter or digit, no "
    f"'--' or '..'), at most {MAX_REPO_PART} characters"
)
_FRAMEWORK = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
#: the longest word (between '.', '-', '_', '/') of a repo id or framework: a key_id (26 characters),
#: a dicom id and any base32/base64 blob of one are longer
MAX_WORD = 24
#: the longest run of digits (separators ignored): MIMIC study and subject ids have 8
MAX_DIGITS = 5
_WORD = re.compile(r"[^./_-]+")
_DIGITS = re.compile(r"\d+")
SHAPE_RULE = (
    f"no word longer than {MAX_WORD} characters between '.', '-', '_' and '/', and no more than "
    f"{MAX_DIGITS} digits in a row (separators ignored): the shapes of case identifiers and their encodings"
)
DEFAULT_HUB = "https://huggingface.co"


class NameRefused(Refused, ValueError):
    """A string that would be published is not a name an upload may carry; the message says which,
    why, and how to name it instead."""


@dataclass(frozen=True)
class PublishedModel:
    """How one model folder is published: ``slug`` (its folder under ``models/``), ``name`` (its row
    in the tables), ``model_id`` (the registry's or baseline's id; None for a labelled model)."""

    slug: str
    name: str
    model_id: str | None

    @property
    def strings(self) -> frozenset[str]:
        """Every string of it that may appear in a staged file."""
        return frozenset(s for s in (self.slug, self.name, self.model_id) if s)


@cache
def vocabulary() -> frozenset[str]:
    """Every name of the registry and the baselines (see the module docstring), and LOCAL."""
    from chexpercept.eval.backends.baselines import BASELINE_PREFIX, KINDS
    from chexpercept.eval.registry import REGISTRY

    out = {LOCAL}
    for spec in REGISTRY.values():
        out.update(s for s in (spec.name, spec.model_id, spec.display, spec.reference_alias) if s)
    for kind in KINDS:
        kinds = [f"{kind}:{k}" for k in range(1, 21)] if kind == "constant" else [kind]
        for k in kinds:
            out.update({BASELINE_PREFIX + k, (BASELINE_PREFIX + k).replace(":", "-")})
    return frozenset(out)


def label_problem(value: object) -> str | None:
    """Why ``value`` cannot be a user's label for a model (``LABEL_RULE``), or None."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if len(value) > MAX_LABEL or not _LABEL.fullmatch(value):
        return f"is not a label: {LABEL_RULE}"
    return None


def name_problem(value: object) -> str | None:
    """Why ``value`` may not be published as a name (neither in the vocabulary nor a label), or None."""
    if isinstance(value, str) and value in vocabulary():
        return None
    problem = label_problem(value)
    return None if problem is None else f"is not in the model registry nor a baseline, and {problem}"


def check_names(values: Iterable[str]) -> frozenset[str]:
    """``values`` when every one may be published as a name; NameRefused listing the others."""
    values = frozenset(values)
    bad = sorted(v for v in values if name_problem(v))
    if bad:
        raise NameRefused(
            "refusing to publish free text as names: " + "; ".join(f"{v!r} {name_problem(v)}" for v in bad)
        )
    return values


def check_label(value: str, what: str = "--name LABEL") -> str:
    """``value`` when it is a label (``LABEL_RULE``); NameRefused naming ``what`` otherwise."""
    problem = label_problem(value)
    if problem:
        raise NameRefused(f"{what}: {value!r} {problem}")
    return value


def shape_problem(value: str) -> str | None:
    """Why ``value``, a string typed by the user that is published as it is (a repo id, a framework's
    slug), could carry a case identifier (``SHAPE_RULE``), or None. Checked whether or not a bundle
    is at hand (``benchmark-card`` without ``--data-dir``); with one, the guard also searches the
    bundle's own identifiers in every string (``identifiers.Identifiers``)."""
    long_word = next((w for w in _WORD.findall(value) if len(w) > MAX_WORD), None)
    if long_word is not None:
        return f"has a word of {len(long_word)} characters; the rule: {SHAPE_RULE}"
    digits = max((len(d) for d in _DIGITS.findall(re.sub(r"[^0-9A-Za-z]", "", value))), default=0)
    if digits > MAX_DIGITS:
        return f"has {digits} digits in a row; the rule: {SHAPE_RULE}"
    return None


def check_repo_id(value: str, what: str) -> str:
    """``value`` when it is a Hub repo id (``REPO_ID_RULE``) of the shape that carries no case
    identifier (``shape_problem``); NameRefused naming ``what`` otherwise."""
    parts = value.split("/") if isinstance(value, str) else []
    ok = (
        len(parts) == 2
        and all(0 < len(p) <= MAX_REPO_PART and _REPO_PART.fullmatch(p) for p in parts)
        and "--" not in value
        and ".." not in value
    )
    if not ok:
        raise NameRefused(f"{what} must be {REPO_ID_RULE}; got {terminal(repr(value))}")
    problem = shape_problem(value)
    if problem:
        raise NameRefused(f"{what} {value!r} {problem}")
    return value


def hub_pages(repo_ids: Iterable[str], endpoint: str | None) -> frozenset[str]:
    """The Hub pages of ``repo_ids`` (model, dataset and space pages) on ``endpoint`` and on the Hub."""
    bases = {DEFAULT_HUB, (endpoint or DEFAULT_HUB).rstrip("/")}
    return frozenset(
        f"{base}/{kind}{repo}" for base in bases for repo in repo_ids for kind in ("", "datasets/", "spaces/")
    )


def check_source_url(url: str, repo_ids: Iterable[str], endpoint: str | None) -> str:
    """``url`` when it is the Hub page of one of ``repo_ids`` (the push's own repos); NameRefused."""
    pages = hub_pages(repo_ids, endpoint)
    if url not in pages:
        raise NameRefused(
            f"--source-url {url!r} is not the Hub page of the benchmark or the model repo (one of "
            f"{', '.join(sorted(pages))}): a link is published as it is, so only these are allowed"
        )
    return url


def check_framework(value: str) -> str:
    """``value`` when it is an evaluation framework's slug (lower-case letters, digits, '-'; at most
    32 characters); NameRefused otherwise."""
    if not isinstance(value, str) or not _FRAMEWORK.fullmatch(value):
        raise NameRefused(
            f"--evaluation-framework must be a framework's slug (lower-case letters, digits and '-', at "
            f"most 32 characters), got {terminal(repr(value))}"
        )
    problem = shape_problem(value)
    if problem:
        raise NameRefused(f"--evaluation-framework {value!r} {problem}")
    return value


def published_model(folder: str, metas: Mapping[str, Mapping[str, Any]], label: str | None) -> PublishedModel:
    """How the runs of model folder ``folder`` (oracle setting -> its run.json, as read) are published:
    under ``label`` when given (``check_label``), else under the registry entry or baseline every run
    names. NameRefused, saying how to name it, when the runs are of another model."""
    from chexpercept.eval.backends.baselines import is_baseline
    from chexpercept.eval.registry import folder_name, lookup

    ids = {str(m.get("model_id") or "") for m in metas.values()}
    models = {str(m.get("model") or "") for m in metas.values()}
    if label is not None:
        check_label(label, f"--name {shell_word(folder)}=LABEL")
        specs = [lookup(x) for x in sorted(models | ids)]
        same = next((s.model_id for s in specs if s is not None and {s.model_id} == ids), None)
        return PublishedModel(label, label, same)
    if len(ids) == 1 and is_baseline(next(iter(ids))) and next(iter(ids)) in vocabulary():
        model_id = next(iter(ids))
        return PublishedModel(folder_name(model_id), folder_name(model_id), model_id)
    specs = [lookup(m) for m in sorted(models)]
    if specs and specs[0] is not None and all(s is not None and s.name == specs[0].name for s in specs):
        spec = specs[0]
        return PublishedModel(
            spec.name, spec.display or spec.name, spec.model_id if ids == {spec.model_id} else None
        )
    shown = ", ".join(sorted(repr(m) for m in models | ids if m))
    raise NameRefused(
        f"models/{terminal(folder)}: the runs are of {shown}, which is not a model of the registry nor a baseline; "
        f"only those names, or one you give, are published (a name taken from a run could carry anything). Name "
        f"it with --name {shell_word(folder)}=LABEL, LABEL being {LABEL_RULE}; or run a registry model by its name "
        "(chexpercept run --list-models)"
    )
