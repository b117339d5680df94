"""``chexpercept estimate``: the model calls, tokens, cost and time of a run, before it starts.

    chexpercept estimate --data-dir DIR --model gpt-5.4 [--oracle none implicit] [--answer-tokens 1000]
    chexpercept estimate --data-dir DIR --model ./my-vlm --backend vllm --tokens-per-second 2500

Counts exactly the turns ``run`` would send for the same selection (eval/estimate/count.py): per oracle
setting the bounds of the two scenarios (every answer right, every answer wrong), then the total.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from chexpercept.cli_options import add_data_dir_option, add_output_option, write_output
from chexpercept.domains import COUNT, COUNT_OR_NONE, POSITIVE, RATE
from chexpercept.escape import markdown_cell, terminal_lines
from chexpercept.eval.backends import BACKENDS
from chexpercept.eval.oracle import ORACLE_CHOICES, end_to_end_note, oracles_for
from chexpercept.eval.runner.selection import add_selection_options
from chexpercept.os_errors import explain_os_error
from chexpercept.results import ORACLE_SETTINGS

#: every backend but the baselines, which call no model
ESTIMATED_BACKENDS = tuple(name for name in BACKENDS if name != "baseline")


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what to estimate")
    add_data_dir_option(g)
    g.add_argument("--model", help="registry name, Hugging Face id or local folder (as for run)")
    g.add_argument("--backend", choices=ESTIMATED_BACKENDS, help="as for run")
    g.add_argument("--model-id", help="as for run: this id or folder instead of the registry's")
    g.add_argument(
        "--oracle",
        nargs="+",
        choices=ORACLE_CHOICES,
        default=list(ORACLE_SETTINGS),
        help="oracle settings to estimate (default: all three); paper: those run's default runs for this "
        "model (implicit for greedy decoding, none and implicit for a sampling model)",
    )
    g.add_argument(
        "--answer-tokens",
        type=COUNT,
        default=1000,
        help="output tokens assumed per answer, reasoning included (default 1000, as the reference's "
        "estimator); earlier answers are re-sent at this length",
    )
    g.add_argument("--no-thinking", action="store_true", help="as for run (local models' chat template)")
    g = parser.add_argument_group("which cases (as for run)")
    add_selection_options(g)
    g = parser.add_argument_group("time (one of)").add_mutually_exclusive_group()
    g.add_argument(
        "--tokens-per-second",
        type=RATE,
        help="stated throughput: uncached input plus output tokens per second (all processes together)",
    )
    g.add_argument(
        "--from-run",
        metavar="RUN_DIR",
        help="measured throughput: a timed trial run of the same model (e.g. chexpercept run ... --limit 20), "
        "its conversations counted as here over the time they took; a trial whose answers are as long as the "
        "real ones (its --max-tokens) times best",
    )
    g = parser.add_argument_group("output")
    g.add_argument("--format", choices=("markdown", "json"), default="markdown", help="default markdown")
    add_output_option(g, help="write to this file instead of stdout")


def _counter(
    spec: Any,
    root: FsPath,
    answer_tokens: int,
    chat_kwargs: dict[str, Any],
    sample: Callable[[], list[Any]],
) -> Any:
    from chexpercept.eval.estimate.count import ApiCounter
    from chexpercept.eval.estimate.pricing import rules_for

    if spec.backend == "openai":
        return ApiCounter(root, rules_for(spec.model_id), answer_tokens=answer_tokens)
    try:
        import importlib.util

        if importlib.util.find_spec("transformers") is None:  # before a download it would not use
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        from chexpercept.eval.estimate.local_tokens import ProcessorCounter
        from chexpercept.eval.weights import HubError, resolve_weights

        try:  # the processor's files only, resolved as run resolves weights (fails fast offline)
            folder = resolve_weights(
                spec.model_id, processor_only=True, remote_code=spec.trust_remote_code
            ).path
        except HubError as e:
            raise ValueError(f"cannot count the tokens of {spec.model_id}: {e}") from None
        counter = ProcessorCounter(root, folder, chat_kwargs, answer_tokens=answer_tokens)
        counter.check(sample())
        return counter
    except ImportError as e:
        from chexpercept.extras import install_hint

        missing = install_hint(e) if isinstance(e, ModuleNotFoundError) else None
        raise ValueError(f"counting a local model's tokens: {missing or f'needs transformers ({e})'}") from e
    except OSError as e:
        raise ValueError(
            f"cannot load the processor of {spec.model_id!r} to count its tokens: {str(e).rstrip('.')}. Estimates of "
            "local models need the model's files on this machine (a local folder, or the Hugging Face "
            "cache: chexpercept download-model)"
        ) from e


@dataclass
class Throughput:
    """What a timed trial run measured: tokens processed per second, as the estimate counts them."""

    tokens_per_second: float
    #: the trial's mean output tokens per answer
    answer_tokens: float
    note: str


def timed_session(run_dir: str, model_id: str) -> tuple[dict[str, Any], float, int]:
    """(run.json, seconds, cases) of the last session of a trial run of ``model_id`` (given any way
    that names the same model). Raises ValueError naming the file: no such folder, no timed session,
    a run of another model or a baseline."""
    from chexpercept.errors import no_such_path
    from chexpercept.eval.registry import same_model_id
    from chexpercept.input_json import read_json
    from chexpercept.results import RUN_NAME

    if not FsPath(run_dir).is_dir():
        raise ValueError(f"--from-run {no_such_path(run_dir)}")
    path = FsPath(run_dir) / RUN_NAME
    try:
        info = read_json(path, what=RUN_NAME)
        session = info["last_session"]
        seconds, cases = session["seconds_main_process"], session["cases"]
        POSITIVE.require(seconds, "last_session.seconds_main_process")  # not NaN, true or 1e-320
        COUNT_OR_NONE.require(cases, "last_session.cases")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {explain_os_error(e).what}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: no timed session to measure throughput from ({e})") from e
    if cases < 1 or seconds < 1e-3:
        raise ValueError(f"{path}: its last session ran no case; run some cases first")
    if info.get("backend") == "baseline" or not same_model_id(info.get("model_id"), model_id):
        raise ValueError(
            f"{path}: a run of {info.get('model_id')!r} ({info.get('backend')}) cannot time {model_id!r}; "
            "give a trial run of the same model (chexpercept run ... --limit 20)"
        )
    return info, seconds, cases


def measured_throughput(
    run_dir: str, spec: Any, cases: list[Any], counter: Any, *, fingerprint: str | None = None
) -> Throughput:
    """Tokens per second of a timed trial run of the same model: the conversations it had, replayed
    and counted as the estimate counts (uncached input plus output tokens, each answer as long as
    the run reported), over the seconds its last session took. The estimate's time is then its own
    count at ``--answer-tokens`` over this rate, so it follows the answer length asked for.

    ``fingerprint``: the bundle's (chexpercept.bundle.fingerprint), which the trial's run.json must
    record: the same key ids in another bundle hold other conversations (red team, stop 44).

    Raises ValueError naming the file (see ``timed_session``; also: another bundle, no case of it)."""
    from chexpercept.eval.estimate.count import estimate_recorded
    from chexpercept.results import RESULTS_NAME, iter_results
    from chexpercept.usage import count

    info, seconds, session_cases = timed_session(run_dir, spec.model_id)
    folder = FsPath(run_dir)
    trial_bundle = info.get("bundle")
    recorded = trial_bundle.get("fingerprint") if isinstance(trial_bundle, dict) else None
    if fingerprint is not None and recorded != fingerprint:
        shown = f"{str(recorded)[:12]}..." if recorded else "none recorded"
        raise ValueError(
            f"{folder / 'run.json'}: the trial was run on another bundle (bundle fingerprint {shown}; "
            f"--data-dir's is {fingerprint[:12]}...), whose cases hold other conversations; time a trial "
            "on this bundle"
        )
    selected = {c.key_id for c in cases}
    results = [r for r in iter_results(folder / RESULTS_NAME) if r.key_id in selected]
    answers = [t for r in results for t in r.turns]
    unknown = sum(1 for t in answers if count((t.usage or {}).get("output_tokens")) is None)
    if unknown:  # the rate would be made of a guess (the estimator's answer length), not measured
        raise ValueError(
            f"{folder / RESULTS_NAME}: {unknown} of its {len(answers)} answers have no output token count "
            "(the server did not report one), so the trial's throughput cannot be measured from it; time a "
            "trial on a server that reports usage, or give --tokens-per-second"
        )
    saved, counter.answer_tokens = counter.answer_tokens, None  # each answer as long as it was
    try:
        trial = estimate_recorded(
            cases,
            results,
            str(info.get("oracle", "implicit")),
            counter,
            model_id=spec.model_id,
            parse_mode=str(info.get("parse_mode", "reference")),
            model=spec.model_id,
        )
    finally:
        counter.answer_tokens = saved
    if not trial.calls:
        raise ValueError(f"{folder / RESULTS_NAME}: none of its cases is in this bundle's selection")
    processed = trial.input_tokens - trial.cached_input_tokens + trial.output_tokens
    rate = processed / trial.cases * session_cases / seconds
    mean_answer = trial.output_tokens / trial.calls
    note = (
        f"time from {run_dir}: {rate:,.0f} tokens per second (uncached input plus output tokens, counted as "
        f"here, of {session_cases} case(s) in {seconds:.1f} s), its answers {mean_answer:,.0f} output tokens "
        "on average"
    )
    return Throughput(rate, mean_answer, note)


def _throughput_notes(measured: Throughput, answer_tokens: int) -> list[str]:
    notes = [measured.note]
    if not 0.5 <= answer_tokens / max(measured.answer_tokens, 1.0) <= 2:
        notes.append(
            f"the trial's answers ({measured.answer_tokens:,.0f} tokens on average) are far from --answer-tokens "
            f"{answer_tokens:,}: an engine reads a prompt at once but writes an answer token by token, so one "
            "rate for both is rough; time a trial whose answers are as long as the real ones (its --max-tokens)"
        )
    return notes


def duration(seconds: float) -> str:
    """12 s, 3.4 min, 5.2 h, 2.1 days."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def _cell(a: Any, b: Any, fmt: Any = "{:,}") -> str:
    if a is None:
        return "N/A"
    show = fmt if callable(fmt) else fmt.format
    return show(a) if a == b else f"{show(min(a, b))} - {show(max(a, b))}"


