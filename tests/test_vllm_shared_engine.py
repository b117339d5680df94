"""The vllm backend on vLLM's real engine (its CPU build), one engine per architecture for the module.

Checks that need no command line of their own share the engine (in this process): continuous
scheduling gives the answers of one conversation at a time and of step-by-step scheduling; each
request's prompt is rendered exactly as ``LLM.chat`` renders it; an image's stable id changes
nothing but the work. The command-line runs (signals, crashes, accelerate, vllm serve) are in
tests/test_vllm_engine.py. ``scripts/test.sh`` runs both in the environment of
``scripts/setup_vllm_cpu.sh``; elsewhere they are skipped.
"""

from __future__ import annotations

import pytest
from vllm_settings import ENGINE_ARGS

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: bash scripts/setup_vllm_cpu.sh")

from chexpercept.bundle import read_bundle  # noqa: E402
from chexpercept.cli import main as cli  # noqa: E402
from chexpercept.eval.backends.vllm.backend import VLLMBackend  # noqa: E402
from chexpercept.eval.conversation import Conversation  # noqa: E402
from chexpercept.eval.engine import admission_order, run_conversations  # noqa: E402
from chexpercept.eval.protocol import Response, RunContext, Sampling  # noqa: E402
from chexpercept.eval.registry import resolve  # noqa: E402

GREEDY = Sampling(temperature=0.0, top_p=1.0, max_tokens=8, greedy=True)


@pytest.fixture(scope="module")
def engines(phantom_bundle, tmp_path_factory):
    """One live engine per architecture (the backend that started it, closed at the end)."""
    out = tmp_path_factory.mktemp("shared_models")
    bundle = read_bundle(phantom_bundle)
    started = {}
    for arch in ("gemma3", "qwen2.5-vl"):
        model = out / arch
        assert cli(["make-tiny-model", "--output-dir", str(model), "--arch", arch]) == 0
        backend = VLLMBackend(resolve(str(model), backend="vllm"), sampling=GREEDY, engine_args=ENGINE_ARGS)
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        assert str(backend.llm.model_config.dtype) == "torch.float32"  # tests/vllm_settings.py
        started[arch] = backend
    yield started
    for backend in started.values():
        backend.close()


def on(engine: VLLMBackend, **kwargs) -> VLLMBackend:
    """Another backend over the same live engine (its own counts)."""
    backend = VLLMBackend(engine.spec, sampling=GREEDY, llm_class=lambda **_: engine.llm, **kwargs)
    backend.platform = engine.platform
    backend.setup(RunContext(root=engine.root, cases=[]))
    return backend


def run(backend: VLLMBackend, cases, *, batch_size: int, schedule: str = "continuous"):
    results = []
    run_conversations(
        admission_order(cases),
        backend,
        oracle="implicit",
        batch_size=batch_size,
        on_finished=results.extend,
        schedule=schedule,
    )
    return {r.key_id: [(t.task, t.response, t.parsed) for t in r.turns] for r in results}


@pytest.mark.parametrize("arch", ["gemma3", "qwen2.5-vl"])
def test_continuous_scheduling_gives_the_answers_of_one_at_a_time_and_of_steps(arch, engines, phantom_bundle):
    cases = read_bundle(phantom_bundle).cases
    engine = engines[arch]
    batched = on(engine)
    together = run(batched, cases, batch_size=64)
    assert len(together) == len(cases)
    assert run(on(engine), cases, batch_size=1) == together
    stepped = on(engine)
    assert run(stepped, cases, batch_size=64, schedule="step") == together
    # the same work, counted; how fast each mode is belongs to bench/runner_schedule.py
    mine, theirs = batched.describe()["schedule"], stepped.describe()["schedule"]
    assert mine["generated_tokens"] == theirs["generated_tokens"] > 0
    assert (
        mine["iterations"] >= mine["floor_iterations"] > 0
        and theirs["iterations"] >= theirs["floor_iterations"]
    )
    assert mine["mode"] == "continuous"
    # each image decoded once, off the engine's thread, and sent by its id alone on later turns
    images = {i for case in cases for turn in case.turns for i in turn.images}
    decoded = mine["decoded_images"]["prepared_ahead"] + mine["decoded_images"]["prepared_on_demand"]
    assert mine["images_by_id_alone"] and decoded <= len(images) + mine["resent_with_pixels"]


def test_each_prompt_is_rendered_as_llm_chat_renders_it(engines, phantom_bundle):
    """enqueue_chat (one request at a time, with image ids) and LLM.chat (a batch, as before the
    continuous engine): the same prompt token ids and the same answers for the same conversation."""
    engine = engines["gemma3"]
    case = next(c for c in read_bundle(phantom_bundle).cases if c.path.value == "RR")
    conversation = Conversation(case, oracle="implicit")
    requests = []
    while not conversation.done:
        requests.append(conversation.pending)
        conversation.answer(Response("Answer: 1"))
    continuous = on(engine)
    continuous.submit(requests)
    streamed = {}
    while len(streamed) < len(requests):
        for request, response in continuous.completed():
            streamed[request.request_id] = response
    plain = on(engine, image_ids=False)  # no uuid: vLLM hashes the pixels itself
    chat = dict(zip([r.request_id for r in requests], plain.generate(requests)))
    for request in requests:
        a, b = streamed[request.request_id], chat[request.request_id]
        assert (a.text, a.usage["input_tokens"], a.usage["output_tokens"]) == (
            b.text,
            b.usage["input_tokens"],
            b.usage["output_tokens"],
        ), request.request_id
    # and the token ids themselves
    llm = engine.llm
    messages = continuous.build_messages(requests[-1])
    (added,) = llm.enqueue_chat([messages], continuous.params, use_tqdm=False)
    ids = added.split("-", 1)[0]  # outputs carry the id LLM gave, without vLLM's random suffix
    done = {}
    while ids not in done and llm.llm_engine.has_unfinished_requests():
        for out in llm.llm_engine.step():
            if out.finished:
                done[out.request_id] = out
    (reference,) = llm.chat(
        [plain.build_messages(requests[-1])], sampling_params=plain.params, use_tqdm=False
    )
    assert list(done[ids].prompt_token_ids) == list(reference.prompt_token_ids)
    assert (
        "uuid" in messages[1]["content"][1]
        and "uuid" not in plain.build_messages(requests[-1])[1]["content"][1]
    )
