"""Subcommands contributed by chexpercept.metrics (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "report": (
        "chexpercept.metrics.report_cmd",
        "Tables, leaderboard, reference CSVs, figures and an HTML case viewer for a folder of runs",
    ),
}
