"""``chexpercept estimate``: model calls, tokens, cost and time of a run before it starts, over the
same conversations the runner has (``count``), priced with the paper's price table (``pricing``),
a local model's tokens counted with its own processor (``local_tokens``); ``command`` is the
command line."""
