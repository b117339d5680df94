"""CheXpercept in Inspect AI (docs/inspect.md): the task ``chexpercept/chexpercept``, registered
through Inspect's entry point (``_registry``), driving our ``Conversation``.

Modules: ``task`` (the task and its samples), ``solver`` (one case's conversation), ``scorer``
(per-turn correctness, our metrics, ``log_records``), ``messages`` (requests as Inspect messages,
replies as our responses), ``rules`` (data-use rules and what the model must take), ``hooks``
(each eval's log settings), ``release`` (the release, read once). Importing this package imports
nothing of Inspect; its modules need the ``inspect`` extra.
"""
