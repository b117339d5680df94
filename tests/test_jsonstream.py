"""Streaming the top-level object of chexpercept.json item by item, with byte spans."""

import io
import json

import pytest

from chexpercept.jsonstream import iter_object_items, read_span

DOC = {
    "effusion_s1_positive_0": {"q": "Is any finding…? ünïcödé ✓", "n": [1, 2.5, -3e2], "x": None, "t": True},
    "edema_s2_negative_1": {"nested": {"a": [{"b": '}{,:"quoted" \\ end'}]}, "n": 12345678901234567890},
    "opacity_s3": [],
    "k": 7,
}


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_items_and_spans(indent, chunk):
    raw = json.dumps(DOC, indent=indent, ensure_ascii=False).encode("utf-8")
    f = io.BytesIO(raw)
    items = list(iter_object_items(f, chunk=chunk))
    assert [(k, v) for k, v, _ in items] == list(DOC.items())
    for _key, value, span in items:
        assert read_span(io.BytesIO(raw), span) == value
        assert json.loads(raw[span.start : span.start + span.length]) == value


def test_empty_object():
    assert list(iter_object_items(io.BytesIO(b"  {  }  "))) == []


@pytest.mark.parametrize(
    "doc,exc",
    [
        (b"[1, 2]", TypeError),
        (b'"text"', TypeError),
        (b"{nope", json.JSONDecodeError),
        (b'{"a": {"b": 1}', json.JSONDecodeError),
        (b'{"a" 1}', json.JSONDecodeError),
        (b'{"a": 1 "b": 2}', json.JSONDecodeError),
        (b"", json.JSONDecodeError),
    ],
)
def test_malformed(doc, exc):
    with pytest.raises(exc):
        list(iter_object_items(io.BytesIO(doc), chunk=4))


def test_number_split_across_chunks():
    raw = b'{"a": 123456789, "b": 1}'
    assert [(k, v) for k, v, _ in iter_object_items(io.BytesIO(raw), chunk=9)] == [("a", 123456789), ("b", 1)]
