"""The usual mistakes of an lmms-eval run of CheXpercept, each refused with what to change.

- no release folder given (``CHEXPERCEPT_DATA_DIR`` or ``dataset_kwargs.data_dir``), or a folder
  that is not a release (our bundle reader's own errors, naming where the folder came from);
- a model class that cannot carry a multi-turn conversation: lmms-eval's simple models get one
  prompt string per round with their own system prompt and no earlier turns, and most chat classes
  have no multi-round loop of their own (they raise NotImplementedError or expect the simple
  models' requests); the one that sends the whole conversation as messages every round is its chat
  vLLM model (``lmms_eval.models.chat.vllm.VLLM``, ``--model vllm``);
- a vLLM engine that takes fewer images per prompt (``limit_mm_per_prompt``) than a selected case's
  last turn carries (every turn re-sends the earlier images), which vLLM would otherwise refuse in
  the middle of the run.

The model checks need lmms-eval's model object, which lmms-eval does not hand to a task: its
``evaluate(lm, ...)`` builds each task's requests, so ``evaluating_model`` finds ``lm`` among the
callers of ``build_all_requests``. Where it cannot (another caller), the model checks are skipped
and the answers' shape is still checked when they are scored (scores.py).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from chexpercept.case import Case
from chexpercept.errors import ReleaseNotFoundError
from chexpercept.escape import shell_word, terminal

from . import DATA_DIR_ENV, LMMS_EVAL_VERSION

#: (module, qualified name) of the ``generate_until_multi_round`` implementations that send the
#: task's messages (``doc_to_messages`` with ``round_idx`` and ``previous_output``) every round
MULTI_ROUND_LOOPS = frozenset({("lmms_eval.models.chat.vllm", "VLLM.generate_until_multi_round")})
#: the model to name in errors
SUPPORTED_MODEL = "--model vllm (lmms-eval's chat vLLM model, vllm_chat; not with --force_simple)"


class LmmsEvalSetupError(RuntimeError):
    """The lmms-eval run cannot give CheXpercept's numbers as set up; the message says what to change."""


def check_version(task: str) -> None:
    """Warn when the installed lmms-eval is not the release these tasks are tested against (its
    multi-round protocol and the model checks rest on that release's internals)."""
    import warnings
    from importlib.metadata import version

    installed = version("lmms_eval")
    if installed != LMMS_EVAL_VERSION:
        warnings.warn(
            f"{task}: tested with lmms-eval {LMMS_EVAL_VERSION}, running on {installed}: the answers and "
            "scores have not been checked against our runner on this version (docs/lmms-eval.md)",
            stacklevel=2,
        )


def release_dir(task: str, dataset_kwargs: Mapping[str, Any] | None) -> tuple[str, str]:
    """(folder, where it came from) of the release: ``dataset_kwargs.data_dir``, else the
    environment variable ``CHEXPERCEPT_DATA_DIR``. Raises ReleaseNotFoundError when neither is set."""
    given = (dataset_kwargs or {}).get("data_dir")
    if given:
        return str(given), "dataset_kwargs.data_dir"
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        return env, DATA_DIR_ENV
    raise ReleaseNotFoundError(
        None,
        f"{task}: no CheXpercept release folder given. Set {DATA_DIR_ENV}=/path/to/the/release "
        "(the folder that holds chexpercept.json), or dataset_kwargs: {data_dir: ...} in a YAML "
        "that includes this task's (docs/lmms-eval.md). The data is credentialed: nothing is "
        "downloaded.",
    )


def evaluating_model() -> Any | None:
    """lmms-eval's model object of the evaluation that is building requests now: the ``lm`` of
    ``lmms_eval.evaluator.evaluate``, a caller of ``Task.build_all_requests``; None when it is not
    among the callers."""
    from lmms_eval.api.model import lmms

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("lm")
        if isinstance(candidate, lmms):
            return candidate
        frame = frame.f_back
    return None


def check_not_cached(task: str, build: Mapping[str, Any]) -> None:
    """LmmsEvalSetupError when the evaluation building requests now keeps a response cache
    (``--use_cache``): lmms-eval keys an answer by the model's name and ``--model_args`` string,
    the task's YAML, the case's index and its first question, none of which changes with the model's
    files under the same path or with another release under ``CHEXPERCEPT_DATA_DIR``; a second run
    got the first one's answers (red team, stop 48: 0.667 instead of 0.333 after the weights
    changed, and case by case on another release)."""
    if build.get("cache_requests") or build.get("rewrite_requests_cache"):  # round 2 (helper-54)
        raise LmmsEvalSetupError(
            f"{task}: lmms-eval's request cache (--cache_requests) is on. It keys the built requests by the "
            "task and its arguments, not by the release under CHEXPERCEPT_DATA_DIR: a run built another "
            "release's requests. Run without --cache_requests"
        )
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_locals.get("response_cache") is not None and "lm" in frame.f_locals:
            raise LmmsEvalSetupError(
                f"{task}: lmms-eval's response cache (--use_cache) is on. It keys each answer by the model's "
                "name and --model_args, the task and the case's index, not by the model's files nor the "
                "release, so it would give back answers of other weights or of another release as this "
                "run's. Run without --use_cache"
            )
        frame = frame.f_back


