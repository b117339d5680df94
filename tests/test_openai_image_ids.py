"""Images sent by id to a vLLM server (eval/backends/openai/image_ids.py), against the fake server
emulating vLLM's processor cache (tests/fake_openai.py, ``vllm=True``): the same conversations and
answers as with every image's pixels on every turn, far fewer bytes, a cache that let an image go
answered by sending the pixels again, and nothing of it towards a server that is not vLLM."""

from __future__ import annotations

import json

from fake_openai import FakeServer, backend_for, conversation_of, run_cases, scripted_reply

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.image_ids import ImageIds, is_cache_miss, served_by_vllm
from chexpercept.eval.run import main
from chexpercept.results import iter_results


def image_parts(server: FakeServer) -> list[dict]:
    return [
        p
        for r in server.requests
        for m in r["body"]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]


def answers(records) -> dict[str, list[str]]:
    return {r.key_id: [t.response for t in r.turns] for r in records}


def run(bundle, **server_options):
    with FakeServer(reply=scripted_reply, **server_options) as server:
        backend = backend_for(server)
        try:
            records = run_cases(backend, bundle, batch_size=8)
            described = backend.describe()
        finally:
            backend.close()
    return server, records, described


def test_a_vllm_server_gets_each_image_once_and_the_same_conversations(fixture_bundle):
    bundle = read_bundle(fixture_bundle, paths=["RR", "RF"])
    plain, plain_records, plain_info = run(bundle)
    by_id, id_records, id_info = run(bundle, vllm=True)
    # what the model saw, turn by turn, is the same; so are the answers
    assert sorted(
        map(json.dumps, map(conversation_of, (by_id.resolve(r["body"]) for r in by_id.requests)))
    ) == sorted(map(json.dumps, map(conversation_of, (r["body"] for r in plain.requests))))
    assert answers(id_records) == answers(plain_records)
    # towards a server that is not vLLM: no ids at all (an OpenAI API would refuse them)
    assert all("uuid" not in p for p in image_parts(plain)) and not plain_info["image_ids"]["used"]
    # towards vLLM: every image's pixels once, later turns by id alone
    parts = image_parts(by_id)
    with_pixels = [p for p in parts if p["image_url"] is not None]
    by_id_only = [p for p in parts if p["image_url"] is None]
    assert all(p["uuid"].startswith("chexpercept-") for p in parts)
    distinct = {i for case in bundle.cases for t in case.turns for i in t.images}
    assert len(with_pixels) == len(distinct) and len({p["uuid"] for p in with_pixels}) == len(distinct)
    assert len(by_id_only) == len(image_parts(plain)) - len(distinct) > 0
    record = id_info["image_ids"]
    assert record["used"] and record["image_parts_by_id"] == len(by_id_only)
    assert record["requests_resent_after_a_cache_miss"] == 0
    assert id_info["request_bytes_sent"] < plain_info["request_bytes_sent"] / 2


def test_an_image_the_server_let_go_is_sent_again_with_its_pixels(fixture_bundle):
    bundle = read_bundle(fixture_bundle, paths=["RR"], lesions=["effusion"])
    plain, plain_records, _ = run(bundle)
    with FakeServer(reply=scripted_reply, vllm=True) as server:
        backend = backend_for(server)
        forgets = iter(range(1, 1000))
        original = server.resolve

        def forgetful(body):  # the cache emptied every third request (a restart, an eviction)
            if next(forgets) % 3 == 0:
                server.held.clear()
            return original(body)

        server.resolve = forgetful
        try:
            records = run_cases(backend, bundle)
            info = backend.describe()["image_ids"]
        finally:
            backend.close()
    assert answers(records) == answers(plain_records)
    assert all(t.error is None for r in records for t in r.turns)
    assert info["requests_resent_after_a_cache_miss"] > 0
    # each refused request was sent once more, with its pixels
    assert len(server.requests) == len(plain.requests) + info["requests_resent_after_a_cache_miss"]


def test_image_ids_off_and_on_are_the_users_to_choose(fixture_bundle, tmp_path):
    """--image-ids off never sends an id, even to vLLM; the option is on the run command."""
    with FakeServer(vllm=True) as server:
        args = ["--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"]
        args += [
            "--base-url",
            server.url,
            "--image-ids",
            "off",
            "--limit",
            "2",
            "--output-dir",
            str(tmp_path),
        ]
        assert main([*args, "--no-progress", "--no-score"]) == 0
    assert image_parts(server) and all("uuid" not in p for p in image_parts(server))
    run_json = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert run_json["backend_settings"]["image_ids"]["mode"] == "off"
    assert len(list(iter_results(tmp_path / "local-vlm" / "oracle_implicit" / "results.jsonl"))) == 2


def test_ids_are_unguessable_outside_the_run_and_stable_within_it():
    a, b = ImageIds("on"), ImageIds("on")
    first = a.id_of("chexpercept/k/x.png")
    assert first == a.id_of("chexpercept/k/x.png") != b.id_of("chexpercept/k/x.png")
    assert len(first) == len("chexpercept-") + 32
    assert a.held(["chexpercept/k/x.png"]) == {}
    a.answered(["chexpercept/k/x.png"])
    assert a.held(["chexpercept/k/x.png"]) == {"chexpercept/k/x.png": first}
    a.missed(["chexpercept/k/x.png"])  # sent again with its pixels: under a new id
    assert a.held(["chexpercept/k/x.png"]) == {} and a.id_of("chexpercept/k/x.png") != first
    a.answered(["chexpercept/k/x.png"])
    a.release(("chexpercept/k/",))
    assert a.held(["chexpercept/k/x.png"]) == {}


def test_what_counts_as_vllm_and_as_a_cache_miss():
    assert served_by_vllm(b'{"data": [{"id": "m", "owned_by": "vllm"}]}')
    assert not served_by_vllm(b'{"data": [{"id": "gpt", "owned_by": "openai"}]}')
    assert not served_by_vllm(b"not json") and not served_by_vllm(b'{"data": "vllm"}')
    assert not served_by_vllm(b'{"data": [{"owned_by": "vllm"}]}' + b" " * (1 << 20))
    assert is_cache_miss(
        400, '{"error": {"message": "Cache miss for image at index 1 but data is not provided."}}'
    )
    assert is_cache_miss(500, "Multi-modal items ['x'] are not in the receiver (P1) cache and no data")
    assert not is_cache_miss(200, "Cache miss for image") and not is_cache_miss(400, "bad request")
