"""vLLM backend: engine arguments, placement and request construction, with a fake LLM class.

The real engine (vLLM's CPU build) runs in tests/test_vllm_engine.py."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import pytest
from simulated_vllm import BatchOnlyLLM, SimulatedLLM, SplitLLM, heavy_tailed_answers

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.vllm import backend as backend_vllm
from chexpercept.eval.backends.vllm.backend import VLLMBackend, plan_cpus, plan_gpus
from chexpercept.eval.engine import ConversationFailed, run_conversations
from chexpercept.eval.protocol import BackendError, RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.run import main

GREEDY = Sampling(temperature=0.0, top_p=1.0, max_tokens=8192, greedy=True)


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM(SimulatedLLM):
    """vLLM's LLM as far as the backend uses it (bench/simulated_vllm.py), keeping what it was given."""

    instances: list[FakeLLM] = []

    def __init__(self, **kwargs):
        super().__init__(answer=kwargs.pop("answer", None), max_num_seqs=kwargs.pop("max_num_seqs", 256))
        self.kwargs = kwargs
        self.calls: list[dict] = []
        FakeLLM.instances.append(self)

    def enqueue_chat(self, messages, sampling_params=None, **kwargs):
        self.calls.append({"messages": messages, "sampling_params": sampling_params, **kwargs})
        return super().enqueue_chat(messages, sampling_params)


def make_backend(model="qwen3.6-27b", gpus=("0",), platform="cuda", **kwargs):
    spec = resolve(model)
    return VLLMBackend(
        spec,
        sampling=GREEDY,
        llm_class=FakeLLM,
        sampling_params_class=FakeSamplingParams,
        gpus=list(gpus),
        platform=platform,
        **kwargs,
    )


def test_engine_arguments(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    rr = [c for c in bundle.cases if c.path.value == "RR"]
    most_images = max(3 + len(c.qa_for("revision_result").answer_options) for c in rr)
    backend = make_backend(gpus=["0", "1", "2", "3"])
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases, seed=7))
    llm = FakeLLM.instances[-1]
    assert llm.kwargs == {
        "model": "Qwen/Qwen3.6-27B",
        "max_model_len": 65536,
        "enable_prefix_caching": True,
        "tensor_parallel_size": 4,  # all visible GPUs, as the reference
        "gpu_memory_utilization": 0.85,
        "limit_mm_per_prompt": {"image": most_images},
        "allowed_local_media_path": str(bundle.root),
        "seed": 7,
    }
    assert backend.params.kwargs == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8192, "seed": 7}
    # the preflight check sees the limits the engine will have
    limits = backend.context_limits(RunContext(root=bundle.root, cases=bundle.cases))
    assert limits.max_model_len == 65536 and limits.max_images == most_images
    # registry flags and user overrides
    glm = make_backend("glm-4.6v", gpus=["0", "1", "2"], engine_args={"max_model_len": 4096})
    glm.setup(RunContext(root=bundle.root, cases=bundle.cases))
    args = FakeLLM.instances[-1].kwargs
    assert args["trust_remote_code"] is True and args["max_model_len"] == 4096
    assert args["tensor_parallel_size"] == 2  # must divide 4 (the reference's gpu_num)
    # the largest conversation of a smaller selection sets the image limit
    only_lf = [c for c in bundle.cases if c.path.value == "LF"]
    small = make_backend()
    small.setup(RunContext(root=bundle.root, cases=only_lf))
    assert FakeLLM.instances[-1].kwargs["limit_mm_per_prompt"] == {"image": 1}


def test_plan_gpus_for_data_parallel_processes():
    gpus = [str(i) for i in range(8)]
    assert plan_gpus(gpus, process_index=0, num_processes=1) == (8, gpus)
    assert plan_gpus(gpus, process_index=1, num_processes=2) == (4, ["4", "5", "6", "7"])
    assert plan_gpus(gpus, process_index=3, num_processes=8, requested_tp=1) == (1, ["3"])
    assert plan_gpus(gpus, process_index=1, num_processes=2, requested_tp=2) == (2, ["4", "5"])
    assert plan_gpus(["0", "1", "2"], process_index=0, num_processes=1, tp_divisor=4) == (2, ["0", "1"])
    assert plan_gpus(gpus, process_index=0, num_processes=1, pipeline_parallel_size=2) == (4, gpus)
    with pytest.raises(BackendError, match="x pipeline_parallel_size 2 needs 8 GPUs"):
        plan_gpus(gpus, process_index=0, num_processes=2, requested_tp=4, pipeline_parallel_size=2)
    with pytest.raises(BackendError, match="only 2 visible GPU"):
        plan_gpus(["0", "1"], process_index=0, num_processes=4)
    with pytest.raises(BackendError, match="needs 4 GPUs per process"):
        plan_gpus(gpus, process_index=0, num_processes=4, requested_tp=4)
    with pytest.raises(BackendError, match="needs a CUDA GPU"):
        plan_gpus([], process_index=0, num_processes=1)


