"""CheXpercept in lmms-eval (eval/harnesses/lmms_eval): lmms-eval's own runner against ours.

These tests need lmms-eval beside vLLM: ``scripts/test.sh`` runs them (marker ``lmms_eval``) in the
environment of ``scripts/setup_lmms_eval.sh``; elsewhere they are skipped. One vLLM engine serves the
module: lmms-eval's chat vLLM model starts it with the engine arguments our vllm backend computes for
the bundle (those ``eval/run.py --backend vllm`` gives vLLM), and our runner's engine loop (the one
``eval/run.py`` drives) then runs on that same engine, so the two runners meet the same engine by
construction. The set-up mistakes are checked through lmms-eval's own task loading and evaluation,
before any engine starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_settings import ENGINE_ARGS

pytestmark = pytest.mark.lmms_eval
pytest.importorskip("lmms_eval", reason="lmms-eval is not installed here: bash scripts/setup_lmms_eval.sh")
pytest.importorskip("vllm", reason="vLLM is not installed here: bash scripts/setup_lmms_eval.sh")

from lmms_eval import models as lmms_models  # noqa: E402
from lmms_eval.api.model import lmms  # noqa: E402
from lmms_eval.evaluator import simple_evaluate  # noqa: E402
from lmms_eval.models.chat.vllm import VLLM as ChatVLLM  # noqa: E402
from lmms_eval.models.simple.dummy import Dummy  # noqa: E402
from lmms_eval.tasks import TaskManager, get_task_dict  # noqa: E402

from chexpercept.bundle import read_bundle  # noqa: E402
from chexpercept.errors import ReleaseNotFoundError  # noqa: E402
from chexpercept.eval.backends.vllm.backend import VLLMBackend  # noqa: E402
from chexpercept.eval.engine import admission_order, run_conversations  # noqa: E402
from chexpercept.eval.harnesses.lmms_eval import DATA_DIR_ENV, TASK_DIR  # noqa: E402
from chexpercept.eval.harnesses.lmms_eval.checks import (  # noqa: E402
    LmmsEvalSetupError,
    engine_image_limit,
    images_of,
    multi_round_problem,
)
from chexpercept.eval.harnesses.lmms_eval.model_args import model_args  # noqa: E402
from chexpercept.eval.harnesses.lmms_eval.scores import metric_keys  # noqa: E402
from chexpercept.eval.protocol import RunContext, Sampling  # noqa: E402
from chexpercept.eval.registry import resolve  # noqa: E402
from chexpercept.metrics import run_from_records, score_model, score_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 8
GREEDY = Sampling(temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS, greedy=True)
#: the setting compared on the engine: the paper's Oracle-Passed runs (every answer of a random model
#: is wrong, so the oracle patches the history before every later turn); lmms-eval runs one request
#: at a time, so each setting costs CI about half a minute: bench/lmms_eval_runner.py compares all three
ORACLES = ("implicit",)


@pytest.fixture(scope="module")
def task_manager():
    return TaskManager(include_path=str(TASK_DIR), include_defaults=False)


def evaluate(model, tasks, task_manager, **kwargs):
    """lmms-eval's ``simple_evaluate`` as its command line calls it, answers at most MAX_TOKENS long."""
    return simple_evaluate(
        model=model,
        tasks=list(tasks),
        task_manager=task_manager,
        gen_kwargs=f"max_new_tokens={MAX_TOKENS}",
        log_samples=True,
        bootstrap_iters=0,
        **kwargs,
    )


def answers_of(samples) -> dict[str, list[str]]:
    """Per case, lmms-eval's answers as its logged samples hold them (the task's scored item)."""
    return {s["depth/RR"]["key_id"]: s["depth/RR"]["responses"] for s in samples}


class EnginelessVLLM(ChatVLLM):
    """lmms-eval's chat vLLM model whose engine takes ``limit`` images per prompt, without starting
    one: the class is lmms-eval's, only ``client`` (vLLM's ``LLM``) is a stand-in holding the
    engine's multimodal config, so the set-up check meets it where it meets a real engine."""

    def __init__(self, limit: int):
        lmms.__init__(self)
        config = SimpleNamespace(get_limit_per_prompt=lambda modality: limit)
        self.client = SimpleNamespace(
            llm_engine=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=config))
        )


