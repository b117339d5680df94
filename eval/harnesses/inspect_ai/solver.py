"""The solver: one case's conversation, driven through our ``Conversation``.

Before the first request of each case, the model is checked (``rules``: data use, images in the
log, what the model can take). Then, turn after turn, the pending request's messages (system
message, every earlier turn as our history holds it, the new question and its images, read through
``chexpercept.containment``) are what Inspect sends; the model's reply goes back to the
conversation, which parses and judges it and applies the oracle setting before the next turn.
The finished record (the one our runner writes to results.jsonl) is kept in the sample's store for
the scorer, and the sample's messages become the conversation as the model last saw it, each image
named by its file.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from inspect_ai.model import GenerateConfig, get_model
from inspect_ai.solver import Generate, Solver, TaskState, solver

from chexpercept.answers import ParseMode
from chexpercept.case import Case
from chexpercept.eval.conversation import Conversation

from . import messages, rules
from .release import load_release, selection

#: the sample store's keys: the finished case's record (a results.jsonl record as a dict), and
#: whether the decoding was greedy (an Oracle-Passed run then also gives the End-to-End numbers)
RECORD_KEY = "chexpercept_record"
GREEDY_KEY = "chexpercept_greedy"


def images_per_request(case: Case) -> int:
    """The most images one request of ``case`` carries: its last, which re-sends them all."""
    return sum(len(t.images) for t in case.turns)


def effective_config(model: Any) -> GenerateConfig:
    """The generation settings of this eval's requests: the model's, then the eval's over them
    (``--batch``, ``--temperature``...). Inspect has no public accessor for the eval's settings
    inside a solver; this private one is that of the pinned version (the tests fail if it moves)."""
    from inspect_ai.model._generate_config import active_generate_config

    return model.config.merge(active_generate_config())


#: the generation settings that cannot change an answer (connections, retries, timeouts, logging of
#: log probabilities, headers); every other one, known now or added by a later Inspect, is in a
#: record's run identity (round 2, helper-53: system_message, verbosity, effort, fallback_models were
#: left out of a list of the ones that do)
TRANSPORT_SETTINGS = frozenset({
    "max_retries", "timeout", "attempt_timeout", "stream_idle_timeout", "max_connections",
    "adaptive_connections", "logprobs", "top_logprobs", "prompt_logprobs", "extra_headers", "batch",
})  # fmt: skip


def run_identity(
    model: str,
    config: GenerateConfig,
    oracle: str,
    parse_mode: str,
    release: str,
    base_url: str | None = None,
) -> dict[str, str]:
    """What each case's record carries of the eval that made it (the ``run`` field our runner's
    lines carry): the model, and a fingerprint of the model, its server's base URL, every generation
    setting but the transport's (``TRANSPORT_SETTINGS``), the parse mode, the release
    (``Release.fingerprint``) and the prompts' version, the oracle setting left out (each record
    names its own), so that the settings folders of one model compare (metrics/discovery.py);
    ``harness`` says whose. Records of two evals then differ, so ``chexpercept score`` refuses a
    results.jsonl that mixes them, and the task's metric an eval that does (red team, stop 48:
    records merged from logs at temperature 0 and 1, or an eval-retry over a release changed in
    place, were scored as one run)."""
    from chexpercept.eval.runner.identity import PROMPT_VERSION
    from chexpercept.results import settings_fingerprint

    generate = config.model_dump(mode="json", exclude_none=True)
    settings = {
        "model": model,
        "base_url": base_url,
        "generate": {k: v for k, v in generate.items() if k not in TRANSPORT_SETTINGS},
        "parse_mode": parse_mode,
        "release": release,
        "prompt_version": PROMPT_VERSION,
    }
    fingerprint = settings_fingerprint(settings)
    return {"model": model, "fingerprint": fingerprint, "harness": "inspect_ai", "parse_mode": parse_mode}


@solver(name="chexpercept_conversation")
def conversation_solver(
    data_dir: str,
    oracle: str,
    parse_mode: ParseMode = "reference",
    lesions: str | list[str] | None = None,
    paths: str | list[str] | None = None,
    dua_compliant: bool = False,
) -> Solver:
    """Drive each sample's case (its id is the key_id) of the release at ``data_dir`` through our
    ``Conversation`` with the oracle setting and parse mode; ``dua_compliant`` declares the
    model's endpoint (``rules``)."""
    release = load_release(data_dir, selection(lesions), selection(paths))
    cases, root = release.cases, release.root
    images_needed = max((images_per_request(c) for c in cases.values()), default=1)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        model = get_model()
        config = effective_config(model)
        rules.check_log_images(state.uuid)
        checked = rules.check_model(model, config, declared=dua_compliant, images_needed=images_needed)
        if checked is not None:
            await rules.guard(model, checked)
        case = cases[str(state.sample_id)]
        conv = Conversation(case, oracle=oracle, parse_mode=parse_mode, model=model.name, root=root)
        while not conv.done:
            request = conv.pending
            state.messages = messages.chat_messages(request)
            try:
                state = await generate(state)
            except Exception as e:
                explained = rules.explain_rejection(
                    e, key_id=case.key_id, task=request.task, images=len(request.images)
                )
                if explained is None:
                    raise
                raise rules.ModelUnsuitable(explained) from e
            conv.answer(messages.response(state.output, model.name))
        state.messages = messages.readable(conv.history)
        record = asdict(conv.result())
        base_url = getattr(getattr(model, "api", None), "base_url", None)
        record["run"] = run_identity(
            str(model), config, oracle, parse_mode, release.fingerprint, str(base_url) if base_url else None
        )
        state.store.set(RECORD_KEY, record)
        state.store.set(GREEDY_KEY, config.temperature == 0)
        return state

    return solve
