"""The benchmark dataset repo (``chexpercept benchmark-card``): metadata only, the data stays on PhysioNet.

Two files:

- ``README.md``: the toolkit's ``dataset_card.md`` (how the release is laid out, how to load it with
  ``load_dataset``, the data-use obligations), with the front matter reduced to what describes a
  repo without data (no ``configs``/``dataset_info``: there are no data files; no gating: there is
  nothing to gate), a note that the repo holds no data, the steps to credentialed access, and the
  task ids with how a model's scores get here;
- ``eval.yaml``: the Hub's benchmark registration (Hub docs "Evaluation Results", "Eval.yaml
  specification"): ``name``, ``description``, ``evaluation_framework`` and ``tasks`` (one per task id
  of ``eval_results.HUB_TASKS``; ``id`` only, since ``config`` and ``split`` would name data this repo
  does not hold). The first task, ``end_to_end``, is the benchmark's headline leaderboard.

Both are checked by the upload guard: the card must be exactly what is rendered here, eval.yaml
must fit its schema.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path as FsPath
from typing import Any

from chexpercept.escape import shell_word
from chexpercept.input_files import TEXT_FILE, read_input_text

from . import DEFAULT_FRAMEWORK
from .eval_results import HUB_TASKS, TASK_IDS
from .guard import Context, ExactSchema, ListOf, Manifest, Obj, Text, YamlSchema, yaml_text
from .identifiers import Identifiers
from .names import check_framework, check_repo_id

BENCHMARK_NAME = "CheXpercept"
DESCRIPTION = (
    "CheXpercept tests whether vision-language models perceive chest X-ray lesions the way a radiologist "
    "does, in one multi-turn conversation per case: detect the lesion (Stage 1), judge a predicted contour "
    "(Stage 2), revise it (Stage 3) and extract its attributes (Stage 4). 2,100 cases over 7 lesions and "
    "3 paths. Scores are End-to-End (a case fails every stage after its first failure) and Oracle-Passed "
    "(wrong answers replaced by the ground truth before the next turn). The data is PhysioNet-credentialed "
    "(MIMIC-CXR-JPG) and is not hosted here."
)
#: front-matter keys that describe data files or gate them: left out of a repo that holds no data
DATA_KEYS = ("configs", "dataset_info", "gated")
NO_DATA_NOTE = (
    "> **This repository holds no data.** It describes the benchmark and carries `eval.yaml`, so that the "
    "Hub lists CheXpercept as a benchmark and gathers the scores model repositories publish. The release "
    "(images, questions, answers) is credentialed data on PhysioNet; see *Getting the data* below."
)


def toolkit_card() -> FsPath:
    """The toolkit's ``dataset_card.md`` (beside ``chexpercept_dataset.py``); FileNotFoundError when
    this installation does not have it (a wheel ships the code only)."""
    spec = importlib.util.find_spec("chexpercept_dataset")
    path = FsPath(spec.origin).with_name("dataset_card.md") if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "dataset_card.md was not found beside chexpercept_dataset.py: run benchmark-card from a "
            "checkout of the toolkit (pip install -e .)"
        )
    return path


def _split_front_matter(text: str, source: str) -> tuple[dict[str, Any], str]:
    import yaml

    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise ValueError(f"{source}: no YAML front matter")
    head, body = text[4:].split("\n---\n", 1)
    meta = yaml.safe_load(head)
    if not isinstance(meta, dict):
        raise ValueError(f"{source}: the front matter is not a mapping")
    return meta, body


def _tasks_table() -> list[str]:
    return [
        "| task id | what it measures |",
        "| --- | --- |",
        *(f"| `{t.id}` | {t.description} |" for t in HUB_TASKS),
    ]


def render_card(card_text: str, repo: str, *, source: str = "dataset_card.md") -> str:
    """The benchmark repo's README.md from the text of ``dataset_card.md`` (see the module docstring)."""
    meta, body = _split_front_matter(card_text, source)
    kept = {k: v for k, v in meta.items() if k not in DATA_KEYS and not k.startswith("extra_gated")}
    lines = body.lstrip("\n").split("\n")
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if title is None:
        raise ValueError(f"{source}: no '# ' title line")
    lines[title + 1 : title + 1] = ["", NO_DATA_NOTE]
    extra = [
        "",
        "## Getting the data",
        "",
        "1. Become a credentialed PhysioNet user (https://physionet.org/settings/credentialing/) and complete "
        'the CITI "Data or Specimens Only Research" training.',
        "2. Sign the data use agreements of MIMIC-CXR-JPG, MIMIC-ILS and CheXpercept on their PhysioNet "
        "project pages.",
        "3. Download the CheXpercept release from PhysioNet: `chexpercept.json` and `chexpercept/<key_id>/...`.",
        "4. Install the CheXpercept toolkit and load the folder with `load_dataset` (see *Dataset structure* "
        "above); `chexpercept validate DIR` checks it first.",
        "",
        "## Scores on the Hub",
        "",
        "`eval.yaml` defines one leaderboard per task (the first, `end_to_end`, is the headline):",
        "",
        *_tasks_table(),
        "",
        "A model's scores live in its own repository as `.eval_results/*.yaml` files, one per variant (oracle "
        "setting, answer parsing, thinking on or off), proposed as a pull request by "
        f"`chexpercept push-results RUNS_DIR --model-repo ORG/MODEL --benchmark {shell_word(repo)}`. "
        f"`chexpercept leaderboard {shell_word(repo)}` reads the leaderboard back.",
        "",
    ]
    text = "---\n" + yaml_text(kept) + "---\n\n" + "\n".join(lines).rstrip("\n") + "\n" + "\n".join(extra)
    return text


def eval_yaml(framework: str = DEFAULT_FRAMEWORK) -> dict[str, Any]:
    """The ``eval.yaml`` data: name, description, evaluation_framework, one task per task id."""
    return {
        "name": BENCHMARK_NAME,
        "description": DESCRIPTION,
        "evaluation_framework": framework,
        "tasks": [{"id": task_id} for task_id in TASK_IDS],
    }


def eval_yaml_schema(framework: str) -> YamlSchema:
    task = Obj({"id": Text(choices=TASK_IDS)}, required=("id",), nullable=False)
    return YamlSchema(
        spec=Obj(
            {
                "name": Text(choices=(BENCHMARK_NAME,)),
                "description": Text(choices=(DESCRIPTION,)),
                "evaluation_framework": Text(choices=(framework,)),
                "tasks": ListOf(task, nullable=False),
            },
            required=("name", "description", "evaluation_framework", "tasks"),
            nullable=False,
        )
    )


def stage_benchmark_card(
    staging: str | os.PathLike[str],
    *,
    repo: str,
    framework: str = DEFAULT_FRAMEWORK,
    identifiers: Identifiers | None = None,
) -> Manifest:
    """Write README.md and eval.yaml for the benchmark repo ``repo`` into ``staging`` (new or empty).

    identifiers: a bundle's identifiers to check the files against (the card is the toolkit's own text,
    so none are needed; given, they are checked all the same). Raises FileNotFoundError without the
    toolkit's dataset_card.md, ValueError when it has no front matter or title."""
    check_repo_id(repo, "--repo")
    check_framework(framework)
    path = toolkit_card()
    card = render_card(read_input_text(path, TEXT_FILE, what="dataset card"), repo, source=str(path))
    manifest = Manifest(staging, Context(identifiers or Identifiers()))
    manifest.write("README.md", card, ExactSchema(text=card))
    manifest.write("eval.yaml", yaml_text(eval_yaml(framework)), eval_yaml_schema(framework))
    return manifest
