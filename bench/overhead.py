"""What the data-protection and long-run guarantees cost a run (issues 27 and 28: "nothing here may slow a
run measurably").

Each guarantee adds work at one place; this script times that work against the operation it guards,
in the same run, on this machine:

- every input a regular file within its size limit (chexpercept.input_files): opening an image through
  ``open_input`` against a plain ``open``;
- JSON bounded in size and depth (chexpercept.input_json): a results line through ``loads`` against
  ``json.loads``;
- every file private from creation, replaced whole (chexpercept.fileio): ``write_atomic`` against a plain
  ``write_text``, and a results append (``append_durable``, which was already fsynced) as it is;
- a resume's identity (eval/runner/identity.py): the fingerprint of the tiny model's folder, and of a
  folder with a 2 GiB weight file (sparse: the fingerprint reads its first and last MiB);
- the shared work queue (eval/runner/work_queue.py): taking one case;
- the peer check (chexpercept/tcp_table.py): finding the owner of a loopback socket, once per new
  connection;
- a whole baseline run of the phantom release (the runner's own work per case, no model).

    python bench/overhead.py [--cases N]

Ratios are against the guarded operation; the absolute times say what a 2,100-case run pays in all.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` calls (in 5 rounds)."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        rounds.append((time.perf_counter() - start) / repeat)
    return sorted(rounds)[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2100, help="cases a run is charged for (default 2,100)")
    args = parser.parse_args(argv)

    from chexpercept.eval.runner.identity import folder_fingerprint
    from chexpercept.eval.runner.work_queue import WorkQueue
    from chexpercept.fileio import append_durable, write_atomic
    from chexpercept.input_files import IMAGE, open_input
    from chexpercept.input_json import loads
    from chexpercept.tcp_table import owner
    from chexpercept.testing import write_fixture_bundle

    rows: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = write_fixture_bundle(work / "bundle", per_cell=1, image_size=1024)
        image = next((bundle / "chexpercept").rglob("*.png"))

        def plain_open() -> None:
            with open(image, "rb") as f:
                f.read(16)

        def checked_open() -> None:
            with open_input(image, IMAGE, what="image") as f:
                f.read(16)

        rows.append(("image opened (regular file, size bound)", per_call(checked_open, 2000),
                     per_call(plain_open, 2000), 5 * args.cases))  # fmt: skip

        line = json.dumps({"key_id": "x", "turns": [{"response": "Answer: 1 " * 60}] * 6, "run": {"f": "y"}})
        rows.append(("results line parsed (size and depth bound)", per_call(lambda: loads(line, source="x"), 2000),
                     per_call(lambda: json.loads(line), 2000), args.cases))  # fmt: skip

        target = work / "out" / "run.json"
        target.parent.mkdir()
        rows.append(("run.json written (private, atomic, fsynced)", per_call(lambda: write_atomic(target, line), 50),
                     per_call(lambda: target.write_text(line), 50), 4))  # fmt: skip
        results = work / "out" / "results.jsonl"
        payload = (line + "\n").encode()
        rows.append(("results line appended (private, locked, fsynced; as before)",
                     per_call(lambda: append_durable(results, payload), 50), float("nan"), args.cases))  # fmt: skip

        tiny = work / "tiny"
        from chexpercept.eval.tiny_model import build_tiny_model

        build_tiny_model(tiny)
        rows.append(("identity: the tiny model's folder fingerprinted", per_call(lambda: folder_fingerprint(tiny), 20),
                     float("nan"), 1))  # fmt: skip
        big = work / "big"
        big.mkdir()
        (big / "config.json").write_text("{}")
        with open(big / "model-00001-of-00001.safetensors", "wb") as f:
            f.truncate(2 << 30)  # sparse 2 GiB
        rows.append(("identity: a folder with a 2 GiB weight file", per_call(lambda: folder_fingerprint(big), 20),
                     float("nan"), 1))  # fmt: skip

        from chexpercept.bundle import read_bundle

        cases = read_bundle(bundle).cases
        queue_file = work / "work-x.queue"

        def take_one() -> None:
            queue_file.unlink(missing_ok=True)
            WorkQueue(queue_file, cases, 0).take()

        rows.append(("work queue: one case taken", per_call(take_one, 500), float("nan"), args.cases))

        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        rows.append(("peer check: owner of a loopback socket (per new connection)",
                     per_call(lambda: owner(("127.0.0.1", port), ("127.0.0.1", 1)), 50), float("nan"), 64))  # fmt: skip
        server.close()

        import subprocess

        command = [sys.executable, str(ROOT / "eval" / "run.py"), "--data-dir", str(bundle), "--model",
                   "baseline:random", "--no-progress", "--no-score"]  # fmt: skip
        start = time.perf_counter()
        subprocess.run([*command, "--output-dir", str(work / "runs")], check=True, capture_output=True)
        whole = time.perf_counter() - start
        n = len(cases)

    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {n} phantom cases in a whole baseline run: {whole:.2f} s "
          f"({1000 * whole / n:.1f} ms per case, the interpreter's start included)\n")  # fmt: skip
    print("| check | time per call | the operation it guards | ratio | calls per run | per run of "
          f"{args.cases:,} cases |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for name, t, base, calls in rows:
        ratio = f"{t / base:.2f}x" if base == base else "-"
        guarded = f"{1e6 * base:,.1f} us" if base == base else "-"
        print(f"| {name} | {1e6 * t:,.1f} us | {guarded} | {ratio} | {calls:,} | {t * calls:.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
