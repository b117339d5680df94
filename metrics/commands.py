"""Subcommands contributed by chexpercept.metrics (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "score": (
        "chexpercept.metrics.cmd_score",
        "Score runs (ours or the reference's all_results.json): flat metrics as JSON, tables, comparisons",
    ),
    "install-metric": (
        "chexpercept.metrics.cmd_install_metric",
        'Install the evaluate module so evaluate.load("chexpercept_metric") works offline anywhere',
    ),
    "report": (
        "chexpercept.metrics.report.command",
        "Tables, leaderboard, reference CSVs, figures and an HTML case viewer for a folder of runs",
    ),
    "push-results": (
        "chexpercept.metrics.cmd_push_results",
        "Publish scores (tables, intervals, leaderboard, provenance) to a Hub dataset repo; never data",
    ),
}
