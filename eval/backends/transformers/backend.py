"""transformers: AutoProcessor + AutoModelForImageTextToText, batched generation with left padding.

It answers a batch at a time (``BatchBackend``): every request handed over since it was last free,
which is the next turn of every live conversation (while ``model.generate`` runs, every live
conversation waits for it). Those are sorted by length and cut into left-padded micro-batches of
similar length (within a padded-token budget), each rendered by the processor's chat template and
decoded together by ``model.generate``. Each image file is decoded once while its conversation is
live (later turns re-send the same images) and dropped when no live conversation uses it; a
step's new images are decoded on ``image_workers`` threads.

Every turn re-sends the whole conversation; the turn cache (turn_cache.py) keeps each live
conversation's keys and values from its last turn so that only the new part of the prompt is
computed, turned on at setup only where a check on two real cases of the run gives the same
answers as computing every turn from scratch. For a model whose image tokens attend to one another
in both directions (Gemma 3) that prefill runs with masks built by broadcasting
(prefill_masks.py), checked against the model's own.

Preparing the inputs of a turn repeats work for every earlier image of the conversation. Three
shortcuts, each turned on at setup only where a check on real images of the run shows the model
inputs stay bit for bit the same (``describe()`` says which are on and why not): the processor
returns numpy arrays (its per-row token checks are slow on torch tensors); a fixed-size processor
gets each image already resized with its own filter (image_resize.py); and its pixel values are
computed once per image while the image is live (pixel_cache.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from chexpercept.case import Case
from chexpercept.containment import ContainmentError, open_image
from chexpercept.domains import COUNT, GIB
from chexpercept.eval.backends.options import BackendOptions, option
from chexpercept.eval.backends.replies import MarkerDecoder
from chexpercept.eval.backends.transformers.image_resize import FixedResize, fixed_resize_of
from chexpercept.eval.backends.transformers.pixel_cache import PixelCache
from chexpercept.eval.backends.transformers.prefill_masks import (
    FULL,
    SLIDING,
    cache_keyword,
    positions,
    prefill_masks,
    same_as_model,
    window_start,
)
from chexpercept.eval.backends.transformers.turn_cache import TurnCache, TurnCacheStats
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import BackendError, BatchBackend, Request, Response, RunContext, Sampling
from chexpercept.eval.registry import ModelSpec
from chexpercept.eval.runner.preflight import CONTEXT_KEYS, ContextLimits, model_context_length
from chexpercept.os_errors import explain_os_error

DTYPES = ("auto", "float32", "bfloat16", "float16")
#: padded prompt tokens per generate call (rows x longest row), estimated. Each micro-batch pays
#: its own decode loop, so fewer, larger ones win as answers get longer (bench/RESULTS.md); the
#: budget bounds memory: lower it if a batch runs out of GPU memory.
DEFAULT_MAX_BATCH_TOKENS = 32768


def pick_device(device: str, local_process_index: int) -> str:
    """``auto``: this process's GPU (its index among the processes of its machine) when CUDA is
    there, else cpu."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return f"cuda:{local_process_index % torch.cuda.device_count()}"
    return "cpu"


def turn_cache_budget(device: Any) -> int:
    """Bytes the turn cache may hold by default: half the GPU memory free once the model is
    loaded (the other half is for the batches), or a quarter of the machine's memory on a CPU."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): 4 GiB
        return 4 * 2**30


def _most_images_first(cases: Iterable[Case]) -> list[Case]:
    """The cases ordered by how many images their turns carry, most first (ties in run order):
    the setup checks run on the richest ones."""
    return sorted(cases, key=lambda c: -sum(len(t.images) for t in c.turns))


def _check_requests(context: RunContext) -> list[Request]:
    """The first and the last turn of the run's case with the most images (answered "Answer: 1")."""
    cases = [c for c in _most_images_first(context.cases) if any(t.images for t in c.turns)]
    if not cases:
        return []
    case = cases[0]
    conversation = Conversation(case, oracle="none")
    requests = [conversation.pending]
    while True:
        conversation.answer(Response("Answer: 1"))
        if conversation.done:
            return requests[:1] + requests[-1:] if len(requests) > 1 else requests
        requests.append(conversation.pending)


