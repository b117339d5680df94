"""``chexpercept inspect DATA_DIR`` (or ``--data-dir DATA_DIR``): load a bundle through ``load_dataset`` and print its composition."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from .cli_options import add_data_dir_option, data_dir_of
from .vocab import LESIONS, PATHS


def composition_table(rows: Any) -> str:
    """Markdown table of cases and questions per lesion and path (paper Table 4 layout)."""
    lesion_names = rows.features["lesion"].names
    path_names = rows.features["path"].names
    cases: Counter[tuple[str, str]] = Counter()
    questions: Counter[tuple[str, str]] = Counter()
    for lesion_id, path_id, turns in zip(rows["lesion"], rows["path"], rows["turns"]):
        cell = (lesion_names[lesion_id], path_names[path_id])
        cases[cell] += 1
        questions[cell] += len(turns)
    paths = [p.value for p in PATHS]
    header = (
        "| Lesion | "
        + " | ".join(f"{p} cases" for p in paths)
        + " | CXRs | "
        + " | ".join(f"{p} questions" for p in paths)
        + " | Questions |"
    )
    lines = [header, "|" + "---|" * (2 * len(paths) + 3)]
    for lesion in LESIONS:
        c = [cases[(lesion, p)] for p in paths]
        q = [questions[(lesion, p)] for p in paths]
        lines.append(
            f"| {lesion} | "
            + " | ".join(map(str, c))
            + f" | {sum(c)} | "
            + " | ".join(map(str, q))
            + f" | {sum(q)} |"
        )
    c = [sum(cases[(lesion, p)] for lesion in LESIONS) for p in paths]
    q = [sum(questions[(lesion, p)] for lesion in LESIONS) for p in paths]
    lines.append(
        "| **total** | "
        + " | ".join(map(str, c))
        + f" | {sum(c)} | "
        + " | ".join(map(str, q))
        + f" | {sum(q)} |"
    )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    add_data_dir_option(parser, positional=True)
    parser.add_argument(
        "--num-proc", type=int, default=None, help="worker processes for building the dataset"
    )


def run(args: argparse.Namespace) -> int:
    import datasets

    import chexpercept  # noqa: F401  (registers the builder)

    data_dir = data_dir_of(args, "chexpercept inspect")
    if not data_dir:
        return 2
    ds = datasets.load_dataset("chexpercept", data_dir=data_dir, num_proc=args.num_proc)["train"]
    items = datasets.load_dataset("chexpercept", "items", data_dir=data_dir, num_proc=args.num_proc)["train"]
    print(
        f"load_dataset('chexpercept', data_dir={data_dir!r}): {ds.num_rows} cases (sequences), "
        f"{items.num_rows} questions (items)"
    )
    print(composition_table(ds))
    return 0
