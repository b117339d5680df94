"""A local model's input tokens, as its own processor and chat template make them, for the estimator.

``ProcessorCounter.count(request, previous)`` gives the text and image tokens of one call and the
prefix a prefix cache reuses (the common token-id prefix with the case's previous call, in blocks of
16 tokens, vLLM's). The definition is the processor itself: ``processor.apply_chat_template`` on the
conversation with its real images (``exact_ids``). Doing that for every call decodes and processes
every image of the history again on every turn (an hour for the release), so by default the counter
takes the same ids apart:

- the chat template is rendered as text (images as the template's own placeholder);
- each placeholder becomes the processor's expansion of an image of that size, learned once per
  distinct image size (width, height: read from the file header, never decoded) from the processor
  on a blank image of that size;
- the text is tokenized piece by piece between the tokenizer's added tokens (which the tokenizer
  splits off first), each distinct piece once.

``check(calls)`` compares both ways on sample conversations of the run before anything is counted:
the pieces, else the whole expanded text tokenized at once, else every call through the processor
(the way that gives the processor's ids is used; ``name`` says which, and why).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.containment import image_file, open_image
from chexpercept.eval.estimate.count import CallTokens, image_size
from chexpercept.eval.protocol import Message, Request

#: ways of counting, fastest first; "processor" is the definition
STRATEGIES: tuple[str, ...] = ("pieces", "text", "processor")


class ProcessorCounter:
    """A local model's view (see the module docstring): exact token ids of every call."""

    exact = True

    def __init__(
        self,
        root: str | FsPath,
        model_dir: str,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        answer_tokens: int | None = None,
        strategy: str = "pieces",
    ):
        from transformers import AutoProcessor

        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        self.root = FsPath(root)
        #: when set, every earlier answer in the history counts as this many tokens (the scenarios'
        #: assumed answer length): the template is rendered with the stand-in's short answers, and
        #: each one's own tokens are replaced by this length
        self.answer_tokens = answer_tokens
        self._answer_lengths: dict[str, int] = {}
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.kwargs = dict(chat_template_kwargs or {})
        self.model_dir = model_dir
        self.block = 16
        self.strategy = strategy
        self.why = "not checked yet"
        #: the last call counted and its token ids (the next call of its case compares with them)
        self._last: tuple[Request, list[int]] | None = None
        self._sizes: dict[str, tuple[int, int]] = {}
        self._expansions: dict[tuple[int, int], str] = {}
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._placeholder: str | None = None
        self._add_special: bool = False
        added = sorted(
            (t.content for t in self.tokenizer.added_tokens_decoder.values()), key=len, reverse=True
        )
        self._added_ids = {c: self.tokenizer.convert_tokens_to_ids(c) for c in added}
        self._split = re.compile("(" + "|".join(map(re.escape, added)) + ")") if added else None
        self.image_token_id = self._image_token_id()

    @property
    def name(self) -> str:
        how = {
            "pieces": "template and image tokens once per shape, text once per piece",
            "text": "template and image tokens once per shape, each call's text tokenized",
            "processor": "every call through the processor",
        }[self.strategy]
        return f"{type(self.processor).__name__} of {self.model_dir} ({how}; {self.why})"

    # ---------------------------------------------------------------- the definition
    def _conversation(self, request: Request, image: Any) -> list[dict[str, Any]]:
        conversation = []
        for m in request.messages:
            content: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
            content += [image(p) for p in m.images]
            conversation.append({"role": m.role, "content": content})
        return conversation

    def exact_ids(self, request: Request) -> list[int]:
        """The processor's ids for the call, on the real images (every image decoded)."""

        def image(p: str) -> dict[str, Any]:
            with open_image(self.root, p) as im:  # inside the bundle, a PNG or JPEG
                return {"type": "image", "image": im.convert("RGB")}

        return self._processor_ids(self._conversation(request, image))

    def _processor_ids(self, conversation: list[dict[str, Any]]) -> list[int]:
        inputs = self.processor.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=True, return_dict=True, **self.kwargs
        )
        ids = inputs["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    def _image_token_id(self) -> int | None:
        """The token that stands for the image's features: the one an image adds most often to a
        conversation (a blank image's ids against the same text alone). Processors name different
        tokens ``image_token`` (Gemma 3's is the start-of-image marker, once per image), so the
        count decides; the processor's attribute is the fallback."""
        from collections import Counter

        from PIL import Image

        text = [{"type": "text", "text": "x"}]
        try:
            alone = Counter(self._processor_ids([{"role": "user", "content": text}]))
            image = [{"type": "image", "image": Image.new("RGB", (224, 224))}]
            added = Counter(self._processor_ids([{"role": "user", "content": text + image}])) - alone
        except Exception:
            added = Counter()
        if added:
            return added.most_common(1)[0][0]
        found = getattr(self.processor, "image_token_id", None)
        token = getattr(self.processor, "image_token", None)
        if found is None and token is not None:
            found = self.tokenizer.convert_tokens_to_ids(token)
        return found

    # ---------------------------------------------------------------- the fast way
    def _render(self, conversation: list[dict[str, Any]]) -> str:
        return self.processor.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, **self.kwargs
        )

    def _learn_placeholder(self) -> str:
        """The text the chat template writes for one image: what it renders between two texts
        around an image."""
        a, b = "qqqq", "zzzz"
        content = [{"type": "text", "text": a}, {"type": "image"}, {"type": "text", "text": b}]
        rendered = self._render([{"role": "user", "content": content}])
        start, end = rendered.find(a), rendered.rfind(b)
        if start < 0 or end < 0 or end <= start + len(a):
            raise ValueError("the chat template writes no text for an image between two texts")
        return rendered[start + len(a) : end]

    def _expansion(self, size: tuple[int, int]) -> str:
        """What the processor puts in place of the placeholder for an image of this size."""
        found = self._expansions.get(size)
        if found is not None:
            return found
        from PIL import Image

        blank = Image.new("RGB", size)
        conversation = [
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "image": blank}]}
        ]
        rendered = self._render(conversation)
        decoded = self.tokenizer.decode(
            self._processor_ids(conversation), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert self._placeholder is not None
        pre, _, post = rendered.partition(self._placeholder)
        # decoded = (a BOS the processor may add) + pre + the expansion + post
        at = decoded.find(pre)
        if at < 0 or not decoded.endswith(post) or at + len(pre) > len(decoded) - len(post):
            raise ValueError("the processor's text does not frame the image the way the template does")
        expansion = decoded[at + len(pre) : len(decoded) - len(post)]
        self._expansions[size] = expansion
        return expansion

    def _size(self, relative: str) -> tuple[int, int]:
        size = self._sizes.get(relative)
        if size is None:
            size = self._sizes[relative] = image_size(image_file(self.root, relative))
        return size

    def _expanded_text(self, request: Request) -> str:
        rendered = self._render(self._conversation(request, lambda _p: {"type": "image"}))
        assert self._placeholder is not None
        parts = rendered.split(self._placeholder)
        images = request.images
        if len(parts) != len(images) + 1:
            raise ValueError(
                f"the template wrote {len(parts) - 1} image placeholders for {len(images)} images"
            )
        out = [parts[0]]
        for p, rest in zip(images, parts[1:]):
            out.append(self._expansion(self._size(p)))
            out.append(rest)
        return "".join(out)

    def _text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=self._add_special)["input_ids"])

    def _piece_ids(self, text: str) -> list[int]:
        ids: list[int] = []
        if self._add_special:
            ids += self.tokenizer.build_inputs_with_special_tokens([])
        pieces = self._split.split(text) if self._split is not None else [text]
        for piece in pieces:
            if not piece:
                continue
            added = self._added_ids.get(piece)
            if added is not None:
                ids.append(added)
                continue
            known = self._pieces.get(piece)
            if known is None:
                known = self._pieces[piece] = tuple(
                    self.tokenizer(piece, add_special_tokens=False)["input_ids"]
                )
            ids.extend(known)
        return ids

    def ids(self, request: Request) -> list[int]:
        """The call's token ids, the way ``strategy`` computes them."""
        if self.strategy == "processor" or self._placeholder is None:  # not checked: the definition
            return self.exact_ids(request)
        text = self._expanded_text(request)
        return self._piece_ids(text) if self.strategy == "pieces" else self._text_ids(text)

    # ---------------------------------------------------------------- checking
    def check(self, calls: Iterable[Request], *, limit: int = 24) -> None:
        """Count up to ``limit`` sample calls both ways and keep the fastest way that gives the
        processor's own ids on every one of them (else every call goes through the processor)."""
        sample = list(calls)[:limit]
        if not sample:
            self.strategy, self.why = "processor", "no sample call to check the fast ways on"
            return
        try:
            self._placeholder = self._learn_placeholder()
        except Exception as e:  # any template: the processor stays the definition
            self.strategy, self.why = "processor", f"the template's image placeholder: {e}"
            return
        exact = [self.exact_ids(r) for r in sample]
        reasons = []
        for strategy in STRATEGIES[STRATEGIES.index(self.strategy) :]:
            if strategy == "processor":
                break
            for add_special in (False, True):
                self.strategy, self._add_special = strategy, add_special
                try:
                    bad = next((r for r, ids in zip(sample, exact) if self.ids(r) != ids), None)
                except Exception as e:
                    bad, err = sample[0], f"{type(e).__name__}: {e}"
                else:
                    err = "different ids"
                if bad is None:
                    self.why = f"same ids as the processor on {len(sample)} sample calls"
                    return
            reasons.append(f"{strategy}: {err} ({bad.key_id}, {bad.task})")
        self.strategy = "processor"
        self.why = "the fast ways differed from the processor: " + "; ".join(reasons)

    # ---------------------------------------------------------------- counting
    def _answer_extra(self, messages: Sequence[Message]) -> int:
        """Tokens to add so that each assistant message counts as ``answer_tokens`` (0 when unset)."""
        if self.answer_tokens is None:
            return 0
        extra = 0
        for m in messages:
            if m.role != "assistant":
                continue
            n = self._answer_lengths.get(m.text)
            if n is None:
                n = self._answer_lengths[m.text] = len(
                    self.tokenizer(m.text, add_special_tokens=False)["input_ids"]
                )
            extra += self.answer_tokens - n
        return extra

    def count(self, request: Request, previous: Request | None) -> CallTokens:
        ids = self.ids(request)
        image = ids.count(self.image_token_id) if self.image_token_id is not None else 0
        shared = 0
        if previous is not None and self._last is not None and self._last[0] is previous:
            for a, b in zip(ids, self._last[1]):
                if a != b:
                    break
                shared += 1
        self._last = (request, ids)
        if shared and previous is not None:  # the earlier answers the reused prefix holds
            common = []
            for mine, theirs in zip(request.messages, previous.messages):
                if mine != theirs:
                    break
                common.append(mine)
            shared += self._answer_extra(common)
        text = len(ids) - image + self._answer_extra(request.messages)
        return CallTokens(text, image, max(0, shared - shared % self.block))
