"""Evaluation harnesses that run CheXpercept through this package's one conversation API.

Each integration (``inspect_ai``: Inspect AI's task, docs/inspect.md; ``lmms_eval``: a task folder for
lmms-eval, docs/lmms-eval.md) drives ``chexpercept.eval.conversation`` for the routes, the history, the
oracle settings and the parsing, and ``chexpercept.metrics`` for the scores, so that a harness sends what
our runner sends and reports the numbers ``chexpercept score`` reports.
"""
