"""Running models on CheXpercept (``chexpercept.eval``): ``eval/run.py`` / ``chexpercept run``.

Modules: ``conversation`` (one case's conversation and oracle handling), ``oracle`` (the exact oracle
texts and triggers), ``engine`` (batched scheduling), ``store`` (results.jsonl, run.json, lock),
``registry`` (the paper's models), ``protocol`` (what the engine asks of a backend), ``backends``
(vllm, transformers, openai, baselines: a lazy table of them, each owning its command-line options;
see backends/ADDING_A_BACKEND.md), ``tiny_model`` (a tiny random VLM for tests), ``run`` (the command).
"""
