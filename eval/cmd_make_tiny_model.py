"""``chexpercept make-tiny-model --out DIR``: a tiny random VLM that ``--backend transformers`` runs."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder to write the model and processor to")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (same seed, same weights)")
    parser.add_argument(
        "--profile",
        choices=("cpu", "gpu"),
        default="cpu",
        help="cpu: smallest (tests, transformers); gpu: head size 64 for vLLM's GPU kernels",
    )


def run(args: argparse.Namespace) -> int:
    from chexpercept.eval.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, seed=args.seed, profile=args.profile)
    print(f"tiny random Gemma3 VLM written to {out} (random weights: for testing software only)")
    backend = "transformers" if args.profile == "cpu" else "vllm"
    print(f"use it with: chexpercept run --data-dir DIR --model {out} --backend {backend}")
    return 0