#: what a model's generation_config keeps under the transformers backend: its token ids and cache
#: settings, which change no answer; every other field (repetition_penalty, top_k, no_repeat_ngram_size,
#: its own temperature...) would add a step to the decoding that run.json does not record and vLLM's
#: engine does not apply (it decodes with the SamplingParams given)
GENERATION_KEPT = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "use_cache",
    "cache_implementation",
)
#: fields of a generation_config that say nothing about decoding
_GENERATION_BOOKKEEPING = frozenset(
    {
        "transformers_version",
        "_from_model_config",
        "output_attentions",
        "output_hidden_states",
        "return_dict_in_generate",
        "output_scores",
    }
)


def decoding_config_only(config: Any) -> tuple[Any, dict[str, Any]]:
    """(a GenerationConfig with only ``config``'s token ids and cache settings, the fields of
    ``config`` it leaves out): the model then decodes with exactly the run's recorded settings
    (``Sampling``), as vLLM does, and run.json names what the model's own file asked for
    (``generation_config_ignored``). A Qwen2.5-VL's ``repetition_penalty: 1.05`` and Gemma 3's
    ``top_k: 64`` were applied before, under a run recorded as plain greedy or top_p sampling."""
    from transformers import GenerationConfig

    kept = {k: getattr(config, k, None) for k in GENERATION_KEPT}
    clean = GenerationConfig(**{k: v for k, v in kept.items() if v is not None})
    ignored = {
        k: v
        for k, v in sorted(config.to_diff_dict().items())
        if k not in GENERATION_KEPT and k not in _GENERATION_BOOKKEEPING
    }
    return clean, ignored


@dataclass(frozen=True)
class TransformersOptions(BackendOptions):
    """The transformers backend's options (``chexpercept run --help``, group "transformers backend")."""

    dtype: str | None = option(choices=DTYPES, help="default auto")
    device: str = option(
        default="auto", answers=False, help="cpu, cuda, cuda:1 ... (default: this process's GPU or cpu)"
    )
    device_map: str | None = option(answers=False, help="e.g. auto, to spread one model over several GPUs")
    attn_implementation: str | None = option(help="e.g. sdpa, flash_attention_2")
    trust_remote_code: bool = option(
        switch=True, help="allow the model's own code (its modeling files; a custom_generate/ is not used)"
    )
    max_batch_tokens: int = option(
        default=DEFAULT_MAX_BATCH_TOKENS,
        type=COUNT,
        answers=False,
        help="padded prompt tokens per generate call; a step is split by length within it; lower it "
        f"if a batch runs out of memory (default {DEFAULT_MAX_BATCH_TOKENS})",
    )
    no_turn_cache: bool = option(
        switch=True,
        answers=False,
        help="compute every turn's whole conversation again instead of keeping each live "
        "conversation's keys and values for its next turn (saves their memory)",
    )
    turn_cache_gib: float | None = option(
        type=GIB,
        answers=False,
        help="memory the turn cache may hold; a turn that does not fit is computed from scratch next "
        "time (default: half the GPU memory free after loading the model, a quarter of RAM on CPU)",
    )


