"""Reference points that need no model: random, constant, prior and oracle answers.

- ``baseline:random``: a uniformly random valid answer per turn, seeded by (seed, key_id, task), so
  results do not depend on order, batch size or sharding. Single choice: one of n options (chance
  1/n). Multi-select with a None option: one of the 2^(n-1) valid answers (None, or any non-empty set
  of the other options; chance 1/2^(n-1)).
- ``baseline:constant:<k>``: always option k.
- ``baseline:prior``: per task, the most frequent gold answer over the selected cases (for point and
  location questions a gold "None" counts as one answer whatever its index).
- ``baseline:oracle``: the gold answer (a sanity check of the whole pipeline: it must score 100%).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chexpercept.answers import oracle_answer_text
from chexpercept.case import Case, Turn
from chexpercept.eval.backends.options import NoOptions
from chexpercept.eval.protocol import BackendError, BatchBackend, Request, Response, RunContext, Sampling

if TYPE_CHECKING:
    from chexpercept.eval.registry import ModelSpec

BASELINE_PREFIX = "baseline:"
KINDS = ("random", "constant", "prior", "oracle")


def is_baseline(model: str) -> bool:
    return model.startswith(BASELINE_PREFIX)


def random_answer(turn: Turn, rng: random.Random) -> list[int]:
    """A uniformly random valid answer to one turn."""
    n = len(turn.options)
    if not turn.multi_select:
        return [rng.randint(1, n)]
    none = turn.none_index
    real = [i for i in range(1, n + 1) if i != none]
    if none is None:
        mask = rng.randrange(1, 2 ** len(real))
    else:
        mask = rng.randrange(0, 2 ** len(real))
        if mask == 0:
            return [none]
    return [opt for bit, opt in enumerate(real) if mask >> bit & 1]


def _answer_key(turn: Turn) -> Any:
    gold = tuple(sorted(turn.answer_index))
    return "None" if turn.none_index is not None and gold == (turn.none_index,) else gold


def _prior(cases: Sequence[Case]) -> dict[str, Any]:
    """Per task, the most frequent gold answer over ``cases``; ties go to the answer that sorts
    first, so the choice is deterministic."""
    counts: dict[str, Counter] = {}
    for case in cases:
        for turn in case.turns:
            counts.setdefault(turn.task, Counter())[_answer_key(turn)] += 1
    return {task: min(c.items(), key=lambda kv: (-kv[1], str(kv[0])))[0] for task, c in counts.items()}


class BaselineBackend(BatchBackend):
    """The four baselines behind the Backend interface."""

    name = "baseline"
    default_batch_size = 256
    reads_model_options = False

    def __init__(self, spec: ModelSpec | str, **run: Any):
        """``spec``: the model (``baseline:<kind>``), or its name. No options: the model string says
        which baseline (--seed seeds baseline:random); the run's other settings (``run``) change
        nothing here."""
        self.options = NoOptions()
        model = spec if isinstance(spec, str) else spec.model_id
        if not is_baseline(model):
            raise ValueError(f"{model!r} is not a baseline (expected baseline:<kind>)")
        spec = model[len(BASELINE_PREFIX) :]
        kind, _, arg = spec.partition(":")
        if kind not in KINDS:
            raise ValueError(
                f"unknown baseline {model!r}; expected baseline:random, baseline:constant:<k>, "
                "baseline:prior or baseline:oracle"
            )
        if kind == "constant":
            if not arg.isdigit() or int(arg) < 1:
                raise ValueError(
                    f"{model!r}: baseline:constant needs an option number >= 1, e.g. baseline:constant:1"
                )
            self.constant = int(arg)
        elif arg:
            raise ValueError(f"{model!r}: baseline:{kind} takes no argument")
        self.kind = kind
        self.seed = 0
        self.prior: dict[str, Any] = {}

    def setup(self, context: RunContext) -> None:
        self.seed = context.local_seed
        if self.kind == "constant":  # an option no question has: every answer out of range, scored 0
            most = max((len(t.options) for c in context.cases for t in c.turns), default=0)
            if self.constant > most:
                raise BackendError(
                    f"baseline:constant:{self.constant}: no question of the selected cases has "
                    f"{self.constant} options (the most is {most}); choose an option number from 1 to {most}"
                )
        if self.kind == "prior":
            self.prior = _prior(context.cases)

    def _indices(self, request: Request) -> list[int]:
        turn = request.turn
        if self.kind == "oracle":
            return list(turn.answer_index)
        if self.kind == "constant":
            return [self.constant]
        if self.kind == "prior":
            key = self.prior[turn.task]
            if key == "None":
                return [turn.none_index] if turn.none_index is not None else [len(turn.options)]
            return list(key)
        digest = hashlib.sha256(f"{self.seed}\0{request.key_id}\0{turn.task}".encode()).digest()
        return random_answer(turn, random.Random(int.from_bytes(digest[:8], "big")))

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        return [Response(oracle_answer_text(self._indices(r))) for r in requests]

    def sampling(self) -> Sampling:
        return Sampling(temperature=0.0, top_p=1.0, max_tokens=0, greedy=True)

    def identity(self, context: RunContext) -> dict[str, Any]:
        """The kind (and option) is in the model id already; baseline:prior's answers depend on the
        selected cases (another --limit or --per-cell gives another prior)."""
        if self.kind != "prior":
            return {}
        return {"prior": {t: (k if k == "None" else list(k)) for t, k in _prior(context.cases).items()}}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"baseline": self.kind}
        if self.kind == "constant":
            out["option"] = self.constant
        if self.kind == "prior":
            out["prior"] = {t: (k if k == "None" else list(k)) for t, k in self.prior.items()}
        return out

    def close(self) -> None:
        pass
