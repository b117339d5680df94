"""The worker pool of ``generate``: cases built in-process (num_proc 1) or on a spawn process pool.

Each worker process holds one ``CaseBuilder`` (and so one deformer: a SAM 3 model is loaded once per
worker), created by the pool's initializer from the picklable ``Settings``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context

from chexpercept.eval.runner.interrupts import shielded_children
from chexpercept.stdio import guard_standard_streams

from .case_builder import CaseBuilder, Outcome, Settings
from .case_selection import Queued
from .sources import SourceError

_BUILDER: CaseBuilder | None = None


def _init_worker(settings: Settings) -> None:
    global _BUILDER
    guard_standard_streams()  # the workers share the command's stderr (chexpercept/stdio.py)
    _BUILDER = CaseBuilder(settings)


def _work(queued: Queued) -> Outcome:
    assert _BUILDER is not None
    return _BUILDER.build(queued)


class CaseRunner:
    """Runs batches of cases in-process (num_proc 1) or on a spawn pool (num_proc > 1)."""

    def __init__(self, settings: Settings, num_proc: int):
        self.settings = settings
        self.num_proc = num_proc
        self.pool: ProcessPoolExecutor | None = None
        self.local: CaseBuilder | None = None

    def __enter__(self) -> CaseRunner:
        if self.num_proc > 1:
            self.pool = ProcessPoolExecutor(
                max_workers=self.num_proc,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.settings,),
            )
        else:
            try:
                self.local = CaseBuilder(self.settings)
            except (ImportError, OSError, ValueError) as e:
                raise SourceError(f"cannot build the {self.settings.deformer} deformer: {e}") from e
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def run(self, batch: list[Queued], on_done: Callable[[Outcome], bool]) -> bool:
        """Build every case of the batch, calling on_done(outcome) as each finishes; False to stop early."""
        if self.local is not None:
            return all(on_done(self.local.build(queued)) for queued in batch)
        assert self.pool is not None
        # the pool starts its workers as work is submitted: a terminal's Ctrl-C (and SIGHUP) to the
        # process group reaches the main process only, which stops the pool in order
        with shielded_children():
            pending: set[Future] = {self.pool.submit(_work, q) for q in batch}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                if not on_done(fut.result()):
                    for p in pending:
                        p.cancel()
                    return False
        return True
