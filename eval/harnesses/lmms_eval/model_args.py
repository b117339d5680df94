"""The ``--model_args`` of lmms-eval's chat vLLM model that start the engine our runner starts.

Our runner records the engine arguments it gave vLLM in run.json (``backend_settings.engine_args``;
``VLLMBackend.build_engine_args`` computes them). lmms-eval's chat vLLM model passes every model
argument it does not know on to ``vllm.LLM``, so the same engine takes the same arguments, with two
exceptions it fixes itself: ``seed`` (always 1; greedy decoding does not read it) and the model,
which is its own ``model=`` argument. Its argument string is split at the commas outside braces and
quotes, so a JSON value (``limit_mm_per_prompt={"image":7}``) travels whole and a plain value that
holds a comma cannot be carried; an argument left at None is vLLM's default and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: engine arguments lmms-eval's chat vLLM model sets itself
FIXED_BY_LMMS_EVAL = frozenset({"model", "seed"})


def model_args(engine_args: Mapping[str, Any], *, max_new_tokens: int) -> str:
    """``--model_args`` for ``lmms-eval --model vllm`` from our engine arguments (run.json's
    ``backend_settings.engine_args``) and the answer budget (our ``--max-tokens``).

    Raises ValueError for a value that lmms-eval's comma-separated argument string cannot carry."""
    parts = [f"model={engine_args['model']}", f"max_new_tokens={int(max_new_tokens)}"]
    for key, value in engine_args.items():
        if key in FIXED_BY_LMMS_EVAL or value is None:
            continue
        text = _text(value)
        if "," in text and not isinstance(value, (dict, list)):
            raise ValueError(
                f"engine argument {key}={text} holds a comma, which lmms-eval's --model_args "
                "(split at commas) cannot carry"
            )
        parts.append(f"{key}={text}")
    return ",".join(parts)


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
