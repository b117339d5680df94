"""No change alters a prompt silently: every request the runner sends, against the committed snapshot."""

from __future__ import annotations

import json

from request_snapshot import ORACLES, SNAPSHOT, snapshot

from chexpercept.eval.runner.identity import PROMPT_VERSION


def test_every_request_equals_the_committed_snapshot():
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    now = snapshot()
    assert set(now) == {*ORACLES, "images", "messy"}
    assert expected["prompt_version"] == PROMPT_VERSION, (
        "the snapshot was recorded under another PROMPT_VERSION: run python tests/request_snapshot.py --update"
    )
    for oracle in ORACLES:
        before = {(e["key_id"], e["messages"]): e for e in expected[oracle]}
        after = {(e["key_id"], e["messages"]): e for e in now[oracle]}
        assert before.keys() == after.keys(), f"oracle {oracle}: other calls than the snapshot's"
        changed = [k for k in before if before[k] != after[k]]
        assert not changed, (
            f"oracle {oracle}: {len(changed)} request(s) differ from tests/data/request_snapshot.json, "
            f"e.g. {changed[0]}: {before[changed[0]]} -> {after[changed[0]]}. If the change is meant, "
            "raise PROMPT_VERSION in eval/runner/identity.py (a run made before it must not be resumed after it), "
            "run python tests/request_snapshot.py --update and review the diff."
        )


def test_the_snapshot_covers_every_oracle_text():
    data = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    # the explicit setting prepends oracle texts the none setting never sends; the implicit setting
    # sends the same user turns as none but patched histories
    explicit = {e["excerpt"] for e in data["explicit"]}
    plain = {e["excerpt"] for e in data["none"]}
    assert explicit - plain
    assert {e["sha256"] for e in data["implicit"]} - {e["sha256"] for e in data["none"]}
    assert len(data["none"]) == len(data["implicit"]) == len(data["explicit"])


def test_changed_requests_cannot_be_recorded_under_the_same_prompt_version(monkeypatch, tmp_path):
    """A change of what is sent must raise PROMPT_VERSION, which resumes check: --update refuses."""
    import request_snapshot

    import chexpercept.eval.conversation as conversation

    copy = tmp_path / "snapshot.json"
    copy.write_bytes(SNAPSHOT.read_bytes())
    monkeypatch.setattr(request_snapshot, "SNAPSHOT", copy)
    monkeypatch.setattr(conversation, "SYSTEM_MESSAGE", conversation.SYSTEM_MESSAGE + " Be brief.")
    assert request_snapshot.main(["--update"]) == 1
    assert copy.read_bytes() == SNAPSHOT.read_bytes()


def test_what_each_backend_makes_of_the_image_bytes_equals_the_snapshot():
    """Image handling is under PROMPT_VERSION too: the openai backend's data URLs and the
    transformers backend's decoded and resized pixels of every image the requests show."""
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))["images"]
    now = snapshot()["images"]
    assert now.keys() == expected.keys()
    changed = [p for p in now if now[p] != expected[p]]
    assert not changed, (
        f"{len(changed)} image(s) reach a backend otherwise than tests/data/request_snapshot.json records, "
        f"e.g. {changed[0]}: {expected[changed[0]]} -> {now[changed[0]]}. If the change is meant, raise "
        "PROMPT_VERSION in eval/runner/identity.py, run python tests/request_snapshot.py --update and review."
    )


def test_how_real_replies_are_read_equals_the_committed_snapshot():
    """The parser and the conversation's reading of replies decide every later request (the
    oracle's triggers, the patched histories), so they are under PROMPT_VERSION as the prompts are:
    conversations answered in messy real-style ways (request_snapshot.MESSY), read in every parse
    mode, against the snapshot. A parser change that kept the prompts was resumed beside answers
    read the old way (red team, stop 44)."""
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))["messy"]
    now = snapshot()["messy"]
    assert set(now) == set(expected)
    for key in expected:
        assert now[key] == expected[key], (
            f"{key}: the replies are read otherwise than in tests/data/request_snapshot.json. If the change "
            "is meant, raise PROMPT_VERSION in eval/runner/identity.py, run python tests/request_snapshot.py "
            "--update and review the diff."
        )


def test_a_parser_change_cannot_be_recorded_under_the_same_prompt_version(monkeypatch, tmp_path):
    import re

    import request_snapshot

    import chexpercept.answers as answers

    copy = tmp_path / "snapshot.json"
    copy.write_bytes(SNAPSHOT.read_bytes())
    monkeypatch.setattr(request_snapshot, "SNAPSHOT", copy)
    monkeypatch.setattr(answers, "_ANSWER", re.compile(r"ANSWER\s*:\s*(\d+)"))  # case-sensitive now
    answers._parse_cached.cache_clear()  # parses are memoised
    try:
        assert request_snapshot.main(["--update"]) == 1
    finally:
        answers._parse_cached.cache_clear()
    assert copy.read_bytes() == SNAPSHOT.read_bytes()
