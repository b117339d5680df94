"""The 14 models of the paper (Table 6; spec 3.11) and how to run any other model.

A registry entry holds what the paper's runs used: the Hugging Face id (or API model id), the
backend, vLLM engine arguments, chat-template switches, and decoding (open models greedy with
temperature 0, top_p 1, max_tokens 8192; API models temperature 1 with medium reasoning effort).
Unlike the reference, ``limit_mm_per_prompt`` is not stored: the runner sizes it to the largest
conversation of the bundle (the reference forgot it for MedGemma-27B, spec 7.1 item 9).

Any other Hugging Face id or local folder runs with an explicit ``--backend``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from chexpercept.escape import terminal
from chexpercept.eval.backends import BACKENDS
from chexpercept.eval.backends.baselines import is_baseline
from chexpercept.reasoning import family_of

OPEN_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8192}
#: top_p None: not sent, the server's own applies (the reference sends none to an API; reasoning
#: models reject it; Gemini's default is 0.95), and run.json records it so
API_SAMPLING = {"temperature": 1.0, "top_p": None, "max_tokens": 8192}
#: what the reference sends to OpenAI/Azure (spec 3.11); Gemini gets reasoning_effort only
API_EXTRA = {"reasoning_effort": "medium", "frequency_penalty": 0.0, "presence_penalty": 0.0}


@dataclass(frozen=True)
class ModelSpec:
    """How to run one model."""

    #: registry name, also the results folder name
    name: str
    #: Hugging Face id, local folder, or API model id
    model_id: str
    backend: str
    display: str = ""
    group: str = ""
    #: the reference's alias (also accepted as --model)
    reference_alias: str = ""
    #: vLLM engine arguments (besides model, seed, limit_mm_per_prompt, tensor_parallel_size)
    engine_args: dict[str, Any] = field(default_factory=dict)
    #: tensor parallel size must divide this (the reference's gpu_num), e.g. 4 attention-head groups
    tp_divisor: int | None = None
    #: the chat template understands enable_thinking (Qwen 3.5/3.6); --no-thinking turns it off
    thinking_switch: bool = False
    sampling: dict[str, Any] = field(default_factory=lambda: dict(OPEN_SAMPLING))
    #: extra request fields for the openai backend (reasoning_effort, penalties)
    api_extra: dict[str, Any] = field(default_factory=dict)
    #: transformers backend: model class, dtype, attention implementation, device_map
    transformers_args: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    notes: str = ""
    in_registry: bool = True

    def request_fields(self, request_extra: dict[str, Any] | None) -> dict[str, Any]:
        """The fields the openai backend puts over its own in every request body: the registry's
        (``api_extra``), then ``--request-extra``'s (a null removes the field). What run.json
        records of the decoding is read from these (``chexpercept.eval.runner.plan.sampling_for``)."""
        return dict(self.api_extra) | dict(request_extra or {})


def _open(name: str, hf_id: str, display: str, group: str, alias: str, **kw: Any) -> ModelSpec:
    engine = {"max_model_len": kw.pop("max_model_len", 65536), "enable_prefix_caching": True}
    trust = kw.pop("trust_remote_code", False)
    if trust:
        engine["trust_remote_code"] = True
    return ModelSpec(
        name=name,
        model_id=hf_id,
        backend=kw.pop("backend", "vllm"),
        display=display,
        group=group,
        reference_alias=alias,
        engine_args=engine,
        trust_remote_code=trust,
        **kw,
    )


def _api(name: str, model_id: str, display: str, alias: str, extra: dict[str, Any], notes: str) -> ModelSpec:
    return ModelSpec(
        name=name,
        model_id=model_id,
        backend="openai",
        display=display,
        group="proprietary",
        reference_alias=alias,
        sampling=dict(API_SAMPLING),
        api_extra=dict(extra),
        notes=notes,
    )


_AZURE = "Azure OpenAI in the paper; any OpenAI-compatible endpoint with --base-url"
_GEMINI = "Vertex AI in the paper; Gemini's OpenAI-compatible endpoint with --base-url"

REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _api("gpt-5.4", "gpt-5.4-2026-03-05", "GPT-5.4", "gpt-5.4", API_EXTRA, _AZURE),
        _api("gpt-5.4-nano", "gpt-5.4-nano-2026-03-17", "GPT-5.4-nano", "gpt-5.4-nano", API_EXTRA, _AZURE),
        _api(
            "gemini-3.1-pro",
            "gemini-3.1-pro-preview",
            "Gemini-3.1-pro",
            "gemini-3.1-pro",
            {"reasoning_effort": "medium"},
            _GEMINI,
        ),
        _api(
            "gemini-3.1-flash",
            "gemini-3.1-flash-lite-preview",
            "Gemini-3.1-flash",
            "gemini-3.1-flash",
            {"reasoning_effort": "medium"},
            _GEMINI,
        ),
        _open(
            "qwen3.6-27b", "Qwen/Qwen3.6-27B", "Qwen3.6-27B", "general", "qwen3.6-27b", thinking_switch=True
        ),
        _open(
            "qwen3.5-122b",
            "Qwen/Qwen3.5-122B-A10B",
            "Qwen3.5-122B",
            "general",
            "qwen3.5-moe",
            thinking_switch=True,
        ),
        _open(
            "glm-4.6v",
            "zai-org/GLM-4.6V",
            "GLM-4.6V",
            "general",
            "glm-4v",
            trust_remote_code=True,
            tp_divisor=4,
            notes="answers inside <|begin_of_box|> are unwrapped by the parser",
        ),
        _open(
            "internvl3.5-38b",
            "OpenGVLab/InternVL3_5-38B",
            "InternVL3.5-38B",
            "general",
            "internvl3.5",
            max_model_len=40960,
            trust_remote_code=True,
        ),
        _open(
            "gemma4-31b", "google/gemma-4-31B-it", "Gemma4-31B", "general", "gemma4", trust_remote_code=True
        ),
        _open("medgemma-27b", "google/medgemma-27b-it", "MedGemma-27B", "medical", "medgemma"),
        _open(
            "medgemma-1.5-4b",
            "google/medgemma-1.5-4b-it",
            "MedGemma1.5-4B",
            "medical",
            "medgemma1.5",
            trust_remote_code=True,
        ),
        _open(
            "huatuogpt-vision-7b",
            "FreedomIntelligence/HuatuoGPT-Vision-7B-Qwen2.5VL",
            "HuatuoGPT-Vision-7B",
            "medical",
            "huatuo",
            tp_divisor=4,
        ),
        _open(
            "lingshu-32b",
            "lingshu-medical-mllm/Lingshu-32B",
            "Lingshu-32B",
            "medical",
            "lingshu",
            trust_remote_code=True,
        ),
        _open(
            "hulu-med-32b",
            "ZJU-AI4H/Hulu-Med-32B",
            "Hulu-Med-32B",
            "medical",
            "hulu-med",
            backend="transformers",
            max_model_len=32768,
            trust_remote_code=True,
            transformers_args={
                "model_class": "AutoModelForCausalLM",
                "dtype": "bfloat16",
                "attn_implementation": "flash_attention_2",
                "device_map": "auto",
            },
            notes="the paper ran it with transformers and the model's own remote code; not verified here",
        ),
    )
}

_BY_ALIAS = {s.reference_alias: s for s in REGISTRY.values()}


def lookup(model: str) -> ModelSpec | None:
    """The registry entry for a registry name or a reference alias (case-insensitive)."""
    key = model.strip().lower()
    return REGISTRY.get(key) or _BY_ALIAS.get(key)


#: a model's folder under --output-dir: one path component, never hidden, never an option; at most
#: 200 characters (a file system's limit is 255 bytes)
RUN_FOLDER_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,199}")


def _reserved(name: str) -> bool:
    """A name that the folders of runs give a meaning of their own: a settings folder
    (``oracle_*``) or one of a run's files, which ``score`` would read as a run."""
    from chexpercept.results import RUN_FILE_NAMES

    return name.lower().startswith("oracle_") or name.lower() in RUN_FILE_NAMES


