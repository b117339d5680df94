"""A case's conversation as it stands after the answers a harness has collected so far.

lmms-eval hands a task the answers of the earlier rounds (``previous_output``) and asks for the next
round's messages, and hands its scorer each case's answers at the end. Both replay the answers
through our ``Conversation`` (routes, history, oracle settings, parsing), so the harness sends what
our runner sends and records what our runner records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

from chexpercept.answers import ParseMode
from chexpercept.bundle import check_release_dir, read_bundle
from chexpercept.case import Case

from ...conversation import Conversation


def open_release(folder: str | os.PathLike[str]) -> tuple[str, dict[str, Case]]:
    """(the release's resolved folder, its cases by key_id), read and validated once per process.
    Raises ReleaseNotFoundError for a folder that is not a release, BundleValidationError (naming
    the case and the file) for a damaged one."""
    root = str(check_release_dir(folder))
    return root, _cases(root)


@lru_cache(maxsize=4)
def _cases(root: str) -> dict[str, Case]:
    return {case.key_id: case for case in read_bundle(root).cases}


def replay(
    case: Case,
    answers: Sequence[str],
    *,
    release: str,
    oracle: str,
    parse_mode: ParseMode,
    model: str,
) -> Conversation:
    """``case``'s conversation after ``answers`` (one per round, in order). Raises ValueError naming
    the case when there are more answers than the case has turns."""
    conversation = Conversation(case, oracle=oracle, parse_mode=parse_mode, model=model, root=release)
    for n, answer in enumerate(answers):
        if conversation.done:
            raise ValueError(
                f"case {case.key_id} (route {case.path.value}) has {len(case.turns)} turns, "
                f"but {len(answers)} answers were given (answer {n + 1} has no question)"
            )
        conversation.answer(answer)
    return conversation
