"""The HTML/CSV/figure report over a folder of runs (``chexpercept report``).

Installed as ``chexpercept.metrics.report``. It reads the runs and scores them only through the metric
library's public API (``chexpercept.metrics`` and its public modules) and writes what people read:

- ``build``: ``write_report(results, out, ...)``, the whole report (the entry point);
- ``command``: the ``chexpercept report`` subcommand;
- ``leaderboard``: the leaderboard rows, markdown and CSV;
- ``reference_csv``: CSV files with the reference analysis's names and columns;
- ``plots``: the figures (matplotlib, imported only when a figure is drawn);
- ``page``: ``index.html`` (markdown to HTML, the page shell) and ``assets/`` (report.css, report.js);
- ``cases``: the case viewer's data files;
- ``style``: one palette shared by the figures and the page;
- ``simulate``: simulated runs for tests and benchmarks.
"""
