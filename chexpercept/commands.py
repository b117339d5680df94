"""Subcommands of the shared core (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("chexpercept.cmd_validate", "Validate a release bundle and report every problem found"),
    "inspect": (
        "chexpercept.cmd_inspect",
        "Load a bundle with load_dataset and print per-path and per-lesion counts",
    ),
}
