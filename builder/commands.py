"""Subcommands contributed by chexpercept.builder (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "generate": (
        "chexpercept.builder.cmd_generate",
        "Regenerate the benchmark from MIMIC-CXR-JPG, MIMIC-ILS and anatomy masks (a release bundle)",
    ),
    "synth-sources": (
        "chexpercept.builder.cmd_synth_sources",
        "Write phantom PhysioNet-shaped sources (MIMIC-CXR-JPG, MIMIC-ILS, anatomy) for testing",
    ),
    "review": (
        "chexpercept.builder.review.cmd_review",
        "Expert review of the generation candidates as a local web app (127.0.0.1); export the review sheets",
    ),
    "synth": (
        "chexpercept.builder.cmd_synth",
        "Write a phantom release bundle (synth-sources + generate --deformer morphology); testing only",
    ),
}
