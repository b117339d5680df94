"""Subcommands contributed by chexpercept.metrics (see chexpercept/cli.py)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "score": (
        "chexpercept.metrics.cmd_score",
        "Score runs (ours or the reference's all_results.json): flat metrics as JSON, tables, comparisons",
    ),
    "power": (
        "chexpercept.metrics.cmd_power",
        "Minimum detectable difference of a paired comparison per stage and path, and the cases a subset "
        "needs for a given difference",
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
        "chexpercept.metrics.hub.cmd_push_results",
        "Publish scores to a Hub dataset repo, or as Eval Results in a pull request on a model repo; never data",
    ),
    "benchmark-card": (
        "chexpercept.metrics.hub.cmd_benchmark_card",
        "Commit the benchmark's dataset card and eval.yaml to a Hub dataset repo (metadata only, no data)",
    ),
    "leaderboard": (
        "chexpercept.metrics.hub.cmd_leaderboard",
        "Read the Hub's leaderboard of a benchmark back: rank, model, value, verified or not",
    ),
}
