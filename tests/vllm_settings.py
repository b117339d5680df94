"""The engine arguments of the tests on vLLM's real engine (tests/test_vllm_*.py and
tests/test_lmms_eval.py).

Those tests compare answers made in batches of different sizes and compositions: one conversation
at a time against 64, a rerun of what an interrupted run left, two processes, ``vllm serve``,
lmms-eval's waves. vLLM runs a float32 checkpoint in bfloat16 unless told otherwise, and its CPU
kernels are not batch-invariant: in bfloat16 the tiny random models' near-equal logits give another
greedy token in another batch (qwen2.5-vl: one case of 63 differed between batch sizes in 3 of 6
comparisons; in float32 none did, in 6 comparisons for each architecture; measured 2026-12-03). In
float32 two batches still differ in their rounding, but far less than two of these models' top
logits usually do.
"""

ENGINE_ARGS: dict[str, str] = {"dtype": "float32"}
