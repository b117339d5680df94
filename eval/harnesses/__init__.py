"""Evaluation harnesses that run CheXpercept through our one conversation API
(``chexpercept.eval.conversation``): ``inspect_ai`` (Inspect AI's tasks, docs/inspect.md)."""
