"""A stand-in for vLLM's offline ``LLM`` that simulates its scheduler, one iteration per ``step``.

For tests and bench/: it has the parts of ``vllm.LLM`` the vllm backend uses (``enqueue_chat``,
``llm_engine.step`` / ``has_unfinished_requests``, ``chat``, ``get_tokenizer``) and schedules as
vLLM's continuous batching does, counted in iterations: each ``step`` admits waiting requests up to
``max_num_seqs`` running ones (the prefill gives a request its first token) and every running
request gains one token; a request finishes when it has its answer's length, and its slot is free at
the next iteration. On a GPU a decode iteration costs about the same for 1 or 256 sequences, so the
iteration count stands for a run's time. The answers and their lengths come from ``answer``: a
function of the conversation (deterministic, so that every scheduler gives the same answers).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


def _digest(conversation: list[dict[str, Any]], seed: int = 0) -> int:
    """A hash of a conversation's texts and image count (not its image URLs, which name folders)."""
    texts = []
    for message in conversation:
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts += [p.get("text", "") if p["type"] == "text" else "<image>" for p in parts]
    text = json.dumps([seed, texts], ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def heavy_tailed_answers(
    median: float = 700.0, sigma: float = 1.0, cap: int = 8192, options: int = 2, seed: int = 0
) -> Callable[[list[dict[str, Any]]], tuple[str, int]]:
    """Answers ``Answer: k`` whose lengths in tokens are lognormal (``median``, ``sigma``), at most
    ``cap``, drawn from a hash of the conversation (and ``seed``): the spread of reasoning models'
    answers."""

    def answer(conversation: list[dict[str, Any]]) -> tuple[str, int]:
        rng = random.Random(_digest(conversation, seed))
        length = min(cap, max(1, round(math.exp(rng.gauss(math.log(median), sigma)))))
        return f"Answer: {rng.randint(1, options)}", length

    return answer


def fixed_answers(length: int, options: int = 2) -> Callable[[list[dict[str, Any]]], tuple[str, int]]:
    """Answers of ``length`` tokens each (a random model running to --max-tokens)."""

    def answer(conversation: list[dict[str, Any]]) -> tuple[str, int]:
        return f"Answer: {1 + _digest(conversation) % options}", length

    return answer


@dataclass
class _Sequence:
    request_id: str
    prompt: list[int]
    text: str
    length: int
    generated: int = 0


@dataclass
class SimulatedEngine:
    """The engine part (``llm.llm_engine``): waiting and running sequences, stepped per iteration."""

    max_num_seqs: int
    max_model_len: int
    waiting: deque[_Sequence] = field(default_factory=deque)
    running: list[_Sequence] = field(default_factory=list)
    iterations: int = 0
    most_running: int = 0

    @property
    def vllm_config(self) -> Any:
        return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=self.max_num_seqs))

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[Any]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.popleft())
        self.iterations += 1
        self.most_running = max(self.most_running, len(self.running))
        finished = []
        for seq in self.running:
            seq.generated += 1
            if seq.generated >= seq.length:
                finished.append(seq)
        self.running = [s for s in self.running if s.generated < s.length]
        return [_output(s) for s in finished]


def _output(seq: _Sequence) -> Any:
    completion = SimpleNamespace(text=seq.text, token_ids=list(range(seq.length)), finish_reason="stop")
    return SimpleNamespace(
        request_id=seq.request_id,
        finished=True,
        prompt_token_ids=seq.prompt,
        num_cached_tokens=0,
        outputs=[completion],
    )


