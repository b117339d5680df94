"""The runner's own work against the engine's (issue 31): does the engine ever wait for us?

Two parts, each timing the runner against what nothing of ours could beat, in one process and one
period (modes alternated, ``--repeat`` timings each; the median is compared), with the load average
at each measurement:

``--vllm`` (vLLM's real engine, one ``vllm.LLM`` in this process; phantom release with 1024x1024
X-rays, ``chexpercept synth``; oracle implicit; answers of exactly ``--max-tokens`` tokens from the
tiny random model, or the model given; with ``--varied-lengths`` each answer exactly L tokens, L
drawn from its request id, lognormal around ``--max-tokens`` (sigma 1, at most 10x), as real
answers vary: the waves then wait for each wave's longest answer, a continuous runner does not):

* ``ours``: the runner's engine over the vllm backend (``run_conversations``, longest routes first,
  ``--batch-size`` live): parsing, oracle, result records included;
* ``waves, decoded``: the very requests ``ours`` sent, straight into ``LLM.chat`` one call per turn
  wave (all first turns, then all second turns...: the upper bound for any runner that respects the
  turns' order), every image decoded beforehand (vLLM's loader, not timed) and sent with its id;
* ``waves, decoding``: the same, each image decoded (once) inside the timed run, before the wave
  that first needs it;
* ``waves, file URLs``: the same with ``file://`` URLs and ids (vLLM's loader decodes every image
  of the history on every turn);
* ``reference``: the reference's runner (spec 7.1 item 4): one conversation and one ``LLM.chat``
  call at a time, every image of the history read and base64-encoded again on every turn.

For each: wall time, engine iterations, the seconds the engine held no request (between the first
request and the last answer), the main process's peak memory (VmHWM, reset before each mode) and
that of the engine's processes, and whether the answers equal ``ours``'s. vLLM's prefix and
multimodal caches are emptied before every mode.

``--api``: the openai backend against a loopback server in another process that answers each
request after a heavy-tailed delay (lognormal, sigma 1, at most 12x the median, drawn from the
request's bytes), ``--concurrency 16``, 128 live, at short and long median delays: the span against
the floor the server's own delays allow (``max(longest conversation's chain, total / 16)``), the
mean requests in flight, and the client's CPU time per request (this process: the engine, the
event loop, the image threads).

Targets (issue 31): ``ours`` within 1.1x of ``waves, decoded`` and of ``waves, decoding``; the main
process's peak within 1.2x of the reference runner's; the API span within 1.35x of the floor with
the short delays, client work under 2 ms per request. Results go to bench/RESULTS.md ("The
runner's own work"); bench/gpu_smoke.sh prints the same tables on a GPU.

    .venv-vllm/bin/python bench/runner_overlap.py --vllm --write     # vLLM's CPU build
    python bench/runner_overlap.py --api --write
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import hashlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.occupancy import IdleClock
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.engine import admission_order, run_conversations
from chexpercept.eval.protocol import Request, Response, RunContext, Sampling
from chexpercept.eval.registry import resolve

VLLM_TARGET = 1.1
MEMORY_TARGET = 1.2
API_TARGET = 1.35
CLIENT_MS_TARGET = 2.0
VLLM_MODES = ("ours", "waves, decoded", "waves, decoding", "waves, file URLs", "reference")


# ------------------------------------------------------------------------------------ memory
def _status(pid: int | str, field: str) -> float:
    """A /proc/PID/status field in MiB (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (vLLM's engine core and workers)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def reset_peaks(pids: list[int]) -> None:
    """Start the peaks (VmHWM) of these processes again from their current size, after giving the
    allocator's free memory back (so that a mode does not inherit the previous one's peak)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) a process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peaks(engine_pids: list[int]) -> dict[str, float]:
    return {
        "main_peak_mib": round(_status(os.getpid(), "VmHWM"), 1),
        "engine_peak_mib": round(sum(_status(p, "VmHWM") for p in engine_pids), 1),
    }


# ------------------------------------------------------------------------------------ vLLM
class EngineWatch:
    """Counts an engine's iterations (``step`` calls) and the seconds it held no request, by
    wrapping its ``add_request`` and ``step`` (every mode goes through them)."""

    def __init__(self, llm: Any):
        engine = llm.llm_engine
        add, step = engine.add_request, engine.step
        self.iterations = 0
        self.clock = IdleClock()

        def add_request(*args: Any, **kwargs: Any) -> Any:
            out = add(*args, **kwargs)
            self.clock.update(engine.get_num_unfinished_requests())
            return out

        def stepped(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            self.iterations += 1
            self.clock.update(engine.get_num_unfinished_requests())
            return out

        engine.add_request, engine.step = add_request, stepped

    def start(self) -> None:
        self.iterations, self.clock = 0, IdleClock()


class Replay:
    """The requests ``ours`` sent, as ``LLM.chat`` waves (one call per turn depth)."""

    def __init__(self, requests: list[Request], root: Path, load: Any, uuid: Any):
        self.requests = requests
        self.root = root
        self.load = load
        self.uuid = uuid

    def waves(self) -> list[list[Request]]:
        depths: dict[int, list[Request]] = {}
        for r in self.requests:
            depths.setdefault(len(r.messages), []).append(r)
        return [depths[d] for d in sorted(depths)]

    def messages(self, request: Request, image: Any) -> list[dict[str, Any]]:
        def part(relative: str) -> dict[str, Any]:
            return {**image(relative), "uuid": self.uuid(relative)}

        out = []
        for m in request.openai_messages(lambda relative: relative):
            content = m["content"]
            if isinstance(content, list):
                content = [part(p["image_url"]["url"]) if p["type"] == "image_url" else p for p in content]
            out.append({**m, "content": content})
        return out

    def run(self, llm: Any, params: Any, form: str, decoded: dict[str, Any]) -> dict[str, str]:
        """Every wave through ``LLM.chat``; request id -> answer. ``params``: request -> its sampling
        parameters; ``form``: decoded (``decoded`` holds every image), decoding (images decoded
        here, once each), file URLs."""
        answers: dict[str, str] = {}
        mine: dict[str, Any] = decoded if form == "decoded" else {}
        for wave in self.waves():
            if form == "file URLs":

                def image(relative: str) -> dict[str, Any]:
                    return {"type": "image_url", "image_url": {"url": (self.root / relative).as_uri()}}

            else:

                def image(relative: str) -> dict[str, Any]:
                    if relative not in mine:
                        mine[relative] = self.load(relative)
                    return {"type": "image_pil", "image_pil": mine[relative]}

            conversations = [self.messages(r, image) for r in wave]
            outputs = llm.chat(conversations, sampling_params=[params(r) for r in wave], use_tqdm=False)
            answers.update({r.request_id: o.outputs[0].text for r, o in zip(wave, outputs)})
        return answers


def reference_run(llm: Any, params: Any, cases: list[Any], root: Path) -> dict[str, list[str]]:
    """The reference's runner: one conversation and one ``LLM.chat`` call at a time, every image of
    the history read and base64-encoded again on every turn (``Request.chat_messages``); ``params``:
    request -> its sampling parameters."""
    out: dict[str, list[str]] = {}
    for case in cases:
        conversation = Conversation(case, oracle="implicit", root=root)
        while not conversation.done:
            messages = conversation.pending.chat_messages(images="data_url")
            (answer,) = llm.chat([messages], sampling_params=params(conversation.pending), use_tqdm=False)
            conversation.answer(Response(answer.outputs[0].text))
        out[case.key_id] = conversation.responses
    return out


def answer_length(request_id: str, median: int) -> int:
    """A heavy-tailed answer length drawn from the request id: lognormal around ``median`` tokens,
    sigma 1, at least 1, at most 10x the median (the same in every mode and every run)."""
    return max(1, round(heavy_tailed(request_id.encode(), median, 10 * median)))


def heavy_tailed(key: bytes, median: float, cap: float) -> float:
    """A draw fixed by ``key``: lognormal with this median, sigma 1, at most ``cap``."""
    digest = hashlib.blake2b(key, digest_size=8).digest()
    u1 = (int.from_bytes(digest[:4], "big") + 1) / (2**32 + 1)
    u2 = (int.from_bytes(digest[4:], "big") + 1) / (2**32 + 1)
    gauss = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    return min(cap, median * math.exp(gauss))


def by_case(answers: dict[str, str]) -> dict[str, list[str]]:
    """request id (``key/task``) -> answer, as each case's answers in turn order."""
    out: dict[str, list[str]] = {}
    for request_id, text in answers.items():
        out.setdefault(request_id.rsplit("/", 1)[0], []).append(text)
    return out


def vllm_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from runner_schedule import compare_answers
    from vllm import SamplingParams

    from chexpercept.eval.backends.vllm.backend import VLLMBackend

    bundle_dir = Path(args.bundle) if args.bundle else None
    if bundle_dir is None:
        from chexpercept.builder.synth import synthesize

        bundle_dir = synthesize(work / "bundle", per_cell=args.per_cell, seed=0)
    model = args.model
    if model is None:
        from chexpercept.eval.tiny_model import build_tiny_model

        model = str(build_tiny_model(work / "tiny-gemma3", arch="gemma3"))
    bundle = read_bundle(bundle_dir)
    cases = bundle.cases
    spec = resolve(model, backend="vllm")
    context = RunContext(root=bundle.root, cases=cases)
    longest = 10 * args.max_tokens if args.varied_lengths else args.max_tokens
    sampling = Sampling(0.0, 1.0, longest, True)
    engine_args = json.loads(args.engine_args) if args.engine_args else None
    first = VLLMBackend(spec, sampling=sampling, engine_args=engine_args)
    started = time.perf_counter()
    first.setup(context)
    engine_start = time.perf_counter() - started
    llm = first.llm

    def params(request: Request) -> Any:
        """Answers of exactly L tokens (the random model never stops early; a real one would):
        --max-tokens, or with --varied-lengths drawn from the request."""
        length = (
            answer_length(request.request_id, args.max_tokens) if args.varied_lengths else args.max_tokens
        )
        return SamplingParams(temperature=0.0, top_p=1.0, max_tokens=length, min_tokens=length, seed=0)

    watch = EngineWatch(llm)
    engine_pids = descendants(os.getpid())
    assert first.images is not None, "this vLLM has no image loader to reach"
    load = first.images.prepare

    def ours(batch_size: int) -> tuple[dict[str, list[str]], list[Request], dict[str, Any]]:
        backend = VLLMBackend(spec, sampling=sampling, engine_args=engine_args, llm_class=lambda **_: llm)
        backend.platform = first.platform
        backend.setup(context)
        backend.params_for = params  # type: ignore[method-assign]
        sent: list[Request] = []
        submit = backend.submit

        def recording(requests: Any) -> None:
            sent.extend(requests)
            submit(requests)

        backend.submit = recording  # type: ignore[method-assign]
        results: list[Any] = []
        try:
            run_conversations(
                admission_order(cases),
                backend,
                oracle="implicit",
                batch_size=batch_size,
                on_finished=results.extend,
            )
            schedule = backend.schedule()
        finally:
            backend.llm = None  # the engine is shared: only this backend's threads stop
            backend.close()
        return {r.key_id: [t.response for t in r.turns] for r in results}, sent, schedule

    # a first run of ours, untimed: it records the requests the waves replay and warms every code path
    reference_answers, sent, _ = ours(args.batch_size)
    replay = Replay(sent, bundle.root, load, first.image_uuid)
    every_image = sorted({i for r in sent for i in r.images})
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
    for repeat in range(args.repeat):
        order = list(args.modes[repeat % len(args.modes) :]) + list(args.modes[: repeat % len(args.modes)])
        for mode in order:
            llm.reset_prefix_cache()
            llm.reset_mm_cache()
            reset_peaks([os.getpid(), *engine_pids])
            watch.start()
            load_before = os.getloadavg()[0]
            extra: dict[str, Any] = {}
            # the decoded side holds every image before its clock starts (its peak counts them)
            decoded = (
                {relative: load(relative) for relative in every_image} if mode == "waves, decoded" else {}
            )
            cpu0 = cpu_seconds(os.getpid()), sum(cpu_seconds(p) for p in engine_pids)
            t0 = time.perf_counter()
            if mode == "ours":
                answers, _, schedule = ours(args.batch_size)
                extra = {
                    "render_seconds": schedule["render_seconds"],
                    "resent": schedule["resent_with_pixels"],
                    "images": schedule["decoded_images"],
                }
            elif mode == "reference":
                answers = reference_run(llm, params, cases, bundle.root)
            else:
                form = mode.split(", ", 1)[1]
                answers = by_case(replay.run(llm, params, form, decoded))
            seconds = time.perf_counter() - t0
            cpu1 = cpu_seconds(os.getpid()), sum(cpu_seconds(p) for p in engine_pids)
            decoded.clear()
            entry = {
                "seconds": round(seconds, 2),
                "main_cpu_seconds": round(cpu1[0] - cpu0[0], 1),
                "engine_cpu_seconds": round(cpu1[1] - cpu0[1], 1),
                "iterations": watch.iterations,
                "engine_idle_seconds": round(watch.clock.idle, 2),
                "load_average": round((load_before + os.getloadavg()[0]) / 2, 1),
                "same_answers": answers == reference_answers,
                "answers_compared": compare_answers(answers, reference_answers),
                **peaks(engine_pids),
                **extra,
            }
            runs[mode].append(entry)
            print(f"{mode}: {json.dumps(entry)}", file=sys.stderr, flush=True)
    sizes = {}
    for batch_size in args.memory_batch_sizes:
        reset_peaks([os.getpid()])
        before = _status(os.getpid(), "VmRSS")
        ours(batch_size)
        sizes[batch_size] = {
            "main_peak_mib": round(_status(os.getpid(), "VmHWM"), 1),
            "rss_before_mib": round(before, 1),
        }
    first.close()
    import vllm

    return {
        "cases": len(cases),
        "turns": sum(len(c.turns) for c in cases),
        "images": len({i for c in cases for t in c.turns for i in t.images}),
        "image_size": _image_size(bundle.root, cases),
        "model": "tiny random Gemma 3 (make-tiny-model)" if args.model is None else args.model,
        "max_tokens": args.max_tokens,
        "varied_lengths": args.varied_lengths,
        "batch_size": args.batch_size,
        "engine_start_seconds": round(engine_start, 1),
        "engine_args": first.engine_args,
        "vllm": vllm.__version__,
        "platform": first.platform,
        "runs": runs,
        "memory_by_batch_size": sizes,
    }


def _image_size(root: Path, cases: list[Any]) -> str:
    from PIL import Image

    first = next(i for c in cases for t in c.turns for i in t.images)
    with Image.open(root / first) as im:
        return f"{im.size[0]}x{im.size[1]}"


def summarize_vllm(part: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode, and the ratios the targets name."""
    out: dict[str, Any] = {}
    for mode, entries in part["runs"].items():
        if not entries:
            continue
        out[mode] = {
            key: statistics.median(e[key] for e in entries)
            for key in (
                "seconds",
                "iterations",
                "engine_idle_seconds",
                "main_cpu_seconds",
                "engine_cpu_seconds",
                "main_peak_mib",
                "engine_peak_mib",
            )
        }
        out[mode]["load_average"] = round(statistics.median(e["load_average"] for e in entries), 1)
        out[mode]["same_answers"] = all(e["same_answers"] for e in entries)
        compared = [e["answers_compared"] for e in entries if "answers_compared" in e]
        if compared and not out[mode]["same_answers"]:
            starts = [c["earliest_difference_at_char"] for c in compared if c["differ"]]
            out[mode]["answers_differ"] = {
                "turns": compared[0]["turns"],
                "most_differ": max(c["differ"] for c in compared),
                "most_first_turns_differ": max(c["first_turns_differ"] for c in compared),
                "earliest_difference_at_char": min(starts) if starts else None,
            }
    ours = out.get("ours")
    if ours:
        for values in out.values():
            values["ours_over_this"] = round(ours["seconds"] / values["seconds"], 3)
        if "reference" in out:
            out["ours"]["peak_over_reference"] = round(
                ours["main_peak_mib"] / out["reference"]["main_peak_mib"], 3
            )
    return out


# ------------------------------------------------------------------------------------ API
def _delay(body: dict[str, Any], median: float) -> float:
    """The server's delay for a request: lognormal (sigma 1), at most 12x the median, drawn from
    the conversation's texts and image count (the same request gets the same delay in every run and
    every mode, whether its images come with their pixels or by id)."""
    shape = [
        (
            m["role"],
            m["content"]
            if isinstance(m["content"], str)
            else [p.get("text", p["type"]) for p in m["content"]],
        )
        for m in body["messages"]
    ]
    return heavy_tailed(json.dumps(shape).encode(), median, 12 * median)


def _serve(port_out: Any, median: float) -> None:
    """The loopback server (another process), as vLLM's OpenAI-compatible server answers: ``GET
    /v1/models`` says vLLM, images sent with a ``uuid`` are kept and may then be named by it alone
    (an unknown one is refused with vLLM's words); each POST answered after its delay, in parallel;
    the delay rides back in ``system_fingerprint`` (the backend records it per turn)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    held: set[str] = set()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, reply: dict[str, Any]) -> None:
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/version":
                self._send(200, {"version": "0.32.0"})
            else:
                self._send(200, {"object": "list", "data": [{"id": "gpt-5.4", "owned_by": "vllm"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            parts = [p for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]]
            images = [p for p in parts if p["type"] == "image_url"]
            with lock:
                if any(p["image_url"] is None and p.get("uuid") not in held for p in images):
                    self._send(
                        400,
                        {"error": {"message": "Cache miss for image at index 0 but data is not provided."}},
                    )
                    return
                held.update(p["uuid"] for p in images if p.get("uuid"))
            delay = _delay(body, median)
            time.sleep(delay)
            reply = {
                "model": "gpt-5.4",
                "system_fingerprint": f"delay={delay:.6f}",
                "choices": [
                    {"message": {"content": f"Answer: {1 + len(images) % 2}"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
            self._send(200, reply)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    httpd = Server(("127.0.0.1", 0), Handler)
    port_out.put(httpd.server_address[1])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    threading.Event().wait()


#: the openai backend's modes: images by id (the server is vLLM) and every image's pixels every turn
API_MODES = {"by id": ("auto", "data"), "pixels": ("off", "data"), "by id, file URLs": ("auto", "file")}


def api_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from chexpercept.eval.backends.openai.backend import OpenAIBackend, RetryPolicy

    bundle_dir = Path(args.bundle) if args.bundle else None
    if bundle_dir is None:
        from chexpercept.builder.synth import synthesize

        bundle_dir = work / "bundle"
        if not (bundle_dir / "chexpercept.json").is_file():
            synthesize(bundle_dir, per_cell=args.per_cell, seed=0)
    bundle = read_bundle(bundle_dir)
    cases = bundle.cases
    spec = resolve("gpt-5.4")
    concurrency, live = 16, 128
    out: dict[str, Any] = {"cases": len(cases), "concurrency": concurrency, "live": live, "medians": {}}
    context = multiprocessing.get_context("fork")
    bodies = _bare_bodies(bundle, cases)
    for median in args.api_medians:
        ports = context.Queue()
        server = context.Process(target=_serve, args=(ports, median), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
        entries: dict[str, list[dict[str, Any]]] = {mode: [] for mode in API_MODES}
        try:
            for _ in range(args.repeat):
                for mode, (image_ids, image_urls) in API_MODES.items():  # alternated, round by round
                    backend = OpenAIBackend(
                        spec, sampling=Sampling(1.0, 1.0, 8192, False), base_url=url, concurrency=concurrency,
                        retry=RetryPolicy(max_retries=2, base_delay=0.05), image_ids=image_ids,
                        image_urls=image_urls,
                    )  # fmt: skip
                    entry = _api_timing(backend, bundle, cases, live, concurrency)
                    entries[mode].append(entry)
                    print(f"api median {median} {mode}: {json.dumps(entry)}", file=sys.stderr, flush=True)
                bare = _bare_aiohttp_timing(url, bodies, concurrency)
                out.setdefault("bare_aiohttp", {}).setdefault(str(median), []).append(bare)
                print(f"api median {median} bare aiohttp: {json.dumps(bare)}", file=sys.stderr, flush=True)
        finally:
            server.kill()
            server.join()
        out["medians"][str(median)] = entries
    return out


def _bare_bodies(bundle: Any, cases: list[Any]) -> list[bytes]:
    """The floor of an HTTP client's work: one body per turn of every case, built before any timing,
    with each image of the case as a data URL on its first turn only (as by id) and a fixed 2 KB
    question; as JSON that the loopback server takes."""
    import pybase64

    encoded: dict[str, str] = {}
    bodies = []
    for case in cases:
        sent: set[str] = set()
        for turn in case.turns:
            content: list[dict[str, Any]] = [{"type": "text", "text": "Is there a lesion? " * 100}]
            for image in turn.images:
                if image in sent:
                    continue
                sent.add(image)
                if image not in encoded:
                    data = pybase64.b64encode((Path(bundle.root) / image).read_bytes()).decode("ascii")
                    encoded[image] = "data:image/png;base64," + data
                content.append({"type": "image_url", "image_url": {"url": encoded[image]}})
            message = {"role": "user", "content": content}
            bodies.append(
                json.dumps({"model": "gpt-5.4", "messages": [message], "max_completion_tokens": 8}).encode()
            )
    return bodies


def _bare_aiohttp_timing(url: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    """``bodies`` POSTed with a bare aiohttp session (``concurrency`` in flight, each reply read and
    parsed) on this thread: its CPU per request, the part of ours that aiohttp alone costs."""
    import asyncio

    import aiohttp

    async def send_all() -> None:
        limit = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(body: bytes) -> None:
                async with (
                    limit,
                    session.post(
                        url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
                    ) as reply,
                ):
                    data = await reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"bare aiohttp: HTTP {reply.status}: {data[:200]!r}")
                    json.loads(data)

            await asyncio.gather(*(one(b) for b in bodies))

    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(send_all())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "wall_seconds": round(wall, 3),
        "client_ms_per_request": round(1000 * cpu / len(bodies), 2),
        "mib_per_request": round(sum(map(len, bodies)) / len(bodies) / (1 << 20), 3),
        "requests": len(bodies),
    }


def _api_timing(backend: Any, bundle: Any, cases: list[Any], live: int, concurrency: int) -> dict[str, Any]:
    """One run of ``cases`` through ``backend``: span against the floor of the server's own
    delays, in-flight count, client CPU and bytes per request."""
    backend.setup(RunContext(root=bundle.root, cases=cases))
    results: list[Any] = []
    load_before = os.getloadavg()[0]
    cpu0, t0 = time.process_time(), time.perf_counter()
    run_conversations(
        admission_order(cases), backend, oracle="implicit", batch_size=live, on_finished=results.extend
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    schedule, described = backend.schedule(), backend.describe()
    backend.close()
    chains = [sum(float(t.usage["system_fingerprint"].split("=", 1)[1]) for t in r.turns) for r in results]
    requests = sum(len(r.turns) for r in results)
    floor = max(max(chains), sum(chains) / concurrency)
    return {
        "span_seconds": schedule["span_seconds"],
        "wall_seconds": round(wall, 3),
        "floor_seconds": round(floor, 3),
        "over_floor": round(schedule["span_seconds"] / floor, 3),
        "mean_in_flight": schedule["mean_in_flight"],
        "client_ms_per_request": round(1000 * cpu / requests, 2),
        "mib_per_request": round(described["request_bytes_sent"] / requests / (1 << 20), 3),
        "resent_after_a_cache_miss": described["image_ids"]["requests_resent_after_a_cache_miss"],
        "answers": sorted((r.key_id, [t.response for t in r.turns]) for r in results),
        "requests": requests,
        "load_average": round((load_before + os.getloadavg()[0]) / 2, 1),
    }


# ------------------------------------------------------------------------------------ report
def _same(summary: dict[str, Any]) -> str:
    """Whether a mode's answers were ours's, and if not how far they differ."""
    differ = summary.get("answers_differ")
    if summary["same_answers"] or not differ:
        return str(summary["same_answers"])
    return (
        f"False: at most {differ['most_differ']} of {differ['turns']} turns differ "
        f"({differ['most_first_turns_differ']} first turns; earliest at character "
        f"{differ['earliest_difference_at_char']})"
    )


def _lengths(part: dict[str, Any]) -> str:
    """How long the answers of a vLLM part were."""
    if part.get("varied_lengths"):
        return (
            f"answers of exactly L tokens, L drawn from each request, lognormal around {part['max_tokens']} "
            f"(sigma 1, at most {10 * part['max_tokens']})"
        )
    return f"answers of exactly {part['max_tokens']} tokens"


def markdown(report: dict[str, Any], command: str) -> str:
    lines = [
        "## The runner's own work",
        "",
        f"`{command}` (bench/runner_overlap.py, {report['date']}); {report['machine']}.",
        "",
    ]
    part = report.get("vllm")
    if part:
        summary = summarize_vllm(part)
        lines += [
            f"**vLLM's engine** ({part['platform']}, vLLM {part['vllm']}; {part['model']}; {part['cases']} cases, "
            f"{part['turns']} turns, {part['images']} images of {part['image_size']} (`chexpercept synth`); oracle "
            f"implicit; {_lengths(part)}; --batch-size {part['batch_size']}; engine "
            f"start {part['engine_start_seconds']} s). Modes alternated in one process on one engine, "
            f"{len(next(iter(part['runs'].values())))} timings each, medians; caches emptied before each mode; "
            "peaks (VmHWM) reset before each mode:",
            "",
            "| mode | wall time | ours / this | iterations | engine idle | CPU: main process, engine | main process peak | engine processes' peak | load | same answers as ours |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for mode in VLLM_MODES:
            if mode not in summary:
                continue
            v = summary[mode]
            lines.append(
                f"| {mode} | {v['seconds']:.1f} s | {v['ours_over_this']:.2f} | {v['iterations']:,} | "
                f"{v['engine_idle_seconds']:.1f} s | {v['main_cpu_seconds']:.0f} s, {v['engine_cpu_seconds']:.0f} s | "
                f"{v['main_peak_mib']:,.0f} MiB | {v['engine_peak_mib']:,.0f} MiB | "
                f"{v['load_average']} | {_same(v)} |"
            )
        sizes = part.get("memory_by_batch_size") or {}
        if sizes:
            cells = ", ".join(f"{b}: {v['main_peak_mib']:,.0f} MiB" for b, v in sizes.items())
            lines += ["", f"Main process peak of `ours` by --batch-size ({cells}).", ""]
    api = report.get("api")
    if api:
        lines += [
            "",
            f"**openai backend** against a loopback server in another process that answers as vLLM's does "
            f"(`GET /v1/models` says vLLM; images kept by their ids) ({api['cases']} cases, 1024x1024 PNGs as "
            f"data URLs, --concurrency {api['concurrency']}, {api['live']} live; delays lognormal, sigma 1, at most "
            "12x the median, drawn from the conversation; floor from the server's own delays). Modes alternated "
            "round by round; medians of the timings:",
            "",
            "| median delay | mode | span | floor | span / floor | mean in flight | client CPU per request | MiB per request | load | same answers |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for median, modes in api["medians"].items():
            reference = modes[next(iter(modes))][0]["answers"]
            for mode, entries in modes.items():
                keys = [k for k in entries[0] if k not in ("requests", "answers")]
                m = {k: statistics.median(e[k] for e in entries) for k in keys}
                same = all(e["answers"] == reference for e in entries)
                lines.append(
                    f"| {float(median) * 1000:g} ms | {mode} | {m['span_seconds']:.2f} s | {m['floor_seconds']:.2f} s | "
                    f"{m['over_floor']:.2f}x | {m['mean_in_flight']:.1f} of {api['concurrency']} | "
                    f"{m['client_ms_per_request']:.2f} ms | {m['mib_per_request']:.2f} | {m['load_average']:.1f} | {same} |"
                )
        for median, entries in (api.get("bare_aiohttp") or {}).items():
            cpu = [e["client_ms_per_request"] for e in entries]
            lines.append(
                f"\nBare aiohttp at {float(median) * 1000:g} ms (the floor of an HTTP client's work: the same "
                f"server, {entries[0]['requests']} bodies built beforehand, each case's images once, "
                f"{entries[0]['mib_per_request']:.2f} MiB per request; one round after each round of the modes): "
                f"{min(cpu):.2f} to {max(cpu):.2f} ms of client CPU per request, wall time "
                f"{min(e['wall_seconds'] for e in entries):.2f} to {max(e['wall_seconds'] for e in entries):.2f} s."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm", action="store_true", help="the vLLM part (engine in .venv-vllm; default: both parts)"
    )
    parser.add_argument(
        "--api",
        action="store_true",
        help="the openai backend against a loopback server (default: both parts)",
    )
    parser.add_argument("--bundle", help="a release folder (default: chexpercept synth --per-cell N)")
    parser.add_argument(
        "--per-cell", type=int, default=4, help="phantom cases per cell (default 4: 84 cases)"
    )
    parser.add_argument("--model", help="--vllm: a model folder (default: the tiny random Gemma 3)")
    parser.add_argument("--engine-args", help="--vllm: extra engine arguments as JSON")
    parser.add_argument("--max-tokens", type=int, default=32, help="--vllm: tokens per answer (default 32)")
    parser.add_argument(
        "--varied-lengths",
        action="store_true",
        help="--vllm: each answer exactly L tokens, L lognormal around --max-tokens (sigma 1, at most 10x), "
        "drawn from the request id",
    )
    parser.add_argument(
        "--batch-size", type=int, default=256, help="--vllm: live conversations (default 256)"
    )
    parser.add_argument(
        "--memory-batch-sizes",
        type=int,
        nargs="*",
        default=[8, 64],
        help="--vllm: also the main process's peak memory of ours at these --batch-size values (default 8 64)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(VLLM_MODES),
        choices=VLLM_MODES,
        help="--vllm: the modes to time, alternated round by round (default: all)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timings of each mode (default 3)")
    parser.add_argument(
        "--api-medians",
        type=float,
        nargs="+",
        default=[0.01, 0.1],
        metavar="SECONDS",
        help="--api: the loopback server's median reply delays, in seconds (default 0.01 0.1)",
    )
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--merge", help="a report (--json) whose parts not run now are kept")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md's section")
    args = parser.parse_args(argv)
    if not (args.vllm or args.api):
        args.vllm = args.api = True
    work = Path(tempfile.mkdtemp(prefix="chexpercept-bench-overlap-"))
    load = os.getloadavg()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, load average {load[0]:.1f} at the start",
    }
    if args.vllm:
        report["vllm"] = vllm_part(args, work)
        report["vllm"]["summary"] = summarize_vllm(report["vllm"])
    if args.api:
        report["api"] = api_part(args, work)
    if args.merge:
        for part, value in json.loads(Path(args.merge).read_text()).items():
            report.setdefault(part, value)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from shared import write_section

        command = f"{Path(sys.executable).parent.parent.name}/bin/python bench/runner_overlap.py " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        write_section("## The runner's own work", markdown(report, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
