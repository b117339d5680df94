"""Tiny random vision-language models, built offline, for tests, benchmarks and the demo.

Two architectures, each with its real model class, a real processor (image processor, byte-level
BPE tokenizer, chat template) and random weights (about 1M parameters):

* ``gemma3``: Gemma 3 / MedGemma (``Gemma3ForConditionalGeneration``): a fixed-size image processor,
  a fixed number of soft tokens per image, sliding-window layers.
* ``qwen2.5-vl``: Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``), the family of four of the
  paper's models: a dynamic-resolution image processor (tokens per image follow the image size),
  3-D rotary positions.

Both are built so that real engines load them as they load the real checkpoints:

* the weights are saved under the parameter names of the Hub checkpoints of their architecture
  (``vision_tower.vision_model.*`` for Gemma 3; ``model.*``, ``visual.*``, ``lm_head`` for
  Qwen2.5-VL), whichever transformers version wrote them;
* every attention head is 64 wide (vLLM's CPU attention has no kernel for 16);
* the tokenizer holds the special tokens and the newline tokens (``"\\n"`` ... ``"\\n\\n\\n\\n"``,
  which vLLM's Gemma 3 processor looks up) of the real vocabularies, and Gemma 3's
  ``<unused94>``/``<unused95>`` (MedGemma's thinking markers), not special, as in the real one.

The answers are noise: these models exist to test software, never to measure anything about
X-rays. The same seed gives the same weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path as FsPath
from typing import Any

from chexpercept import templates
from chexpercept.fileio import replaced_dir, write_atomic, write_json_atomic
from chexpercept.vocab import LESIONS, POINT_COLORS

ARCHITECTURES: tuple[str, ...] = ("gemma3", "qwen2.5-vl")
#: text decoder sizes: 64-wide heads, 4 query and 2 key-value heads (fewer heads give random
#: models that repeat one token whatever the input)
GEMMA_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
#: Qwen2 derives the head size from hidden_size / num_attention_heads
QWEN_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
HEAD_DIM = 64
VOCAB_SIZE = 2000
#: newline runs that real Gemma and Qwen vocabularies hold as single tokens
NEWLINE_TOKENS = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")

# Gemma 3: 56x56 images, 14-pixel patches, pooled to 4 soft tokens per image
GEMMA_IMAGE_SIZE = 56
GEMMA_TOKENS_PER_IMAGE = 4
GEMMA_SPECIAL = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
#: MedGemma's thinking markers: ordinary (non-special) tokens of the real Gemma 3 vocabulary
GEMMA_PLAIN = ("<unused94>", "<unused95>")
#: one <start_of_image> per image part; the processor expands it into the image's soft tokens
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Qwen2.5-VL: images resized to between 56x56 and 112x112 pixels, 14-pixel patches merged 2x2
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 112 * 112
QWEN_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN_PLAIN = ("<think>", "</think>")
#: ChatML with one <|vision_start|><|image_pad|><|vision_end|> per image part
QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _training_text() -> list[str]:
    """Sentences the tokenizer learns from: the benchmark's own prompts and answers."""
    points = templates.point_option_labels([*POINT_COLORS, "None"])
    regions = [
        f"the intersection of the {side} {part} lung and the {side} {zone} zone lung"
        for side in ("left", "right")
        for part in ("medial", "lateral", "peripheral")
        for zone in ("upper", "mid", "lower")
    ] + ["the left costophrenic angle", "the right costophrenic angle"]
    lines = [templates.SYSTEM_MESSAGE, templates.comparison_question(), templates.revision_result_question(4)]
    for lesion in LESIONS:
        lines += [
            templates.detection_question(lesion),
            templates.contour_eval_question(lesion),
            templates.initial_context(lesion),
            templates.expansion_question(lesion, points),
            templates.contraction_question(lesion, points),
            templates.distribution_question(lesion),
            templates.location_question(lesion, [*regions[:3], templates.LOCATION_NONE]),
            templates.severity_question(lesion, "left lung"),
            templates.severity_question(lesion, "right lung"),
        ]
    lines += regions
    lines += [f"Answer: {i}" for i in range(1, 10)] + ["Answer: 1,3", "Answer: 2,4"]
    return lines


