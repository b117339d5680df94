"""Model registry: the paper's 14 models, the reference's aliases, and any other model with --backend."""

from __future__ import annotations

import pytest

from chexpercept.eval.registry import REGISTRY, folder_name, lookup, resolve

# Table 6 of the paper (spec/paper.md section 4): model id and backend
PAPER = {
    "gpt-5.4-2026-03-05": "openai",
    "gpt-5.4-nano-2026-03-17": "openai",
    "gemini-3.1-pro-preview": "openai",
    "gemini-3.1-flash-lite-preview": "openai",
    "Qwen/Qwen3.6-27B": "vllm",
    "Qwen/Qwen3.5-122B-A10B": "vllm",
    "zai-org/GLM-4.6V": "vllm",
    "OpenGVLab/InternVL3_5-38B": "vllm",
    "google/gemma-4-31B-it": "vllm",
    "google/medgemma-27b-it": "vllm",
    "google/medgemma-1.5-4b-it": "vllm",
    "FreedomIntelligence/HuatuoGPT-Vision-7B-Qwen2.5VL": "vllm",
    "lingshu-medical-mllm/Lingshu-32B": "vllm",
    "ZJU-AI4H/Hulu-Med-32B": "transformers",
}


def test_the_papers_fourteen_models():
    assert {s.model_id: s.backend for s in REGISTRY.values()} == PAPER
    for spec in REGISTRY.values():
        if spec.backend == "openai":
            assert spec.sampling == {"temperature": 1.0, "top_p": None, "max_tokens": 8192}
            assert spec.api_extra["reasoning_effort"] == "medium"
        else:
            assert spec.sampling == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8192}
    assert REGISTRY["internvl3.5-38b"].engine_args["max_model_len"] == 40960
    assert REGISTRY["glm-4.6v"].tp_divisor == 4 and REGISTRY["glm-4.6v"].engine_args["trust_remote_code"]
    assert REGISTRY["medgemma-27b"].engine_args == {"max_model_len": 65536, "enable_prefix_caching": True}
    assert [s.name for s in REGISTRY.values() if s.thinking_switch] == ["qwen3.6-27b", "qwen3.5-122b"]


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("medgemma1.5", "medgemma-1.5-4b"),
        ("qwen3.5-moe", "qwen3.5-122b"),
        ("glm-4v", "glm-4.6v"),
        ("HUATUO", "huatuogpt-vision-7b"),
    ],
)
def test_reference_aliases(alias, name):
    assert lookup(alias).name == name


def test_resolve_other_models_and_overrides(tmp_path):
    with pytest.raises(ValueError, match="--backend vllm"):
        resolve("org/unknown-vlm")
    spec = resolve("org/unknown-vlm", backend="vllm")
    assert spec.model_id == "org/unknown-vlm" and spec.name == "org--unknown-vlm" and not spec.in_registry
    assert resolve("medgemma-1.5-4b", backend="transformers").backend == "transformers"
    assert resolve("medgemma-1.5-4b", model_id="/models/mg").model_id == "/models/mg"
    local = tmp_path / "my model"
    local.mkdir()
    assert resolve(str(local), backend="transformers").name == "my-model"
    assert resolve("baseline:constant:3").backend == "baseline"
    with pytest.raises(ValueError, match="baseline"):
        resolve("baseline:random", backend="vllm")
    with pytest.raises(ValueError, match="baseline model"):
        resolve("medgemma-1.5-4b", backend="baseline")
    with pytest.raises(ValueError, match="unknown backend"):
        resolve("x", backend="tpu")
    assert folder_name("baseline:constant:2") == "baseline-constant-2"
