"""Subcommands contributed by chexpercept.metrics (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {}
