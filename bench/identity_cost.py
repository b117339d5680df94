"""What a run's identity costs at each start: whole-file digests of model weights and bundle images.

``python bench/identity_cost.py [--cases 2100] [--gib 2]`` measures, in a private temporary cache:

- sha256 of one weight file read whole (random bytes, just written, so read from the page cache:
  a cold disk is slower, and bounds it then), in MB/s, and the time for a 54 GB model from it;
- ``Bundle.images_fingerprint`` over a phantom bundle of ``--cases`` cases with distinct image
  files: the first start (every image read) and every later start (each image known by its stat).

Writes the "Run identity" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared import write_section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2100)
    parser.add_argument("--gib", type=float, default=2.0, help="size of the weight file hashed (GiB)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["CHEXPERCEPT_CACHE"] = str(work / "cache")
        from chexpercept.bundle import read_bundle
        from chexpercept.eval.runner.identity import folder_fingerprint
        from chexpercept.file_digest import DigestCache
        from chexpercept.testing import write_fixture_bundle

        model = work / "model"
        model.mkdir()
        (model / "config.json").write_text("{}")
        size = int(args.gib * (1 << 30))
        with open(model / "model.safetensors", "wb") as f:
            block = os.urandom(1 << 24)
            for _ in range(size // len(block)):
                f.write(block)
        cache = DigestCache()
        t0, c0 = time.perf_counter(), time.process_time()
        folder_fingerprint(model, cache)
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        folder_fingerprint(model, cache)
        warm_model = time.perf_counter() - t0
        rate, cpu_rate = size / cold / 1e6, size / cold_cpu / 1e6

        per_cell = max(1, round(args.cases / 21))
        bundle = read_bundle(
            write_fixture_bundle(work / "bundle", per_cell=per_cell, seed=0), check_images="none"
        )
        files = [p for p in (bundle.root / "chexpercept").rglob("*") if p.is_file()]
        image_bytes = sum(p.stat().st_size for p in files)
        t0, c0 = time.perf_counter(), time.process_time()
        bundle.images_fingerprint()
        first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        bundle.images_fingerprint()
        later, later_cpu = time.perf_counter() - t0, time.process_time() - c0

    text = f"""## Run identity

`python bench/identity_cost.py --cases {args.cases} --gib {args.gib:g}` (bench/identity_cost.py): whole-file
sha256 digests (chexpercept/file_digest.py) of a model's weights and a bundle's images, with the digest
cache keyed by device, inode, size, mtime and ctime. 2 cores shared with other jobs (load average
{os.getloadavg()[0]:.0f} while measured: times on an idle machine are several times shorter).

Wall time, and in brackets the process's CPU time (what an idle machine would take, page cache
assumed; a cold disk adds its read time):

| what | size | first start | each later start |
| --- | --- | --- | --- |
| one weight file, read whole (page cache) | {args.gib:g} GiB | {cold:.2f} s, {rate:,.0f} MB/s (CPU {cold_cpu:.2f} s, {cpu_rate:,.0f} MB/s) | {warm_model * 1000:.1f} ms |
| a 54 GB model (a Hub snapshot too: read once by content), from the CPU rate | 54 GB | {54e9 / (cpu_rate * 1e6):.0f} s (+ disk) | ms (stat per file) |
| a Hub snapshot (blob names no longer trusted) | its size | read once, as the row above | ms (stat per file) |
| bundle images (`Bundle.images_fingerprint`), phantom | {len(bundle.cases):,} cases, {len(files):,} files, {image_bytes / 1e6:.1f} MB | {first * 1000:.0f} ms (CPU {first_cpu * 1000:.0f} ms) | {later * 1000:.0f} ms (CPU {later_cpu * 1000:.0f} ms) |

The phantom images are small; the release's (about 10,400 files under `chexpercept/`, a few GB)
take their size over the rate above once, then a stat per file as in the last column.
"""
    write_section("## Run identity", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