def _tokenizer(special: tuple[str, ...], plain: tuple[str, ...], **named: Any) -> Any:
    """A byte-level BPE tokenizer trained on the benchmark's text, wrapped for transformers.

    ``special``: special tokens (ids from 0, in order); ``plain``: ordinary added tokens that
    decoding keeps (thinking markers, newline runs); ``named``: the wrapper's named tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=named.get("unk_token")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_text(), trainer=trainer)
    # added tokens match longest first, so "\n\n\n" is one token as in the real vocabularies
    bpe.add_tokens([AddedToken(t, normalized=False, special=False) for t in (*NEWLINE_TOKENS, *plain)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, padding_side="left", **named)


def _save_hub_layout(model: Any, out: FsPath, rename: Callable[[str], str]) -> None:
    """``save_pretrained``, then the weight file's keys renamed to the Hub checkpoints' names.

    transformers versions differ in the names they write (some write the module paths of their own
    classes); real checkpoints, which every engine loads, keep their original names.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    model.save_pretrained(out)
    path = out / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        tensors = {rename(k): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    save_file(tensors, str(path), metadata=metadata)


def _gemma3_hub_name(key: str) -> str:
    """google/gemma-3-*-it and google/medgemma-*: language_model.model.*, vision_tower.vision_model.*."""
    for new, hub in (
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
    ):
        if key.startswith(new):
            key = hub + key[len(new) :]
    if key.startswith("model.vision_tower."):
        key = key[len("model.") :]
    if key.startswith("model.multi_modal_projector."):
        key = key[len("model.") :]
    if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
        key = "vision_tower.vision_model." + key[len("vision_tower.") :]
    return key


def _qwen25vl_hub_name(key: str) -> str:
    """Qwen/Qwen2.5-VL-*-Instruct: model.* (text), visual.* (vision), lm_head.*."""
    if key.startswith("model.language_model."):
        return "model." + key[len("model.language_model.") :]
    if key.startswith("model.visual."):
        return key[len("model.") :]
    return key


def _build_gemma3(out: FsPath) -> None:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
    )

    tokenizer = _tokenizer(
        GEMMA_SPECIAL,
        GEMMA_PLAIN,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": GEMMA_IMAGE_SIZE, "width": GEMMA_IMAGE_SIZE}),
        tokenizer=tokenizer,
        chat_template=GEMMA_TEMPLATE,
        image_seq_length=GEMMA_TOKENS_PER_IMAGE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA_SPECIAL}
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer),
            **GEMMA_TEXT,
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 64,
            "max_position_embeddings": 4096,
            "pad_token_id": ids["<pad>"],
            "eos_token_id": ids["<eos>"],
            "bos_token_id": ids["<bos>"],
        },
        vision_config={
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": GEMMA_IMAGE_SIZE,
            "patch_size": 14,
            "vision_use_head": False,  # as in every Gemma 3 checkpoint
        },
        mm_tokens_per_image=GEMMA_TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    _finish(model, pad=ids["<pad>"], bos=ids["<bos>"], eos=[ids["<eos>"], ids["<end_of_turn>"]])
    _save_hub_layout(model, out, _gemma3_hub_name)
    processor.save_pretrained(out)


def _build_qwen25vl(out: FsPath) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    tokenizer = _tokenizer(
        QWEN_SPECIAL,
        QWEN_PLAIN,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            **QWEN_TEXT,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [HEAD_DIM // 8, 3 * HEAD_DIM // 16, 3 * HEAD_DIM // 16],  # sums to 32
            },
            "tie_word_embeddings": False,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_heads": 2,
            "out_hidden_size": QWEN_TEXT["hidden_size"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    _finish(
        model,
        pad=ids["<|endoftext|>"],
        bos=ids["<|endoftext|>"],
        eos=[ids["<|im_end|>"], ids["<|endoftext|>"]],
    )
    _save_hub_layout(model, out, _qwen25vl_hub_name)
    # The processor is written as files: building Qwen2VLProcessor in Python needs its video
    # processor, which needs torchvision; loading it back needs torchvision too (as for any
    # Qwen2.5-VL model with transformers).
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=QWEN_MIN_PIXELS,
        max_pixels=QWEN_MAX_PIXELS,
        size={"shortest_edge": QWEN_MIN_PIXELS, "longest_edge": QWEN_MAX_PIXELS},
    )
    image_processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    settings = json.loads((out / "preprocessor_config.json").read_text())
    settings["image_processor_type"] = "Qwen2VLImageProcessor"
    settings["processor_class"] = "Qwen2_5_VLProcessor"
    write_json_atomic(out / "preprocessor_config.json", settings)
    video = {k: v for k, v in settings.items() if k != "image_processor_type"}
    video["video_processor_type"] = "Qwen2VLVideoProcessor"
    write_json_atomic(out / "video_preprocessor_config.json", video)
    write_json_atomic(out / "processor_config.json", {"processor_class": "Qwen2_5_VLProcessor"}, indent=None)
    write_atomic(out / "chat_template.jinja", QWEN_TEMPLATE)


def _finish(model: Any, *, pad: int, bos: int, eos: list[int]) -> None:
    generation = model.generation_config
    generation.pad_token_id = pad
    generation.bos_token_id = bos
    generation.eos_token_id = eos


BUILDERS: dict[str, Callable[[FsPath], None]] = {"gemma3": _build_gemma3, "qwen2.5-vl": _build_qwen25vl}


#: the file that marks a folder as a tiny model written here, so that a rerun replaces it and nothing else
TINY_MODEL_MARKER = ".chexpercept-tiny-model"


def build_tiny_model(out: str | os.PathLike[str], *, arch: str = "gemma3", seed: int = 0) -> FsPath:
    """Write a tiny random VLM of architecture ``arch`` and its processor to ``out``.

    Loadable with ``AutoProcessor`` / ``AutoModelForImageTextToText`` and by vLLM. ``out`` must be
    new, empty or an earlier tiny model (it holds ``TINY_MODEL_MARKER``): a user's own model folder
    given by mistake is never overwritten with random weights. The model is written aside and takes
    ``out``'s place whole (``fileio.replaced_dir``). Raises ValueError for an unknown architecture,
    ``fileio.NotOursError`` for a folder that is not a tiny model.
    """
    if arch not in BUILDERS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHITECTURES)}")
    import torch

    out = FsPath(out)
    with replaced_dir(out, marker=TINY_MODEL_MARKER) as stage:
        torch.manual_seed(seed)
        BUILDERS[arch](stage)
    return out
