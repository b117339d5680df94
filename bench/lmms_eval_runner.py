"""lmms-eval's runner against ours on vLLM's real engine, same model, same cases, one engine.

The CheXpercept tasks of eval/harnesses/lmms_eval run on lmms-eval's chat vLLM model
(``lmms_eval.models.chat.vllm.VLLM``, started with the engine arguments our vllm backend computes
for the bundle); our runner's engine (``run_conversations`` over the vllm backend, what
``eval/run.py --backend vllm`` drives) then runs on the very same ``vllm.LLM``. Per oracle setting:

* lmms-eval: ``simple_evaluate`` of the task (requests built, every conversation run, scored),
* ours: ``run_conversations`` + ``score_model`` on the records (the same work),

vLLM's prefix cache emptied before each. Both must give the same answers case for case and the same
metrics (checked; the parity table of docs/lmms-eval.md). Then both once more on a single case
(``--single``: the first case of the longest route, one conversation at a time), where neither can
overlap conversations, to see the cost of a request itself.

Needs lmms-eval beside vLLM (``bash scripts/setup_lmms_eval.sh``), then
``.venv-lmms-eval/bin/python bench/lmms_eval_runner.py [--write]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chexpercept.builder.synth import synthesize
from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.vllm.backend import VLLMBackend
from chexpercept.eval.engine import admission_order, run_conversations
from chexpercept.eval.harnesses.lmms_eval import DATA_DIR_ENV, LMMS_EVAL_VERSION, TASK_DIR
from chexpercept.eval.harnesses.lmms_eval.model_args import model_args
from chexpercept.eval.harnesses.lmms_eval.scores import metric_keys
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.tiny_model import build_tiny_model
from chexpercept.metrics import run_from_records, score_model

ORACLES = ("none", "implicit", "explicit")


def lmms_eval_run(lm: Any, task: str, manager: Any, max_tokens: int, only: int | None = None) -> dict:
    """lmms-eval's evaluation of one task (of its document ``only`` alone: ``--offset only --limit 1``);
    its answers per case, metrics and wall time."""
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.protocol import ChatMessages

    lm.client.reset_prefix_cache()
    spent = {"model": 0.0, "messages": 0.0, "requests": 0}
    start = time.perf_counter()
    with (
        timed(type(lm), "generate_until_multi_round", spent, "model"),
        timed(ChatMessages, "to_openai_messages", spent, "messages"),
    ):
        out = simple_evaluate(
            model=lm,
            tasks=[task],
            task_manager=manager,
            gen_kwargs=f"max_new_tokens={max_tokens}",
            log_samples=True,
            bootstrap_iters=0,
            limit=None if only is None else 1,
            offset=only or 0,
        )
    seconds = time.perf_counter() - start
    answers = {s["depth/RR"]["key_id"]: s["depth/RR"]["responses"] for s in out["samples"][task]}
    return {"seconds": seconds, "answers": answers, "results": out["results"][task], **spent}


@contextmanager
def timed(owner: Any, name: str, spent: dict, key: str):
    """Add the wall time of every call of ``owner.name`` (a class's function, or an object's method:
    the model's is wrapped on the object, so that its class, which the task checks, stays lmms-eval's)
    to ``spent[key]``, and count the calls of the message builder (one per request), while the block
    runs."""
    original = getattr(owner, name)
    own = name in vars(owner)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start
            if key == "messages":
                spent["requests"] += 1

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def our_run(backend: VLLMBackend, cases: list, oracle: str, model: str, batch_size: int) -> dict:
    """Our runner's engine and scorer over the same cases; answers per case, metrics, wall time."""
    backend.llm.reset_prefix_cache()
    backend.new_session()
    records: list = []
    start = time.perf_counter()
    run_conversations(
        admission_order(cases),
        backend,
        oracle=oracle,
        model=model,
        batch_size=batch_size,
        on_finished=records.extend,
    )
    flat = score_model([run_from_records(records, oracle=oracle, greedy=True, model=model)]).flat
    seconds = time.perf_counter() - start
    answers = {r.key_id: [t.response for t in r.turns] for r in records}
    return {"seconds": seconds, "answers": answers, "flat": flat, "iterations": backend.iterations}


