"""Benchmark: building the ``sequences`` config vs a baseline that decodes and re-encodes every image.

Each measurement runs in a fresh subprocess (own datasets cache) so that wall time and peak RSS
(VmHWM of the child, see shared.PEAK) are those of one build. The bundle has the release's format and 1024x1024
radiograph-like PNGs (hard-linked from a small pool so a large bundle is quick to write; each file
is still opened, and by the baseline decoded and re-encoded, on its own).

    python bench/load_bundle.py                      # 2,100 cases, baseline on all of them
    python bench/load_bundle.py --baseline-cases 210 # faster: baseline on a stratified subset, scaled
    python bench/load_bundle.py --bundle DIR         # an existing bundle (e.g. chexpercept synth output)
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from pathlib import Path

from shared import PEAK, run_child

OURS = PEAK + textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import chexpercept, datasets
    t1 = time.perf_counter()
    ds = datasets.load_dataset("chexpercept", data_dir=sys.argv[1], cache_dir=sys.argv[2])["train"]
    t2 = time.perf_counter()
    rss = peak_mib()
    turns = ds.data.column("turns").to_pylist()  # arrow values: counts images without decoding them
    n_images = ds.num_rows + sum(len(t["images"]) for case in turns for t in case)
    print(json.dumps({"rows": ds.num_rows, "seconds": t2 - t1, "import_seconds": t1 - t0,
                      "images": n_images, "peak_rss_mib": rss}))
    """
)

BASELINE = PEAK + textwrap.dedent(
    """
    import json, sys, time
    import datasets
    from PIL import Image
    import chexpercept
    from chexpercept_dataset import Chexpercept
    t1 = time.perf_counter()
    bundle = chexpercept.read_bundle(sys.argv[1])
    limit = int(sys.argv[3])
    cases = bundle.cases if limit <= 0 else bundle.cases[:: max(1, len(bundle.cases) // limit)][:limit]
    features = Chexpercept(config_name="sequences").info.features

    def load(rel):  # the naive way: decode every image into memory, let datasets re-encode it
        im = Image.open(bundle.abspath(rel)); im.load(); return im

    def gen():
        for c in cases:
            turns = []
            for t in c.turns:
                row = t.as_dict(); row["images"] = [load(r) for r in t.images]; turns.append(row)
            yield {"key_id": c.key_id, "lesion": c.lesion, "path": c.path.value, "dicom_id": c.dicom_id,
                   "image": load(c.cxr_image), "turns": turns}

    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=sys.argv[2])
    t2 = time.perf_counter()
    print(json.dumps({"rows": ds.num_rows, "seconds": t2 - t1, "peak_rss_mib": peak_mib()}))
    """
)


def _make_bundle(root: Path, per_cell: int) -> Path:
    from chexpercept.testing import write_fixture_bundle

    return write_fixture_bundle(
        root, per_cell=per_cell, seed=0, image_size=1024, image_style="smooth", image_pool=16
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, help="existing bundle (default: write a 2,100-case bundle)")
    parser.add_argument("--per-cell", type=int, default=100, help="cases per (lesion, path) when writing one")
    parser.add_argument(
        "--baseline-cases", type=int, default=0, help="baseline on a subset of N cases (0 = all)"
    )
    parser.add_argument(
        "--rss-sizes", default="10,300", help="extra per-cell sizes for the peak-RSS scaling check"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="chexpercept-bench-") as tmp:
        tmp = Path(tmp)
        bundle = args.bundle or _make_bundle(tmp / "bundle", args.per_cell)
        ours = run_child(OURS, str(bundle), str(tmp / "cache_ours"))
        base = run_child(BASELINE, str(bundle), str(tmp / "cache_base"), str(args.baseline_cases))
        per_case_base = base["seconds"] / base["rows"]
        base_full = per_case_base * ours["rows"]
        print(f"bundle: {bundle} ({ours['rows']} cases, {ours['images']} images)")
        print(
            f"ours:     {ours['seconds']:.2f} s  ({ours['rows'] / ours['seconds']:.0f} cases/s), peak RSS {ours['peak_rss_mib']:.0f} MiB"
        )
        scaled = "" if base["rows"] == ours["rows"] else f" (measured on {base['rows']} cases, scaled)"
        print(f"baseline: {base_full:.2f} s{scaled}, peak RSS {base['peak_rss_mib']:.0f} MiB")
        print(f"speed-up: {base_full / ours['seconds']:.1f}x")
        if not args.bundle:
            for per_cell in (int(x) for x in args.rss_sizes.split(",") if x):
                b = _make_bundle(tmp / f"bundle_{per_cell}", per_cell)
                r = run_child(OURS, str(b), str(tmp / f"cache_{per_cell}"))
                print(
                    f"scaling: {r['rows']:>5} cases -> {r['seconds']:.2f} s, peak RSS {r['peak_rss_mib']:.0f} MiB"
                )


if __name__ == "__main__":
    main()
