"""Every request the runner sends on a fixed bundle, as a hash per call plus a readable excerpt.

The snapshot (tests/data/request_snapshot.json) is checked by tests/test_request_snapshot.py, so that no
change to the engine, the conversation, the oracle texts or the message shape alters a prompt
silently. The bundle is ``write_fixture_bundle(per_cell=1, seed=0)`` (fixed texts, noise images:
nothing in it depends on a numeric library), the answers those of ``baseline:random`` (seed 0), so
that right and wrong answers, and with them every oracle trigger, occur. Images enter each request's
hash by their paths (relative to the bundle); ``images`` records, per image the requests show, the
hash of what each backend makes of its bytes with the toolkit's own code: the openai backend's data
URL, the transformers backend's decoded RGB pixels and those pixels after its fixed resize (56x56,
bicubic: the tiny model's). The vllm backend hands vLLM the file (a file:// URL and the file's
sha256 as its id): its decoding is vLLM's, whose version is part of a local run's identity, as
the file's bytes are (``bundle_images``).

Regenerate after a deliberate change of what is sent (then review the diff of the JSON file):

    python tests/request_snapshot.py --update

The file also records the toolkit's prompt version (``PROMPT_VERSION`` in eval/runner/identity.py), which
every run's identity carries: a resume after the prompts changed is refused. ``--update`` refuses to
record other requests under the same version, so that a change of what is sent cannot forget to
raise it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("data") / "request_snapshot.json"
ORACLES = ("none", "implicit", "explicit")
BASELINE = "baseline:random"


def request_entry(request: Any) -> dict[str, Any]:
    """One call: its identity, the hash of what is sent and an excerpt of the new user turn."""
    sent = {
        "records": [m.as_record() for m in request.messages],
        "openai_messages": request.openai_messages(lambda p: p),
    }
    digest = hashlib.sha256(
        json.dumps(sent, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    ).hexdigest()
    last = request.messages[-1]
    return {
        "key_id": request.key_id,
        "task": request.task,
        "messages": len(request.messages),
        "sha256": digest[:32],
        "excerpt": last.text[:160],
        "images": list(last.images),
    }


def record_requests(root: Path, oracle: str) -> list[dict[str, Any]]:
    """Every request of a run of the baseline over the bundle at ``root``, in (case, turn) order."""
    from chexpercept.bundle import read_bundle
    from chexpercept.eval.backends.baselines import BaselineBackend
    from chexpercept.eval.engine import run_conversations
    from chexpercept.eval.protocol import RunContext

    bundle = read_bundle(root)
    sent: list[dict[str, Any]] = []

    class Recording(BaselineBackend):
        def generate(self, requests: Sequence[Any]) -> list[Any]:
            sent.extend(request_entry(r) for r in requests)
            return super().generate(requests)

    backend = Recording(BASELINE)
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases, seed=0))
    run_conversations(bundle.cases, backend, oracle=oracle, batch_size=7, on_finished=lambda _: None)
    order = {c.key_id: i for i, c in enumerate(bundle.cases)}
    return sorted(sent, key=lambda e: (order[e["key_id"]], e["messages"]))


def image_entries(root: Path, paths: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per image: the sha256 (32 hex) of what each backend's own code makes of its bytes."""
    from types import SimpleNamespace

    from PIL import Image

    from chexpercept.containment import image_data_url
    from chexpercept.eval.backends.transformers.backend import TransformersBackend
    from chexpercept.eval.backends.transformers.image_resize import FixedResize

    def sha(data: bytes | str) -> str:
        return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:32]

    resize = FixedResize(56, 56, int(Image.Resampling.BICUBIC))
    out = {}
    for rel in sorted(set(paths)):
        decoded = TransformersBackend._decode(SimpleNamespace(root=str(root)), rel)  # the backend's decoding
        out[rel] = {
            "openai": sha(image_data_url(root, rel)),
            "transformers": sha(f"{decoded.mode}{decoded.size}".encode() + decoded.tobytes()),
            "transformers_resized": sha(resize.apply(decoded).tobytes()),
        }
    return out


def snapshot() -> dict[str, Any]:
    """The snapshot of every oracle setting, and of the images they show, computed now."""
    from chexpercept.testing import write_fixture_bundle

    with tempfile.TemporaryDirectory() as tmp:
        root = write_fixture_bundle(Path(tmp) / "bundle", per_cell=1, seed=0)
        data: dict[str, Any] = {oracle: record_requests(root, oracle) for oracle in ORACLES}
        data["images"] = image_entries(root, [p for o in ORACLES for e in data[o] for p in e["images"]])
        return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {SNAPSHOT}")
    args = parser.parse_args(argv)
    from chexpercept.eval.runner.identity import PROMPT_VERSION

    data = snapshot()
    stored = json.loads(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.exists() else {}
    same = {o: stored.get(o) for o in (*ORACLES, "images")} == data
    if not args.update:
        print("request snapshot: " + ("unchanged" if same else f"DIFFERS from {SNAPSHOT}"))
        return 0 if same else 1
    first_images = "images" not in stored and {o: stored.get(o) for o in ORACLES} == {
        o: data[o] for o in ORACLES
    }
    if not same and stored.get("prompt_version") == PROMPT_VERSION and not first_images:
        print(
            f"the requests differ from {SNAPSHOT} but PROMPT_VERSION is still {PROMPT_VERSION}: raise it in "
            "eval/runner/identity.py (runs made before the change must not be resumed by this version), then update",
            file=sys.stderr,
        )
        return 1
    SNAPSHOT.write_text(
        json.dumps({"prompt_version": PROMPT_VERSION, **data}, indent=1, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {SNAPSHOT}: " + ", ".join(f"{o} {len(v)} calls" for o, v in data.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
