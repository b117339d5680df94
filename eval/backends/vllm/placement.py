"""Where one process's vLLM engine runs: its share of the GPUs (tensor and pipeline parallel sizes)
or of the CPU cores, and the CPU engine's KV-cache size; the platform vLLM finds. Used by
``VLLMBackend`` (eval/backends/vllm/backend.py) for each process of a data-parallel run."""

from __future__ import annotations

import os
from collections.abc import Sequence

from chexpercept.eval.protocol import BackendError

#: CPU: the KV cache gets this share of the memory available at start-up, at most CPU_KV_CACHE_MAX
CPU_KV_CACHE_SHARE = 0.25
CPU_KV_CACHE_MAX = 4 << 30


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