def missing_notes(rows: list[tuple[str, Any, Any]], spec: Any) -> list[str]:
    """Why a column is N/A (no throughput given, no price known), and how to fill it."""
    notes = []
    if any(lo.seconds is None for _, lo, _ in rows):
        if spec.backend == "openai":
            notes.append(
                "time N/A: an API's speed depends on the provider's rate limits and load, not on the tokens; "
                "time a short trial run (chexpercept run ... --limit 20) and pass --from-run RUN_DIR, or give "
                "--tokens-per-second"
            )
        else:
            notes.append(
                "time N/A: no throughput given; pass --tokens-per-second (uncached input plus output tokens "
                "per second of your engine) or --from-run RUN_DIR (a timed trial run: chexpercept run ... "
                "--limit 20)"
            )
    if any(lo.cost_usd is None for _, lo, _ in rows):
        if spec.backend == "openai":
            notes.append(
                f"USD N/A: no price is known for {spec.model_id!r} (the paper's price table, eval/estimate/pricing.py)"
            )
        else:
            notes.append("USD N/A: a local model has no price per token (its cost is the time on your GPUs)")
    return notes


def _paper_notes(spec: Any, rows: Sequence[tuple[str, Any, Any]], greedy: bool) -> list[str]:
    """For a sampling model: what its End-to-End numbers need, and what the paper's two runs cost."""
    settings = [name for name, _, _ in rows if not name.startswith("*")]
    temperature = spec.sampling.get("temperature")
    note = end_to_end_note(spec.name, greedy=greedy, temperature=temperature, settings=settings)
    if note:
        return [note]
    paper = {name: (lo, hi) for name, lo, hi in rows if name in ("none", "implicit")}
    if greedy or len(paper) < 2 or len(settings) == 2:
        return []
    lo = sum(v[0].cost_usd or 0 for v in paper.values())
    hi = sum(v[1].cost_usd or 0 for v in paper.values())
    return [
        f"{spec.name} samples, so the paper's numbers need its none and implicit runs (chexpercept run's default "
        f"--oracle paper runs both): USD {lo:,.2f} - {hi:,.2f} together"
    ]


