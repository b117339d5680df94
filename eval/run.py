"""Run a model (or a baseline) on CheXpercept: one conversation per case, results per case on disk.

    python eval/run.py --data-dir DIR --model baseline:prior --oracle implicit --output-dir runs/
    accelerate launch --num_processes 8 eval/run.py --data-dir DIR --model qwen3.6-27b --no-thinking
    chexpercept run --data-dir DIR --model ./tiny-vlm --backend transformers

Results go to ``OUT/<model>/oracle_<setting>/results.jsonl`` (one line per finished case) and
``run.json``. Rerunning the same command resumes; under accelerate every process runs its own
backend on its share of the cases and all of them append to the same results file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path as FsPath

if (
    __name__ == "__main__"
    and sys.path
    and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__))
):
    # run as a script (python eval/run.py, accelerate launch eval/run.py): this folder's modules
    # must be imported as chexpercept.eval.*, never as top-level names
    sys.path.pop(0)

if __name__ == "__main__":
    from chexpercept.entry_point import start_program

    start_program("chexpercept run")  # before the imports (seconds): streams, and a stop says one line

try:
    from chexpercept.bundle import IMAGE_CHECKS
    from chexpercept.cli_options import (
        CommandParser,
        add_data_dir_option,
        add_output_dir_option,
        add_parse_mode_option,
        add_progress_option,
    )
    from chexpercept.domains import COUNT, NON_NEGATIVE, SEED, SHARE
    from chexpercept.entry_point import Stopped, launched_as, program_started, run_program
    from chexpercept.escape import terminal_lines
    from chexpercept.eval.backends import BACKENDS, backend_class
    from chexpercept.eval.backends.options import json_object
    from chexpercept.eval.oracle import ORACLE_CHOICES, PAPER
    from chexpercept.eval.registry import REGISTRY
    from chexpercept.eval.runner.distributed import Distributed
    from chexpercept.eval.runner.execute import EXIT_UNFINISHED, EXPECTED_ERRORS, execute
    from chexpercept.eval.runner.interrupts import RunInterrupted, stop_on_signals
    from chexpercept.eval.runner.outcome import os_error_text, say_end
    from chexpercept.eval.runner.plan import build_plan
    from chexpercept.eval.runner.selection import add_selection_options
    from chexpercept.eval.weights import add_revision_option
    from chexpercept.redaction import redact_text
except ModuleNotFoundError as missing:  # run with a Python where the project is not installed
    sys.exit(
        f"eval/run.py: {missing.name or 'a module'} is not installed in this Python ({sys.executable}): "
        "activate the project's environment first (. .venv/bin/activate, made by bash scripts/demo.sh or "
        "bash scripts/test.sh), or install the project into this one (pip install -e '.[hf]')"
    )

__all__ = ["EXIT_UNFINISHED", "configure", "main", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    _add_run_options(parser)
    _add_selection_options(parser)
    _add_output_options(parser)
    _add_decoding_options(parser)
    _add_backend_options(parser)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what to run")
    add_data_dir_option(g, help="folder of the release bundle (chexpercept.json + chexpercept/)")
    g.add_argument(
        "--model",
        help="registry name (see --list-models), Hugging Face id, local folder, or "
        "baseline:random | baseline:constant:<k> | baseline:prior | baseline:oracle",
    )
    g.add_argument(
        "--backend", choices=BACKENDS, help="default: the registry's backend (required for other models)"
    )
    g.add_argument(
        "--model-id", help="load/send this id or folder instead of the registry's (e.g. a local copy)"
    )
    add_revision_option(g)  # Hub (chexpercept.eval.weights)
    g.add_argument(
        "--oracle",
        nargs="+",
        choices=ORACLE_CHOICES,
        default=[PAPER],
        metavar="SETTING",
        help="oracle setting(s): none, implicit, explicit; several run in turn on one engine, each in its "
        "own folder. paper (default): what the paper's numbers need for this model: implicit for greedy "
        "decoding (it gives End-to-End exactly too), none and implicit for a sampling model (API models)",
    )
    add_parse_mode_option(
        g,
        help="how answers are read during the run, which drives oracle triggers (default: reference)",
        made=False,
    )
    g.add_argument(
        "--on-error",
        choices=("stop", "record"),
        default="stop",
        help="when a request fails (after the backend's retries; or the engine refuses it): stop the run "
        "(finished cases are saved; rerun to resume) or record the case as unfinished in failures.jsonl "
        "and go on with the others (exit status 3; a rerun retries them). Default: stop",
    )
    g.add_argument("--list-models", action="store_true", help="print the model registry and exit")


def _add_selection_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("which cases")
    add_selection_options(g)
    g.add_argument(
        "--check-images",
        choices=[c for c in IMAGE_CHECKS if c != "none"],
        default="basic",
        help="image check before the run (default: basic: exists, parses, not truncated)",
    )


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("output")
    add_output_dir_option(
        g, default="runs", help="results go to DIR/<model>/oracle_<setting>/ (default: runs, in this folder)"
    )
    g.add_argument("--run-name", help="folder name instead of the model's")
    add_progress_option(g)
    g.add_argument(
        "--no-score",
        action="store_true",
        help="do not score the run at the end (by default the model's Table 2 row is printed)",
    )


def _add_decoding_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("decoding")
    g.add_argument(
        "--batch-size",
        type=COUNT,
        help="most conversations live at once; a finished one's slot goes to the next case at once "
        "(backend default otherwise)",
    )
    g.add_argument(
        "--seed",
        type=SEED,
        help="seed for sampling and baseline:random (default 0); the openai backend sends it as the "
        "request's seed field only when given (run.json records none otherwise: the server's own)",
    )
    g.add_argument(
        "--temperature", type=NON_NEGATIVE, help="default: 0 (open models), 1 (API models as in the paper)"
    )
    g.add_argument("--top-p", type=SHARE, help="default 1")
    g.add_argument("--max-tokens", type=COUNT, help="most new tokens per answer (default 8192)")
    g.add_argument(
        "--no-thinking", action="store_true", help="chat_template_kwargs enable_thinking=False (Qwen3.5/3.6)"
    )
    g.add_argument("--chat-template-kwargs", type=json_object, help="extra chat template variables as JSON")


def _add_backend_options(parser: argparse.ArgumentParser) -> None:
    """Each backend's own options (chexpercept.eval.backends), one group per backend in the table's order."""
    for name in BACKENDS:
        backend_class(name).add_options(parser.add_argument_group(f"{name} backend"))


def print_registry() -> None:
    rows = [("name", "backend", "model id", "reference alias")]
    rows += [(s.name, s.backend, s.model_id, s.reference_alias) for s in REGISTRY.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def run(args: argparse.Namespace) -> int:
    """Entry point of ``chexpercept run`` and of this script."""
    if args.list_models:
        print_registry()
        return 0
    missing = [name for name, value in (("--data-dir", args.data_dir), ("--model", args.model)) if not value]
    if missing:
        print(f"chexpercept run: error: {' and '.join(missing)} required", file=sys.stderr)
        return 2
    dist: Distributed | None = None
    status: int | None = None  # the run's own status, once it has one
    try:
        with stop_on_signals() as children:
            try:
                dist = Distributed()  # under accelerate: imports torch, waits for the other processes
                plan, backend = build_plan(args, dist)
                status = execute(plan, backend, dist, children)
            finally:
                if dist is not None:
                    dist.close()  # inside the block: after a stop signal, its grace still bounds this
        return status
    except (RunInterrupted, Stopped) as e:  # execute says how a run ended; this is before or after it
        if status is not None and status >= 128:  # a stop that execute has already told (the
            return status  # launcher's copy of a stop another process said in the work queue)
        if status is None:  # execute says how its cases ended, and a stop after its end
            said = "before any case ran; nothing was written"
        else:
            said = "while its processes were closing; the run itself had ended (see above)"
        print(f"chexpercept run: {launched_as()}stopped by {e.name} {said}", file=sys.stderr)
        return e.exit_status
    except (*EXPECTED_ERRORS, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:  # the system's: its real cause named
            # before the folder was taken: nothing of this command is saved
            what, advice = os_error_text(e, FsPath(args.output_dir), saved=False)
            say_end(None, f"error: {what}", advice)
        elif isinstance(e, EXPECTED_ERRORS):
            print(redact_text(f"chexpercept run: error: {terminal_lines(e)}"), file=sys.stderr)
        else:
            raise
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="eval/run.py", description=__doc__.split("\n\n")[0])
    configure(parser)
    args = parser.parse_args(argv)
    program_started()  # run as a script: a stop signal is now the run's to handle
    return run(args)


if __name__ == "__main__":
    sys.exit(run_program(main))
