"""CheXpercept metric for Hugging Face evaluate: stage accuracy, depth, sub-tasks, bias, intervals.

A thin wrapper over chexpercept.metrics (installed with the chexpercept package). Load it with
``evaluate.load("chexpercept_metric")`` after the one-time ``chexpercept install-metric``, or from
its folder: ``evaluate.load(str(chexpercept.metrics.METRIC_PATH))``.
"""

import datasets
import evaluate

from chexpercept.metrics.evaluate_support import compute_metric

_CITATION = """\
@article{chexpercept2026,
  title={CheXpercept: A Benchmark for Evaluating Expert-Level Lesion Perception in Chest X-rays},
  journal={arXiv preprint arXiv:2606.21020},
  year={2026}
}
"""

_DESCRIPTION = """\
Scores multi-turn CheXpercept conversations the way the paper does: Stage 1-4 accuracy End-to-End
(a case fails every stage after its first failed one) and Oracle-Passed (each stage on its own),
depth (stages passed before the first error; cardiomegaly +1), sub-task accuracy, Stage 2 and
Stage 3 answer bias, parse-failure rates, and design-based intervals (cases the unit, lesion x path
cells the strata). Raw responses are
parsed like the reference implementation (mode="reference") or strictly (mode="strict").
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: per case, the model's raw responses, one string per turn, in turn order.
    references: per case a dict: key_id, lesion, path (names, or the dataset's ClassLabel ids) and
        turns, a list of {"task", "options", "answer_index"} in turn order (the dataset's turns
        work as they are; chexpercept.metrics.references_from_dataset(ds) builds them).
    mode: "reference" (default; the reference's parser, reproduces the paper) or "strict".
    oracle: how the conversations were run: "none" (default), "implicit" or "explicit".
        Oracle-Passed numbers need an oracle run and are None after "none".
    greedy: whether decoding was greedy (default True). End-to-End numbers from an oracle run are
        exact only then; otherwise they are None (score a run with oracle="none").
    model: the model's name (only GLM models get their answer box unwrapped in reference mode).
    return_details: also return the nested tables, intervals, sources, notes and parse rates.
    n_resamples, level: 0 leaves the details' intervals out; level is theirs (default 0.95). The
        intervals are design-based, nothing is resampled: other n_resamples values and seed do nothing.
    return_cases: with return_details, add every case's parsed answers and verdicts.
Returns:
    A flat dict: e2e/stage<k>/<P> (k 1-4), op/stage<k>/<P> (k 2-4) with P in RR, RF, LF, all;
    depth/<P> for RR, RF, LF; sub/<task> for expansion, contraction, revision_result,
    distribution, location, severity, comparison. Values are fractions (depth in stages), None
    where the cell does not apply. With return_details=True: {"flat": ..., "tables": ...,
    "intervals": ..., "sources": ..., "notes": ..., "parse": ..., "counts": ...}.
Examples:
    >>> import evaluate
    >>> from chexpercept.metrics import METRIC_PATH
    >>> metric = evaluate.load(str(METRIC_PATH))
    >>> references = [
    ...     {"key_id": "effusion_s1_negative_0", "lesion": "effusion", "path": "LF",
    ...      "turns": [{"task": "detection", "options": ["Yes", "No"], "answer_index": [2]}]},
    ...     {"key_id": "cardiomegaly_s2_positive_0", "lesion": "cardiomegaly", "path": "RF",
    ...      "turns": [{"task": "detection", "options": ["Yes", "No"], "answer_index": [1]},
    ...                {"task": "contour_eval", "options": ["Yes", "No"], "answer_index": [2]}]},
    ... ]
    >>> predictions = [["Answer: 2"], ["<think>A large heart.</think>Answer: 1", "Answer: 1"]]
    >>> results = metric.compute(predictions=predictions, references=references)
    >>> results["e2e/stage1/all"], results["e2e/stage2/RF"], results["depth/RF"], results["e2e/stage2/LF"]
    (1.0, 0.0, 1.0, None)
    >>> results["op/stage2/all"] is None  # oracle="none": Oracle-Passed does not apply
    True

    With an implicit-oracle run, details and intervals:

    >>> details = metric.compute(predictions=predictions, references=references, oracle="implicit",
    ...                          return_details=True)
    >>> details["flat"]["op/stage2/RF"], details["tables"]["table10"]["RF"]["yes"]
    (0.0, 1.0)
    >>> details["sources"]["e2e"]["description"]
    'oracle implicit run with greedy decoding (exact: histories are identical up to the first error)'
    >>> [round(x, 3) for x in details["intervals"]["values"]["e2e/stage1/all"]]  # 2 of 2: not [1, 1]
    [0.158, 1.0]
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ChexperceptMetric(evaluate.Metric):
    """The CheXpercept metric (see chexpercept.metrics for the library underneath)."""

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.List(datasets.Value("string")),
                    "references": datasets.Json(),
                }
            ),
            reference_urls=["https://arxiv.org/abs/2606.21020"],
        )

    def _compute(
        self,
        predictions,
        references,
        mode="reference",
        oracle="none",
        greedy=True,
        model="",
        return_details=False,
        n_resamples=1000,
        seed=0,
        level=0.95,
        return_cases=False,
    ):
        return compute_metric(
            predictions,
            references,
            mode=mode,
            oracle=oracle,
            greedy=greedy,
            model=model,
            return_details=return_details,
            n_resamples=n_resamples,
            seed=seed,
            level=level,
            return_cases=return_cases,
        )
