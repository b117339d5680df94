"""``chexpercept review``: the expert review of the generation candidates as a local web app.

* ``prepare``: generate's candidate selection (same seed, same rules), the mask overlays, the split
  between annotators;
* ``store``: one append-only, fsynced JSON-lines file of decisions per annotator;
* ``server``: a ``ThreadingHTTPServer`` on 127.0.0.1 serving the page (``static/``) and a small JSON API;
* ``export``: the review sheets ``generate --review`` reads, agreement (``kappa``) and disagreements.
"""
