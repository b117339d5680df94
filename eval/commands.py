"""Subcommands contributed by chexpercept.eval (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "chexpercept.eval.run",
        "Run a model or baseline on a bundle (same as eval/run.py; resumable, accelerate-shardable)",
    ),
    "estimate": (
        "chexpercept.eval.estimate.command",
        "Model calls, tokens, cost and time of a run before it starts (same conversations as run)",
    ),
    "make-tiny-model": (
        "chexpercept.eval.cmd_make_tiny_model",
        "Build, offline, a tiny random vision-language model (Gemma 3 or Qwen2.5-VL) for tests and demos",
    ),
    "download-model": (
        "chexpercept.eval.cmd_download_model",
        "Fetch a model's weights into the Hugging Face cache ahead of a run (gated access, revision, disk checked)",
    ),
}