def test_each_request_joins_the_running_engine_rendered_as_llm_chat_renders_it(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion", "cardiomegaly"])
    backend = make_backend(chat_template_kwargs={"enable_thinking": False})
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    llm = FakeLLM.instances[-1]
    llm.answer = heavy_tailed_answers(median=6, sigma=1.0, cap=40)
    results = []
    stats = run_conversations(
        bundle.cases, backend, oracle="implicit", batch_size=64, on_finished=results.extend
    )
    assert len(results) == 6
    # one enqueue_chat per request (a refused one fails alone), with the run's parameters and kwargs
    assert len(llm.calls) == stats.requests == sum(len(c.turns) for c in bundle.cases)
    first = llm.calls[0]
    assert len(first["messages"]) == 1 and first["sampling_params"] is backend.params
    assert first["use_tqdm"] is False and first["chat_template_kwargs"] == {"enable_thinking": False}
    # answers of varied lengths: a conversation's next turn goes in while others still run, so the
    # engine is stepped far fewer times than a step-by-step scheduler would need
    schedule = backend.describe()["schedule"]
    assert schedule["mode"] == "continuous" and schedule["iterations"] == llm.llm_engine.iterations
    assert schedule["generated_tokens"] == sum(t.usage["output_tokens"] for r in results for t in r.turns)
    assert schedule["iterations"] >= schedule["floor_iterations"] > 0
    key = bundle.cases[0].key_id
    conv = next(c["messages"][0] for c in llm.calls if "detection_qa" in json_of(c) and key in json_of(c))
    assert conv[0] == {"role": "system", "content": conv[0]["content"]} and conv[0]["content"].startswith(
        "You are an expert radiologist."
    )
    user = conv[1]
    assert user["role"] == "user"
    assert user["content"][0] == {"type": "text", "text": bundle.cases[0].turn("detection").text}
    image = user["content"][1]
    assert image["type"] == "image_url"
    url = image["image_url"]["url"]
    assert url.startswith("file:///") and url.endswith(f"chexpercept/{key}/detection_qa/xray.png")
    path = Path(url[len("file://") :])
    assert path.is_file()
    # a stable id per image: the SHA-256 of the file, the same on every turn that re-sends it
    import hashlib

    assert image["uuid"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    # a later turn: history with text-only assistant answers, then the new user turn
    later = next(c["messages"][0] for c in llm.calls if len(c["messages"][0]) == 10)
    assert [m["role"] for m in later] == ["system"] + ["user", "assistant"] * 4 + ["user"]
    assert later[2]["role"] == "assistant" and later[2]["content"][0]["text"].startswith("Answer: ")
    assert later[1]["content"][1]["uuid"].startswith("sha256:")
    assert [p["type"] for p in later[-1]["content"]][1:] == ["image_url"] * (len(later[-1]["content"]) - 1)
    record = next(r for r in results if r.key_id == key)
    usage = record.turns[0].usage
    assert usage["input_tokens"] > 0 and usage["output_tokens"] >= 1 and usage["finish_reason"] == "stop"


def json_of(call):
    return json.dumps(call["messages"])


def test_continuous_and_step_scheduling_give_the_same_answers_in_fewer_iterations(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    runs = {}
    for schedule in ("continuous", "step"):
        backend = make_backend()
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        llm = FakeLLM.instances[-1]
        llm.answer = heavy_tailed_answers(median=20, sigma=1.0, cap=200)
        results = []
        run_conversations(
            bundle.cases,
            backend,
            oracle="implicit",
            batch_size=8,
            on_finished=results.extend,
            schedule=schedule,
        )
        runs[schedule] = (
            {r.key_id: [t.response for t in r.turns] for r in results},
            llm.llm_engine.iterations,
        )
    assert runs["continuous"][0] == runs["step"][0]
    assert runs["continuous"][1] < runs["step"][1]


def test_requests_rendered_on_their_own_thread_send_seen_images_by_id_alone(fixture_bundle):
    """Where vLLM renders apart from adding, requests render on the backend's thread for it, each
    image goes with its pixels once and by its id alone afterwards, and a request whose image the
    engine's cache let go is rendered again with every image: the answers of enqueue_chat."""
    bundle = read_bundle(fixture_bundle)
    answer = heavy_tailed_answers(median=20, sigma=1.0, cap=200)

    def run(llm):
        backend = VLLMBackend(
            resolve("qwen3.6-27b"), sampling=GREEDY, llm_class=lambda **_: llm,
            sampling_params_class=FakeSamplingParams, gpus=["0"], platform="cuda",
        )  # fmt: skip
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        results = []
        run_conversations(bundle.cases, backend, oracle="implicit", batch_size=8, on_finished=results.extend)
        schedule = backend.schedule()
        backend.close()
        return {r.key_id: [t.response for t in r.turns] for r in results}, schedule

    plain, _ = run(SimulatedLLM(answer=answer))
    roomy = SplitLLM(answer=answer)
    answers, schedule = run(roomy)
    assert answers == plain
    assert schedule["rendered"] == sum(len(turns) for turns in plain.values())
    images = {i for case in bundle.cases for turn in case.turns for i in turn.images}
    assert schedule["images_by_id_alone"] and schedule["resent_with_pixels"] == 0
    assert roomy.with_pixels == len(images) and roomy.by_id > len(images)
    assert roomy.render_threads == {"chexpercept-render"}  # never the engine's thread
    # a cache of one image: later turns find theirs gone, are rendered again with pixels, same answers
    tight = SplitLLM(answer=answer, cache_items=1)
    answers, schedule = run(tight)
    assert answers == plain and schedule["resent_with_pixels"] > 0


def test_a_request_the_engine_refuses_fails_its_conversation_only(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    backend = make_backend()
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    llm = FakeLLM.instances[-1]
    # the long RR route's late turns do not fit; the other routes finish
    rr = next(c for c in bundle.cases if c.path.value == "RR")
    llm.llm_engine.max_model_len = 950
    results, failures = [], []
    run_conversations(
        bundle.cases,
        backend,
        oracle="implicit",
        batch_size=8,
        on_finished=results.extend,
        on_failed=failures.extend,
    )
    assert [f.key_id for f in failures] == [rr.key_id]
    assert "vLLM refused the request: ValueError: The decoder prompt (length" in failures[0].error
    assert failures[0].turn_index > 0 and len(results) == len(bundle.cases) - 1
    # without on_failed (--on-error stop) the run stops, naming the case; finished ones came first
    backend = make_backend()
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    FakeLLM.instances[-1].llm_engine.max_model_len = 950
    done = []
    with pytest.raises(ConversationFailed, match=rr.key_id):
        run_conversations(bundle.cases, backend, oracle="implicit", batch_size=8, on_finished=done.extend)


def test_a_vllm_without_enqueue_chat_is_driven_a_batch_at_a_time(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    answers = {}
    for llm_class in (SimulatedLLM, BatchOnlyLLM):
        backend = make_backend()
        backend._llm_class = llm_class
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        results = []
        run_conversations(bundle.cases, backend, oracle="implicit", batch_size=8, on_finished=results.extend)
        answers[llm_class] = {r.key_id: [t.response for t in r.turns] for r in results}
        assert backend.continuous is (llm_class is SimulatedLLM)
        assert backend.describe()["schedule"]["mode"].startswith(
            "continuous" if backend.continuous else "step"
        )
    assert answers[SimulatedLLM] == answers[BatchOnlyLLM]


def test_no_thinking_only_where_the_model_has_the_switch(fixture_bundle, tmp_path, capsys):
    import argparse

    from chexpercept.eval.run import configure
    from chexpercept.eval.runner.plan import chat_kwargs_for

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--no-thinking"])
    assert chat_kwargs_for(resolve("qwen3.6-27b"), args) == ({"enable_thinking": False}, None)
    kwargs, note = chat_kwargs_for(resolve("medgemma-1.5-4b"), args)
    assert kwargs == {} and "no effect" in note
    args = parser.parse_args(["--chat-template-kwargs", '{"foo": 1}'])
    assert chat_kwargs_for(resolve("medgemma1.5"), args) == ({"foo": 1}, None)


def test_without_vllm_the_backend_says_how_to_install_it(fixture_bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    monkeypatch.setitem(sys.modules, "vllm.platforms", None)
    rc = main(
        ["--data-dir", str(fixture_bundle), "--model", "medgemma-1.5-4b", "--output-dir", str(tmp_path)]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[vllm]'" in err and "scripts/setup_vllm_cpu.sh" in err


def test_without_a_gpu_on_cuda_the_backend_says_so(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    backend = make_backend(gpus=[])
    with pytest.raises(BackendError, match="needs a CUDA GPU"):
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))


def test_cpu_engines_run_eagerly_with_an_explicit_kv_cache(fixture_bundle, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(backend_vllm, "_available_memory", lambda: 8 << 30)
    bundle = read_bundle(fixture_bundle)
    backend = make_backend("medgemma-1.5-4b", gpus=[], platform="cpu")
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    args = FakeLLM.instances[-1].kwargs
    assert args["enforce_eager"] is True and args["kv_cache_memory_bytes"] == 2 << 30  # a quarter of 8 GiB
    assert args["tensor_parallel_size"] == 1 and "gpu_memory_utilization" not in args
    described = backend.describe()
    assert described["platform"] == "cpu"
    assert described["platform_defaults"] == {"enforce_eager": True, "kv_cache_memory_bytes": 2 << 30}
    assert described["environment"] == {}  # one process: vLLM binds its own threads
    # at most 4 GiB however much memory is free
    assert backend_vllm.cpu_kv_cache_bytes(100 << 30) == 4 << 30
    # the user's settings win, and the record says which defaults were left
    mine = make_backend(
        "medgemma-1.5-4b",
        gpus=[],
        platform="cpu",
        gpu_memory_utilization=0.3,
        engine_args={"enforce_eager": False},
    )
    mine.setup(RunContext(root=bundle.root, cases=bundle.cases))
    args = FakeLLM.instances[-1].kwargs
    assert args["enforce_eager"] is False and args["gpu_memory_utilization"] == 0.3
    assert "kv_cache_memory_bytes" not in args and mine.describe()["platform_defaults"] == {}
    # VLLM_CPU_KVCACHE_SPACE (vLLM's own variable) sizes the cache instead
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    env = make_backend("medgemma-1.5-4b", gpus=[], platform="cpu")
    env.setup(RunContext(root=bundle.root, cases=bundle.cases))
    assert "kv_cache_memory_bytes" not in FakeLLM.instances[-1].kwargs


def test_cpu_processes_split_the_cores(fixture_bundle, monkeypatch):
    for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.setenv(var, "")  # recorded, so that what setup() sets is undone after the test
        monkeypatch.delenv(var)
    monkeypatch.setattr(backend_vllm, "allowed_cpus", lambda: [0, 1, 2, 3, 4, 5, 6, 7])
    bundle = read_bundle(fixture_bundle)
    backend = make_backend("medgemma-1.5-4b", gpus=[], platform="cpu")
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases, process_index=1, num_processes=2))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "4-7"
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert backend.describe()["devices"] == ["cpu:4-7"]
    assert plan_cpus([0, 2, 4, 6], process_index=0, num_processes=2) == "0,2"
    assert plan_cpus([3], process_index=0, num_processes=1) == "3"
    with pytest.raises(BackendError, match="only 2 CPU"):
        plan_cpus([0, 1], process_index=0, num_processes=3)


def test_ray_and_pipeline_parallel_arguments(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    # GLM-4.6V over two 8-GPU nodes: tensor parallel within a node, a pipeline stage per node
    ray = make_backend(
        "glm-4.6v",
        gpus=["0"],  # this node's GPUs do not limit an engine that spans the cluster
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
    )
    ray.setup(RunContext(root=bundle.root, cases=bundle.cases))
    args = FakeLLM.instances[-1].kwargs
    assert args["tensor_parallel_size"] == 8 and args["pipeline_parallel_size"] == 2
    assert args["distributed_executor_backend"] == "ray" and args["trust_remote_code"] is True
    with pytest.raises(BackendError, match="one engine over the Ray cluster"):
        make_backend("glm-4.6v", distributed_executor_backend="ray").setup(
            RunContext(root=bundle.root, cases=bundle.cases, process_index=0, num_processes=2)
        )
    # on one node: each pipeline stage takes tensor_parallel_size GPUs of the process's share
    local = make_backend(gpus=[str(i) for i in range(8)], tensor_parallel_size=2, pipeline_parallel_size=2)
    local.setup(RunContext(root=bundle.root, cases=bundle.cases))
    assert FakeLLM.instances[-1].kwargs["pipeline_parallel_size"] == 2
    assert local.devices == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match="--pipeline-parallel-size"):
        make_backend(pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="--distributed-executor-backend"):
        make_backend(distributed_executor_backend="slurm")


def test_each_process_gets_its_own_gpus_and_a_clean_environment(fixture_bundle, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    bundle = read_bundle(fixture_bundle)
    backend = make_backend(gpus=["0", "1", "2", "3"])
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases, process_index=1, num_processes=2))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
    assert FakeLLM.instances[-1].kwargs["tensor_parallel_size"] == 2


def test_the_vllm_and_openai_backends_send_the_same_messages(fixture_bundle):
    """One request builder (Request.openai_messages) serves both: only the image URLs differ."""
    from chexpercept.eval.backends.openai.backend import OpenAIBackend
    from chexpercept.eval.conversation import Conversation
    from chexpercept.eval.protocol import Response

    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["RR"])
    case = bundle.cases[0]
    vllm_backend = make_backend()
    vllm_backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    from fake_openai import FakeServer

    with FakeServer() as server:  # asked what it is at setup
        api = OpenAIBackend(resolve("qwen3.6-27b"), sampling=GREEDY, base_url=server.url)
        api.setup(RunContext(root=bundle.root, cases=bundle.cases))
    conversation = Conversation(case, oracle="implicit")
    checked = 0
    while not conversation.done:
        request = conversation.pending
        offline = vllm_backend.build_messages(request)
        online = api.build_payload(request)["messages"]
        assert len(offline) == len(online) == len(request.messages)

        def same_but_images(a, b):
            if isinstance(a, dict) and a.get("type") == "image_url":
                # the same file: a file:// URL inside the bundle, or a data URL of its bytes
                path = Path(a["image_url"]["url"][len("file://") :])
                encoded = base64.b64encode(path.read_bytes()).decode()
                return b["image_url"]["url"] == "data:image/png;base64," + encoded
            if isinstance(a, dict):
                return a.keys() == b.keys() and all(same_but_images(a[k], b[k]) for k in a)
            if isinstance(a, list):
                return len(a) == len(b) and all(same_but_images(x, y) for x, y in zip(a, b))
            return a == b

        assert same_but_images(offline, online)
        # what goes on the wire: json.dumps's bytes, each image's data URL encoded once and spliced in
        assert api.build_body(request) == json.dumps(api.build_payload(request)).encode("utf-8")
        conversation.answer(Response("Answer: 2"))
        checked += 1
    assert checked == len(case.turns)


def test_the_engine_s_sockets_and_compiled_code_are_in_folders_of_this_account_alone(
    fixture_bundle, tmp_path, monkeypatch
):
    """vLLM makes its ZMQ sockets in /tmp and torch its compiled-code cache in
    /tmp/torchinductor_<user>, both under the umask: under umask 000 another account connected to the
    sockets and hung the run (red team, stop 43), and could have planted code in the cache. The
    backend points both at owner-only folders of this account unless the user set them; the
    sockets' folder goes with the engine. vLLM's and Triton's caches of compiled code stay where
    they are, and are made this account's alone."""
    import stat

    bundle = read_bundle(fixture_bundle)
    monkeypatch.setenv("CHEXPERCEPT_CACHE", str(tmp_path / "cache"))
    for var in ("VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # where vLLM's cache is
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # the user's own, kept
    (tmp_path / "triton").mkdir(mode=0o777)
    os.chmod(tmp_path / "triton", 0o777)  # made under umask 000: tightened
    before = os.umask(0)
    try:
        backend = make_backend(gpus=["0"])
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    finally:
        os.umask(before)
    # vLLM's and Triton's caches stay where they are (warm), made this account's alone
    folders = [Path(os.environ[v]) for v in ("VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR")]
    folders += [tmp_path / "xdg" / "vllm", tmp_path / "triton"]
    for folder in folders:
        info = folder.stat()
        assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700, folder
    assert folders[1] == tmp_path / "cache" / "torchinductor"
    backend.close()
    assert not folders[0].exists() and folders[1].exists()
    assert "VLLM_RPC_BASE_PATH" not in os.environ  # as it was, for the next engine of the process
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path / "mine"))  # the user's own choice stays
    again = make_backend(gpus=["0"])
    again.setup(RunContext(root=bundle.root, cases=bundle.cases))
    assert os.environ["VLLM_RPC_BASE_PATH"] == str(tmp_path / "mine")
    again.close()
