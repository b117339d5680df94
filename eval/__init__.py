"""Running models on CheXpercept (``chexpercept.eval``): ``eval/run.py`` / ``chexpercept run``.

Modules: ``conversation`` (one case's conversation and oracle handling), ``oracle`` (the exact oracle
texts and triggers), ``engine`` (batched scheduling), ``store`` (results.jsonl, run.json, lock),
``registry`` (the paper's models), ``backend_*`` (vllm, transformers, openai, baselines; each
imported only when used), ``tiny_model`` (a tiny random VLM for tests), ``run`` (the command).
"""