def compare(oracle: str, theirs: dict, ours: dict) -> dict[str, Any]:
    """One row: cases and turns, identical answers, equal metrics, times and their ratio."""
    turns = sum(len(a) for a in ours["answers"].values())
    same = sum(
        x == y for key, a in ours["answers"].items() for x, y in zip(a, theirs["answers"].get(key, []))
    )
    keys = metric_keys(oracle)
    equal = sum(theirs["results"][f"{k},none"] == ours["flat"][k] for k in keys)
    return {
        "oracle": oracle,
        "cases": len(ours["answers"]),
        "same_cases": sum(ours["answers"][k] == theirs["answers"].get(k) for k in ours["answers"]),
        "turns": turns,
        "same_turns": same,
        "metrics": len(keys),
        "equal_metrics": equal,
        "lmms_eval_s": theirs["seconds"],
        "lmms_eval_model_s": theirs["model"],
        "lmms_eval_messages_s": theirs["messages"],
        "lmms_eval_requests": theirs["requests"],
        "ours_s": ours["seconds"],
        "iterations": ours["iterations"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-cell", type=int, default=1, help="phantom cases per lesion and route")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--oracles", nargs="+", default=list(ORACLES), choices=ORACLES)
    parser.add_argument("--write", action="store_true", help="record the tables in bench/RESULTS.md")
    args = parser.parse_args()

    from lmms_eval import models
    from lmms_eval.tasks import TaskManager

    work = Path(tempfile.mkdtemp(prefix="chexpercept-bench-lmms-"))
    synthesize(work / "bundle", per_cell=args.per_cell, seed=0)
    build_tiny_model(work / "model")
    os.environ[DATA_DIR_ENV] = str(work / "bundle")
    bundle = read_bundle(work / "bundle")
    cases = bundle.cases
    spec = resolve(str(work / "model"), backend="vllm")
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=args.max_tokens, greedy=True)
    context = RunContext(root=bundle.root, cases=cases)
    engine_args = VLLMBackend(spec, sampling=sampling).build_engine_args(context)
    start = time.perf_counter()
    lm = models.get_model("vllm").create_from_arg_string(
        model_args(engine_args, max_new_tokens=args.max_tokens)
    )
    engine_start = time.perf_counter() - start
    ours = VLLMBackend(spec, sampling=sampling, llm_class=lambda **_: lm.client)
    ours.setup(context)
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)

    # warm-up, untimed: the first evaluation of each side pays for lazy imports and first requests
    lmms_eval_run(lm, "chexpercept_none", manager, args.max_tokens, only=0)
    our_run(ours, cases[:1], "none", spec.model_id, 1)
    rows = []
    for oracle in args.oracles:
        task = f"chexpercept_{oracle}"
        theirs = lmms_eval_run(lm, task, manager, args.max_tokens, None)
        rows.append(compare(oracle, theirs, our_run(ours, cases, oracle, spec.model_id, 256)))
        print(rows[-1])
    # one case, one conversation at a time: the first case of the longest route, in release order
    longest = max(len(c.turns) for c in cases)
    first = next(i for i, c in enumerate(cases) if len(c.turns) == longest)
    single_theirs = lmms_eval_run(lm, "chexpercept_implicit", manager, args.max_tokens, only=first)
    single = compare("implicit", single_theirs, our_run(ours, [cases[first]], "implicit", spec.model_id, 1))
    print(single)
    ours.close()
    text = report(rows, single, engine_start, len(cases), args)
    print(text)
    if args.write:
        from shared import write_section

        write_section("## lmms-eval's runner and ours", text)


def report(
    rows: list[dict], single: dict, engine_start: float, n_cases: int, args: argparse.Namespace
) -> str:
    import vllm

    lines = [
        "## lmms-eval's runner and ours",
        "",
        f"`.venv-lmms-eval/bin/python bench/lmms_eval_runner.py --per-cell {args.per_cell} --max-tokens "
        f"{args.max_tokens} --write` (bench/lmms_eval_runner.py, {time.strftime('%Y-%m-%d')}): lmms-eval "
        f"{LMMS_EVAL_VERSION}'s chat vLLM model over the CheXpercept tasks of eval/harnesses/lmms_eval "
        f"against our runner's engine (`run_conversations` over the vllm backend, what `eval/run.py "
        f"--backend vllm` drives), both on one `vllm.LLM` (vLLM {vllm.__version__}'s CPU build, engine "
        f"start {engine_start:.1f} s, the engine arguments our backend computes for the bundle), the "
        f"tiny random Gemma 3, {n_cases} phantom cases, greedy, at most {args.max_tokens} new tokens; "
        f"each side's time covers running every conversation and scoring; one untimed warm-up "
        f"evaluation each first; prefix cache emptied before each; load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| oracle | cases | identical answers (turns) | equal metrics | lmms-eval | ours | lmms-eval / ours |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in [*rows, {**single, "oracle": "implicit, 1 case (longest route), one at a time"}]:
        ratio = r["lmms_eval_s"] / r["ours_s"] if r["ours_s"] else float("nan")
        lines.append(
            f"| {r['oracle']} | {r['same_cases']}/{r['cases']} | {r['same_turns']}/{r['turns']} | "
            f"{r['equal_metrics']}/{r['metrics']} | {r['lmms_eval_s']:.2f} s | {r['ours_s']:.2f} s | "
            f"**{ratio:.1f}x** |"
        )
    lines += [
        "",
        "Where lmms-eval's time goes (same runs): its model's multi-round loop (of which building each "
        "request's messages: every image read and re-encoded as base64 PNG), and the rest of "
        "`simple_evaluate` (the task's documents and requests, our scoring, its bookkeeping).",
        "",
        "| oracle | requests | model loop | of which messages (images to base64) | rest of `simple_evaluate` |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in [*rows, {**single, "oracle": "implicit, 1 case"}]:
        lines.append(
            f"| {r['oracle']} | {r['lmms_eval_requests']} | {r['lmms_eval_model_s']:.2f} s | "
            f"{r['lmms_eval_messages_s']:.2f} s | {r['lmms_eval_s'] - r['lmms_eval_model_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
