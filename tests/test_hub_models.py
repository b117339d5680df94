"""Model weights through huggingface_hub (chexpercept.eval.weights, ``download-model``, ``run``), offline
against a cache laid out like the Hub's and online against a loopback Hub (tests/fake_hub.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fake_hub import FakeHub, FakeModel, sha1
from huggingface_hub import constants

from chexpercept.cli import main as cli
from chexpercept.eval.registry import resolve
from chexpercept.eval.run import main as run_main
from chexpercept.eval.tiny_model import TINY_MODEL_MARKER
from chexpercept.eval.weights import HubError, Weights, prepare_model, resolve_weights

FILES = {
    "config.json": b'{"model_type": "toy"}',
    "model.safetensors": b"w" * 4096,
    "sub/tokenizer.json": b"{}",
}


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    return folder


@pytest.fixture
def hub(monkeypatch, no_token, cache):
    """A loopback Hub with org/toy (public), google/medgemma-toy (gated); the client online."""
    server = FakeHub().start()
    server.models["org/toy"] = FakeModel(dict(FILES), refs={"v1": ""})
    server.models["org/toy"].refs["v1"] = server.models["org/toy"].commit
    server.models["google/medgemma-toy"] = FakeModel({"config.json": b"{}"}, gated=True)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def hub_cache(root: Path, repo: str, files: dict[str, bytes], ref: str = "main") -> str:
    """A cache as huggingface_hub lays it out: blobs, snapshots/<commit>/ links, refs/<ref>."""
    commit = sha1(repr(sorted(files.items())).encode())
    storage = root / ("models--" + repo.replace("/", "--"))
    for name, data in files.items():
        blob = storage / "blobs" / sha1(data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return commit


# ------------------------------------------------------------------------------------ offline
def test_offline_uses_the_cache_by_branch_and_by_commit(cache, offline):
    commit = hub_cache(cache, "org/cached", FILES)
    w = resolve_weights("org/cached")
    assert (w.source, w.commit) == ("cache", commit)
    assert Path(w.path) == cache / "models--org--cached" / "snapshots" / commit
    assert (Path(w.path) / "sub" / "tokenizer.json").read_bytes() == b"{}"
    assert resolve_weights("org/cached", commit).commit == commit


def test_offline_without_the_model_says_how_to_fetch_it(cache, offline):
    with pytest.raises(HubError) as e:
        resolve_weights("org/absent", "v2")
    msg = str(e.value)
    assert "HF_HUB_OFFLINE" in msg and "chexpercept download-model org/absent --revision v2" in msg
    assert str(cache) in msg


def test_local_folder_is_used_as_it_is_and_takes_no_revision(tmp_path):
    w = resolve_weights(str(tmp_path))
    assert (w.source, w.commit, w.path) == ("local", None, str(tmp_path))
    with pytest.raises(HubError, match="local folder"):
        resolve_weights(str(tmp_path), "main")
    with pytest.raises(HubError, match="neither a local folder nor a Hugging Face id"):
        resolve_weights(str(tmp_path / "missing" / "x" / "y"))


# ------------------------------------------------------------------------------------ online
def test_download_once_then_the_cache_is_used(hub, cache):
    w = resolve_weights("org/toy")
    commit = hub.models["org/toy"].commit
    assert (w.source, w.commit, w.size, w.downloaded) == ("download", commit, 4096 + 21 + 2, 4096 + 21 + 2)
    for name, data in FILES.items():
        assert (Path(w.path) / name).read_bytes() == data
    assert (cache / "models--org--toy" / "refs" / "main").read_text() == commit
    assert len(hub.downloads()) == 3
    again = resolve_weights("org/toy")
    assert (again.source, again.path) == ("cache", w.path)
    assert len(hub.downloads()) == 3  # nothing fetched twice


def test_revision_is_resolved_to_its_commit_and_kept_in_refs(hub, cache):
    w = resolve_weights("org/toy", "v1")
    assert w.revision == "v1" and w.commit == hub.models["org/toy"].commit
    assert (cache / "models--org--toy" / "refs" / "v1").read_text() == w.commit
    assert w.record() == {
        "model_id": "org/toy",
        "revision": "v1",
        "commit": w.commit,
        "source": "download",
        "size_bytes": w.size,
    }


def test_missing_model_and_missing_revision_are_named(hub):
    with pytest.raises(HubError, match="model org/nothing was not found on http://127.0.0.1"):
        resolve_weights("org/nothing")
    with pytest.raises(HubError, match="revision 'v9' of org/toy does not exist"):
        resolve_weights("org/toy", "v9")
    assert not hub.downloads()


def test_gated_model_without_token_names_the_page_and_hf_auth_login(hub):
    with pytest.raises(HubError) as e:
        resolve_weights("google/medgemma-toy")
    msg = str(e.value)
    assert "gated" in msg and f"{hub.url}/google/medgemma-toy" in msg and "hf auth login" in msg
    assert not hub.downloads()


def test_gated_model_with_a_token_without_access_says_to_accept_the_terms(hub):
    with pytest.raises(HubError) as e:
        resolve_weights("google/medgemma-toy", token="hf_not_granted")
    msg = str(e.value)
    assert "has no access" in msg and "accept the model's terms" in msg
    assert f"{hub.url}/google/medgemma-toy" in msg


def test_not_enough_disk_says_how_much_is_needed_where(hub, cache):
    hub.models["org/toy"].reported_sizes["model.safetensors"] = 10**18
    with pytest.raises(HubError) as e:
        resolve_weights("org/toy")
    msg = str(e.value)
    assert "not enough free disk" in msg and "1000000.0 TB" in msg
    assert str(cache / "models--org--toy") in msg and "HF_HOME" in msg
    assert not hub.downloads()


def test_a_failed_download_says_what_happened_and_that_a_rerun_continues(hub, cache):
    hub.models["org/toy"].lost.add("model.safetensors")
    with pytest.raises(HubError) as e:
        resolve_weights("org/toy")
    msg = str(e.value)
    assert "downloading org/toy" in msg and "failed" in msg and "run the same command again" in msg
    hub.models["org/toy"].lost.clear()
    w = resolve_weights("org/toy")
    assert (
        w.source == "download"
        and (Path(w.path) / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    )


def test_unreachable_hub_falls_back_to_the_cache(hub, cache, monkeypatch, capsys):
    commit = hub_cache(cache, "org/cached", FILES)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    w = resolve_weights("org/cached")
    assert (w.source, w.commit) == ("cache", commit)
    assert "could not be reached" in capsys.readouterr().err
    with pytest.raises(HubError, match="cannot reach the Hugging Face Hub"):
        resolve_weights("org/elsewhere")


# ------------------------------------------------------------------------------------ processes
class FakeDist:
    """One process of a launched run; ``main_outcome`` is what process 0 broadcasts."""

    def __init__(self, index: int, local_index: int, main_outcome=None):
        self.index, self.local_index, self.main_outcome = index, local_index, main_outcome
        self.barriers = 0

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def barrier(self) -> None:
        self.barriers += 1

    def broadcast(self, obj):
        return obj if self.is_main else self.main_outcome


def test_main_fetches_and_the_other_processes_read_the_cache(hub, cache):
    spec = resolve("org/toy", backend="transformers")
    load, w = prepare_model(spec, None, FakeDist(0, 0))
    assert load.model_id == w.path and spec.model_id == "org/toy" and w.source == "download"
    requests = len(hub.requests)
    peer_spec, peer = prepare_model(spec, None, FakeDist(1, 1, {"ok": True, "commit": w.commit}))
    assert peer_spec.model_id == w.path and peer.commit == w.commit
    assert len(hub.requests) == requests  # the peer never asked the Hub


def test_first_process_of_another_machine_fetches_the_main_commit(hub, tmp_path, monkeypatch):
    commit = hub.models["org/toy"].commit
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "node2"))
    spec = resolve("org/toy", backend="transformers")
    load, w = prepare_model(spec, "v1", FakeDist(2, 0, {"ok": True, "commit": commit}))
    assert w.commit == commit and w.revision == "v1" and load.model_id.startswith(str(tmp_path / "node2"))


def test_a_failure_on_the_main_process_stops_the_others_quietly(hub):
    spec = resolve("google/medgemma-toy", backend="transformers")
    with pytest.raises(HubError, match="gated"):
        prepare_model(spec, None, FakeDist(0, 0))
    with pytest.raises(SystemExit) as e:
        prepare_model(spec, None, FakeDist(1, 1, {"ok": False}))
    assert e.value.code == 2


def test_no_weights_are_fetched_for_an_engine_that_is_not_installed(hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    spec = resolve("org/toy", backend="vllm")
    assert prepare_model(spec, None, FakeDist(0, 0)) == (spec, None)
    assert hub.requests == []


def test_backends_without_weights_need_nothing(tmp_path):
    for model, backend in (("baseline:prior", None), ("gpt-5.4", None)):
        spec = resolve(model, backend=backend)
        assert prepare_model(spec, None, FakeDist(0, 0)) == (spec, None)
        with pytest.raises(HubError, match="--revision applies to the vllm and transformers"):
            prepare_model(spec, "main", FakeDist(0, 0))
    local = resolve(str(tmp_path), backend="transformers")
    load, w = prepare_model(local, None, FakeDist(0, 0))
    assert load is local and isinstance(w, Weights) and w.source == "local"


# ------------------------------------------------------------------------------------ commands
def test_download_model_command(hub, cache, capsys):
    assert cli(["download-model", "org/toy", "--revision", "v1"]) == 0
    out = capsys.readouterr().out
    commit = hub.models["org/toy"].commit
    assert f"org/toy commit {commit} (downloaded" in out and "HF_HUB_OFFLINE=1" in out
    assert cli(["download-model", "org/toy"]) == 0
    assert "already in the cache" in capsys.readouterr().out
    assert cli(["download-model", "google/medgemma-toy"]) == 2
    assert "hf auth login" in capsys.readouterr().err
    assert cli(["download-model", "gpt-5.4"]) == 2
    assert "no weights to download" in capsys.readouterr().err
    other = cache.parent / "elsewhere"
    assert cli(["download-model", "org/toy", "--cache-dir", str(other)]) == 0
    assert (other / "models--org--toy" / "refs" / "main").is_file()


def test_download_model_resolves_registry_names(hub, cache, capsys):
    hub.models["google/medgemma-27b-it"] = FakeModel({"config.json": b"{}"}, gated=True)
    assert cli(["download-model", "medgemma-27b"]) == 2
    err = capsys.readouterr().err
    assert "google/medgemma-27b-it is a gated model" in err and f"{hub.url}/google/medgemma-27b-it" in err


def test_run_fetches_a_hub_model_once_and_records_its_commit(
    hub, cache, tiny_model, fixture_bundle, tmp_path
):
    files = {
        p.name: p.read_bytes()
        for p in Path(tiny_model).iterdir()
        if p.is_file() and p.name != TINY_MODEL_MARKER
    }
    hub.models["org/tiny-vlm"] = FakeModel(files)
    commit = hub.models["org/tiny-vlm"].commit
    out = tmp_path / "runs"
    args = ["--data-dir", str(fixture_bundle), "--model", "org/tiny-vlm", "--backend", "transformers"]
    args += ["--output-dir", str(out), "--limit", "2", "--max-tokens", "2", "--no-progress", "--no-score"]
    assert run_main([*args, "--revision", "main"]) == 0
    meta = json.loads((out / "org--tiny-vlm" / "oracle_implicit" / "run.json").read_text())
    assert meta["weights"] == {
        "model_id": "org/tiny-vlm",
        "revision": "main",
        "commit": commit,
        "source": "download",
        "size_bytes": sum(len(d) for d in files.values()),
    }
    assert meta["model_id"] == "org/tiny-vlm"  # the settings keep the id, not the cache path
    assert len(hub.downloads()) == len(files)
    # the same run resumed offline reads the cache
    hub.stop()
    constants.HF_HUB_OFFLINE = True
    assert run_main([*args, "--revision", "main", "--run-name", "again"]) == 0
    again = json.loads((out / "again" / "oracle_implicit" / "run.json").read_text())
    assert again["weights"]["commit"] == commit and again["weights"]["source"] == "cache"


def test_run_stops_on_a_gated_model_before_reading_the_bundle(hub, tmp_path, capsys):
    from chexpercept.testing import write_fixture_bundle

    bundle = write_fixture_bundle(tmp_path / "bundle", per_cell=1)
    (
        bundle
        / "chexpercept"
        / next(iter(sorted((bundle / "chexpercept").iterdir()))).name
        / "detection_qa"
        / "xray.png"
    ).unlink()
    rc = run_main(
        [
            "--data-dir",
            str(bundle),
            "--model",
            "google/medgemma-toy",
            "--backend",
            "transformers",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "gated" in err and "hf auth login" in err


def test_run_names_a_wrong_data_dir_before_fetching_weights(hub, tmp_path, capsys):
    rc = run_main(
        ["--data-dir", str(tmp_path / "typo"), "--model", "google/medgemma-toy", "--backend", "transformers"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "typo" in err and "gated" not in err


# ------------------------------------------------------------------------------------ remote code
def test_the_registry_s_remote_code_models_are_pinned():
    from chexpercept.eval.backends.transformers.backend import TransformersBackend
    from chexpercept.eval.backends.vllm.backend import VLLMBackend
    from chexpercept.eval.protocol import Sampling
    from chexpercept.eval.registry import REGISTRY
    from chexpercept.eval.weights import runs_remote_code

    trusting = sorted(n for n, s in REGISTRY.items() if s.trust_remote_code)
    assert len(trusting) == 6
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=8, greedy=True)
    for name in trusting:
        spec = REGISTRY[name]
        backend_class = VLLMBackend if spec.backend == "vllm" else TransformersBackend
        assert runs_remote_code(backend_class(spec, sampling=sampling)), name
    plain = REGISTRY["qwen3.6-27b"]
    assert not runs_remote_code(VLLMBackend(plain, sampling=sampling))
    # --engine-args can turn it on for any model: pinned as well
    assert runs_remote_code(VLLMBackend(plain, sampling=sampling, engine_args={"trust_remote_code": True}))


def _run_remote_code_model(fixture_bundle, out, name, *extra):
    args = ["--data-dir", str(fixture_bundle), "--model", "lingshu-32b", "--backend", "transformers"]
    args += ["--output-dir", str(out), "--run-name", name, "--limit", "1", "--max-tokens", "2"]
    assert run_main([*args, "--no-progress", "--no-score", *extra]) == 0
    return json.loads((out / name / "oracle_implicit" / "run.json").read_text())["weights"]


def test_remote_code_runs_from_the_first_fetched_commit_until_a_revision_moves_it(
    hub, cache, tiny_model, fixture_bundle, tmp_path, capsys
):
    """lingshu-32b (a registry model with trust_remote_code) on a loopback Hub: the first run
    records the commit; upstream changes; the next run keeps the recorded code; --revision main
    moves it (issue 27 item 7c)."""
    files = {
        p.name: p.read_bytes()
        for p in Path(tiny_model).iterdir()
        if p.is_file() and p.name != TINY_MODEL_MARKER
    }
    model = hub.models["lingshu-medical-mllm/Lingshu-32B"] = FakeModel(files)
    first = model.commit
    out = tmp_path / "runs"
    recorded = _run_remote_code_model(fixture_bundle, out, "first")
    assert recorded["commit"] == first

    changed = dict(files, **{"modeling_lingshu.py": b"print('new upstream code')\n"})
    upstream = model.push(changed)
    downloads = len(hub.downloads())
    weights = _run_remote_code_model(fixture_bundle, out, "again")
    assert weights["commit"] == first and weights["revision"] is None  # not the new upstream
    assert len(hub.downloads()) == downloads  # nothing of the new commit fetched
    assert recorded["remote_code"] == {"commit": first, "pinned_by": "first fetch"}
    assert weights["remote_code"]["pinned_by"].startswith("recorded (first fetch")
    assert "pass --revision" in capsys.readouterr().err

    weights = _run_remote_code_model(fixture_bundle, out, "moved", "--revision", "main")
    assert weights["commit"] == upstream
    assert weights["remote_code"] == {"commit": upstream, "pinned_by": "--revision main"}
    # the explicit revision is the new record, offline too
    constants.HF_HUB_OFFLINE = True
    assert resolve_weights("lingshu-medical-mllm/Lingshu-32B", remote_code=True).commit == upstream


def test_code_from_another_repository_is_refused(hub, cache):
    config = json.dumps({"auto_map": {"AutoModel": "someone/else--modeling_x.Model"}}).encode()
    hub.models["org/borrows-code"] = FakeModel({"config.json": config})
    with pytest.raises(HubError) as e:
        resolve_weights("org/borrows-code", remote_code=True)
    assert "config.json auto_map.AutoModel" in str(e.value) and "someone/else--modeling_x.Model" in str(
        e.value
    )
    own = json.dumps({"auto_map": {"AutoModel": "modeling_x.Model"}}).encode()
    hub.models["org/own-code"] = FakeModel({"config.json": own, "modeling_x.py": b""})
    assert resolve_weights("org/own-code", remote_code=True).remote_code["pinned_by"] == "first fetch"


def test_estimate_fetches_the_processor_only_and_fails_fast_without_the_hub(
    hub, fixture_bundle, tiny_model, monkeypatch, capsys
):
    """estimate counts a Hub model's tokens with its processor: it fetches every file but the weights,
    resolved as run resolves them; with no Hub to reach it says so at once (it used to retry inside
    the processor's loader for minutes)."""
    files = {
        p.relative_to(tiny_model).as_posix(): p.read_bytes()
        for p in tiny_model.rglob("*")
        if p.is_file() and p.name != TINY_MODEL_MARKER
    }
    hub.models["org/tiny-vlm"] = FakeModel(files)
    argv = [
        "estimate",
        "--data-dir",
        str(fixture_bundle),
        "--model",
        "org/tiny-vlm",
        "--backend",
        "transformers",
    ]
    assert cli([*argv, "--oracle", "implicit", "--limit", "2"]) == 0
    assert "Estimate for org--tiny-vlm" in capsys.readouterr().out
    fetched = {d.rsplit("/", 1)[-1] for d in hub.downloads()}
    assert "config.json" in fetched and "model.safetensors" not in fetched
    # what estimate needs, fetched ahead on a login node: the processor's files, not the weights
    hub.models["org/tiny-b"] = FakeModel(files)
    assert cli(["download-model", "org/tiny-b", "--processor-only"]) == 0
    fetched_b = [d for d in hub.downloads() if "tiny-b" in d]
    assert any(d.endswith("config.json") for d in fetched_b)
    assert not any(d.endswith(".safetensors") for d in fetched_b)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    argv[argv.index("org/tiny-vlm")] = "org/never-fetched"
    assert cli([*argv, "--oracle", "implicit"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Hugging Face Hub" in err
    assert "download-model org/never-fetched --processor-only" in err  # the few MB, not the weights


def test_weights_rewritten_in_a_snapshot_under_the_same_commit_stop_the_resume(
    cache, offline, tiny_model, fixture_bundle, tmp_path, capsys
):
    """A Hub model's identity was its commit alone: weights rewritten in its snapshot (a
    ``save_pretrained`` into it writes through the links; a blob edited in place) kept the commit,
    and a resume kept the first weights' answers beside the new ones' (red team, stop 43). The
    identity now holds the snapshot's fingerprint too, so the resume is refused before any engine
    loads, naming it."""
    files = {p.name: p.read_bytes() for p in Path(tiny_model).iterdir() if p.is_file()}
    commit = hub_cache(cache, "org/tiny-vlm", files)
    out = tmp_path / "runs"
    args = ["--data-dir", str(fixture_bundle), "--model", "org/tiny-vlm", "--backend", "transformers"]
    args += ["--output-dir", str(out), "--max-tokens", "2", "--no-progress", "--no-score"]
    assert run_main([*args, "--limit", "2"]) == 0
    meta = json.loads((out / "org--tiny-vlm" / "oracle_implicit" / "run.json").read_text())
    weights = meta["settings"]["weights"]
    assert weights["commit"] == commit and weights["folder"].startswith("sha256:")
    weights_file = cache / "models--org--tiny-vlm" / "snapshots" / commit / "model.safetensors"
    data = bytearray(weights_file.read_bytes())
    data[-1] ^= 1  # one bit of one weight, written through the snapshot's link
    with open(weights_file, "r+b") as f:
        f.write(bytes(data))
    capsys.readouterr()
    assert run_main([*args, "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert "holds a run made with other settings" in err and "weights.folder: 'sha256:" in err, err
    lines = (out / "org--tiny-vlm" / "oracle_implicit" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2  # nothing answered by the other weights
