"""``chexpercept inspect DATA_DIR`` (or ``--data-dir DATA_DIR``): what ``load_dataset`` gives for a
bundle, cases and questions per lesion and path, in a second.

The counts come from the bundle reader that the datasets builder runs (chexpercept.json streamed
and validated entry by entry, every image a question needs checked to exist), so they are the rows of
``load_dataset("chexpercept", data_dir=DIR)`` (config ``sequences``: one per case; ``items``: one per
question) without building the arrow cache or decoding any image. ``chexpercept validate DIR``
checks the images' contents too.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable

from .cli_options import add_data_dir_option, data_dir_of
from .domains import PROCESSES
from .vocab import LESIONS, PATHS


def composition_table(cells: Iterable[tuple[str, str, int]]) -> str:
    """Markdown table of cases and questions per lesion and path (paper Table 4 layout).

    cells: one (lesion, path, number of questions) per case, e.g. from ``read_bundle(DIR).cases``.
    """
    cases: Counter[tuple[str, str]] = Counter()
    questions: Counter[tuple[str, str]] = Counter()
    for lesion, path, n_questions in cells:
        cases[(lesion, path)] += 1
        questions[(lesion, path)] += n_questions
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
    # inspect no longer builds the dataset; the option is accepted so that old scripts keep working
    parser.add_argument("--num-proc", type=PROCESSES, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .bundle import read_bundle
    from .errors import BundleValidationError, ReleaseNotFoundError
    from .escape import shell_word, terminal, terminal_lines

    data_dir = data_dir_of(args, "chexpercept inspect")
    if not data_dir:
        return 2
    try:
        bundle = read_bundle(data_dir, check_images="exists")
    except (ReleaseNotFoundError, BundleValidationError) as e:
        print(f"chexpercept inspect: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    questions = sum(len(c.turns) for c in bundle.cases)
    kind = "phantom bundle (synthetic: for testing software only)" if bundle.synthetic else "bundle"
    print(
        f"{kind} {terminal(bundle.root)}: load_dataset('chexpercept', data_dir={terminal(repr(data_dir))}) gives "
        f"{len(bundle.cases)} cases (config sequences), {questions} questions (config items)"
    )
    print(composition_table((c.lesion, c.path.value, len(c.turns)) for c in bundle.cases))
    print(
        f"every image a question needs exists; `chexpercept validate {shell_word(data_dir)}` checks their contents"
    )
    return 0
