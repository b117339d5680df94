"""The few collective steps a sharded run needs, over accelerate when launched with several processes.

Under ``accelerate launch --num_processes N`` (or torchrun) each process runs its own backend on its
share of the cases; processes only agree on the start (the main process takes the folder's lock and
repairs the results file) and on the end (the main process checks and orders the results). The
coordination group is CPU-only (gloo, ``PartialState(cpu=True)``), so it never competes with a
model for GPU memory and also works on machines without a GPU. A plain ``python eval/run.py``
imports neither torch nor accelerate.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chexpercept.entry_point import stop_at_once_while
from chexpercept.escape import terminal
from chexpercept.input_files import TEXT_FILE, read_input_text

#: seconds the processes of a run wait for each other at the start (CHEXPERCEPT_COORDINATION_TIMEOUT)
COORDINATION_TIMEOUT = 7 * 24 * 3600


def coordination_timeout() -> float:
    return float(os.environ.get("CHEXPERCEPT_COORDINATION_TIMEOUT") or COORDINATION_TIMEOUT)


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _parent(what: str) -> list[str] | None:
    """The launcher's (parent process's) command line or environment as NUL-separated items, where
    the system shows them (Linux: /proc); None elsewhere."""
    try:
        with open(f"/proc/{os.getppid()}/{what}", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _asked(command: Sequence[str], *names: str) -> str | None:
    """The value of the first option among ``names`` in ``command`` (``--x N`` or ``--x=N``)."""
    for i, arg in enumerate(command):
        for name in names:
            if arg == name and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _config_processes(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """num_processes in the accelerate config the launch read (--config_file, else the default one)."""
    path = _asked(command, "--config_file", "--config-file")
    if path is None:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        path = os.path.join(os.path.expanduser(home), "accelerate", "default_config.yaml")
    try:
        import yaml

        text = read_input_text(path, TEXT_FILE, what="accelerate config")  # bounded, never a FIFO
        value = (yaml.safe_load(text) or {}).get("num_processes")
    except Exception:  # no config, or not readable: nothing to add
        return None
    return str(value) if value is not None else None


def _more_than_one(value: str | None) -> bool:
    return value is not None and value.isdigit() and int(value) > 1


def launch_mismatch(
    environ: Mapping[str, str] | None = None,
    parent: Sequence[str] | None = None,
    parent_environ: Mapping[str, str] | None = None,
) -> str | None:
    """A warning when ``accelerate launch`` was asked for several processes (``--num_processes N``
    or machines, on the command line or in accelerate's config) but started one: accelerate's simple
    launcher, which it picks without ``--multi_gpu`` on a machine without GPUs (and always with
    ``--cpu``), runs one process and ignores the number. None when the launch gave what was asked,
    or this is no accelerate launch. ``environ``, ``parent`` (the launcher's command line) and
    ``parent_environ`` (its environment) are read from the system when not given."""
    env = os.environ if environ is None else environ
    if "ACCELERATE_MIXED_PRECISION" not in env or int(env.get("WORLD_SIZE", "1") or 1) > 1:
        return None  # not launched by accelerate, or launched with several processes
    command = (_parent("cmdline") or []) if parent is None else list(parent)
    if parent_environ is None:
        items = _parent("environ")
        parent_environ = dict(i.split("=", 1) for i in items if "=" in i) if items is not None else None
    asked = _asked(command, "--num_processes", "--num-processes")
    machines = _asked(command, "--num_machines", "--num-machines")
    # the simple launcher sets MASTER_PORT for its single process exactly when the command line or
    # the config asked for more than one process or machine
    set_by_launcher = (
        "MASTER_PORT" in env and parent_environ is not None and "MASTER_PORT" not in parent_environ
    )
    if not (_more_than_one(asked) or _more_than_one(machines) or set_by_launcher):
        return None
    asked = asked or _config_processes(command, env)
    what = f"{asked} processes" if _more_than_one(asked) else "several processes"
    return (
        f"accelerate launch was asked for {what} but started one (accelerate's simple launcher: without "
        "--multi_gpu, or a config with distributed_type MULTI_GPU or MULTI_CPU, it runs a single process "
        "on a machine without GPUs, and --cpu always does). This run uses 1 process (run.json "
        "num_processes: 1). For N processes on CPUs or GPUs: accelerate launch --multi_gpu "
        "--num_processes N eval/run.py ... (they coordinate over gloo, so no GPU is needed)."
    )


@contextlib.contextmanager
def _peers_lost() -> Iterator[None]:
    """torch's error when another process of the run has gone (it ended with its own error, on this
    machine or another) as one line, not a traceback of torch's: ValueError."""
    try:
        yield
    except RuntimeError as e:  # gloo's "Connection closed by peer", torch's DistNetworkError, a timeout
        first = " ".join(str(e).split())[:200]
        raise ValueError(
            "another process of the run ended before the processes met (stopped, or an error: its own "
            f"output, on its machine, says which), so this one stops too (torch: {first})"
        ) from None


class Distributed:
    """Process index/count, a barrier and a broadcast from the main process."""

    def __init__(self) -> None:
        self.state: Any = None
        self.index = 0
        self.count = 1
        #: this process's index among the processes of its machine, and their number
        self.local_index = 0
        self.local_count = 1
        #: why this launch runs fewer processes than were asked for (printed on stderr), or None
        self.mismatch = launch_mismatch()
        if self.mismatch:
            print(f"warning: {terminal(self.mismatch)}", file=sys.stderr)
        if launched_world_size() > 1:
            from accelerate import PartialState

            # the processes meet only at the start (while the main process fetches weights or counts
            # tokens, which may take long); the work itself is shared through files (work_queue.py)
            wait = datetime.timedelta(seconds=coordination_timeout())
            # a C wait; a peer that goes while they meet is one line, not torch's traceback (red team,
            # stop 47: DistNetworkError "Failed to recv" from a stop on the other machine)
            with stop_at_once_while("waiting for the run's other processes to start"), _peers_lost():
                self.state = PartialState(cpu=True, timeout=wait)
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
        """The main process's ``obj`` (JSON: a tuple arrives as a list) on every process, sent as
        JSON text, never pickled: the processes meet over TCP (torch's store and gloo) that any local
        account can connect to, and accelerate's ``broadcast_object_list`` unpickled what arrived,
        which runs code of the sender's choosing (red team, stop 43). ValueError for an object JSON
        cannot hold."""
        if not self.active:
            return obj
        import torch
        import torch.distributed as td

        data = json.dumps(obj, allow_nan=False).encode("utf-8") if self.is_main else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        with _peers_lost():
            td.broadcast(size, src=0)
            if self.is_main:
                payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            else:
                payload = torch.empty(int(size.item()), dtype=torch.uint8)
            td.broadcast(payload, src=0)
        from chexpercept.input_json import loads

        return loads(payload.numpy().tobytes(), source="the main process's broadcast")

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in process order, on every process; sent as JSON text, never
        pickled (see ``broadcast``). ValueError for an object JSON cannot hold."""
        if not self.active:
            return [obj]
        import torch
        import torch.distributed as td

        data = json.dumps(obj, allow_nan=False).encode("utf-8")
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.count)]
        with _peers_lost():
            td.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
            longest = max(int(s.item()) for s in sizes)
            mine = torch.zeros(longest, dtype=torch.uint8)
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
            payloads = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.count)]
            td.all_gather(payloads, mine)
        from chexpercept.input_json import loads

        return [
            loads(p[: int(s.item())].numpy().tobytes(), source=f"process {i}'s part of a gather")
            for i, (p, s) in enumerate(zip(payloads, sizes))
        ]

    def close(self) -> None:
        if self.active:
            self.state.destroy_process_group()
