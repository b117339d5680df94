"""``ChexperceptTask``: one CheXpercept oracle setting as an lmms-eval task.

lmms-eval loads it from the task YAMLs of this folder (``class: !function utils.ChexperceptTask``).
It is one of lmms-eval's message tasks (``generate_until_multi_round``), and every piece of the
benchmark's semantics is ours:

- the documents are the release's cases, read with our bundle reader from ``CHEXPERCEPT_DATA_DIR``
  or ``dataset_kwargs.data_dir`` (validated, every image inside the release; nothing downloaded);
  a document holds names only (key_id, lesion, route, tasks), never pixels;
- each round's messages are ``Conversation.pending`` after the answers so far (replay.py): system
  message, every earlier turn with its images, the oracle's corrections, in lmms-eval's message form
  with each image as its path inside the release;
- the metrics are ``chexpercept.metrics`` on the records the answers make (scores.py);
- before any request, the model and its engine are checked (checks.py).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

from datasets import Dataset, DatasetDict
from lmms_eval.api.task import ConfigurableMessagesTask

from chexpercept.answers import PARSE_MODES
from chexpercept.errors import ReleaseNotFoundError
from chexpercept.results import check_oracle

from ...conversation import Conversation
from ...protocol import Request
from .checks import (
    check_engine_private,
    check_image_limit,
    check_model,
    check_not_cached,
    check_version,
    evaluating_model,
    model_name,
    release_dir,
)
from .replay import open_release, replay
from .scores import aggregate, case_item, metric_keys


def lmms_messages(request: Request) -> list[dict[str, Any]]:
    """``request`` in lmms-eval's message form (``lmms_eval.protocol.ChatMessages``: a list of
    content parts for every role, an image as its local path): the text, order and images of
    ``Request.chat_messages``, which our vllm backend sends, each image checked to be inside the
    release."""
    messages = []
    for message in request.chat_messages(images="file_url"):
        content = message["content"]
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        else:
            parts = [
                {"type": "image", "url": url2pathname(urlsplit(part["image_url"]["url"]).path)}
                if part["type"] == "image_url"
                else {"type": "text", "text": part["text"]}
                for part in content
            ]
        messages.append({"role": message["role"], "content": parts})
    return messages


def keep_outputs_private() -> None:
    """From now on, this process (an lmms-eval run of our task) makes its files owner-only: lmms-eval
    writes ``--output_path`` (its results and, with ``--log_samples``, every case's key_id, questions
    and answers) with plain ``open()`` under the umask, 0644 in 0755 folders that another account
    read (red team, stop 43). The umask keeps its own bits and gains 077."""
    current = os.umask(0o077)
    os.umask(current | 0o077)
    global STARTED_UNDER
    if STARTED_UNDER is None:
        STARTED_UNDER = current


#: the umask this process had before ``keep_outputs_private`` (the one lmms-eval started its model's
#: engine under: it builds the model before any task)
STARTED_UNDER: int | None = None


class ChexperceptTask(ConfigurableMessagesTask):
    """One oracle setting of CheXpercept (``metadata.oracle``; ``metadata.parse_mode``, default
    ``reference``) over the cases of a local release."""

    def __init__(self, *args: Any, config: dict[str, Any] | None = None, **kwargs: Any):
        config = dict(config or {})
        config.pop("class", None)
        task = str(config.get("task", "chexpercept"))
        check_version(task)
        keep_outputs_private()
        metadata = dict(config.get("metadata") or {})
        self.oracle = check_oracle(str(metadata.get("oracle", "")), f"{task}: metadata.oracle")
        self.parse_mode = str(metadata.get("parse_mode", "reference"))
        if self.parse_mode not in PARSE_MODES:
            raise ValueError(
                f"{task}: metadata.parse_mode must be one of {PARSE_MODES}, got {self.parse_mode!r}"
            )
        #: the release folder and its cases, set by ``download``
        self.release = ""
        self.cases: dict[str, Any] = {}
        #: the model's id for the parser's per-family rules, set when requests are built
        self.model_id = ""
        # lmms-eval takes metric names it does not know only from a task with process_results
        config["process_results"] = self.process_results
        config["metric_list"] = [
            {"metric": key, "aggregation": partial(aggregate, key=key), "higher_is_better": True}
            for key in metric_keys(self.oracle)
        ]
        super().__init__(*args, config=config, **kwargs)

    # ------------------------------------------------------------------ documents
    def download(self, dataset_kwargs: dict[str, Any] | None = None) -> None:
        """The release's cases as documents (one split, ``test_split``), read with our bundle reader."""
        task = self.config.task
        folder, source = release_dir(task, dataset_kwargs)
        try:
            self.release, self.cases = open_release(folder)
        except ReleaseNotFoundError as e:
            raise ReleaseNotFoundError(folder, f"{task} ({source}={folder}): {e}", instructions=False) from e
        if not self.cases:
            raise ReleaseNotFoundError(
                folder, f"{task} ({source}={folder}): the release has no cases", instructions=False
            )
        rows = [
            {
                "key_id": case.key_id,
                "lesion": case.lesion,
                "path": case.path.value,
                "tasks": [turn.task for turn in case.turns],
            }
            for case in self.cases.values()
        ]
        split = self.config.test_split or "test"
        self.dataset = DatasetDict({split: Dataset.from_list(rows)})
        self.dataset_no_image = self.dataset

    def doc_to_text(self, doc: dict[str, Any]) -> str:
        """The case's first question (lmms-eval's context string; the rounds are ``doc_to_messages``)."""
        return self.cases[doc["key_id"]].turns[0].text

    def doc_to_target(self, doc: dict[str, Any]) -> str:
        """The gold answers, turn by turn (for lmms-eval's logged samples)."""
        turns = self.cases[doc["key_id"]].turns
        return "; ".join(f"{t.task}: {','.join(str(i) for i in t.answer_index)}" for t in turns)

    # ------------------------------------------------------------------ rounds
    def doc_to_messages(
        self,
        doc: dict[str, Any],
        *,
        round_idx: int | None = None,
        previous_output: list[str] | None = None,
        previous_round_info: Any = None,
    ) -> Any:
        """The first round's messages (``round_idx`` None); afterwards lmms-eval's round protocol:
        (messages, terminal, previous_output, previous_round_info), terminal once every turn of the
        case's route is answered."""
        answers = list(previous_output or [])
        conversation = self.conversation(doc["key_id"], answers)
        if round_idx is None:
            return lmms_messages(conversation.pending)
        if conversation.done:
            return None, True, answers, previous_round_info
        return lmms_messages(conversation.pending), False, answers, previous_round_info

    def conversation(self, key_id: str, answers: list[str]) -> Conversation:
        """The case's conversation after ``answers``."""
        return replay(
            self.cases[key_id],
            answers,
            release=self.release,
            oracle=self.oracle,
            parse_mode=self.parse_mode,  # type: ignore[arg-type]
            model=self.model_id,
        )

    def build_all_requests(self, *args: Any, **kwargs: Any) -> None:
        """Check the model and its engine (checks.py), then build the requests as lmms-eval does."""
        lm = evaluating_model()
        if lm is not None:
            task = self.config.task
            check_model(lm, task)
            check_not_cached(task, kwargs)
            check_engine_private(task, STARTED_UNDER)
            self.model_id = model_name(lm)
            check_image_limit(lm, self._selected(kwargs.get("limit"), kwargs.get("offset")), task)
        super().build_all_requests(*args, **kwargs)

    def _selected(self, limit: Any, offset: Any) -> list[Any]:
        """The cases lmms-eval's ``--limit`` and ``--offset`` select."""
        keys = list(self.eval_docs["key_id"])
        start = int(offset or 0)
        stop = start + int(limit) if isinstance(limit, (int, float)) and limit else len(keys)
        return [self.cases[k] for k in keys[start:stop]]

    # ------------------------------------------------------------------ scores
    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        """Every metric gets the case's item (its answers and the task's settings; scores.py)."""
        gen = self.config.generation_kwargs or {}
        item = case_item(
            self.cases[doc["key_id"]],
            results[0] if results else None,
            task=self.config.task,
            release=self.release,
            oracle=self.oracle,
            parse_mode=self.parse_mode,
            model=self.model_id,
            greedy=float(gen.get("temperature") or 0) == 0,
        )
        return {key: item for key in metric_keys(self.oracle)}