def render(
    rows: list[tuple[str, Any, Any]],
    model: str,
    counter: str,
    exact: bool,
    notes: Sequence[str] = (),
) -> str:
    """Markdown: per oracle setting the range of the two scenarios, then the total; then why any
    column is N/A."""
    lines = [
        f"**Estimate for {markdown_cell(model)}** (tokens counted by {counter}"
        f"{'' if exact else ', approximate'})",
        "",
        "| oracle | cases | calls | input tokens (text + image) | image tokens | cached input | output tokens "
        "| USD | USD without caching | time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, lo, hi in rows:
        lines.append(
            f"| {name} | {lo.cases:,} | {_cell(lo.calls, hi.calls)} | {_cell(lo.input_tokens, hi.input_tokens)} "
            f"| {_cell(lo.input_image_tokens, hi.input_image_tokens)} "
            f"| {_cell(lo.cached_input_tokens, hi.cached_input_tokens)} | {_cell(lo.output_tokens, hi.output_tokens)} "
            f"| {_cell(lo.cost_usd, hi.cost_usd, '{:,.2f}')} "
            f"| {_cell(lo.cost_usd_without_cache, hi.cost_usd_without_cache, '{:,.2f}')} "
            f"| {_cell(lo.seconds, hi.seconds, duration)} |"
        )
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from chexpercept.bundle import read_bundle
    from chexpercept.errors import BundleValidationError, ReleaseNotFoundError
    from chexpercept.eval.estimate.count import estimate_bounds, sample_calls, total
    from chexpercept.eval.registry import resolve
    from chexpercept.eval.runner.selection import select_cases, split_list

    prog = "chexpercept estimate"
    if not args.data_dir or not args.model:
        print(f"{prog}: error: --data-dir and --model are required", file=sys.stderr)
        return 2
    try:
        spec = resolve(args.model, backend=args.backend, model_id=args.model_id)
        if spec.backend == "baseline":
            raise ValueError(f"{args.model} is a baseline: it makes no model calls and costs nothing")
        bundle = read_bundle(
            args.data_dir,
            lesions=split_list(args.lesions),
            paths=split_list(args.paths),
            check_images="exists",
        )
        cases = select_cases(bundle.cases, per_cell=args.per_cell, limit=args.limit)
        if not cases:
            raise ValueError(f"no case of {bundle.root} matches the selection")
        chat_kwargs = {"enable_thinking": False} if args.no_thinking else {}
        greedy = spec.sampling.get("temperature") == 0
        settings = oracles_for(args.oracle, greedy=greedy)
        counter = _counter(
            spec, bundle.root, args.answer_tokens, chat_kwargs, lambda: sample_calls(cases, settings)
        )
        measured = (
            measured_throughput(args.from_run, spec, bundle.cases, counter, fingerprint=bundle.fingerprint())
            if args.from_run
            else None
        )
        rate = measured.tokens_per_second if measured else args.tokens_per_second
        rows, lows, highs = [], [], []
        for oracle in settings:
            lo, hi = estimate_bounds(
                cases, oracle, counter, model_id=spec.model_id, answer_tokens=args.answer_tokens,
                tokens_per_second=rate,
            )  # fmt: skip
            rows.append((oracle, lo, hi))
            lows.append(lo)
            highs.append(hi)
    except (ValueError, FileNotFoundError, BundleValidationError, ReleaseNotFoundError) as e:
        print(f"{prog}: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    if len(rows) > 1:
        rows.append(("**total**", total(lows, "min"), total(highs, "max")))
    notes = missing_notes(rows, spec) + (_throughput_notes(measured, args.answer_tokens) if measured else [])
    notes += _paper_notes(spec, rows, greedy)
    if args.format == "json":
        text = json.dumps(
            {
                "model": spec.name,
                "model_id": spec.model_id,
                "answer_tokens": args.answer_tokens,
                "counter": counter.name,
                "exact": counter.exact,
                "estimates": {
                    name.strip("*"): {"min": lo.as_dict(), "max": hi.as_dict()} for name, lo, hi in rows
                },
                "notes": notes,
            },
            indent=2,
        )
    else:
        text = render(rows, spec.display or spec.name, counter.name, counter.exact, notes)
    write_output(args.output, text + "\n")
    return 0
