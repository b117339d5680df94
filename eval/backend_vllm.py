"""vLLM offline engine: each step's conversations go to one ``LLM.chat`` call.

Images are handed over as ``file://`` URLs inside the bundle folder (``allowed_local_media_path``),
so nothing is base64-encoded per turn as the reference does (spec 7.1 item 4); vLLM's prefix cache
reuses the shared history of later turns. ``limit_mm_per_prompt`` is sized to the largest
conversation of the selected cases. vLLM is imported only when this backend starts (CUDA machines
only: it cannot be installed on the CPU machines this project is tested on).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path as FsPath
from typing import Any

from .protocol import BackendError, Request, Response, RunContext, Sampling
from .registry import ModelSpec

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
) -> tuple[int, list[str]]:
    """(tensor_parallel_size, GPU ids) for one process of a data-parallel run.

    The GPUs are split evenly between processes; by default a process uses all of its share for
    tensor parallelism (as the reference uses all visible GPUs), reduced to the largest divisor of
    ``tp_divisor`` when the model needs one (the reference's ``gpu_num``).
    """
    if not gpus:
        raise BackendError("the vllm backend needs a CUDA GPU and none is visible")
    share = len(gpus) // num_processes
    if share < 1:
        raise BackendError(
            f"{num_processes} processes but only {len(gpus)} visible GPU(s): launch at most {len(gpus)} processes"
        )
    tp = requested_tp or share
    if tp > share:
        raise BackendError(
            f"tensor_parallel_size {tp} needs {tp} GPUs per process, but each of the {num_processes} "
            f"process(es) has {share} of the {len(gpus)} visible GPUs"
        )
    if tp_divisor:
        tp = max(d for d in range(1, tp + 1) if tp_divisor % d == 0)
    start = process_index * share
    return tp, list(gpus[start : start + tp])


class VLLMBackend:
    name = "vllm"
    default_batch_size = 256

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        chat_template_kwargs: dict[str, Any] | None = None,
        engine_overrides: dict[str, Any] | None = None,
        tensor_parallel_size: int | None = None,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        llm_class: Callable[..., Any] | None = None,
        sampling_params_class: Callable[..., Any] | None = None,
        gpus: Sequence[str] | None = None,
    ):
        self.spec = spec
        self._sampling = sampling
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.engine_overrides = dict(engine_overrides or {})
        self.requested_tp = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.seed = 0
        self._llm_class = llm_class
        self._params_class = sampling_params_class
        self._gpus = gpus
        self.engine_args: dict[str, Any] = {}
        self.root = ""
        self.llm: Any = None
        self.params: Any = None

    def build_engine_args(self, context: RunContext) -> dict[str, Any]:
        gpus = list(self._gpus) if self._gpus is not None else visible_gpus()
        tp, devices = plan_gpus(
            gpus,
            process_index=context.process_index,
            num_processes=context.num_processes,
            requested_tp=self.requested_tp,
            tp_divisor=self.spec.tp_divisor,
        )
        self.devices = devices
        args: dict[str, Any] = {
            "model": self.spec.model_id,
            **self.spec.engine_args,
            "tensor_parallel_size": tp,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "limit_mm_per_prompt": {"image": context.max_images_per_case},
            "allowed_local_media_path": str(context.root),
            "seed": context.seed,
        }
        args.update(self.engine_overrides)
        return args

    def setup(self, context: RunContext) -> None:
        self.root = str(context.root)
        self.seed = context.seed
        self.engine_args = self.build_engine_args(context)
        if context.num_processes > 1:
            # one engine per process on its own GPUs; vLLM's workers must not see our launcher's group
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
            for var in _LAUNCHER_ENV:
                os.environ.pop(var, None)
        llm_class, params_class = self._llm_class, self._params_class
        if llm_class is None or params_class is None:
            try:
                from vllm import LLM, SamplingParams
            except ImportError as e:
                raise BackendError(
                    "the vllm backend needs vLLM on a CUDA machine: pip install -e '.[vllm]' "
                    f"(import failed: {e}); on CPU use --backend transformers"
                ) from e
            llm_class = llm_class or LLM
            params_class = params_class or SamplingParams
        self.llm = llm_class(**self.engine_args)
        s = self._sampling
        self.params = params_class(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=self.seed
        )

    def image_url(self, relative: str) -> str:
        return FsPath(self.root, relative).as_uri()

    def build_messages(self, request: Request) -> list[dict[str, Any]]:
        """OpenAI-style messages with images as file:// URLs inside the bundle."""
        return request.openai_messages(self.image_url)

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        conversations = [self.build_messages(r) for r in requests]
        kwargs: dict[str, Any] = {"sampling_params": self.params, "use_tqdm": False}
        if self.chat_template_kwargs:
            kwargs["chat_template_kwargs"] = self.chat_template_kwargs
        outputs = self.llm.chat(conversations, **kwargs)
        responses = []
        for request, out in zip(requests, outputs):
            if not out.outputs:
                raise BackendError(f"{request.key_id} ({request.task}): vLLM returned no completion")
            completion = out.outputs[0]
            usage: dict[str, Any] = {
                "input_tokens": len(out.prompt_token_ids or ()),
                "output_tokens": len(completion.token_ids or ()),
            }
            cached = getattr(out, "num_cached_tokens", None)
            if isinstance(cached, int):
                usage["cached_input_tokens"] = cached
            if getattr(completion, "finish_reason", None):
                usage["finish_reason"] = completion.finish_reason
            responses.append(Response(completion.text or "", usage))
        return responses

    def sampling(self) -> Sampling:
        return self._sampling

    def describe(self) -> dict[str, Any]:
        return {
            "engine_args": self.engine_args,
            "chat_template_kwargs": self.chat_template_kwargs,
            "gpus": getattr(self, "devices", []),
        }

    def close(self) -> None:
        self.llm = None
