"""Images sent by id to a vLLM server (eval/backends/openai/image_ids.py), against the fake server
emulating vLLM's processor cache (tests/fake_openai.py, ``vllm=True``): the same conversations and
answers as with every image's pixels on every turn, far fewer bytes, a cache that let an image go
answered by sending the pixels again, and nothing of it towards a server that is not vLLM."""

from __future__ import annotations

import json

from fake_openai import FakeServer, backend_for, conversation_of, run_cases, scripted_reply

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.image_ids import ImageIds, is_cache_miss, refuses_ids, why_not_vllm
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import RunContext
from chexpercept.eval.run import main
from chexpercept.results import iter_results


def image_parts(server: FakeServer) -> list[dict]:
    return [p for r in server.requests for p in image_parts_of(r)]


def answers(records) -> dict[str, list[str]]:
    return {r.key_id: [t.response for t in r.turns] for r in records}


def run(bundle, *, prepare=None, image_ids="auto", batch_size=8, **server_options):
    """(the server, the records, the backend's run.json record) of ``bundle`` through the openai
    backend against a fake server; ``prepare(server)`` sets the server up before the first request."""
    with FakeServer(reply=scripted_reply, **server_options) as server:
        if prepare is not None:
            prepare(server)
        backend = backend_for(server, image_ids=image_ids)
        try:
            records = run_cases(backend, bundle, batch_size=batch_size)
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
    forgets = iter(range(1, 1000))

    def forgetful(server):
        original = server.resolve

        def resolve(body):  # the cache emptied every third request (a restart, an eviction)
            if next(forgets) % 3 == 0:
                server.held.clear()
            return original(body)

        server.resolve = resolve

    server, records, described = run(bundle, prepare=forgetful, batch_size=64, vllm=True)
    info = described["image_ids"]
    assert answers(records) == answers(plain_records)
    assert all(t.error is None for r in records for t in r.turns)
    assert info["requests_resent_after_a_cache_miss"] > 0
    # each refused request was sent once more, with its pixels
    assert len(server.requests) == len(plain.requests) + info["requests_resent_after_a_cache_miss"]


def test_an_image_the_server_holds_is_not_kept_encoded(fixture_bundle):
    """By id, the client lets go of an image's encoding once the server holds it (later turns name
    it by id; a miss encodes it again): memory for the requests in flight, not for every live
    conversation. With pixels on every turn it is kept for the conversation's next turns."""
    bundle = read_bundle(fixture_bundle, paths=["RR"], lesions=["effusion"])
    case = bundle.cases[0]
    held = {}
    for mode, server_options in (("auto", {"vllm": True}), ("off", {})):
        with FakeServer(reply=scripted_reply, **server_options) as server:
            backend = backend_for(server, image_ids=mode)
            try:
                backend.setup(RunContext(root=bundle.root, cases=[case]))
                request = Conversation(case, oracle="implicit").pending
                backend.submit([request])
                ((_, answer),) = backend.completed()
                assert answer.error is None and request.images
                held[mode] = backend.images.held_bytes
            finally:
                backend.close()
    assert held["auto"] == 0 < held["off"]


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
    vllm = b'{"data": [{"id": "m", "owned_by": "vllm"}]}'
    assert why_not_vllm(vllm, b'{"version": "0.32.0"}') is None
    assert why_not_vllm(vllm, b'{"version": "0.11.1rc2.dev3+gabc"}') is None
    assert "0.11 or later" in why_not_vllm(vllm, b'{"version": "0.10.2"}')
    assert "no version" in why_not_vllm(vllm, b"") and "no version" in why_not_vllm(vllm, b'{"version": 11}')
    assert "does not say vLLM" in why_not_vllm(b'{"data": [{"id": "gpt", "owned_by": "openai"}]}', b"")
    # behind a router that serves several kinds, the requested model's entry decides (red team, stop 44)
    mixed = b'{"data": [{"id": "gpt", "owned_by": "openai"}, {"id": "q", "owned_by": "vllm"}]}'
    assert "does not say vLLM" in why_not_vllm(mixed, b'{"version": "0.32.0"}', "gpt")
    assert why_not_vllm(mixed, b'{"version": "0.32.0"}', "q") is None
    assert (
        why_not_vllm(vllm, b'{"version": "0.32.0"}', "not-listed") is None
    )  # a vllm serve lists vLLM's alone
    assert why_not_vllm(b"not json", b"") and why_not_vllm(b'{"data": "vllm"}', b"")
    from chexpercept.eval.backends.openai.image_ids import MODELS_REPLY_LIMIT

    assert why_not_vllm(vllm + b" " * MODELS_REPLY_LIMIT, b'{"version": "0.32.0"}')  # over the limit read
    assert is_cache_miss(
        400, '{"error": {"message": "Cache miss for image at index 1 but data is not provided."}}'
    )
    assert is_cache_miss(500, "Multi-modal items ['x'] are not in the receiver (P1) cache and no data")
    assert not is_cache_miss(200, "Cache miss for image") and not is_cache_miss(400, "bad request")
    assert refuses_ids(400, "messages.1.content.1.image_url: Input should be a valid dictionary")
    assert not refuses_ids(400, "This model's maximum context length is 8192 tokens")
    assert not refuses_ids(500, "image_url") and not refuses_ids(
        400, "Cache miss for image at index 0 (uuid)"
    )


