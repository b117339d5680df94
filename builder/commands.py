"""Subcommands contributed by chexpercept.builder (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {}
