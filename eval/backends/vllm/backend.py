"""vLLM offline engine, fed continuously: each request joins the running engine as soon as it arises.

Every request is rendered exactly as ``LLM.chat`` renders it (``LLM.enqueue_chat``, the same chat
template and multimodal processing) and added to the engine while others run; the backend steps the
engine (``LLMEngine.step``, one scheduler iteration each) and hands back each answer as soon as its
request finishes, so a conversation's next turn joins the engine's batch at the next iteration
instead of waiting for the slowest answer of a step (vLLM's continuous batching, kept full).
A request the engine refuses (a prompt longer than ``max_model_len``, too many images) fails its own
conversation only; a dead engine (``EngineDeadError``) ends the run with one line.

Images are handed over as ``file://`` URLs inside the bundle folder (``allowed_local_media_path``),
so nothing is base64-encoded per turn as the reference does (spec 7.1 item 4), each with a stable id
(the ``uuid`` of its content part: the SHA-256 of the file), so that vLLM does not hash the decoded
pixels again on every turn that re-sends the image and its multimodal caches recognise it at once.
vLLM's prefix cache reuses the shared history of later turns (its hit rate is recorded in run.json).
``limit_mm_per_prompt`` is sized to the largest conversation of the selected cases. run.json also
records the engine's scheduler iterations, the tokens generated and the floor for that work (see
``ScheduleStats``). A vLLM without ``LLM.enqueue_chat`` is driven a batch at a time with ``LLM.chat``.

It runs wherever vLLM's platform does: CUDA GPUs (the ``vllm`` extra), or the CPU with vLLM's CPU
build (``scripts/setup_vllm_cpu.sh``). vLLM is imported only when this backend starts.

Placement, per process of a data-parallel run (``accelerate launch``): on CUDA the visible GPUs are
split evenly between the processes of a machine and each engine uses its share for tensor parallelism; with
``--distributed-executor-backend ray`` one engine spans a Ray cluster (tensor x pipeline parallel,
for models larger than one node). On the CPU each process's engine is bound to its share of the
cores, runs eagerly (no graph compilation: start-up in about a third of the time) and gets an explicit
KV-cache size instead of a fraction of the machine's memory (``gpu_memory_utilization`` means a
fraction of the NUMA node's memory there).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chexpercept.containment import image_file
from chexpercept.domains import COUNT, SHARE
from chexpercept.escape import shown
from chexpercept.eval.backends.occupancy import IdleClock, WorkLedger, ratio, schedule_record
from chexpercept.eval.backends.options import BackendOptions, json_object, option
from chexpercept.eval.backends.prefetch import ImagePrefetch
from chexpercept.eval.backends.replies import MarkerDecoder
from chexpercept.eval.backends.vllm.limits import engine_image_limit, engine_max_model_len
from chexpercept.eval.backends.vllm.placement import (
    _available_memory,
    allowed_cpus,
    cpu_kv_cache_bytes,
    plan_cpus,
    plan_gpus,
    visible_gpus,
    vllm_platform,
)
from chexpercept.eval.backends.vllm.render_thread import RenderThread
from chexpercept.eval.protocol import (
    BackendBase,
    BackendError,
    Completion,
    Request,
    Response,
    RunContext,
    Sampling,
)
from chexpercept.eval.registry import ModelSpec
from chexpercept.eval.runner.identity import ENGINE_ARGS_NAMING_FILES
from chexpercept.eval.runner.interrupts import shielded_children
from chexpercept.eval.runner.preflight import ContextLimits, model_context_length
from chexpercept.input_files import IMAGE, open_input

#: launcher variables that would make vLLM's own worker processes think they belong to our group
_LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.85
EXECUTOR_BACKENDS: tuple[str, ...] = ("mp", "ray")


#: engine arguments that place or size the engine and cannot change an answer: not part of the
#: run's identity (every other engine argument is: dtype, quantization, max_model_len, the chat
#: template, the tokenizer, multimodal processor settings...)
PLACEMENT_ENGINE_ARGS = frozenset(
    {
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "swap_space",
        "cpu_offload_gb",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "distributed_executor_backend",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enforce_eager",
        "disable_log_stats",
        "enable_prefix_caching",
        "allowed_local_media_path",
        "limit_mm_per_prompt",
        "seed",
    }
)


#: engine arguments the run sets itself, and why --engine-args may not (a red team's finding: the
#: model loaded would differ from the one run.json's identity names, the seed from --seed, the media
#: path would reach beyond the bundle)
ENGINE_ARGS_OF_THE_RUN = {
    "model": "the run loads --model, which run.json names",
    "seed": "give --seed",
    "allowed_local_media_path": "the run lets the engine read the bundle's folder alone",
    # a Hub revision outside the snapshot the run loads and fingerprints (red team round 2, stop 43)
    "revision": "the run loads the snapshot --revision resolved, which run.json records",
    "code_revision": "the model's code runs from the commit run.json records (--revision)",
    "tokenizer_revision": "give tokenizer as a local folder, whose files count in the run's identity",
}
#: engine arguments that name code by its import path (a module of the working directory or of the
#: environment): what it does cannot be fingerprinted, so no identity could tell two runs apart
ENGINE_ARGS_NAMING_CODE = ("logits_processors", "worker_cls", "worker_extension_cls", "scheduler_cls")
#: engine arguments that are also options: in --engine-args, the option's domain holds as well
ENGINE_ARG_DOMAINS = {
    "gpu_memory_utilization": SHARE,
    "tensor_parallel_size": COUNT,
    "pipeline_parallel_size": COUNT,
    "max_num_seqs": COUNT,
}


@dataclass(frozen=True)
class VLLMOptions(BackendOptions):
    """The vllm backend's options (``chexpercept run --help``, group "vllm backend")."""

    tensor_parallel_size: int | None = option(
        type=COUNT, answers=False, help="GPUs per engine (default: the process's share)"
    )
    pipeline_parallel_size: int = option(
        default=1, type=COUNT, answers=False, help="pipeline stages per engine (default 1)"
    )
    distributed_executor_backend: str | None = option(
        choices=EXECUTOR_BACKENDS,
        answers=False,
        help="ray: one engine over a Ray cluster (models larger than a node); default: vLLM's choice",
    )
    gpu_memory_utilization: float | None = option(
        type=SHARE,
        answers=False,
        help=f"fraction of GPU memory for the engine (default {DEFAULT_GPU_MEMORY_UTILIZATION}); on the "
        "CPU a fraction of the NUMA node's memory, by default replaced by an explicit KV-cache size",
    )
    engine_args: dict[str, Any] | None = option(
        type=json_object, help="extra vLLM engine arguments as JSON (override registry)"
    )

    def answers(self) -> dict[str, Any]:
        """The engine arguments that can change an answer (all but PLACEMENT_ENGINE_ARGS)."""
        extra = self.engine_args or {}
        return {"engine_args": {k: v for k, v in sorted(extra.items()) if k not in PLACEMENT_ENGINE_ARGS}}


