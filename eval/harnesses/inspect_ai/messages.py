"""Between our requests and Inspect's messages: what goes to the model, what comes back, and what
the log shows.

- ``chat_messages(request)``: the pending request of a ``Conversation`` as Inspect ``ChatMessage``s,
  built from ``Request.chat_messages(images="data_url")``, the very messages the openai backend
  sends (system message first, each user turn's text then its images, earlier replies as the
  history holds them), images read inside the release by ``chexpercept.containment``.
- ``response(output, model)``: Inspect's ``ModelOutput`` as our ``Response`` (the reply's text, the
  whole reply with the model's separate reasoning put back in front as the openai backend does, a
  refusal, the usage the provider reported).
- ``readable(history)``: the finished conversation for ``inspect view``: every message's text, each
  image named by its path in the release (no pixels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chexpercept.eval.backends.replies import join_reasoning
from chexpercept.eval.protocol import Message, Request, Response
from chexpercept.usage import call_usage, count


def chat_messages(request: Request) -> list[Any]:
    """The request as Inspect messages, text and images exactly as our runner sends them."""
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageUser,
        ContentImage,
        ContentText,
    )

    out: list[Any] = []
    for m in request.chat_messages(images="data_url"):
        content = m["content"]
        if m["role"] == "system":
            out.append(ChatMessageSystem(content=content))
            continue
        parts = [
            ContentText(text=p["text"]) if p["type"] == "text" else ContentImage(image=p["image_url"]["url"])
            for p in content
        ]
        if m["role"] == "user":
            out.append(ChatMessageUser(content=parts))
        else:  # our replies are text only
            out.append(ChatMessageAssistant(content="".join(p["text"] for p in content)))
    return out


def response(output: Any, model: str) -> Response:
    """Our ``Response`` for Inspect's ``ModelOutput``: ``text`` the reply (``output.completion``),
    ``full_text`` the reply with the reasoning the provider returned apart (``ContentReasoning``,
    unless redacted) in front of it between the model family's markers (eval/replies.py), a
    refusal for ``stop_reason == "content_filter"``, the usage the provider reported."""
    from inspect_ai.model import ContentReasoning

    text = output.completion or ""
    message = output.message if output.choices else None
    reasoning = ""
    if message is not None and not isinstance(message.content, str):
        reasoning = "".join(
            c.reasoning for c in message.content if isinstance(c, ContentReasoning) and not c.redacted
        )
    refusal = (
        "content filter (stop_reason content_filter)" if output.stop_reason == "content_filter" else None
    )
    return Response(
        text=text,
        usage=usage(output.usage),
        full_text=join_reasoning(reasoning or None, text, model),
        refusal=refusal,
    )


def usage(u: Any) -> dict[str, Any]:
    """Inspect's ``ModelUsage`` in our usage keys (chexpercept.usage); a figure the provider did not
    report is None, and no usage at all is an empty dict."""
    if u is None:
        return {}
    cached, written = u.input_tokens_cache_read, u.input_tokens_cache_write
    # Inspect counts cache reads and writes apart from input_tokens; ours is the whole prompt (unknown
    # when a part it gives is not a count)
    parts = [count(u.input_tokens), *(count(p) for p in (cached, written) if p is not None)]
    tokens = call_usage(
        {
            "input_tokens": None if None in parts else sum(parts),  # type: ignore[arg-type]
            "cached_input_tokens": cached,
            "output_tokens": u.output_tokens,
            "thinking_tokens": u.reasoning_tokens,
            "total_tokens": u.total_tokens,
        }
    )
    return {**tokens, "cost_usd": u.total_cost}


def readable(history: Sequence[Message]) -> list[Any]:
    """The conversation as the model last saw it, for the log: each image as a line naming its
    file in the release, never its pixels."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

    out: list[Any] = []
    for m in history:
        if m.role == "system":
            out.append(ChatMessageSystem(content=m.text))
        elif m.role == "assistant":
            out.append(ChatMessageAssistant(content=m.text))
        else:
            images = "".join(f"\n[image: {p}]" for p in m.images)
            out.append(ChatMessageUser(content=m.text + images))
    return out
