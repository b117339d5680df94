"""Streaming the top-level object of chexpercept.json item by item, with byte spans."""

import io
import json

import pytest

from chexpercept.input_json import JsonInputError
from chexpercept.jsonstream import Span, iter_object_items, read_span

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


@pytest.mark.parametrize(
    "doc,said",
    [(b'{"a": 1}{"b": 2}', "more after the top-level object ends, from byte 8"),
     (b'{"a": 1}\n]', "more after the top-level object ends, from byte 9"),
     (b'{"a": 1} garbage', "more after the top-level object ends, from byte 9"),
     (b'{"a": 1,}', "a comma before the closing '}' at byte 8"),
     (b'{"a": 1, }\n', "a comma before the closing '}' at byte 9")],
)  # fmt: skip
def test_what_json_loads_refuses_around_the_items_is_refused(doc, said):
    """A second object appended to chexpercept.json (or a stray bracket after it) was dropped without a
    word: validate said OK and every reader ran the first object's cases (red team, stop 43).
    Whatever json.loads refuses ("Extra data", a trailing comma) is refused here too, naming the byte."""
    for chunk in (3, 1 << 20):
        with pytest.raises(JsonInputError, match=said):
            list(iter_object_items(io.BytesIO(doc), chunk=chunk))
        with pytest.raises(json.JSONDecodeError):
            json.loads(doc)
    assert list(iter_object_items(io.BytesIO(b'{"a": 1}\n \n'))) == [("a", 1, Span(6, 1))]


def test_number_split_across_chunks():
    raw = b'{"a": 123456789, "b": 1}'
    assert [(k, v) for k, v, _ in iter_object_items(io.BytesIO(raw), chunk=9)] == [("a", 123456789), ("b", 1)]


def test_a_long_entry_is_read_in_doubling_reads_not_once_per_chunk():
    """Red team #7: an entry much longer than a chunk (a one-line chexpercept.json of one huge entry)
    was re-decoded after every chunk, in time quadratic in its length; the reads now double, so the
    decoder is tried O(log n) times. Counted, not timed."""

    class Counting(io.BytesIO):
        reads = 0

        def read(self, size=-1):
            Counting.reads += 1
            return super().read(size)

    doc = json.dumps({"a": {"x": "y" * (4 << 20)}, "b": 1}).encode()
    items = list(iter_object_items(Counting(doc), chunk=1 << 12))
    assert [k for k, _, _ in items] == ["a", "b"] and len(items[0][1]["x"]) == 4 << 20
    assert Counting.reads < 20  # one read per 4 KiB chunk would be over 1,000


def test_half_a_character_is_read_as_invalid_utf8_is():
    """A lone surrogate escape in chexpercept.json (``"\\ud800"``: half of a UTF-16 pair) passed
    validate and then ended every run when the question was written (red team round 2, stop 43):
    the streaming reader reads it as ``loads`` does, U+FFFD, keys too; a pair stays one character."""
    doc = b'{"k\\udcff": {"q": "x\\ud800 \\ud83d\\ude00"}}'
    assert [(k, v) for k, v, _ in iter_object_items(io.BytesIO(doc), chunk=4)] == [
        ("k\ufffd", {"q": "x\ufffd \U0001f600"})
    ]


def _broken_files() -> list[tuple[str, str]]:
    """(text, the entry the mistake is in) of files broken as an edit by hand breaks them, far from
    the start, some with characters of several bytes before the mistake."""
    entries = {
        f"case_{i}": {"question": f"Is there ü {i}?\nOptions:\n(1) Yes", "answer": [1, 2]} for i in range(40)
    }
    text = json.dumps(entries, indent=2, ensure_ascii=False)
    at = text.index('"case_30"')
    doubled = text[:at] + text[at:].replace('"answer"', ',"answer"', 1)
    missing = text[:at] + text[at:].replace("[", "[,", 1)
    return [
        (doubled, "case_30"),
        (missing, "case_30"),
        (text[: text.index('"case_21"') + 40], "case_21"),  # cut off in an entry
        (text[:at] + text[at:].replace('"question":', '"question"', 1), "case_30"),
    ]


@pytest.mark.parametrize("chunk", [7, 1 << 20])
@pytest.mark.parametrize("case", range(4))
def test_a_json_mistake_is_placed_as_json_loads_places_it_and_its_entry_named(tmp_path, chunk, case):
    """chexpercept.json with a doubled comma on line 286 was reported at "line 6 column 15 (char
    217)": counted from the start of the entry being read, without naming it (new user, stop 45).
    The streaming reader gives the line, column and character json.loads gives for the whole file,
    whatever its chunk size, and names the entry."""
    text, entry = _broken_files()[case]
    path = tmp_path / "chexpercept.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with open(path, "rb") as f, pytest.raises(json.JSONDecodeError) as found:
        list(iter_object_items(f, chunk=chunk))
    e, want = found.value, expected.value
    assert (e.lineno, e.colno, e.pos) == (want.lineno, want.colno, want.pos), (str(e), str(want))
    assert f"(in the entry '{entry}')" in str(e) and f"line {want.lineno} column {want.colno}" in str(e)
