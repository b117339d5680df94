"""The evaluate module: loading by path and by bare name, offline; inputs; docstring examples."""

import doctest
import importlib.util
import random

import evaluate
import pytest

import chexpercept.metrics as metrics_pkg
from chexpercept.bundle import read_bundle
from chexpercept.metrics import (
    METRIC_PATH,
    install_metric,
    references_from_cases,
    references_from_dataset,
    run_from_records,
    score_model,
)
from chexpercept.metrics.simulate import simulate_records
from chexpercept.vocab import LESIONS, PATHS


@pytest.fixture(scope="module")
def bundle(fixture_bundle):
    return read_bundle(fixture_bundle, check_images="none")


@pytest.fixture(scope="module")
def answered(bundle):
    rnd = random.Random(4)
    records = simulate_records(bundle.cases, lambda c, t: rnd.random() < 0.6, oracle="none")
    predictions = [[t.response for t in r.turns] for r in records]
    return records, predictions


def test_module_docstring_examples_run_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location(
        "chexpercept_metric_doc", METRIC_PATH / "chexpercept_metric.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module, raise_on_error=False)
    assert result.attempted >= 8 and result.failed == 0


def test_library_docstring_examples():
    result = doctest.testmod(metrics_pkg, raise_on_error=False)
    assert result.attempted >= 4 and result.failed == 0


def test_bare_name_after_install_matches_the_library(tmp_path, monkeypatch, bundle, answered):
    records, predictions = answered
    installed = install_metric()  # into the tests' HF_HOME (offline)
    assert (
        installed.name == "chexpercept_metric.py"
        and installed.read_bytes() == (METRIC_PATH / "chexpercept_metric.py").read_bytes()
    )
    monkeypatch.chdir(tmp_path)  # nothing named chexpercept_metric here
    metric = evaluate.load("chexpercept_metric")
    flat = metric.compute(predictions=predictions, references=references_from_cases(bundle.cases))
    expected = score_model([run_from_records(records, oracle="none")]).flat
    assert flat == expected


def test_add_batch_strict_mode_and_details(bundle, answered):
    _, predictions = answered
    references = references_from_cases(bundle.cases)
    metric = evaluate.load(str(METRIC_PATH))
    half = len(references) // 2
    metric.add_batch(predictions=predictions[:half], references=references[:half])
    metric.add_batch(predictions=predictions[half:], references=references[half:])
    details = metric.compute(
        mode="strict", oracle="implicit", greedy=False, return_details=True, n_resamples=50, return_cases=True
    )
    assert details["mode"] == "strict"
    assert details["flat"]["e2e/stage1/all"] is None  # sampled oracle run: End-to-End is N/A
    assert details["sources"]["e2e"] is None and details["sources"]["op"]["oracle"] == "implicit"
    assert any("was sampled" in n for n in details["notes"])
    assert set(details["tables"]) == {"table2", "table3", "table8", "table9", "table10", "table11"}
    assert details["intervals"]["values"]["op/stage2/all"] is not None
    assert len(details["cases"]["implicit"]) == len(references)


def test_references_from_the_dataset_equal_those_from_the_bundle(fixture_bundle, bundle):
    from datasets import load_dataset

    import chexpercept  # noqa: F401  (registers the builder)

    ds = load_dataset("chexpercept", data_dir=str(fixture_bundle), split="train")
    assert references_from_dataset(ds) == references_from_cases(bundle.cases)


def test_classlabel_ids_and_input_errors(bundle, answered):
    _, predictions = answered
    refs = references_from_cases(bundle.cases)

    by_id = [
        {**r, "lesion": LESIONS.index(r["lesion"]), "path": [p.value for p in PATHS].index(r["path"])}
        for r in refs
    ]
    metric = evaluate.load(str(METRIC_PATH))
    assert metric.compute(predictions=predictions, references=by_id) == metric.compute(
        predictions=predictions, references=refs
    )
    short = [list(p) for p in predictions]
    short[3] = short[3][:-1]
    with pytest.raises(ValueError, match=f"case {refs[3]['key_id']}: {len(short[3])} responses for"):
        metric.compute(predictions=short, references=refs)
    bad = [dict(r) for r in refs]
    bad[0] = {**bad[0], "turns": [{**bad[0]["turns"][0], "task": "guessing"}]}
    with pytest.raises(ValueError, match="unknown task 'guessing'"):
        metric.compute(predictions=[p[:1] for p in predictions[:1]], references=bad[:1])
    # an answer key naming an option the question does not have (red team, stop 44)
    first = bad[0] = {**refs[0], "turns": [{**refs[0]["turns"][0], "answer_index": [9]}]}
    n = len(first["turns"][0]["options"])
    with pytest.raises(ValueError, match=rf"turn 0 \(\w+\): answer_index \[9\] must name options 1 to {n}"):
        metric.compute(predictions=[p[:1] for p in predictions[:1]], references=bad[:1])
    # arguments of the wrong type (red team, stop 48): each was taken and gave wrong numbers, or an
    # internal error; "no cases" gave every metric None
    one = [p[:1] for p in predictions[:1]]
    truthy = {**refs[0], "turns": [{**refs[0]["turns"][0], "answer_index": [True]}]}
    with pytest.raises(ValueError, match=r"answer_index \[True\] must be int"):
        metric.compute(predictions=one, references=[truthy])
    with pytest.raises(ValueError, match="greedy must be True, False or None"):
        metric.compute(predictions=predictions, references=refs, oracle="implicit", greedy="no")
    with pytest.raises(ValueError, match="model must be a string"):
        metric.compute(predictions=predictions, references=refs, model=None)
    for key_id in (None, 7, ""):
        with pytest.raises(ValueError, match="key_id must be a non-empty string"):
            metric.compute(predictions=one, references=[{**refs[0], "key_id": key_id}])
    with pytest.raises(ValueError, match="no cases"):
        metric.compute(predictions=[], references=[])


def _child(code, env):
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", ["HF_HOME", "HF_MODULES_CACHE", "XDG_CACHE_HOME"])
def test_install_metric_finds_evaluate_s_module_cache_without_importing_evaluate(tmp_path, where):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "HF_MODULES_CACHE", "XDG_CACHE_HOME")}
    env[where] = str(tmp_path / where)
    ours = _child(
        "import json, sys\nfrom chexpercept.metrics.evaluate_support import evaluate_modules_cache\n"
        "from chexpercept.cli import main\nmain(['install-metric'])\n"
        "print(json.dumps({'path': str(evaluate_modules_cache()), "
        "'heavy': sorted(m for m in ('evaluate', 'datasets', 'torch') if m in sys.modules)}))",
        env,
    )
    theirs = _child(
        "import json\nfrom evaluate.loading import init_dynamic_modules\nprint(json.dumps(init_dynamic_modules()))",
        env,
    )
    assert ours == {"path": theirs, "heavy": []}


def test_the_installed_copy_serves_an_interpreter_without_the_start_up_hook(tmp_path):
    """Without the hook (CHEXPERCEPT_NO_STARTUP_HOOK=1, nothing imported) evaluate finds the bare name
    only in its module cache: what `chexpercept install-metric` puts there."""
    import os

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "CHEXPERCEPT_NO_STARTUP_HOOK": "1"}
    code = (
        "import json\nimport evaluate\ntry:\n    evaluate.load('chexpercept_metric'); ok = True\n"
        "except FileNotFoundError:\n    ok = False\nprint(json.dumps(ok))"
    )
    assert _child(code, env) is False
    _child("from chexpercept.cli import main\nmain(['install-metric'])\nprint('null')", env)
    assert _child(code, env) is True
