"""``chexpercept make-tiny-model --output-dir DIR [--arch gemma3|qwen2.5-vl]``: a tiny random VLM that the
transformers and vllm backends load (for tests, benchmarks and demos; its answers are noise)."""

from __future__ import annotations

import argparse

from chexpercept.cli_options import add_output_dir_option, require
from chexpercept.domains import SEED
from chexpercept.escape import shell_word, terminal


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.eval.tiny_model import ARCHITECTURES

    add_output_dir_option(parser, required=True, help="folder to write the model and processor to")
    parser.add_argument(
        "--arch",
        choices=ARCHITECTURES,
        default="gemma3",
        help="gemma3 (Gemma 3 / MedGemma) or qwen2.5-vl (the Qwen-VL family); default gemma3",
    )
    parser.add_argument("--seed", type=SEED, default=0, help="weight seed (same seed, same weights)")


def run(args: argparse.Namespace) -> int:
    from chexpercept.eval.tiny_model import build_tiny_model

    require(args, "chexpercept make-tiny-model", "--output-dir")
    out = build_tiny_model(args.output_dir, arch=args.arch, seed=args.seed)
    print(
        f"tiny random {args.arch} VLM written to {terminal(out)} (random weights: for testing software only)"
    )
    print(
        f"use it with: chexpercept run --data-dir DIR --model {shell_word(out)} --backend transformers|vllm --max-tokens 8 "
        "(random weights never stop on their own: a small budget keeps the run short)"
    )
    return 0
