"""What a backend hands back besides the reply as the reference records it: the whole reply as the
parser must read it.

The reference records a reply as its engine decodes it (``skip_special_tokens=True``) and re-sends
that text in the history; the runner does the same. Two things that text can lose, which the parser
needs (``chexpercept.reasoning``):

* reasoning markers that are special tokens (Gemma 4's ``<|channel>`` ... ``<channel|>``): the
  decoders drop them, and a reply then reads as if its reasoning were the answer. ``MarkerDecoder``
  decodes the generated ids a second time, keeping those markers and dropping every other special
  token;
* an API's separate reasoning field (vLLM serve with a reasoning parser: ``reasoning`` or, before
  vLLM 0.16, ``reasoning_content``): ``join_reasoning`` puts it back in front of the content between
  the family's markers, unclosed when the model never finished it (``content: null``).

The result goes to ``TurnResult.full_response`` (None when it equals the reply).

And the shape of an API's chat completion (``read_chat_reply``; a streamed one put together by
``merge_stream``): ``choices`` a non-empty list of objects, ``message`` (or a chunk's ``delta``) an
object, ``content`` text, null or a list of text parts, ``reasoning``/``refusal``/``finish_reason``
text or null. A reply of another shape (a message that is a string, a chunk that is a list, choices
missing) raises ``ReplyShapeError`` naming the field: the backend records it as that case's error,
like any other server error, instead of ending the run with a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chexpercept.reasoning import ALL_BLOCKS, DEFAULT_BLOCK, family_of


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    return ids


class MarkerDecoder:
    """Decodes generated token ids keeping the reasoning markers that are special tokens of this
    tokenizer (any family's, so that fine-tunes under other names are covered too)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        special = _special_ids(tokenizer)
        vocab = tokenizer.get_vocab()
        markers = {m for block in ALL_BLOCKS for m in block}
        #: id -> marker, for the markers this tokenizer holds as special tokens
        self.markers: dict[int, str] = {vocab[m]: m for m in markers if m in vocab and vocab[m] in special}
        self._special = special - set(self.markers)

    @property
    def active(self) -> bool:
        return bool(self.markers)

    def full_text(self, token_ids: Sequence[int], text: str) -> str | None:
        """The reply with its special reasoning markers, or None when it has none (then ``text``
        is the whole reply)."""
        ids = [int(i) for i in token_ids]
        if not self.markers or not any(i in self.markers for i in ids):
            return None
        kept = [i for i in ids if i not in self._special]
        full = self.tokenizer.decode(kept, skip_special_tokens=False)
        return None if full == text else full


def join_reasoning(reasoning: str | None, content: str | None, model: str) -> str | None:
    """The whole reply from an API's separate reasoning and content fields, reasoning between the
    model family's markers (``<think>`` ... ``</think>`` when the family has none); the block stays
    open when ``content`` is None (the reasoning never finished). None without reasoning."""
    if not reasoning:
        return None
    family = family_of(model)
    open_marker, close_marker = family.reasoning[0] if family and family.reasoning else DEFAULT_BLOCK
    if content is None:
        return open_marker + reasoning
    return open_marker + reasoning + close_marker + content


# ------------------------------------------------------------------------------------ API replies
class ReplyShapeError(ValueError):
    """A chat completion that does not have the expected shape; ``field`` names where (``choices[0].
    message``)."""

    def __init__(self, field: str, expected: str, got: Any) -> None:
        self.field = field
        super().__init__(f"the reply's {field} is not {expected} (it is {_kind(got)})")


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


@dataclass(frozen=True)
class ChatReply:
    """What a chat completion's first choice says: the answer's text (None: no content), the model's
    reasoning where the server returns it apart, a refusal, and why it stopped."""

    content: str | None
    reasoning: str | None
    refusal: str | None
    finish_reason: str | None


def _text(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ReplyShapeError(field, "text or null", value)


def _content(value: Any, field: str) -> str | None:
    """``content``: text, null, or a list of parts (strings, or objects whose ``text`` is text; other
    parts, such as an image a server echoes, carry no text)."""
    if not isinstance(value, list):
        return _text(value, field)
    out = []
    for i, part in enumerate(value):
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict):
            out.append(_text(part.get("text"), f"{field}[{i}].text") or "")
        else:
            raise ReplyShapeError(f"{field}[{i}]", "a text part (a string or an object)", part)
    return "".join(out)


def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReplyShapeError(field, "an object", value)
    return value


def read_chat_reply(reply: Any) -> ChatReply:
    """The first choice of a chat completion (an OpenAI-compatible API's reply, as decoded JSON);
    ReplyShapeError naming the field when the reply does not have that shape."""
    reply = _object(reply, "top level")
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ReplyShapeError("choices", "a non-empty list", choices)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ReplyShapeError("choices[0]", "an object", choice)
    message = _object(choice.get("message"), "choices[0].message")
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    return ChatReply(
        content=_content(message.get("content"), "choices[0].message.content"),
        # vLLM serve with a reasoning parser: "reasoning" (vLLM >= 0.16), "reasoning_content" before
        reasoning=_text(reasoning, "choices[0].message.reasoning") or None,
        refusal=_text(message.get("refusal"), "choices[0].message.refusal") or None,
        finish_reason=_text(choice.get("finish_reason"), "choices[0].finish_reason"),
    )


STREAMED_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")

#: finish reasons of a generation that did not finish, in any case (vLLM's ``FinishReason``: the
#: request aborted, an error in the engine; a cancelled request): never an answer (red team, stop 48)
UNFINISHED = frozenset({"abort", "aborted", "error", "cancelled", "canceled"})


def unfinished(finish: Any) -> bool:
    """Whether a ``finish_reason`` says the generation did not finish (``UNFINISHED``)."""
    return isinstance(finish, str) and finish.strip().lower() in UNFINISHED


def merge_stream(chunks: Iterable[Any]) -> tuple[dict[str, Any], bool]:
    """A streamed chat completion's decoded chunks (``data: {...}``) as one reply object (its first
    choice, ``index`` 0, as a reply that is not streamed is read: choices of ``n`` > 1 were joined
    into one reply, red team stop 48), and whether that choice gave a ``finish_reason``;
    ReplyShapeError naming the chunk and field otherwise."""
    message: dict[str, str] = {}
    reply: dict[str, Any] = {}
    finish = None
    for n, chunk in enumerate(chunks):
        where = f"streamed chunk {n + 1}"
        chunk = _object(chunk, where)
        for key in ("model", "system_fingerprint", "usage"):
            if chunk.get(key):
                reply[key] = chunk[key]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ReplyShapeError(f"{where}: choices", "a list", choices)
        for i, choice in enumerate(choices):
            choice = _object(choice, f"{where}: choices[{i}]")
            if choice.get("index", 0) != 0:
                continue
            delta = _object(choice.get("delta"), f"{where}: choices[{i}].delta")
            for key in STREAMED_FIELDS:
                text = _content(delta.get(key), f"{where}: choices[{i}].delta.{key}")
                if text is not None:
                    message[key] = message.get(key, "") + text
            said = _text(choice.get("finish_reason"), f"{where}: choices[{i}].finish_reason")
            if said and not unfinished(finish):  # an unfinished generation stays so (abort, then stop)
                finish = said
    reply["choices"] = [{"message": message, "finish_reason": finish}]
    return reply, finish is not None
