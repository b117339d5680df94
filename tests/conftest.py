"""Shared test setup: offline Hugging Face caches inside a temporary folder, small fixture bundles."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from chexpercept.testing import write_fixture_bundle


def pytest_configure(config: pytest.Config) -> None:
    # Never touch ~/.cache or the network from tests.
    base = os.environ.get("CHEXPERCEPT_TEST_HF_HOME")
    if not base:
        import tempfile

        base = tempfile.mkdtemp(prefix="chexpercept-hf-")
        os.environ["CHEXPERCEPT_TEST_HF_HOME"] = base
    os.environ["HF_HOME"] = base
    os.environ["HF_DATASETS_CACHE"] = os.path.join(base, "datasets")
    os.environ["CHEXPERCEPT_CACHE"] = os.path.join(base, "chexpercept")  # file digests (file_digest.py)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Python's own stdout is buffered in a user's shell; CI and IDEs often set PYTHONUNBUFFERED,
    # which hid that a program's last flush to a reader that went away ended in status 120.
    os.environ.pop("PYTHONUNBUFFERED", None)
    start_children_as_a_terminal_would(config)


#: stop signals that a suite's launcher may leave ignored: ``nohup`` (hangup), a background job of a
#: non-interactive shell (Ctrl-C, Ctrl-\\), ``trap '' TERM``
STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
#: key of xdist's ``workerinput``: the stop signals the suite was started with ignored (its workers
#: start without them ignored, from a process that holds handlers instead)
LAUNCH_IGNORED = "chexpercept_launch_ignored"
_LAUNCH_IGNORED_KEY = pytest.StashKey[list]()


def _still_ignored(signum: int, frame: object) -> None:
    """The suite's own processes go on ignoring what its launcher had them ignore."""


def start_children_as_a_terminal_would(config: pytest.Config) -> None:
    """Every program a test starts gets the stop signals at their defaults, as a shell in the
    foreground leaves them, however the suite itself was started.

    An ignored signal is inherited across ``exec``, and the runner rightly keeps a signal its user
    ignored ignored (``chexpercept.entry_point``), so under ``nohup pytest`` a test that sends a
    hangup would find its program deaf to it. A handler is not inherited across ``exec``: the suite's
    process and its xdist workers (told through ``workerinput``) replace each stop signal the
    launcher left ignored with a handler that does nothing. They still ignore it; the programs the
    tests start do not (a test that wants a signal ignored in its child sets that in the child, with
    ``preexec_fn``). The price: a real hangup now reaches those programs, so a suite meant to outlive
    its terminal is started with ``setsid`` (docs/testing.md). Children made by ``fork`` alone
    (multiprocessing) keep the do-nothing handler."""
    if threading.current_thread() is not threading.main_thread():  # xdist < 3.6 configures workers
        return  # off the main thread, where no handler can be set
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        ignored = set(worker.get(LAUNCH_IGNORED, ()))
    else:
        ignored = {int(s) for s in STOP_SIGNALS if signal.getsignal(s) is signal.SIG_IGN}
        config.stash[_LAUNCH_IGNORED_KEY] = sorted(ignored)
    for signum in ignored:
        signal.signal(signum, _still_ignored)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist (``node``: its WorkerController): each worker learns which stop signals the suite was
    started with ignored."""
    node.workerinput[LAUNCH_IGNORED] = node.config.stash.get(_LAUNCH_IGNORED_KEY, [])


@pytest.fixture(scope="session")
def fixture_bundle(tmp_path_factory: pytest.TempPathFactory):
    """A format-valid bundle, one case per (lesion, path) cell, 32x32 noise images (read-only!)."""
    return write_fixture_bundle(tmp_path_factory.mktemp("fixture_bundle"), per_cell=1, seed=0)


@pytest.fixture(scope="session")
def phantom_bundle(tmp_path_factory: pytest.TempPathFactory):
    """``chexpercept synth --per-cell 1 --seed 0``: 21 phantom cases through the generation pipeline (read-only!)."""
    from chexpercept.builder.synth import synthesize

    out = tmp_path_factory.mktemp("phantom") / "bundle"
    synthesize(out, per_cell=1, seed=0)
    return out


@pytest.fixture
def fresh_bundle(tmp_path):
    """A writable fixture bundle for tests that damage it."""
    return write_fixture_bundle(tmp_path / "bundle", per_cell=1, seed=1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    """``chexpercept make-tiny-model``: the tiny random Gemma3 VLM (read-only!)."""
    from chexpercept.cli import main as cli

    out = tmp_path_factory.mktemp("tiny") / "tiny-vlm"
    assert cli(["make-tiny-model", "--output-dir", str(out)]) == 0
    return out