def test_usual_mistakes_are_refused_before_any_request(task_manager, phantom_bundle, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    # no release folder: where to give it
    with pytest.raises(
        ReleaseNotFoundError, match=f"chexpercept_implicit: no CheXpercept release.*{DATA_DIR_ENV}"
    ):
        get_task_dict(["chexpercept_implicit"], task_manager)
    # a folder that is not a release: which folder, given where, and what it lacks
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a release")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "notes"))
    with pytest.raises(ReleaseNotFoundError) as refused:
        get_task_dict(["chexpercept_implicit"], task_manager)
    assert f"{DATA_DIR_ENV}={tmp_path / 'notes'}" in str(refused.value)
    assert "not a CheXpercept release: it has no chexpercept.json" in str(refused.value)
    # the other way to give it: a YAML of one's own that includes ours (docs/lmms-eval.md)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my_chexpercept.yaml").write_text(
        f"include: {TASK_DIR / 'chexpercept_implicit.yaml'}\ntask: my_chexpercept\n"
        f"dataset_kwargs:\n  data_dir: {phantom_bundle}\n"
    )
    before = os.umask(0o022)
    try:
        (loaded,) = get_task_dict(
            ["my_chexpercept"], TaskManager(include_path=str(mine), include_defaults=False)
        ).values()
        # the run's outputs (--output_path, --log_samples: key_ids, questions, answers) owner-only:
        # lmms-eval writes them under the umask, 0644 in 0755 folders (red team, stop 43)
        assert os.umask(0o022) == 0o077
    finally:
        os.umask(before)
    assert len(loaded.eval_docs) == len(read_bundle(phantom_bundle).cases)

    monkeypatch.setenv(DATA_DIR_ENV, str(phantom_bundle))
    # a model class that cannot carry the conversation, refused by lmms-eval's own evaluation
    with pytest.raises(
        LmmsEvalSetupError, match=r"lmms_eval.models.simple.dummy.Dummy .*simple models.*--model vllm"
    ):
        evaluate(Dummy(), ["chexpercept_implicit"], task_manager)
    # which of lmms-eval's classes can: its chat vLLM model only
    assert multi_round_problem(object.__new__(lmms_models.get_model("vllm"))) is None
    assert "simple models" in multi_round_problem(object.__new__(lmms_models.get_model("vllm", True)))
    for name in ("vllm_generate", "huggingface", "openai"):
        problem = multi_round_problem(object.__new__(lmms_models.get_model(name)))
        assert problem and "not lmms-eval's message-based multi-round loop" in problem, name
    # an engine that takes fewer images than a route's last turn carries
    most = max(images_of(c) for c in read_bundle(phantom_bundle).cases)
    with pytest.raises(
        LmmsEvalSetupError, match=rf"at most 4 per prompt.*limit_mm_per_prompt={{\"image\":{most}}}"
    ):
        evaluate(EnginelessVLLM(4), ["chexpercept_implicit"], task_manager)
    # red team, stop 48: lmms-eval's response cache keys answers by --model_args and the case's
    # index, never by the model's files nor the release: a second run got the first one's answers
    enough = EnginelessVLLM(most)
    with pytest.raises(LmmsEvalSetupError, match=r"response cache \(--use_cache\) is on"):
        evaluate(enough, ["chexpercept_implicit"], task_manager, use_cache=str(tmp_path / "cache"))
    # round 2 (helper-54): the request cache is keyed without the release: another release's requests
    with pytest.raises(LmmsEvalSetupError, match=r"request cache \(--cache_requests\) is on"):
        evaluate(enough, ["chexpercept_implicit"], task_manager, cache_requests=True)
    # and the engine is started before any task: its sockets and compiled code under a umask that
    # lets others write, or in a cache folder others may write to, are refused
    from chexpercept.eval.harnesses.lmms_eval import task as lmms_task

    monkeypatch.setattr(lmms_task, "STARTED_UNDER", 0o000)
    with pytest.raises(LmmsEvalSetupError, match="started the model's engine under umask 000"):
        evaluate(enough, ["chexpercept_implicit"], task_manager)
    monkeypatch.setattr(lmms_task, "STARTED_UNDER", 0o022)
    shared = tmp_path / "vllm-cache"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(shared))
    with pytest.raises(LmmsEvalSetupError, match=r"vllm-cache \(the engine's compiled code"):
        evaluate(enough, ["chexpercept_implicit"], task_manager)
    if os.geteuid() == 0:  # round 2 (helper-54): another account's folder, whatever its mode
        shared.chmod(0o755)
        os.chown(shared, 65534, 65534)
        with pytest.raises(LmmsEvalSetupError, match="belongs to another account"):
            evaluate(enough, ["chexpercept_implicit"], task_manager)


