"""The Inspect task ``chexpercept/chexpercept``: one sample per case (its id the key_id), driven by
our conversation solver and scored by our scorer (docs/inspect.md).

    inspect eval chexpercept/chexpercept -T data_dir=DIR -T oracle=implicit --no-log-images \\
        --model openai/<model> --model-base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig

from chexpercept.answers import PARSE_MODES
from chexpercept.case import Case
from chexpercept.eval.registry import OPEN_SAMPLING
from chexpercept.results import check_oracle

from .release import load_release, selection
from .scorer import turns_scorer
from .solver import conversation_solver


def sample(case: Case) -> Sample:
    """The sample of one case: its first question as the input, every turn's gold option(s) as the
    target, its lesion, route and turns as metadata (the solver asks the questions itself)."""
    first = case.turns[0]
    return Sample(
        id=case.key_id,
        input=first.text,
        target="; ".join(f"{t.task}: {','.join(map(str, t.answer_index))}" for t in case.turns),
        metadata={
            "lesion": case.lesion,
            "route": case.path.value,
            "turns": [t.task for t in case.turns],
            "images": sum(len(t.images) for t in case.turns),
        },
    )


def _task_name() -> str:
    """``chexpercept``, which Inspect namespaces as ``chexpercept/chexpercept`` by the installed
    package the task comes from. It reads that from the package's metadata, and a
    ``chexpercept.egg-info`` ahead of the installed one on ``sys.path`` (the source folder of an
    editable install, when Python runs there) hides it: then the name is given in full, so that
    ``chexpercept/chexpercept`` names the task wherever Python runs."""
    try:
        from inspect_ai._util.package import get_installed_package_name
    except ImportError:  # a later Inspect: its own namespacing
        return "chexpercept"
    return "chexpercept" if get_installed_package_name(sample) else "chexpercept/chexpercept"


@task(name=_task_name())
def chexpercept(
    data_dir: str | None = None,
    oracle: str = "implicit",
    parse_mode: str = "reference",
    lesions: str | list[str] | None = None,
    paths: str | list[str] | None = None,
    dua_compliant: bool = False,
) -> Task:
    """CheXpercept: each case one multi-turn conversation, exactly as ``chexpercept run`` holds it.

    Args:
        data_dir: folder of the release (chexpercept.json and chexpercept/).
        oracle: none, implicit (the paper's Oracle-Passed runs; under greedy decoding also the
            End-to-End numbers) or explicit.
        parse_mode: reference (the paper's numbers) or strict.
        lesions: only these lesions (comma-separated).
        paths: only these routes (RR, RF, LF; comma-separated).
        dua_compliant: the model's endpoint is covered by the PhysioNet data use agreement (zero
            data retention); without it only this machine's loopback endpoints and in-process
            models receive the images, and --batch is refused.
    """
    oracle = check_oracle(oracle, "-T oracle")
    if parse_mode not in PARSE_MODES:
        raise ValueError(f"-T parse_mode: expected one of {', '.join(PARSE_MODES)}, got {parse_mode!r}")
    release = load_release(data_dir, selection(lesions), selection(paths))
    return Task(
        dataset=MemoryDataset([sample(c) for c in release.cases.values()], name="chexpercept"),
        solver=conversation_solver(
            data_dir=str(data_dir),
            oracle=oracle,
            parse_mode=parse_mode,
            lesions=lesions,
            paths=paths,
            dua_compliant=bool(dua_compliant),
        ),
        scorer=turns_scorer(),
        # our runner's decoding for a model outside its registry (greedy); --temperature etc. win
        config=GenerateConfig(**OPEN_SAMPLING),
        metadata={"oracle": oracle, "parse_mode": parse_mode},
    )