class VLLMBackend(BackendBase):
    name = "vllm"
    default_batch_size = 256
    Options = VLLMOptions
    engine_packages = ("vllm", "transformers", "tokenizers", "torch", "pillow")

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        options: VLLMOptions | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        on_error: str = "stop",
        llm_class: Callable[..., Any] | None = None,
        sampling_params_class: Callable[..., Any] | None = None,
        gpus: Sequence[str] | None = None,
        platform: str | None = None,
        image_ids: bool = True,
        **fields: Any,
    ):
        """``options`` (or its ``fields`` as keywords). The other keywords are for tests and bench/:
        vLLM's classes, the GPUs and the platform as this process would see them, and the image ids
        (off only to measure what they save)."""
        options = options or VLLMOptions(**fields)
        self.options = options
        tensor_parallel_size = options.tensor_parallel_size
        pipeline_parallel_size = options.pipeline_parallel_size
        distributed_executor_backend = options.distributed_executor_backend
        gpu_memory_utilization = options.gpu_memory_utilization
        engine_overrides = options.engine_args
        self.spec = spec
        self._sampling = sampling
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.engine_overrides = dict(engine_overrides or {})
        taken = {k: v for k, v in ENGINE_ARGS_OF_THE_RUN.items() if k in self.engine_overrides}
        if taken:
            raise ValueError(
                "--engine-args may not set " + "; ".join(f"{k} ({why})" for k, why in taken.items())
            )
        code = [k for k in ENGINE_ARGS_NAMING_CODE if k in self.engine_overrides]
        if code:
            raise ValueError(
                f"--engine-args may not set {', '.join(code)}: it names code by its import path, which runs "
                "outside the model's folder and the run's identity, so a change to it could never be told "
                "apart on a resume"
            )
        for key, domain in ENGINE_ARG_DOMAINS.items():
            if key in self.engine_overrides:
                domain.require(self.engine_overrides[key], f"--engine-args {key}")
        for key in ENGINE_ARGS_NAMING_FILES:
            value = self.engine_overrides.get(key)
            if value is not None and not (
                isinstance(value, str) and os.path.exists(os.path.expanduser(value))
            ):
                raise ValueError(
                    f"--engine-args {key} must name a local folder or file (its files then count in the "
                    f"run's identity), got {value!r}: a Hub id there loads whatever the cache holds that "
                    "day; fetch it (chexpercept download-model) and give its folder"
                )
        self.requested_tp = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self.executor_backend = distributed_executor_backend
        self.gpu_memory_utilization = gpu_memory_utilization
        self.seed = 0
        self._llm_class = llm_class
        self._params_class = sampling_params_class
        self._gpus = gpus
        self.platform = platform
        self.engine_args: dict[str, Any] = {}
        #: engine arguments chosen for the platform (not given by the registry or the user)
        self.platform_defaults: dict[str, Any] = {}
        #: environment variables set for vLLM's processes (CPU binding, GPU ids)
        self.environment: dict[str, str] = {}
        self.devices: list[str] = []
        self.root = ""
        self.llm: Any = None
        self.params: Any = None
        #: keeps reasoning markers that are special tokens for the parser (eval/backends/replies.py)
        self.markers: MarkerDecoder | None = None
        self._prompt_tokens = 0
        self._cached_tokens = 0
        #: give each image a stable id (vLLM's multimodal uuids); off only to measure what it saves
        self.image_ids = image_ids
        self._uuids: dict[str, str] = {}
        #: images decoded ahead of need with vLLM's own loader, each until its first render
        #: (eval/backends/prefetch.py; None: images go as file URLs)
        self.images: ImagePrefetch[Any] | None = None
        #: send an image the engine already holds by its id alone (vLLM's multimodal processor
        #: cache); on where the engine has that cache and image ids are on
        self.ids_only = False
        #: images whose pixels went to the engine (later turns send their id alone)
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        #: requests rendered again with every image's pixels (the engine's cache had let one go)
        self.resent = 0
        self._resend: set[str] = set()
        #: renders requests off the engine's thread (eval/backends/vllm/render_thread.py)
        self.renderer: RenderThread | None = None
        self.render_seconds = 0.0
        self.rendered = 0
        #: request id (vLLM's) -> the request, for requests in the engine
        self._in_flight: dict[str, Request] = {}
        #: vLLM's ids of the requests in the engine that sent an image by its id alone
        self._by_id: set[str] = set()
        #: answers ready before the next step (requests the engine refused)
        self._ready: list[Completion] = []
        #: requests handed over, for a vLLM without enqueue_chat (answered a batch at a time)
        self._pending: list[Request] = []
        self._fatal: tuple[type[BaseException], ...] = ()
        self.continuous = True
        self.max_num_seqs: int | None = None
        #: scheduler iterations (engine steps) and the tokens generated per conversation
        self.iterations = 0
        self.ledger = WorkLedger()
        #: seconds the engine held no request between the first request and the last answer
        self.idle = IdleClock()

    @property
    def trust_remote_code(self) -> bool:
        """Whether vLLM will run the model's own code (the registry's or --engine-args'
        trust_remote_code); its commit is then pinned (eval/weights.py)."""
        return bool({**self.spec.engine_args, **self.engine_overrides}.get("trust_remote_code"))

    # ------------------------------------------------------------------ engine arguments
    def build_engine_args(self, context: RunContext) -> dict[str, Any]:
        """The arguments of ``vllm.LLM`` for this process (also sets ``environment``)."""
        platform = self.platform or vllm_platform()
        self.platform = platform
        args: dict[str, Any] = {
            "model": self.spec.model_id,
            "enable_prefix_caching": True,
            **self.spec.engine_args,
            "limit_mm_per_prompt": {"image": context.max_images_per_case},
            "allowed_local_media_path": str(context.root),
            "seed": context.local_seed,
        }
        if self.pipeline_parallel_size > 1:
            args["pipeline_parallel_size"] = self.pipeline_parallel_size
        if self.executor_backend:
            args["distributed_executor_backend"] = self.executor_backend
        if self.gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
        if platform == "cpu":
            self._cpu_placement(args, context)
        else:
            self._gpu_placement(args, context)
        for key, value in self.platform_defaults.items():
            args.setdefault(key, value)
        args.update(self.engine_overrides)
        # what the user or the registry set wins over a platform default: keep the record honest
        self.platform_defaults = {
            k: v for k, v in self.platform_defaults.items() if k not in self.engine_overrides
        }
        return args

    def identity(self, context: RunContext) -> dict[str, Any]:
        """The engine arguments that can change an answer, as the engine gets them (the registry's,
        then --engine-args), all but PLACEMENT_ENGINE_ARGS."""
        given = {**self.spec.engine_args, **self.engine_overrides}
        return {"engine_args": {k: v for k, v in sorted(given.items()) if k not in PLACEMENT_ENGINE_ARGS}}

    def model_dir(self) -> str | None:
        return self.spec.model_id

    def context_limits(self, context: RunContext) -> ContextLimits:
        """max_model_len and images per prompt as this run's engine will have them (for the
        preflight check, before the engine loads): --engine-args, then the registry, then the
        model's config.json."""
        args = {**self.spec.engine_args, **self.engine_overrides}
        where = (
            "--engine-args" if "max_model_len" in self.engine_overrides else "the registry's engine arguments"
        )
        length, length_source = engine_max_model_len(args.get("max_model_len"), where), where
        if length is None:
            found = model_context_length(self.spec.model_id)
            auto = args.get("max_model_len") == -1
            length, length_source = found if found else (None, "")
            if found and auto:
                length_source += f" (max_model_len -1 in {where}: the engine fits it to memory, at most this)"
        images_where = (
            "--engine-args"
            if "limit_mm_per_prompt" in self.engine_overrides
            else "the registry's engine arguments"
        )
        images = engine_image_limit(args, images_where)
        images_source = (
            f"language_model_only in {images_where}"
            if args.get("language_model_only") is True
            else f"limit_mm_per_prompt in {images_where}"
        )
        if images is None:
            images, images_source = (
                context.max_images_per_case,
                "limit_mm_per_prompt: the largest conversation",
            )
        return ContextLimits(
            length,
            length_source,
            images,
            images_source,
            raise_length="--engine-args '{{\"max_model_len\": {n}}}', memory permitting",
            raise_images='--engine-args \'{{"limit_mm_per_prompt": {{"image": {n}}}}}\'',
        )

    def _gpu_placement(self, args: dict[str, Any], context: RunContext) -> None:
        args.setdefault("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
        if self.executor_backend == "ray":
            # one engine spans the Ray cluster: its GPUs are the cluster's, not this node's
            if context.num_processes > 1:
                raise BackendError(
                    "--distributed-executor-backend ray runs one engine over the Ray cluster: start "
                    "eval/run.py once (python, not accelerate launch with several processes)"
                )
            args["tensor_parallel_size"] = self.requested_tp or 1
            return
        gpus = list(self._gpus) if self._gpus is not None else visible_gpus()
        tp, devices = plan_gpus(
            gpus,
            process_index=context.local_index,
            num_processes=context.local_count,
            requested_tp=self.requested_tp,
            tp_divisor=self.spec.tp_divisor,
            pipeline_parallel_size=self.pipeline_parallel_size,
        )
        self.devices = devices
        args["tensor_parallel_size"] = tp
        if context.local_count > 1:
            self.environment["CUDA_VISIBLE_DEVICES"] = ",".join(devices)

    def _cpu_placement(self, args: dict[str, Any], context: RunContext) -> None:
        args["tensor_parallel_size"] = self.requested_tp or 1
        defaults: dict[str, Any] = {"enforce_eager": True}
        if self.gpu_memory_utilization is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            defaults["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(_available_memory())
        self.platform_defaults = defaults
        if context.local_count > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            cpus = allowed_cpus()
            self.environment["VLLM_CPU_OMP_THREADS_BIND"] = plan_cpus(
                cpus, process_index=context.local_index, num_processes=context.local_count
            )
            # every core of the share computes; none is kept back for the front end
            self.environment["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        self.devices = [f"cpu:{self.environment.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}"]

    # ------------------------------------------------------------------ life cycle
    def setup(self, context: RunContext) -> None:
        self.root = str(context.root)
        self.seed = context.local_seed
        self.engine_args = self.build_engine_args(context)
        if context.num_processes > 1:
            # one engine per process on its own devices; vLLM's workers must not see our launcher's group
            os.environ.update(self.environment)
            for var in _LAUNCHER_ENV:
                os.environ.pop(var, None)
        self._private = private_engine_folders()
        os.environ.update(self._private)
        llm_class, params_class = self._llm_class, self._params_class
        if llm_class is None or params_class is None:
            from vllm import LLM, SamplingParams

            llm_class = llm_class or LLM
            params_class = params_class or SamplingParams
        self._fatal = _fatal_errors()
        with shielded_children():  # a Ctrl-C to the process group reaches this process only
            self.llm = llm_class(**self.engine_args)
        get_tokenizer = getattr(self.llm, "get_tokenizer", None)
        self.markers = MarkerDecoder(get_tokenizer()) if callable(get_tokenizer) else None
        s = self._sampling
        self.params = params_class(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=self.seed
        )
        self.continuous = callable(getattr(self.llm, "enqueue_chat", None))
        load = _image_loader(self.llm) if self.image_ids else None
        if load is not None:

            def decode(relative: str) -> Any:
                self.image_uuid(relative)
                return load(self.image_url(relative))

            self.images = ImagePrefetch(
                decode,
                decoded_bytes,
                budget=image_budget(),
                workers=image_workers(),
                name="chexpercept-decode",
            )
        self.ids_only = self.image_ids and _has_processor_cache(self.llm)
        if self.continuous and _can_split(self.llm):
            self.renderer = RenderThread(self._render, ahead=RENDER_AHEAD)
        config = getattr(
            getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None), "scheduler_config", None
        )
        self.max_num_seqs = getattr(config, "max_num_seqs", None)

    def image_url(self, relative: str) -> str:
        """file:// URL of the image, resolved inside the bundle and checked to be a PNG or JPEG."""
        return image_file(self.root, relative).as_uri()

    def image_uuid(self, relative: str) -> str:
        """A stable id for an image: the SHA-256 of the file (computed once per live conversation)."""
        uuid = self._uuids.get(relative)
        if uuid is None:
            digest = hashlib.sha256()
            with open_input(image_file(self.root, relative), IMAGE, what="image") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            uuid = self._uuids[relative] = "sha256:" + digest.hexdigest()
        return uuid

    def build_messages(self, request: Request) -> list[dict[str, Any]]:
        """The request as ``LLM.chat`` takes it (OpenAI-style messages, Request.openai_messages):
        each image part with the image's stable id (``uuid``), and the image as its decoded pixels
        (``image_pil``: vLLM's own loader, the pixels the file's URL gives, decoded ahead of need),
        or by its id alone when the engine already holds it (``ids_only``), or as a file:// URL
        inside the bundle (image ids off, or a vLLM without a loader to reach)."""
        return self._messages(request, resend=False)[0]

    def _messages(self, request: Request, *, resend: bool) -> tuple[list[dict[str, Any]], list[str], bool]:
        """(messages, the images whose pixels they carry, whether an image goes by its id alone);
        ``resend``: every image with its pixels."""
        if not self.image_ids:
            return request.openai_messages(self.image_url), [], False
        carried: list[str] = []
        by_id = False
        with self._lock:
            sent = set() if resend or not self.ids_only else self._sent & set(request.images)

        def part(relative: str) -> dict[str, Any]:
            nonlocal by_id
            # decoding also hashed the file (the pool's workers do both ahead of need)
            image = None if relative in sent or self.images is None else self.images.get(relative)
            uuid = self.image_uuid(relative)
            if relative in sent:
                by_id = True
                return {"type": "image_pil", "image_pil": None, "uuid": uuid}
            carried.append(relative)
            if self.images is None:
                return {"type": "image_url", "image_url": {"url": self.image_url(relative)}, "uuid": uuid}
            return {"type": "image_pil", "image_pil": image, "uuid": uuid}

        return request.messages_with(part), carried, by_id

    def _chat_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"use_tqdm": False}
        if self.chat_template_kwargs:
            kwargs["chat_template_kwargs"] = self.chat_template_kwargs
        return kwargs

    def params_for(self, request: Request) -> Any:
        """The sampling parameters of one request (the run's; bench/ varies answer lengths here)."""
        return self.params

    def prefetch(self, images: Sequence[str]) -> None:
        """Decode these images ahead (the next turns carry them), as the budget allows."""
        if self.images is not None:
            with self._lock:
                wanted = [i for i in images if i not in self._sent]
            self.images.want(wanted, hint=True)

    # ------------------------------------------------------------------ requests
    def submit(self, requests: Sequence[Request]) -> None:
        """Every request goes to the render thread (rendered as ``LLM.chat`` renders it) and joins
        the running engine as soon as it is rendered (``completed`` adds it); its new images start
        decoding at once. A vLLM whose rendering cannot be split from adding (no
        ``_preprocess_chat_one``) gets each request here, rendered and added by ``enqueue_chat``."""
        if not self.continuous:
            self._pending.extend(requests)
            return
        ordered = sorted(requests, key=lambda r: -r.turns_after)  # the order the render thread takes
        if self.images is not None:
            with self._lock:
                wanted = [i for r in ordered for i in r.images if i not in self._sent]
            self.images.want(wanted)
        if self.renderer is not None:
            self.renderer.put(requests)
            return
        rendered: list[tuple[Request, Any]] = []
        for request in ordered:
            try:
                rendered.append((request, self._render(request)))
            except BaseException as e:
                rendered.append((request, e))
        self._add(rendered)

    def _render(self, request: Request) -> tuple[Callable[[], str], bool]:
        """Render ``request`` (on the render thread); returns what adds it to the engine and whether
        an image went by its id alone. An image the engine's cache no longer holds makes vLLM refuse
        the render: it is rendered again with every image's pixels."""
        started = time.perf_counter()
        resend = request.request_id in self._resend
        try:
            try:
                return self._render_once(request, resend=resend)
            except self._fatal:
                raise
            except Exception:
                if resend or not self.ids_only:
                    raise
                self.resent += 1
                return self._render_once(request, resend=True)
        finally:
            self.rendered += 1
            self.render_seconds += time.perf_counter() - started

    def _render_once(self, request: Request, *, resend: bool) -> tuple[Callable[[], str], bool]:
        """One render: ``LLM.enqueue_chat`` does it and adds at once; its two halves (vLLM's
        ``_preprocess_chat_one`` and ``_add_request``, the very calls it makes) are used where this
        vLLM has them, the first here, the second on the engine's thread."""
        messages, carried, by_id = self._messages(request, resend=resend)
        params = self.params_for(request)
        kwargs = self._chat_kwargs()
        llm = self.llm
        preprocess, add = getattr(llm, "_preprocess_chat_one", None), getattr(llm, "_add_request", None)
        template_kwargs = kwargs.get("chat_template_kwargs") or {}
        if template_kwargs.get("enable_thinking"):
            # what enqueue_chat does for a thinking model (Gemma 4 keeps its marker tokens)
            adjust = getattr(llm, "_adjust_params_for_parsing", None)
            if not callable(adjust):
                preprocess = None
            else:
                adjust([params])
        if not (callable(preprocess) and callable(add)):
            self._note_sent(carried)
            return (lambda: llm.enqueue_chat([messages], params, **kwargs)[0]), by_id
        prompt = preprocess(messages, chat_template_kwargs=kwargs.get("chat_template_kwargs"))
        self._note_sent(carried)
        resolve = getattr(llm, "_resolve_mm_lora", None)
        lora = resolve(prompt, None) if callable(resolve) else None
        return (lambda: add(prompt, params, lora_request=lora, priority=0)), by_id

    def _note_sent(self, carried: Sequence[str]) -> None:
        """These images' pixels went to the engine: later turns send their ids alone."""
        if carried and self.ids_only:
            with self._lock:
                self._sent.update(carried)

    def _add_rendered(self, *, wait: bool) -> None:
        """Add every request the render thread has rendered to the engine; with ``wait``, wait for
        at least one."""
        if self.renderer is not None:
            self._add(self.renderer.take(wait=wait))

    def _add(self, rendered: Sequence[tuple[Request, Any]]) -> None:
        """Add rendered requests to the engine (on the engine's thread), in order; one the engine
        refuses (or that could not be rendered) fails alone."""
        for request, rendered_as in rendered:
            if isinstance(rendered_as, self._fatal):
                raise engine_error(rendered_as) from rendered_as
            if isinstance(rendered_as, BaseException):
                if not isinstance(rendered_as, Exception):
                    raise rendered_as
                # the engine refused this request (too long, an image it cannot read)
                self._ready.append((request, Response("", {}, error=refusal(rendered_as))))
                continue
            add, by_id = rendered_as
            try:
                request_id = _external(add())
            except self._fatal as e:
                raise engine_error(e) from e
            except Exception as e:
                self._ready.append((request, Response("", {}, error=refusal(e))))
                continue
            self._in_flight[request_id] = request
            if by_id:
                self._by_id.add(request_id)
        self.idle.update(len(self._in_flight))
        self.ledger.in_flight(self._running())

    def _running(self) -> int:
        n = len(self._in_flight)
        return min(n, self.max_num_seqs) if isinstance(self.max_num_seqs, int) else n

    def completed(self) -> list[Completion]:
        if not self.continuous:
            batch, self._pending = self._pending, []
            return list(zip(batch, self.generate(batch)))
        engine = self.llm.llm_engine
        while True:
            self._add_rendered(wait=False)
            if self._ready:
                ready, self._ready = self._ready, []
                return ready
            if self._in_flight:
                if not engine.has_unfinished_requests():  # stepping an idle engine would wait forever
                    lost = ", ".join(r.request_id for r in list(self._in_flight.values())[:3])
                    raise BackendError(
                        f"vLLM holds no request but {len(self._in_flight)} answer(s) never came (e.g. {lost})"
                    )
                try:
                    outputs = engine.step()
                except self._fatal as e:
                    raise engine_error(e) from e
                self.iterations += 1
                self._finished(outputs)
            elif self.renderer is not None and self.renderer.pending:
                self._add_rendered(wait=True)
            else:
                raise BackendError("vllm backend: completed() called with no request in flight")

    def _finished(self, outputs: Sequence[Any]) -> None:
        """The finished requests of one step: answers, or (an image the engine's cache had let go,
        sent by its id alone) the request again, rendered with every image's pixels."""
        self.ledger.in_flight(self._running())
        for out in outputs:
            if not getattr(out, "finished", True):
                continue
            request_id = _external(out.request_id)
            request = self._in_flight.pop(request_id, None)
            by_id = request_id in self._by_id
            self._by_id.discard(request_id)
            if request is None:
                continue
            if by_id and _errored(out) and request.request_id not in self._resend:
                self._resend.add(request.request_id)
                self.resent += 1
                self.submit([request])
                continue
            self._resend.discard(request.request_id)
            self._ready.append((request, self._response(request, out)))
        self.idle.update(len(self._in_flight))

    def release(self, key_ids: Sequence[str]) -> None:
        self.ledger.release(key_ids)
        prefixes = tuple(f"chexpercept/{k}/" for k in key_ids)
        with self._lock:
            self._uuids = {p: u for p, u in self._uuids.items() if not p.startswith(prefixes)}
            self._sent = {p for p in self._sent if not p.startswith(prefixes)}
        if self.images is not None:
            self.images.release(prefixes)

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        """One ``LLM.chat`` call for a batch (vLLM without ``enqueue_chat``; checks and benchmarks):
        every image with its pixels."""
        conversations = [self._messages(r, resend=True)[0] for r in requests]
        try:
            outputs = self.llm.chat(conversations, sampling_params=self.params, **self._chat_kwargs())
        except self._fatal as e:
            raise engine_error(e) from e
        if len(outputs) != len(requests):
            raise BackendError(f"vLLM returned {len(outputs)} outputs for {len(requests)} conversations")
        return [self._response(r, out) for r, out in zip(requests, outputs)]

    def _response(self, request: Request, out: Any) -> Response:
        if not out.outputs:
            return Response("", {}, error="vLLM returned no completion")
        completion = out.outputs[0]
        finish = getattr(completion, "finish_reason", None)
        if str(finish) in ("abort", "error"):  # aborted or a request-level engine error: no answer
            return Response("", {}, error=f"vLLM finished the request with finish_reason {finish!s}")
        prompt_tokens = len(out.prompt_token_ids or ())
        generated = len(completion.token_ids or ())
        usage: dict[str, Any] = {"input_tokens": prompt_tokens, "output_tokens": generated}
        cached = getattr(out, "num_cached_tokens", None)
        if isinstance(cached, int):
            usage["cached_input_tokens"] = cached
            self._cached_tokens += cached
        self._prompt_tokens += prompt_tokens
        self.ledger.add(request.key_id, generated)
        if finish:
            usage["finish_reason"] = finish
        text = completion.text or ""
        full = self.markers.full_text(completion.token_ids or (), text) if self.markers else None
        return Response(text, usage, full_text=full)

    def sampling(self) -> Sampling:
        return self._sampling

    def new_session(self) -> None:
        """Counts start again (a command running several oracle settings records each one's)."""
        self.iterations, self.ledger, self.idle = 0, WorkLedger(), IdleClock()
        self._prompt_tokens = self._cached_tokens = 0
        self.rendered, self.render_seconds, self.resent = 0, 0.0, 0

    def schedule(self) -> dict[str, Any]:
        """run.json's ``schedule``: iterations against the floor for the tokens generated, the
        seconds the engine held no request, and the work done off the engine's thread."""
        ledger = self.ledger
        floor = ledger.floor()
        return schedule_record(
            mode="continuous" if self.continuous else "step (this vLLM has no LLM.enqueue_chat)",
            iterations=self.iterations if self.continuous else None,
            generated_tokens=int(ledger.total),
            longest_conversation_tokens=int(ledger.longest_chain),
            most_sequences_at_once=ledger.most_in_flight,
            max_num_seqs=self.max_num_seqs,
            floor_iterations=math.ceil(floor),
            iterations_over_floor=ratio(self.iterations, floor) if self.continuous else None,
            engine_span_seconds=self.idle.span,
            engine_idle_seconds=self.idle.idle,
            rendered=self.rendered,
            render_seconds=self.render_seconds,
            image_ids=self.image_ids,
            images_by_id_alone=self.ids_only,
            resent_with_pixels=self.resent,
            decoded_images=self.images.record() if self.images is not None else None,
        )

    def describe(self) -> dict[str, Any]:
        hit_rate = self._cached_tokens / self._prompt_tokens if self._prompt_tokens else None
        return {
            "platform": self.platform,
            "engine_args": self.engine_args,
            "platform_defaults": self.platform_defaults,
            "environment": self.environment,
            "chat_template_kwargs": self.chat_template_kwargs,
            "devices": self.devices,
            "prefix_cache": {
                "prompt_tokens": self._prompt_tokens,
                "cached_tokens": self._cached_tokens,
                "hit_rate": None if hit_rate is None else round(hit_rate, 4),
            },
            "schedule": self.schedule(),
        }

    def close(self) -> None:
        renderer, self.renderer = self.renderer, None
        if renderer is not None:
            renderer.close()
        if self.images is not None:
            self.images.close()
        llm, self.llm = self.llm, None
        self._in_flight.clear()
        engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        private, self._private = getattr(self, "_private", {}), {}
        for var, value in private.items():  # the environment as it was, for the next engine
            if os.environ.get(var) == value:
                del os.environ[var]
        if private.get("VLLM_RPC_BASE_PATH"):  # the engine's sockets, left behind by vLLM
            shutil.rmtree(private["VLLM_RPC_BASE_PATH"], ignore_errors=True)


def private_engine_folders() -> dict[str, str]:
    """The environment that keeps vLLM's own files this account's alone, where the user set none:
    ``VLLM_RPC_BASE_PATH``, a fresh owner-only folder for the engine's ZMQ sockets (vLLM makes them in
    /tmp under the umask: under umask 000 another account connected to them and hung the run, red
    team stop 43), and the folders of compiled code (``COMPILED_CODE_FOLDERS``), owner-only under
    the toolkit's cache (torch's default /tmp/torchinductor_<user> is made under the umask too, and
    compiled code another account can write there would run as this one)."""
    import tempfile

    from chexpercept.file_digest import cache_dir
    from chexpercept.fileio import private_dir

    out: dict[str, str] = {}
    if not os.environ.get("VLLM_RPC_BASE_PATH"):
        out["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="chexpercept-vllm-ipc-")  # mode 0700
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):  # torch's default is in /tmp, where anyone may make it
        folder = cache_dir() / "torchinductor"
        private_dir(folder, own=True)  # an existing one tightened; another account's refused
        out["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    # vLLM's cache (its compile cache sets torch's below it when it compiles, red team round 2) and
    # Triton's kernels stay where they are, warm, and are made this account's alone
    for variable, default in COMPILED_CODE_FOLDERS.items():
        private_dir(os.path.expanduser(os.environ.get(variable) or default()), own=True)
    return out


def _user_cache() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


#: the folders of compiled code that stay where the user's environment puts them, made owner-only:
#: the environment variable, and the default where it is not set (vLLM's and Triton's own)
COMPILED_CODE_FOLDERS = {
    "VLLM_CACHE_ROOT": lambda: os.path.join(_user_cache(), "vllm"),
    "TRITON_CACHE_DIR": lambda: os.path.expanduser("~/.triton/cache"),
}


#: decoded images waiting for their first render, at most: this share of the memory available at
#: start-up, at most IMAGE_BUDGET_MAX (a 1024x1024 X-ray is 3 MiB decoded, 3.8 MiB with its file's
#: bytes, which vLLM's loader keeps beside the pixels). Each image is held only from its decoding to
#: its first render: later turns send its id alone
IMAGE_BUDGET_SHARE = 1 / 32
IMAGE_BUDGET_MAX = 64 << 20
#: rendered requests waiting to be added to the engine, at most (each may hold processed pixels)
RENDER_AHEAD = 16


def image_budget() -> int:
    """Bytes of decoded images held ahead of need."""
    return int(min(_available_memory() * IMAGE_BUDGET_SHARE, IMAGE_BUDGET_MAX))


def image_workers() -> int:
    """Threads that decode images: a quarter of this process's cores, 1 to 4."""
    return max(1, min(4, len(allowed_cpus()) // 4))


def decoded_bytes(image: Any) -> int:
    """Memory of an image as vLLM's loader returns it: width x height x bands, and the file's bytes
    it keeps beside them."""
    width, height = image.size
    return width * height * len(image.getbands()) + len(getattr(image, "original_bytes", b"") or b"")


def _has_processor_cache(llm: Any) -> bool:
    """Whether this engine caches processed images by id (vLLM's multimodal processor cache), so
    that an image it has seen can be sent by its id alone (``{"type": "image_pil", "image_pil":
    None, "uuid": ...}``; vLLM renders such a part from its cache, and refuses the render when the
    cache let it go)."""
    try:
        multimodal = llm.llm_engine.model_config.multimodal_config
        return float(multimodal.mm_processor_cache_gb) > 0
    except (AttributeError, TypeError, ValueError):
        return False


def _can_split(llm: Any) -> bool:
    """Whether this vLLM renders a chat request apart from adding it (``LLM._preprocess_chat_one``
    and ``LLM._add_request``, the two halves of ``enqueue_chat``): then requests are rendered on a
    thread of their own."""
    return callable(getattr(llm, "_preprocess_chat_one", None)) and callable(
        getattr(llm, "_add_request", None)
    )


def _errored(out: Any) -> bool:
    """A finished request that the engine ended with an error (no answer)."""
    outputs = getattr(out, "outputs", None)
    return not outputs or str(getattr(outputs[0], "finish_reason", None)) == "error"


def _image_loader(llm: Any) -> Callable[[str], Any] | None:
    """vLLM's own image loader for this engine (its media connector, with the engine's media
    settings), or None where this vLLM has none to reach (then images go as file URLs)."""
    try:
        from vllm import envs
        from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

        config = llm.llm_engine.model_config
        multimodal = getattr(config, "multimodal_config", None)
        connector = MEDIA_CONNECTOR_REGISTRY.load(
            envs.VLLM_MEDIA_CONNECTOR,
            media_io_kwargs=getattr(multimodal, "media_io_kwargs", None),
            allowed_local_media_path=config.allowed_local_media_path,
            allowed_media_domains=config.allowed_media_domains,
        )
    except Exception:
        return None
    return connector.fetch_image


def _external(request_id: str) -> str:
    """The id ``LLM`` gave a request (its counter: "17"), which outputs carry; ``add_request``
    returns it with a random suffix vLLM adds for uniqueness ("17-3fa2c9e1")."""
    return request_id.split("-", 1)[0]


def _fatal_errors() -> tuple[type[BaseException], ...]:
    """vLLM's exceptions that end the engine, not one request (VLLMServerError: EngineDeadError...)."""
    try:
        from vllm.exceptions import VLLMServerError
    except ImportError:
        try:
            from vllm.v1.engine.exceptions import EngineDeadError as VLLMServerError
        except ImportError:
            return ()
    return (VLLMServerError,)


def refusal(error: BaseException) -> str:
    """The failure text of a request vLLM refused."""
    return f"vLLM refused the request: {type(error).__name__}: {shown(str(error).strip(), 500)}"


def engine_error(error: BaseException) -> BackendError:
    """A dead engine as one line: what vLLM said (the root cause is in its log above)."""
    name = type(error).__name__
    detail = shown(error, 300, one_line=True)
    return BackendError(
        f"vLLM's engine stopped ({name}: {detail}); its own log above says why (e.g. out of memory). "
        "The engine cannot go on"
    )