class TransformersBackend(BatchBackend):
    name = "transformers"
    default_batch_size = 64
    Options = TransformersOptions
    engine_packages = ("transformers", "tokenizers", "torch", "torchvision", "pillow", "accelerate")

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        options: TransformersOptions | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        on_error: str = "stop",
        fast_inputs: bool = True,
        image_workers: int | None = None,
        **fields: Any,
    ):
        """``options`` (or its ``fields`` as keywords). fast_inputs, image_workers: for tests and
        bench/ (the checked shortcuts in preparing inputs; the threads that decode images)."""
        options = options or TransformersOptions(**fields)
        self.options = options
        dtype, device, device_map = options.dtype, options.device, options.device_map
        attn_implementation = options.attn_implementation
        trust_remote_code = True if options.trust_remote_code else None
        max_batch_tokens, turn_cache, turn_cache_gib = (
            options.max_batch_tokens,
            not options.no_turn_cache,
            options.turn_cache_gib,
        )
        targs = spec.transformers_args
        self.spec = spec
        self._sampling = sampling
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.dtype = dtype or targs.get("dtype", "auto")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        self.device = device
        self.device_map = device_map or targs.get("device_map")
        self.attn_implementation = attn_implementation or targs.get("attn_implementation")
        self.model_class = targs.get("model_class", "AutoModelForImageTextToText")
        self.trust_remote_code = spec.trust_remote_code if trust_remote_code is None else trust_remote_code
        self.max_batch_tokens = max_batch_tokens
        #: the checked shortcuts in preparing model inputs (see _plan_inputs); False: the plain path
        self.fast_inputs = fast_inputs
        #: what the processor is asked to return ("np" where checked to give the same inputs)
        self.tensors = "pt"
        self.resize: FixedResize | None = None
        self.pixel_cache: PixelCache | None = None
        #: reuse each conversation's keys and values on its next turn (see _plan_turn_cache)
        self.use_turn_cache = turn_cache
        #: memory the turn cache may hold (None: chosen at setup, see turn_cache_budget)
        self.turn_cache_gib = turn_cache_gib
        self.turn_cache: TurnCache | None = None
        #: the turn cache's prefill runs with masks built by prefill_masks.py (checked at setup)
        self.own_masks = False
        self.notes: dict[str, str] = {}
        #: whether the turn cache is on, or why not (describe()'s "turn_cache")
        self.turn_cache_note = ""
        self.root = ""
        self._images: dict[str, Image.Image] = {}
        #: threads that decode a step's new images (default: the CPU count, at most 8)
        self.image_workers = image_workers if image_workers is not None else min(8, os.cpu_count() or 1)
        if self.image_workers < 1:
            raise ValueError(f"image_workers must be at least 1, got {image_workers}")
        self._pool: ThreadPoolExecutor | None = None
        self.model: Any = None
        self.processor: Any = None
        self.markers: MarkerDecoder | None = None
        #: the name under which the model takes a key-value cache (see ``cache_keyword``)
        self.cache_keyword = "cache"

    def identity(self, context: RunContext) -> dict[str, Any]:
        """dtype and attention as the model is loaded with them (the option, else the registry's),
        and the model class; ``trust_remote_code`` where --trust-remote-code turns on the model's own
        code (its modeling files then compute the answers), so a resume that turns it on is refused."""
        own_code = self.trust_remote_code and not self.spec.trust_remote_code
        return {
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "model_class": self.model_class,
            **({"trust_remote_code": True} if own_code else {}),
        }

    def model_dir(self) -> str | None:
        return self.spec.model_id

    def context_limits(self, context: RunContext) -> ContextLimits:
        """The model's context length from its config.json (for the preflight check)."""
        found = model_context_length(self.spec.model_id)
        return ContextLimits(*found) if found else ContextLimits(None)

    def setup(self, context: RunContext) -> None:
        try:
            import torch
            import transformers
        except ImportError as e:
            raise BackendError(
                f"the transformers backend needs torch and transformers: pip install -e '.[hf]' ({e})"
            ) from e
        self.root = str(context.root)
        self._torch = torch
        torch.manual_seed(context.local_seed)
        if context.process_index != 0:  # one progress display per run: the main process's
            transformers.utils.logging.disable_progress_bar()
        self.resolved_device = pick_device(self.device, context.local_index)
        self.processor = transformers.AutoProcessor.from_pretrained(
            self.spec.model_id, trust_remote_code=self.trust_remote_code
        )
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is None:
            raise BackendError(f"{self.spec.model_id}: its processor has no tokenizer")
        tokenizer.padding_side = "left"
        self.markers = MarkerDecoder(tokenizer)
        model_cls = getattr(transformers, self.model_class)
        kwargs: dict[str, Any] = {
            "dtype": "auto" if self.dtype == "auto" else getattr(torch, self.dtype),
            "trust_remote_code": self.trust_remote_code,
        }
        if self.attn_implementation:
            kwargs["attn_implementation"] = self.attn_implementation
        if self.device_map:
            kwargs["device_map"] = self.device_map
        self.model = model_cls.from_pretrained(self.spec.model_id, **kwargs).eval()
        self.cache_keyword = cache_keyword(self.model.forward)
        if not self.device_map:
            self.model.to(self.resolved_device)
        gen = self.model.generation_config
        self.model.generation_config, self.generation_config_ignored = decoding_config_only(gen)
        # a model folder's custom_generate/generate.py (loaded under trust_remote_code) replaces the
        # model's generate: another decoding than the recorded one, so transformers' own is kept
        self.custom_generate_ignored = "generate" in vars(self.model)
        if self.custom_generate_ignored:
            del self.model.generate
        pad = gen.pad_token_id if gen.pad_token_id is not None else tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
        self.context_length = loaded_context_length(self.model.config)
        self._plan_inputs(context)
        self._plan_turn_cache(context)

    def _plan_inputs(self, context: RunContext) -> None:
        """Turn on each shortcut in preparing model inputs only where it changes none of them.

        Checked on a real two-row batch of the run (the first and the last turn of the case with the
        most images, so padding and several images are covered), against the processor asked for
        torch tensors with the images as decoded: numpy outputs (converted once), images resized
        once, pixel values once per image. Any difference in any input (token ids, masks, pixel
        values) or any error keeps the plain path for that shortcut, and describe() says why.
        """
        self.notes = {
            key: "off (fast_inputs=False)" for key in ("processor_outputs", "images", "pixel_values")
        }
        if not self.fast_inputs:
            return
        requests = _check_requests(context)
        if not requests:
            self.notes = {key: "plain: no image in the run to check on" for key in self.notes}
            return
        paths = sorted({p for r in requests for p in r.images})
        originals = {p: self._decode(p) for p in paths}
        where = f"(checked on {paths[0]}{' and others' if len(paths) > 1 else ''})"

        def encode(images: dict[str, Image.Image], tensors: str) -> dict[str, Any] | str:
            try:
                batch = [self._messages(r, images.__getitem__) for r in requests]
                return {k: v for k, v in self._encode(batch, tensors).items() if hasattr(v, "shape")}
            except Exception as e:  # a processor that cannot take a shortcut keeps the plain path
                return f"failed: {type(e).__name__}: {e}"

        reference = encode(originals, "pt")
        if isinstance(reference, str):
            raise BackendError(f"{self.spec.model_id}: the processor {reference} {where}")

        def differs(candidate: dict[str, Any] | str) -> str:
            if isinstance(candidate, str):
                return candidate
            torch = self._torch
            same = candidate.keys() == reference.keys() and all(
                torch.equal(reference[k], candidate[k]) for k in reference
            )
            return "" if same else "changed the model inputs"

        problem = differs(encode(originals, "np"))
        if problem:
            self.notes["processor_outputs"] = f"torch tensors: numpy outputs {problem} {where}"
        else:
            self.tensors = "np"
            self.notes["processor_outputs"] = "numpy arrays, converted to torch once per batch"
        plan, why_not = fixed_resize_of(self.processor)
        if plan is None:
            self.notes["images"] = f"kept at their own size: {why_not}"
            self.notes["pixel_values"] = "computed per turn (the processor is not fixed-size)"
            return
        resized = {p: plan.apply(im) for p, im in originals.items()}
        problem = differs(encode(resized, self.tensors))
        if problem:
            self.notes["images"] = (
                f"kept at their own size: resizing to {plan.describe()} first {problem} {where}"
            )
            self.notes["pixel_values"] = "computed per turn (images not resized once)"
            return
        self.resize = plan
        self.notes["images"] = f"resized once to {plan.describe()} (the processor's size and filter)"
        cache = PixelCache(self.processor.image_processor)
        self.processor.image_processor = cache
        problem = differs(encode(resized, self.tensors)) or differs(encode(resized, self.tensors))
        cache.keep_only(())
        if problem:
            self.processor.image_processor = cache.wrapped
            self.notes["pixel_values"] = f"computed per turn: computing them once per image {problem} {where}"
        else:
            self.pixel_cache = cache
            self.notes["pixel_values"] = "computed once per image while its conversation is live"

    def _plan_turn_cache(self, context: RunContext) -> None:
        """Keep each conversation's keys and values for its next turn, where a check shows it safe.

        Checked on two real cases of the run: the second turn of one (reusing its first turn) in
        a batch with the first turn of another (reusing the shared start of the conversation), with
        up to 16 new tokens, against the same batch computed from scratch. Different answers, an
        error, or nothing reused (a model whose inputs do not map one image per token run) keep
        the plain path, and describe() says why. Where the model marks its image tokens for
        attention in both directions, the masks of the reused turns' prefill are built here
        (prefill_masks.py) when they equal the model's own on the check batch.
        """
        if not self.use_turn_cache:
            self.turn_cache_note = "off (--no-turn-cache)"
            return
        stop = self.model.generation_config.eos_token_id
        stop_ids = [stop] if isinstance(stop, int) else list(stop or [])
        if self.turn_cache_gib is None:
            self.turn_cache_gib = round(turn_cache_budget(self.model.device) / 2**30, 2)
        text = self.model.config.get_text_config()
        window = getattr(text, "sliding_window", None)
        self.turn_cache = TurnCache(
            getattr(self.model.config, "image_token_id", None),
            stop_ids,
            max_bytes=int(self.turn_cache_gib * 2**30),
            windows=[
                window if kind == SLIDING else None for kind in getattr(text, "layer_types", None) or []
            ],
        )
        cases = [c for c in _most_images_first(context.cases) if len(c.turns) > 1][:2]
        if not cases:
            self.turn_cache = None
            self.turn_cache_note = "off: no case of the run has two turns to check on"
            return
        sampling, budget = self._sampling, self.turn_cache.max_bytes
        self._sampling = Sampling(0.0, 1.0, min(16, sampling.max_tokens), True)
        self.turn_cache.max_bytes = None  # the check keeps its turns whatever the budget
        try:
            problem = self._check_turn_cache(cases)
        except Exception as e:  # a model or transformers version that cannot continue from a cache
            problem = f"the check failed: {type(e).__name__}: {e}"
        finally:
            self._sampling = sampling
            if self.turn_cache is not None:
                self.turn_cache.max_bytes = budget
        if problem:
            self.turn_cache = None
            self.own_masks = False
            self.turn_cache_note = f"off: {problem} (checked on {cases[0].key_id})"
            return
        self.turn_cache.clear()
        self.turn_cache.stats = TurnCacheStats()
        how = "prefill masks built by broadcasting" if self.own_masks else "the model's own prefill masks"
        self.turn_cache_note = (
            f"on: each conversation's keys and values reused on its next turn ({how}; "
            f"checked on {cases[0].key_id})"
        )

    def _check_turn_cache(self, cases: Sequence[Any]) -> str:
        first = Conversation(cases[0], oracle="none")
        requests = [first.pending]
        (response,) = self._generate(requests)
        first.answer(response)
        requests = [first.pending] + [Conversation(c, oracle="none").pending for c in cases[1:]]
        self.load_images(p for r in requests for p in r.images)
        inputs = self._encode([self.build_conversation(r) for r in requests])
        self.own_masks = "token_type_ids" in inputs and self.attn_implementation in (None, "sdpa")
        if self.own_masks:
            width = inputs["input_ids"].shape[1]
            for start in sorted({1, width // 2, width - 2}):
                if same_as_model(
                    self.model, inputs["attention_mask"], inputs["token_type_ids"], start, width - 1
                ):
                    self.own_masks = False
                    break
        assert self.turn_cache is not None
        before = self.turn_cache.stats.reused_tokens
        reused = [r.text for r in self._generate(requests)]
        if self.turn_cache.stats.reused_tokens == before:
            return "nothing was reused on the check turns"
        fresh = [r.text for r in self._generate(requests, reuse=False)]
        if reused != fresh:
            return "reusing the cache changed the answers"
        return ""

    # ------------------------------------------------------------------ requests
    def _decode(self, relative: str) -> Image.Image:
        path = os.path.join(self.root, relative)
        try:  # inside the bundle and a PNG or JPEG (chexpercept.containment), then decoded
            with open_image(self.root, relative) as f:
                return f.convert("RGB")
        except (OSError, ContainmentError) as e:  # missing, truncated, refused: name the file (and case)
            if isinstance(e, OSError) and e.errno is not None:  # the system's, not the image's bytes
                raise BackendError(f"cannot read image {path}: {explain_os_error(e).what}") from e
            raise BackendError(
                f"cannot decode image {path}: {e} (validate the bundle with --check-images full)"
            ) from e

    def _prepare(self, relative: str) -> Image.Image:
        im = self._decode(relative)
        return self.resize.apply(im) if self.resize is not None else im

    def image(self, relative: str) -> Image.Image:
        """The image as the processor gets it: decoded once per live conversation, pre-resized if planned."""
        im = self._images.get(relative)
        if im is None:
            im = self._images[relative] = self._prepare(relative)
        return im

    def load_images(self, paths: Iterable[str]) -> None:
        """Decode (and resize) the images not held yet on ``image_workers`` threads.

        Pillow releases the GIL while it decodes and resizes, so a step's new images (64 X-rays
        when 64 conversations start) are prepared on all cores instead of one after the other.
        """
        new = [p for p in dict.fromkeys(paths) if p not in self._images]
        if len(new) > 1 and self.image_workers > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.image_workers, thread_name_prefix="chexpercept-images")
            self._images.update(zip(new, self._pool.map(self._prepare, new)))
        else:
            for p in new:
                self.image(p)

    def build_conversation(self, request: Request) -> list[dict[str, Any]]:
        """Chat-template messages: user text first, then that turn's images (as the reference)."""
        return self._messages(request, self.image)

    @staticmethod
    def _messages(request: Request, image: Callable[[str], Image.Image]) -> list[dict[str, Any]]:
        conversation: list[dict[str, Any]] = []
        for m in request.messages:
            content: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
            content += [{"type": "image", "image": image(p)} for p in m.images]
            conversation.append({"role": m.role, "content": content})
        return conversation

    def estimated_tokens(self, request: Request) -> int:
        """A cheap prompt-length estimate (about 4 characters a token, plus each image's tokens)."""
        per_image = getattr(self.processor, "image_seq_length", None) or 256
        return sum(len(m.text) for m in request.messages) // 4 + per_image * len(request.images)

    def micro_batches(self, requests: Sequence[Request]) -> list[list[int]]:
        """Request indices grouped by similar length, each group within the padded-token budget.

        One padded batch costs (rows x longest row); mixing a first turn with a ninth wastes most of
        it, so a step's requests are sorted by length and cut where the budget would be exceeded.
        """
        sizes = [self.estimated_tokens(r) for r in requests]
        groups: list[list[int]] = []
        for i in sorted(range(len(requests)), key=sizes.__getitem__):
            longest = sizes[i]  # sorted: the newest row is the longest
            if groups and (len(groups[-1]) + 1) * longest <= self.max_batch_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        used = dict.fromkeys(p for r in requests for p in r.images)  # in order, without repeats
        self.load_images(used)
        if self.turn_cache is not None:  # conversations not asked again have finished
            self.turn_cache.keep_only([r.key_id for r in requests])
        responses: list[Response | None] = [None] * len(requests)
        for group in self.micro_batches(requests):
            for i, response in zip(group, self._generate([requests[i] for i in group])):
                responses[i] = response
        # keep decoded images only for conversations still running (they re-send them next turn)
        self._images = {p: im for p, im in self._images.items() if p in used}
        if self.pixel_cache is not None:
            self.pixel_cache.keep_only(self._images.values())
        return [r for r in responses if r is not None]

    def _encode(
        self, conversations: list[list[dict[str, Any]]], tensors: str | None = None
    ) -> dict[str, Any]:
        """Chat template, tokenizer and image processor: the model inputs of a left-padded batch.

        With numpy outputs (the default where checked) the processor's per-row token checks run on
        numpy rows instead of torch scalars, several times faster; the arrays become tensors here.
        """
        inputs = self.processor.apply_chat_template(
            conversations,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors=tensors or self.tensors,
            processor_kwargs={"padding": True},
            **self.chat_template_kwargs,
        )
        torch = self._torch
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}

    def _generate(self, requests: Sequence[Request], *, reuse: bool = True) -> list[Response]:
        torch = self._torch
        inputs = self._encode([self.build_conversation(r) for r in requests])
        rows = inputs["attention_mask"].sum(dim=1).tolist()
        caps = answer_caps(rows, self._sampling.max_tokens, getattr(self, "context_length", None))
        if len(requests) > 1 and len(set(caps)) > 1:  # each row to its own length: one at a time
            return [self._generate([r], reuse=reuse)[0] for r in requests]
        if caps[0] <= 0:  # rows of one length here
            full = f"fills the model's context of {self.context_length:,} tokens: no answer fits"
            return [Response("", {}, error=f"the prompt ({n:,} tokens) {full}") for n in rows]
        cache = plan = None
        if reuse and self.turn_cache is not None:
            plan = self.turn_cache.plan(
                [r.key_id for r in requests],
                inputs["input_ids"].numpy(),
                inputs["attention_mask"].numpy(),
                [r.images for r in requests],
            )
            pixels = inputs.get("pixel_values")
            if plan is not None and pixels is not None and len(pixels) != len(plan.new_images):
                plan = None  # not one row of pixel values per image: compute the batch from scratch
            if plan is not None:
                if pixels is not None:  # only the images whose tokens are computed in this call
                    keep = torch.tensor(plan.new_images, dtype=torch.bool)
                    if keep.any():
                        inputs["pixel_values"] = pixels[keep]
                    else:
                        del inputs["pixel_values"]
                cache = self.turn_cache.cache_for(plan)
        device = self.model.device
        dtype = self.model.dtype
        batch = {
            k: (v.to(device, dtype=dtype) if v.is_floating_point() else v.to(device))
            for k, v in inputs.items()
            if hasattr(v, "to")
        }
        s = self._sampling
        options: dict[str, Any] = {"max_new_tokens": caps[0], "pad_token_id": self.pad_token_id}
        if s.temperature > 0:  # top_k 0: none, as vLLM's default (transformers' own default is 50)
            options.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
        else:
            options["do_sample"] = False
        if plan is not None:
            options[self.cache_keyword] = cache
        with torch.inference_mode():
            if plan is not None and self.own_masks:
                batch = self._prefill(batch, cache, plan.past)
            out = self.model.generate(**batch, **options)
        if plan is not None and self.turn_cache is not None:
            self.turn_cache.store(plan, out, cache)
        prompt_len = batch["input_ids"].shape[1]
        new = out[:, prompt_len:]
        texts = self.processor.batch_decode(new, skip_special_tokens=True)
        prompt_tokens = batch["attention_mask"].sum(dim=1).tolist()
        output_tokens = (new != self.pad_token_id).sum(dim=1).tolist()
        markers = self.markers
        rows = new.tolist() if markers is not None and markers.active else [()] * len(texts)
        return [
            Response(
                text,
                {"input_tokens": int(i), "output_tokens": int(o)},
                full_text=markers.full_text(r, text) if markers else None,
            )
            for text, i, o, r in zip(texts, prompt_tokens, output_tokens, rows)
        ]

    def _prefill(self, batch: dict[str, Any], cache: Any, start: int) -> dict[str, Any]:
        """Run slots ``start`` to the last but one through the model with our own masks, filling
        ``cache``; returns what generate still needs (it computes the last token and decodes).

        The cache's sliding-window layers show attention only the keys inside some query's
        window (see TurnCache.cache_for), so their masks start there too.
        """
        ids, mask = batch["input_ids"], batch["attention_mask"]
        end = ids.shape[1] - 1
        if end <= start or "token_type_ids" not in batch:
            return batch
        text = self.model.config.get_text_config()
        window = getattr(text, "sliding_window", None)
        self.model(
            input_ids=ids[:, start:end],
            pixel_values=batch.get("pixel_values"),
            attention_mask=prefill_masks(
                mask,
                batch["token_type_ids"],
                start,
                end,
                window,
                # the cache's sliding-window layers show only the window (TurnCache.cache_for)
                sliding_from=window_start(start, window)
                if self.turn_cache and any(self.turn_cache.windows)
                else 0,
                kinds=set(getattr(text, "layer_types", None) or (FULL, SLIDING)),
            ),
            position_ids=positions(mask, start, end),
            **{self.cache_keyword: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return {"input_ids": ids, "attention_mask": mask}

    def sampling(self) -> Sampling:
        return self._sampling

    def describe(self) -> dict[str, Any]:
        return {
            "model_class": self.model_class,
            "dtype": self.dtype,
            "device": getattr(self, "resolved_device", self.device),
            "device_map": self.device_map,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
            "max_batch_tokens": self.max_batch_tokens,
            "image_workers": self.image_workers,
            **{f"inputs_{k}": v for k, v in self.notes.items()},
            "turn_cache": self.turn_cache_note,
            **self._turn_cache_counts(),
            "chat_template_kwargs": self.chat_template_kwargs,
            # what the model's generation_config.json asked for and this run did not apply
            "generation_config_ignored": getattr(self, "generation_config_ignored", {}),
            "custom_generate_ignored": getattr(self, "custom_generate_ignored", False),
        }

    def _turn_cache_counts(self) -> dict[str, int]:
        """Prompt tokens sent so far, and how many of them came from the turn cache."""
        if self.turn_cache is None:
            return {}
        stats = self.turn_cache.stats
        return {
            "turn_cache_gib": self.turn_cache_gib,
            "turn_cache_prompt_tokens": stats.prompt_tokens,
            "turn_cache_reused_tokens": stats.reused_tokens,
            "turn_cache_turns_not_kept": stats.not_kept,
        }

    def close(self) -> None:
        self.model = None
        if self.turn_cache is not None:
            self.turn_cache.clear()
        self._images.clear()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def loaded_context_length(config: Any) -> int | None:
    """The loaded model's context length in tokens (its text config's ``max_position_embeddings``
    or the like, ``eval/runner/preflight.py: CONTEXT_KEYS``), or None when its config names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for section in (text, config):
        for key in CONTEXT_KEYS:
            value = getattr(section, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def answer_caps(prompt_tokens: Sequence[int], max_tokens: int, context: int | None) -> list[int]:
    """Each row's answer length: ``max_tokens``, cut where the prompt and the answer fill the model's
    ``context`` (tokens), as vLLM's engine ends a request at its ``max_model_len`` (finish reason
    "length"); 0 or less: the prompt alone fills it, no answer fits (vLLM refuses that prompt). A
    model generating past its context length computes positions it was never trained on."""
    if context is None:
        return [max_tokens] * len(prompt_tokens)
    return [min(max_tokens, context - n) for n in prompt_tokens]