def run_folder_name(name: str, *, option: str = "--run-name") -> str:
    """``name`` when it can name a model's folder directly under ``--output-dir``
    (``RUN_FOLDER_NAME``: letters, digits, ``. _ + -``, not starting with ``.`` or ``-``); ValueError
    naming ``option`` otherwise. Every model folder's name passes here (``RunPlan``), so that no name
    reaches above, beside or inside another folder (``..``, ``/``, an absolute path) nor hides from
    ``score`` (``.name``)."""
    if not RUN_FOLDER_NAME.fullmatch(name) or _reserved(name):
        shown = repr(name) if len(name) <= 200 else f"{name[:40]!r}... ({len(name)} characters)"
        raise ValueError(
            f"{option} {terminal(shown)}: must be one folder name of at most 200 characters "
            "(letters, digits, '.', '_', '+', '-'; not starting with '.' or '-'; not oracle_* nor a "
            "run's file name such as results.jsonl): it names the model's folder directly under --output-dir"
        )
    return name


def folder_name(model: str) -> str:
    """A results-folder name for any model string (registry name, HF id, local folder, baseline):
    ``RUN_FOLDER_NAME``'s characters, others replaced by ``-``. ValueError when nothing is left or
    the name is too long (then --run-name names the folder)."""
    if is_baseline(model):
        name = model.replace(":", "-")
    else:
        if os.path.isdir(os.path.expanduser(model)):
            model = os.path.basename(os.path.normpath(os.path.expanduser(model)))
        name = model.strip().replace("/", "--")
        name = re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-.")
    if not RUN_FOLDER_NAME.fullmatch(name) or _reserved(name):
        raise ValueError(f"cannot make a folder name from model {terminal(repr(model))}; pass --run-name")
    return name