#: the engine's folders of vLLM (its compiled code) that another account must not write to
ENGINE_CACHES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def check_engine_private(task: str, umask: int | None) -> None:
    """LmmsEvalSetupError when the model's engine was started where another account could write to
    what it made: lmms-eval builds the model (vLLM's IPC sockets, its compiled-code caches) before
    any task, so this task's umask 077 comes too late for them (red team, stop 48: under umask 000
    the sockets were srwxrwxrwx and another account connected; the compiled ``*.main.so`` that the
    next run loads were 0777). ``umask``: the one the process started under; a cache folder that
    exists already is checked too."""
    if umask is not None and umask & 0o022 != 0o022:
        raise LmmsEvalSetupError(
            f"{task}: lmms-eval started the model's engine under umask {umask:03o}, which lets other "
            "accounts write to its sockets and its compiled code (which later runs load). Run lmms-eval "
            "under umask 077, e.g. (umask 077; lmms-eval ...)"
        )
    home = os.path.expanduser("~")
    folders = [os.environ.get(name) for name in ENGINE_CACHES]
    folders += [  # the defaults where the variables are not set (vLLM's, Triton's, TorchInductor's)
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "vllm"),
        os.path.join(home, ".triton", "cache"),
        os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"),
    ]
    for folder in filter(None, folders):
        with contextlib.suppress(OSError):
            info = os.stat(folder)
            mode = info.st_mode
            if info.st_uid != os.geteuid():  # its owner may replace anything in it (round 2, helper-54)
                raise LmmsEvalSetupError(
                    f"{task}: {terminal(folder)} (the engine's compiled code, which runs load) belongs to "
                    "another account: point the engine's caches at folders of your own"
                )
            if mode & 0o022:
                raise LmmsEvalSetupError(
                    f"{task}: {terminal(folder)} (the engine's compiled code, which runs load) is writable by other "
                    f"accounts (mode {stat.S_IMODE(mode):03o}): make it yours alone (chmod -R go-w {shell_word(folder)}), "
                    "then run lmms-eval under umask 077"
                )


def _user() -> str:
    """The login name TorchInductor names its default folder after (``getpass.getuser``), or the
    uid where this account has none (a container's)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.geteuid())


def multi_round_problem(lm: Any) -> str | None:
    """Why ``lm`` cannot run a CheXpercept conversation, or None when it can."""
    if getattr(lm, "is_simple", True):
        return (
            "it is one of lmms-eval's simple models, which send one prompt string per round with "
            "their own system prompt and none of the earlier turns"
        )
    method = getattr(type(lm), "generate_until_multi_round", None)
    where = (getattr(method, "__module__", ""), getattr(method, "__qualname__", ""))
    if where not in MULTI_ROUND_LOOPS:
        return (
            f"its generate_until_multi_round ({where[0]}.{where[1]}) is not lmms-eval's message-based "
            "multi-round loop (it raises NotImplementedError or expects the simple models' requests)"
        )
    return None


def check_model(lm: Any, task: str) -> None:
    """Raise LmmsEvalSetupError when ``lm`` cannot run the conversation (see the module docstring)."""
    problem = multi_round_problem(lm)
    if problem is not None:
        cls = type(lm)
        raise LmmsEvalSetupError(
            f"{task}: lmms-eval's model class {cls.__module__}.{cls.__qualname__} cannot run a "
            f"CheXpercept conversation: {problem}. Each round must carry the system message, every "
            f"earlier turn with its images and the oracle's corrections; run it with {SUPPORTED_MODEL}. "
            "See docs/lmms-eval.md."
        )


def model_name(lm: Any) -> str:
    """The model's id as the parser's per-family rules read it (our runner passes its model id)."""
    name = getattr(lm, "model", "")
    return name if isinstance(name, str) else ""


def engine_image_limit(lm: Any) -> int | None:
    """The images per prompt ``lm``'s vLLM engine takes (``limit_mm_per_prompt``), or None where
    ``lm`` has no vLLM engine to ask."""
    try:
        config = lm.client.llm_engine.model_config.multimodal_config
    except AttributeError:
        return None
    limit = getattr(config, "get_limit_per_prompt", None)
    return int(limit("image")) if callable(limit) else None


def images_of(case: Case) -> int:
    """Images a case's last request carries: every turn re-sends the earlier turns' images."""
    return sum(len(turn.images) for turn in case.turns)


def check_image_limit(lm: Any, cases: Sequence[Case], task: str) -> None:
    """Raise LmmsEvalSetupError when a selected case carries more images than the engine takes."""
    limit = engine_image_limit(lm)
    if limit is None or not cases:
        return
    over = [c for c in cases if images_of(c) > limit]
    if not over:
        return
    worst = max(over, key=images_of)
    most = images_of(worst)
    raise LmmsEvalSetupError(
        f"{task}: case {worst.key_id} (route {worst.path.value}) sends {most} images in its last turn "
        f"(every turn re-sends the earlier images), but this vLLM engine takes at most {limit} per "
        f"prompt (limit_mm_per_prompt); {len(over)} of the {len(cases)} selected cases need more. "
        f'Start it with --model_args ...,limit_mm_per_prompt={{"image":{most}}} (docs/lmms-eval.md).'
    )
