"""``chexpercept download-model NAME [--revision R]``: fetch a model's weights into the Hugging Face
cache ahead of a run (e.g. on a login node before a cluster job), with the same checks as ``run``:
gated access, missing model or revision, free disk. ``HF_HOME`` / ``HF_HUB_CACHE`` say where."""

from __future__ import annotations

import argparse
import sys

from chexpercept.escape import shell_word, terminal, terminal_lines


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.eval.weights import add_revision_option

    parser.add_argument(
        "name", metavar="NAME", help="registry name (see chexpercept run --list-models) or Hugging Face id"
    )
    add_revision_option(parser)
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="Hugging Face cache folder (default: HF_HUB_CACHE, else HF_HOME/hub)",
    )
    parser.add_argument(
        "--processor-only",
        action="store_true",
        help="every file but the weights (configuration, tokenizer, chat template, processor): what "
        "chexpercept estimate needs to count a model's tokens, a few MB",
    )


def model_id_of(name: str) -> str:
    """The Hugging Face id a registry name stands for (any other name is taken as an id)."""
    from chexpercept.eval.registry import lookup
    from chexpercept.eval.weights import WEIGHT_BACKENDS

    spec = lookup(name)
    if spec is None:
        return name
    if spec.backend not in WEIGHT_BACKENDS:
        raise ValueError(
            f"{spec.name} runs through the {spec.backend} backend: it has no weights to download"
        )
    return spec.model_id


def run(args: argparse.Namespace) -> int:
    from chexpercept.eval.weights import HubError, human_size, resolve_weights

    try:
        model_id = model_id_of(args.name)
        weights = resolve_weights(
            model_id, args.revision, cache_dir=args.cache_dir, processor_only=args.processor_only
        )
    except (HubError, ValueError) as e:
        print(f"chexpercept download-model: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    if weights.source == "local":
        print(f"{terminal(model_id)} is a local folder: nothing to download")
        return 0
    size = f", {human_size(weights.size)}" if weights.size is not None else ""
    how = {"cache": "already in the cache", "download": f"downloaded {human_size(weights.downloaded)}"}
    print(f"{terminal(model_id)} commit {terminal(weights.commit)} ({how[weights.source]}{size})")
    print(f"  {terminal(weights.path)}")
    print(
        f"offline runs read it from the cache: HF_HUB_OFFLINE=1 chexpercept run --model {shell_word(args.name)} "
        f"--revision {shell_word(weights.commit)} ..."
    )
    return 0
