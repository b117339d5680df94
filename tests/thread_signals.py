"""Sending a signal to one thread of another process (Linux ``tgkill``): the kernel gives a
process's signal to any thread that does not block it, and which one it picks is chance; these
tests pick it."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

#: tgkill's system call number by machine (Linux)
TGKILL = {"x86_64": 234, "aarch64": 131}


def can_pick_a_thread() -> bool:
    return os.uname().machine in TGKILL and Path("/proc/self/task").is_dir()


def blocked(pid: int, tid: int) -> int:
    """The thread's blocked-signal mask (``SigBlk``), from /proc."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigBlk for thread {tid} of {pid}")


def other_threads(pid: int, signum: int) -> list[int]:
    """The threads of ``pid`` but its main thread that do not block ``signum``."""
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    out = []
    for tid in tids:
        try:
            if not blocked(pid, tid) >> (signum - 1) & 1:
                out.append(tid)
        except OSError:  # the thread ended meanwhile
            continue
    return out


def send_to_thread(pid: int, tid: int, signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(TGKILL[os.uname().machine], pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum})")