def _check_local_path(model: str) -> None:
    """A model given as a path that does not exist fails here, naming the nearest folders: a path
    written as one (``./x``, ``../x``, ``/x``, ``~/x``), or ``a/b`` whose ``a`` is a local folder
    holding a name close to ``b`` (a typo, not a Hugging Face id)."""
    from chexpercept.errors import no_such_path

    expanded = os.path.expanduser(model)
    if os.path.exists(expanded):
        return
    explicit = model.startswith(("./", "../", "/", "~", ".\\")) or model in (".", "..")
    if explicit:
        raise ValueError(f"--model {no_such_path(model)}")
    parent = model.rstrip("/").rpartition("/")[0]
    if parent and os.path.isdir(os.path.expanduser(parent)):
        message = no_such_path(model)
        if "did you mean" in message:
            raise ValueError(f"--model {message}; a Hugging Face id is organisation/name")


def same_model_id(a: str | None, b: str | None) -> bool:
    """Whether two model ids name the same model: equal strings, or one local folder however it was
    spelled (relative or absolute, ``~``, a trailing slash, a link); relative paths are taken from
    the current folder. Hugging Face ids compare as strings."""
    if a is None or b is None:
        return a == b
    if a == b:
        return True
    paths = [os.path.expanduser(x) for x in (a, b)]
    if not all(os.path.isdir(p) for p in paths):
        return False
    return os.path.samefile(*paths)


#: API model families (chexpercept.reasoning) that accept no temperature but 1 (OpenAI's reasoning
#: models reject 0 with HTTP 400), and Gemini, which the paper also ran at 1: models of these
#: families outside the registry get the paper's API sampling by default
API_TEMPERATURE_ONE_FAMILIES = frozenset({"gpt-5", "gemini"})


def default_sampling(model_id: str, backend: str) -> dict[str, Any]:
    """Decoding for a model outside the registry: greedy, except API models of families that
    reject temperature 0 (or that the paper ran at temperature 1)."""
    family = family_of(model_id.strip())
    if backend == "openai" and family is not None and family.name in API_TEMPERATURE_ONE_FAMILIES:
        return dict(API_SAMPLING)
    return dict(OPEN_SAMPLING)


def resolve(model: str, *, backend: str | None = None, model_id: str | None = None) -> ModelSpec:
    """The spec to run ``model`` with: a registry entry, a baseline, or any id with --backend."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if is_baseline(model):
        if backend not in (None, "baseline"):
            raise ValueError(f"{model} is a baseline; it runs with --backend baseline (or no --backend)")
        return ModelSpec(name=folder_name(model), model_id=model, backend="baseline", in_registry=False)
    if backend == "baseline":
        raise ValueError(f"--backend baseline needs a baseline model (baseline:random ...), got {model!r}")
    spec = lookup(model)
    if spec is None:
        _check_local_path(model_id or model)
        if backend is None:
            import difflib

            near = difflib.get_close_matches(model.strip().lower(), [*REGISTRY, *_BY_ALIAS], n=1, cutoff=0.8)
            guess = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(
                f"{terminal(repr(model))} is not in the model registry ({guess}it holds "
                f"{', '.join(REGISTRY)}); to run another Hugging Face id or local folder, say how with "
                "--backend vllm|transformers|openai"
            )
        spec = ModelSpec(
            name=folder_name(model),
            model_id=model_id or model,
            backend=backend,
            sampling=default_sampling(model_id or model, backend),
            in_registry=False,
        )
    elif backend is not None and backend != spec.backend:
        spec = replace(spec, backend=backend)
    if model_id:
        spec = replace(spec, model_id=model_id)
    return spec
