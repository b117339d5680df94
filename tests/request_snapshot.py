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
the file's bytes are (``bundle_images``). ``messy`` records the same conversations answered in
messy real-style ways (``MESSY``) and read in every parse mode: each call's hash and how each turn's
reply was read, so that a change to the parser is under the same version as the prompts.

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


#: how a model's reply may put the baseline's answer (``{a}``: "1" or "1, 3"): the parser reads each
#: differently, or not at all, and what it reads decides the oracle's triggers and the histories
MESSY = (
    "Answer: {a}",
    "**Answer:** {a}",
    "answer:{a}\n",
    "The answer is {a}.",
    "Final answer: \\boxed{{{a}}}",
    "<think>Option 2 looks likely, but</think>\nAnswer: {a}",
    "<think>still thinking about {a}",
    "{a}",
    "Answer: ({a})",
    "I think it is {a} or maybe 2.",
    "Answer: None",
    "",
    "I cannot determine this from the image.",
    "Answer: {a}<end_of_turn>",
    "Option {a}, because the opacity is in the lower lobe. Answer: {a}",
    # red team, stop 44: forms whose reading the first MESSY did not pin down
    "Answer: 2\nWait, let me look again. Answer: {a}",  # the last statement, not the first
    "The final answer is {a}",
    "Answer: ({a}) Yes",
    "{a}. No",
    "Answer: $\\text{{{a}}}$",
    "Answer: $ {a} $",
    "Answer: {wide}",  # full-width digits
    "Answer\uff1a{a}",  # a full-width colon (read through NFKC)
    "Answer: {joined}",  # "1 and 3"
    "Answer: {amp}",  # "1 & 3"
    "<|begin_of_box|>{a}<|end_of_box|>",  # GLM's answer box (read under a GLM model's name)
)
#: how a reply may list several options (a multi-select answer)
MULTI = ("Answer: {joined}", "Answer: {amp}", "Answer: [{a}]", "The answers are {a}")
#: replies whose text, whole text and refusal differ (``Response.full_text``, ``Response.refusal``):
#: the parser reads the whole text, and a refusal is an answer scored as unparsed
SPECIAL = (
    ("", "<think>it could be 2</think>Answer: {a}", None),  # the answer in the whole text alone
    ("Answer: 2", "<think>unsure</think>Answer: {a}", None),  # the whole text says otherwise
    ("Answer: {a}", None, "declined by the content filter"),  # a refusal, whatever its text says
)
#: the parse modes the conversations are read with
PARSE_MODES = ("reference", "strict")


def record_parses(root: Path, oracle: str, parse_mode: str, model: str = "") -> list[dict[str, Any]]:
    """Every call of the conversations answered in ``MESSY``'s ways (one per case and turn, fixed),
    and how each turn's reply was read: what the parser and the conversation make of real replies,
    which decides every later request (the oracle's triggers, the patched histories), under the
    snapshot as the prompts are."""
    from chexpercept.bundle import read_bundle
    from chexpercept.eval.backends.baselines import BaselineBackend
    from chexpercept.eval.engine import run_conversations
    from chexpercept.eval.protocol import Response, RunContext

    bundle = read_bundle(root)
    sent: list[dict[str, Any]] = []
    read: list[dict[str, Any]] = []

    class Messy(BaselineBackend):
        def generate(self, requests: Sequence[Any]) -> list[Any]:
            for r in requests:  # the call's hash alone: its text is the snapshot's above
                entry = request_entry(r)
                sent.append({k: entry[k] for k in ("key_id", "task", "messages", "sha256")})
            out = []
            for request, answer in zip(requests, super().generate(requests)):
                digest = hashlib.sha256(f"{request.key_id}\0{request.task}".encode()).digest()
                kind, pick = digest[0], digest[1]  # two bytes: every form can meet every reply kind
                given = answer.text.split(":", 1)[1].strip()
                forms = {
                    "a": given,
                    "wide": given.translate({ord(d): 0xFF10 + int(d) for d in "0123456789"}),
                    "joined": " and ".join(x.strip() for x in given.split(",")),
                    "amp": " & ".join(x.strip() for x in given.split(",")),
                }
                if "," in given and kind % 2:  # half the multi-select answers in a list's other spellings
                    out.append(Response(MULTI[pick % len(MULTI)].format(**forms)))
                elif kind % 5 == 4:  # one reply in five carries a whole text or a refusal of its own
                    text, full, refusal = SPECIAL[pick % len(SPECIAL)]
                    out.append(
                        Response(
                            text.format(**forms), full_text=full and full.format(**forms), refusal=refusal
                        )
                    )
                else:
                    out.append(Response(MESSY[pick % len(MESSY)].format(**forms)))
            return out

    def finished(results: Sequence[Any]) -> None:
        for r in results:
            for t in r.turns:
                entry = {"key_id": r.key_id, "task": t.task, "parsed": t.parsed, "status": t.parse_status}
                read.append({**entry, "correct": t.correct, "patched_to": t.patched_to})

    backend = Messy(BASELINE)
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases, seed=0))
    run_conversations(
        bundle.cases,
        backend,
        oracle=oracle,
        parse_mode=parse_mode,
        model=model,
        batch_size=7,
        on_finished=finished,
    )
    order = {c.key_id: i for i, c in enumerate(bundle.cases)}
    return [
        {"calls": sorted(sent, key=lambda e: (order[e["key_id"]], e["messages"]))},
        {"turns": sorted(read, key=lambda e: (order[e["key_id"]], e["task"]))},
    ]


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
        data["messy"] = {
            f"{oracle}/{mode}": record_parses(root, oracle, mode)
            for oracle in ORACLES
            for mode in PARSE_MODES
        }
        # a model-specific reading: GLM's answer box is unwrapped under a GLM model's name only
        data["messy"]["none/reference/glm"] = record_parses(root, "none", "reference", model="glm-4.5v")
        return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {SNAPSHOT}")
    args = parser.parse_args(argv)
    from chexpercept.eval.runner.identity import PROMPT_VERSION

    data = snapshot()
    stored = json.loads(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.exists() else {}
    same = {o: stored.get(o) for o in (*ORACLES, "images", "messy")} == data
    if not args.update:
        print("request snapshot: " + ("unchanged" if same else f"DIFFERS from {SNAPSHOT}"))
        return 0 if same else 1
    # a part added to the snapshot is recorded once under the version it describes
    new_part_only = all(stored.get(o) == data[o] for o in ORACLES) and all(
        part not in stored or stored[part] == data[part] for part in ("images", "messy")
    )
    if not same and stored.get("prompt_version") == PROMPT_VERSION and not new_part_only:
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
