"""Subcommands of the shared core (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("chexpercept.cmd_validate", "Validate a release bundle and report every problem found"),
    "inspect": (
        "chexpercept.cmd_inspect",
        "Print the rows load_dataset gives for a bundle, per lesion and path, without building them",
    ),
}