class SimulatedLLM:
    """``vllm.LLM`` as far as the vllm backend uses it; see the module docstring."""

    def __init__(
        self,
        *,
        answer: Callable[[list[dict[str, Any]]], tuple[str, int]] | None = None,
        max_num_seqs: int = 256,
        max_model_len: int = 1 << 20,
        **engine_args: Any,
    ):
        self.engine_args = engine_args
        self.answer = answer or fixed_answers(8)
        self.llm_engine = SimulatedEngine(max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        self._next_id = 0
        #: every conversation rendered (as enqueue_chat or chat got it)
        self.conversations: list[list[dict[str, Any]]] = []

    @staticmethod
    def prompt_tokens(conversation: list[dict[str, Any]]) -> int:
        """A stand-in prompt length: a token per 4 characters of text, 64 per image."""
        tokens = 0
        for message in conversation:
            content = message["content"]
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for part in parts:
                tokens += len(part.get("text", "")) // 4 if part["type"] == "text" else 64
        return tokens

    def _sequence(self, conversation: list[dict[str, Any]]) -> _Sequence:
        prompt = self.prompt_tokens(conversation)
        if prompt >= self.llm_engine.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {prompt}) is longer than the maximum model length of "
                f"{self.llm_engine.max_model_len}."
            )
        text, length = self.answer(conversation)
        self._next_id += 1
        self.conversations.append(conversation)
        return _Sequence(str(self._next_id), list(range(prompt)), text, length)

    def _add(self, messages: Sequence[list[dict[str, Any]]]) -> list[str]:
        sequences = [self._sequence(m) for m in messages]
        self.llm_engine.waiting.extend(sequences)
        return [s.request_id for s in sequences]

    def enqueue_chat(
        self, messages: Sequence[list[dict[str, Any]]], sampling_params: Any = None, **kwargs: Any
    ) -> list[str]:
        return self._add(messages)

    def chat(
        self, messages: Sequence[list[dict[str, Any]]], sampling_params: Any = None, **kwargs: Any
    ) -> list[Any]:
        """All conversations at once, stepped until every one is finished (as ``LLM.chat``)."""
        ids = self._add(messages)
        done: dict[str, Any] = {}
        while self.llm_engine.has_unfinished_requests():
            for out in self.llm_engine.step():
                done[out.request_id] = out
        return [done[i] for i in ids]

    def get_tokenizer(self) -> Any:
        return SimpleNamespace(
            all_special_ids=[], added_tokens_decoder={}, get_vocab=dict, decode=lambda ids, **_: ""
        )


class BatchOnlyLLM(SimulatedLLM):
    """A vLLM without ``enqueue_chat`` (driven a batch at a time through ``chat``)."""

    enqueue_chat = None  # type: ignore[assignment]


class SplitLLM(SimulatedLLM):
    """A vLLM whose rendering is split from adding (``_preprocess_chat_one`` and ``_add_request``,
    the two halves of ``enqueue_chat``; the vllm backend then renders on a thread of its own), with
    a multimodal processor cache of ``cache_items`` images by id, least recently used out: an image
    part without its pixels (``image_pil`` None, its ``uuid`` given) renders only while the cache
    holds that id, and is refused otherwise, as vLLM refuses it."""

    def __init__(self, *, cache_items: int = 1 << 20, **kwargs: Any):
        super().__init__(**kwargs)
        self.cache_items = cache_items
        self._cache: OrderedDict[str, None] = OrderedDict()
        #: image parts rendered with their pixels (or URL) / by their id alone from the cache
        self.with_pixels = 0
        self.by_id = 0
        #: the threads that rendered
        self.render_threads: set[str] = set()
        mm = SimpleNamespace(mm_processor_cache_gb=4)
        self.llm_engine.model_config = SimpleNamespace(multimodal_config=mm)  # type: ignore[attr-defined]

    def _preprocess_chat_one(
        self, messages: list[dict[str, Any]], chat_template_kwargs: Any = None
    ) -> list[dict[str, Any]]:
        self.render_threads.add(threading.current_thread().name)
        for message in messages:
            content = message["content"]
            for part in content if isinstance(content, list) else ():
                uuid = part.get("uuid")
                if part["type"] == "text" or uuid is None:
                    continue
                if part["type"] == "image_pil" and part.get("image_pil") is None:
                    if uuid not in self._cache:
                        raise ValueError(f"multi_modal_data['image'] is empty and {uuid} is not in the cache")
                    self.by_id += 1
                else:
                    self.with_pixels += 1
                self._cache[uuid] = None
                self._cache.move_to_end(uuid)
                while len(self._cache) > self.cache_items:
                    self._cache.popitem(last=False)
        return messages  # the rendered prompt: the conversation stands for itself here

    def _adjust_params_for_parsing(self, params: Sequence[Any]) -> None:
        """What vLLM does to a thinking model's sampling parameters (nothing here)."""

    def _add_request(self, prompt: list[dict[str, Any]], params: Any = None, **kwargs: Any) -> str:
        return self._add([prompt])[0]
