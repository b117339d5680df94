"""A tiny random Gemma3 vision-language model, built offline, for tests, benchmarks and the demo.

It has the real architecture (vision tower, projector, text decoder), a real processor (image
processor, byte-level BPE tokenizer, chat template) and random weights (about 150k parameters), so
the transformers backend runs the exact code path of a real model in a fraction of a second on CPU.
Its answers are noise: it exists to test software, never to measure anything about X-rays.
The same seed gives the same weights.
"""

from __future__ import annotations

import os
from pathlib import Path as FsPath

from chexpercept import templates
from chexpercept.vocab import LESIONS, POINT_COLORS

IMAGE_SIZE = 56
PATCH_SIZE = 14
TOKENS_PER_IMAGE = 4
SPECIAL_TOKENS = (
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
#: one <start_of_image> per image part; the processor expands it into the image's soft tokens
CHAT_TEMPLATE = (
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


#: layer sizes: "cpu" is as small as transformers allows; "gpu" uses head size 64, which the GPU
#: attention kernels of vLLM support (they do not support 16)
PROFILES: dict[str, dict[str, dict[str, int]]] = {
    "cpu": {
        "text": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        },
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2},
    },
    "gpu": {
        "text": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
        },
        "vision": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2},
    },
}


def build_tiny_model(out: str | os.PathLike[str], *, seed: int = 0, profile: str = "cpu") -> FsPath:
    """Write the model and its processor to ``out`` (loadable with AutoProcessor/AutoModel...)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    sizes = PROFILES[profile]
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        PreTrainedTokenizerFast,
    )

    out = FsPath(out)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer),
            **sizes["text"],
            "num_hidden_layers": 2,
            "query_pre_attn_scalar": sizes["text"]["head_dim"],
            "sliding_window": 64,
            "max_position_embeddings": 4096,
            "pad_token_id": ids["<pad>"],
            "eos_token_id": ids["<eos>"],
            "bos_token_id": ids["<bos>"],
        },
        vision_config={
            **sizes["vision"],
            "num_hidden_layers": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.pad_token_id = ids["<pad>"]
    generation.bos_token_id = ids["<bos>"]
    generation.eos_token_id = [ids["<eos>"], ids["<end_of_turn>"]]
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
