"""The few collective steps a sharded run needs, over accelerate when launched with several processes.

Under ``accelerate launch --num_processes N`` (or torchrun) each process runs its own backend on its
share of the cases; processes only agree on the start (the main process takes the folder's lock and
repairs the results file) and on the end (the main process checks and orders the results). The
coordination group is CPU-only (gloo, ``PartialState(cpu=True)``), so it never competes with a
model for GPU memory and also works on machines without a GPU. A plain ``python eval/run.py``
imports neither torch nor accelerate.
"""

from __future__ import annotations

import os
from typing import Any


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class Distributed:
    """Process index/count, a barrier and a broadcast from the main process."""

    def __init__(self) -> None:
        self.state: Any = None
        self.index = 0
        self.count = 1
        #: this process's index among the processes of its machine, and their number
        self.local_index = 0
        self.local_count = 1
        if launched_world_size() > 1:
            from accelerate import PartialState

            self.state = PartialState(cpu=True)
            self.index = self.state.process_index
            self.count = self.state.num_processes
            self.local_index = self.state.local_process_index
            self.local_count = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or self.count

    @property
    def is_main(self) -> bool:
        return self.index == 0

    @property
    def active(self) -> bool:
        return self.count > 1

    def barrier(self) -> None:
        if self.active:
            self.state.wait_for_everyone()

    def broadcast(self, obj: Any) -> Any:
        """The main process's ``obj`` on every process."""
        if not self.active:
            return obj
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def close(self) -> None:
        if self.active:
            self.state.destroy_process_group()