def test_a_vllm_that_takes_no_image_by_id_gets_pixels(fixture_bundle):
    """Red team: a vLLM older than 0.11 says ``owned_by: vllm`` too, and refuses an image part
    without pixels: auto asks /version, and sends it no id (saying why in run.json)."""
    bundle = read_bundle(fixture_bundle, paths=["RR"], lesions=["effusion"])
    _, plain_records, _ = run(bundle)
    old, records, info = run(bundle, vllm=True, vllm_version="0.10.1")
    assert answers(records) == answers(plain_records)
    assert all("uuid" not in p and p["image_url"] for p in image_parts(old))
    assert not info["image_ids"]["used"] and "0.10.1" in info["image_ids"]["off_because"]


def test_a_server_that_refuses_ids_anyway_gets_pixels_from_then_on(fixture_bundle, capsys):
    """``--image-ids on`` (or a fork that says it is a recent vLLM) against a server that refuses a
    part without pixels: that request again with pixels, no id for the rest of the run, one note."""
    bundle = read_bundle(fixture_bundle, paths=["RR"], lesions=["effusion"])
    plain, plain_records, _ = run(bundle)

    def refusing(server):
        server.refuse_ids = True

    server, records, described = run(bundle, prepare=refusing, image_ids="on", batch_size=64, vllm=True)
    info = described["image_ids"]
    assert answers(records) == answers(plain_records)
    assert all(t.error is None for r in records for t in r.turns)
    assert "the server refused an image by id" in info["off_because"]
    refusals = sum(1 for r in server.requests if any(p["image_url"] is None for p in image_parts_of(r)))
    assert refusals == 1 and len(server.requests) == len(plain.requests) + 1
    assert capsys.readouterr().err.count("note: the server refused an image by id") == 1


def test_the_servers_answer_is_read_whole(fixture_bundle):
    """Red team: /models in two pieces (behind a proxy) was read as its first piece alone."""
    bundle = read_bundle(fixture_bundle, paths=["RR"], lesions=["effusion"])

    def split(server):
        server.split_models = True

    _, _, described = run(bundle, prepare=split, batch_size=64, vllm=True)
    assert described["image_ids"]["used"]


def image_parts_of(request: dict) -> list[dict]:
    return [
        p
        for m in request["body"]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]


def test_a_served_root_holding_a_token_is_recorded_redacted():
    """A server's ``root`` went into run.json's identity as it came, a token in its URL included (red
    team, stop 45): it is redacted like every text the toolkit writes from outside."""
    import json as json_module

    from chexpercept.eval.backends.openai.image_ids import served_root

    listing = {"data": [{"id": "m", "owned_by": "vllm", "root": "https://hub.example/m?token=abcdef123456"}]}
    root = served_root(json_module.dumps(listing).encode(), "m")
    assert root is not None and "abcdef123456" not in root and root.startswith("https://hub.example/m?token=")
