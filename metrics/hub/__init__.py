"""Everything that goes to the Hugging Face Hub: the upload guard and what it allows.

- ``identifiers``: the bundle's own case identifiers, found in any case or common encoding;
- ``guard``: the manifest of what a stager wrote and the allow-list check run right before an upload;
- ``commit``: one commit (or pull request) of exactly the checked bytes;
- ``eval_results``: ``.eval_results/*.yaml`` files for a model repo (``push-results --model-repo``);
- ``benchmark_card``: the metadata-only benchmark dataset repo (``benchmark-card``);
- ``leaderboard``: the Hub's leaderboard of a benchmark read back (``leaderboard``, ``report``).

The dataset repo of scores (``push-results --repo``) is staged by ``chexpercept.metrics.hub.push_results``.
"""

#: eval.yaml's ``evaluation_framework`` unless ``benchmark-card --evaluation-framework`` says otherwise
DEFAULT_FRAMEWORK = "chexpercept"