def test_scores_are_those_of_chexpercept_score_for_the_same_answers(
    task_manager, phantom_bundle, tmp_path, monkeypatch
):
    """The answers of a run of ours (the random baseline: answers right and wrong), scored by the
    task's metrics as lmms-eval scores them, give the numbers ``chexpercept score`` gives."""
    out = tmp_path / "runs"
    argv = [sys.executable, str(ROOT / "eval" / "run.py"), "--data-dir", str(phantom_bundle)]
    argv += ["--model", "baseline:random", "--oracle", "implicit", "--output-dir", str(out)]
    argv += ["--run-name", "b", "--no-progress", "--no-score"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = out / "b" / "oracle_implicit"
    expected = score_path(folder).flat

    monkeypatch.setenv(DATA_DIR_ENV, str(phantom_bundle))
    (task,) = get_task_dict(["chexpercept_implicit"], task_manager).values()
    records = {
        r["key_id"]: [t["response"] for t in r["turns"]]
        for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())
    }
    items = {}
    for doc in task.eval_docs:
        for key, item in task.process_results(doc, [records[doc["key_id"]]]).items():
            items.setdefault(key, []).append(item)
    got = {key: task.aggregation()[key](values) for key, values in items.items()}
    assert got == {key: expected[key] for key in metric_keys("implicit")}
    assert any(0 < v < 1 for v in got.values() if v is not None)  # not all right, not all wrong
    # a model whose multi-round output is one string is named, not scored
    doc = task.eval_docs[0]
    with pytest.raises(ValueError, match=f"{doc['key_id']}.*one string, not one answer per round"):
        task.process_results(doc, ["Answer: 1"])


@pytest.fixture(scope="module")
def shared_engine(phantom_bundle, tiny_model):
    """lmms-eval's chat vLLM model, started with our vllm backend's engine arguments for the bundle,
    and our backend over the same engine."""
    bundle = read_bundle(phantom_bundle)
    spec = resolve(str(tiny_model), backend="vllm")
    context = RunContext(root=bundle.root, cases=bundle.cases)
    engine_args = VLLMBackend(spec, sampling=GREEDY, engine_args=ENGINE_ARGS).build_engine_args(context)
    lm = lmms_models.get_model("vllm").create_from_arg_string(
        model_args(engine_args, max_new_tokens=MAX_TOKENS)
    )
    assert str(lm.client.model_config.dtype) == "torch.float32"  # tests/vllm_settings.py
    ours = VLLMBackend(spec, sampling=GREEDY, engine_args=ENGINE_ARGS, llm_class=lambda **_: lm.client)
    ours.setup(context)
    yield SimpleNamespace(lm=lm, ours=ours, spec=spec, cases=bundle.cases, engine_args=engine_args)
    ours.close()


def test_lmms_eval_gives_our_runners_answers_and_scores(
    shared_engine, task_manager, phantom_bundle, monkeypatch
):
    lm, cases = shared_engine.lm, shared_engine.cases
    # the engine is the one our runner would start (images per prompt: the largest conversation)
    assert engine_image_limit(lm) == shared_engine.engine_args["limit_mm_per_prompt"]["image"]
    assert engine_image_limit(lm) == max(images_of(c) for c in cases)
    monkeypatch.setenv(DATA_DIR_ENV, str(phantom_bundle))
    theirs = evaluate(lm, [f"chexpercept_{o}" for o in ORACLES], task_manager)
    for oracle in ORACLES:
        task = f"chexpercept_{oracle}"
        records = []
        run_conversations(
            admission_order(cases),
            shared_engine.ours,
            oracle=oracle,
            model=shared_engine.spec.model_id,
            batch_size=64,
            on_finished=records.extend,
        )
        ours = {r.key_id: [t.response for t in r.turns] for r in records}
        # case for case, turn for turn, the same answers (greedy)
        assert answers_of(theirs["samples"][task]) == ours, oracle
        assert sum(map(len, ours.values())) > len(cases)
        # and every metric is the number chexpercept score gives for our records
        expected = score_model([run_from_records(records, oracle=oracle, greedy=True)]).flat
        results = theirs["results"][task]
        assert {k: results[f"{k},none"] for k in metric_keys(oracle)} == {
            k: expected[k] for k in metric_keys(oracle)
        }, oracle
