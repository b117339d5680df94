"""What the bench/ scripts share: a measured child process, its peak memory, the RESULTS.md writer.

The scripts run as ``python bench/<name>.py``, so this folder is on sys.path and they import it as
``shared``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
_TITLE = "# Benchmark results (numbers measured by the scripts in bench/)\n"

#: child-side code defining peak_mib(): the high-water mark of this process image (VmHWM). Not
#: ru_maxrss: Linux keeps that across fork+exec, so a child would report its parent's size.
PEAK = (
    "def peak_mib():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1]) / 1024\n"
)


def run_child(code: str, *args: str) -> dict:
    """Run ``python -c code args`` offline in a fresh process; its last stdout line is JSON.

    Returns that JSON with ``wall`` (seconds, start-up and imports included) added.
    """
    env = {
        **os.environ,
        "MPLBACKEND": "Agg",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    }
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - start
    return result


def write_section(section: str, text: str) -> None:
    """Replace the ``section`` heading's part of bench/RESULTS.md with ``text`` (or append it)."""
    current = RESULTS.read_text(encoding="utf-8") if RESULTS.is_file() else _TITLE
    start = current.find(section + "\n")
    if start == -1:
        new = current.rstrip("\n") + "\n\n" + text
    else:
        nxt = current.find("\n## ", start + len(section))
        new = current[:start] + text + (current[nxt + 1 :] if nxt != -1 else "")
    RESULTS.write_text(new.rstrip("\n") + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")
