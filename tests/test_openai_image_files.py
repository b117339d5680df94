"""``--image-urls file``: the openai backend names each image by its ``file://`` URL in the bundle
and a vllm serve on this machine reads the file itself (``--allowed-local-media-path``), so the
client sends no pixels. Against the fake server reading files as vLLM does (tests/fake_openai.py,
``local_media``): the same conversations and answers as with data URLs, by id or not; a server
that does not read the bundle's files ends the run at its first answer with one line saying how to
start it; a server elsewhere is refused before anything is sent."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeServer, backend_for, conversation_of, run_cases, scripted_reply

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.backend import refuses_files
from chexpercept.eval.run import main


def run(bundle, *, image_urls: str, vllm: bool, local_media=None):
    with FakeServer(reply=scripted_reply, vllm=vllm, local_media=local_media) as server:
        backend = backend_for(server, image_urls=image_urls)
        try:
            records = run_cases(backend, bundle, batch_size=8)
            described = backend.describe()
        finally:
            backend.close()
    return server, {r.key_id: [t.response for t in r.turns] for r in records}, described


def image_urls_sent(server: FakeServer) -> list[str]:
    return [
        p["image_url"]["url"]
        for r in server.requests
        for m in r["body"]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url" and p["image_url"] is not None
    ]


@pytest.mark.parametrize("vllm", [False, True], ids=["every image every turn", "by id"])
def test_file_urls_give_the_conversations_and_answers_of_data_urls(fixture_bundle, vllm):
    bundle = read_bundle(fixture_bundle, paths=["RR", "RF"])
    data, data_answers, data_info = run(bundle, image_urls="data", vllm=vllm)
    files, file_answers, file_info = run(bundle, image_urls="file", vllm=vllm, local_media=fixture_bundle)
    assert file_answers == data_answers
    # what the model saw, turn by turn, is the same: the server read the files the URLs name

    def seen(server: FakeServer) -> list[str]:
        bodies = (server.read_files(r["body"])[0] for r in server.requests)
        return sorted(json.dumps(conversation_of(server.resolve(b) if vllm else b)) for b in bodies)

    assert seen(files) == seen(data)
    urls = image_urls_sent(files)
    root = fixture_bundle.resolve().as_uri() + "/"
    assert urls and all(u.startswith(root) for u in urls)  # no pixels: the bundle's files, named
    assert file_info["image_urls"] == "file" and data_info["image_urls"] == "data"
    assert file_info["request_bytes_sent"] < data_info["request_bytes_sent"]  # 32x32 images here


@pytest.mark.parametrize("allowed", [None, "elsewhere"], ids=["no local media", "another folder"])
def test_a_server_that_does_not_read_the_bundles_files_ends_the_run_at_once(
    fixture_bundle, tmp_path, allowed, capsys
):
    """vllm serve without --allowed-local-media-path answers a file URL with a 500 (which is retried)
    and one outside it with a 400: either way every request would fail. The run ends at the first
    answer with one line saying how to start the server, without retrying for minutes."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with FakeServer(vllm=True, local_media=elsewhere if allowed else None) as server:
        args = ["--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"]
        args += ["--base-url", server.url, "--image-urls", "file", "--output-dir", str(tmp_path / "runs")]
        status = main([*args, "--no-progress", "--no-score"])
    err = capsys.readouterr().err
    assert status != 0 and len(server.requests) <= 8, err[-2000:]  # the first wave, none retried
    assert "--allowed-local-media-path" in err and "--image-urls data" in err, err[-2000:]
    assert str(fixture_bundle) in err and "Traceback" not in err, err[-2000:]
    assert "check --base-url, the model id" not in err


def test_file_urls_go_only_to_a_server_on_this_machine(fixture_bundle, tmp_path, capsys):
    args = ["--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"]
    args += ["--base-url", "http://10.1.2.3:8000/v1", "--dua-compliant-endpoint", "--image-urls", "file"]
    assert main([*args, "--output-dir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--image-urls file needs a server on this machine" in err and "--image-urls data" in err, err


def test_what_a_refusal_of_files_looks_like():
    assert refuses_files(
        500, '{"error": {"message": "Cannot load local files without `--allowed-local-media-path`."}}'
    )
    assert refuses_files(
        400, "The file path <path> must be a subpath of `--allowed-local-media-path <path>`."
    )
    assert not refuses_files(400, "Cache miss for image at index 0 but data is not provided.")
    assert not refuses_files(200, "--allowed-local-media-path")
