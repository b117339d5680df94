"""Subcommands contributed by chexpercept.eval (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {}
