"""``chexpercept review`` without a browser: kappas against textbook values, the annotator split, the
append-only decision store (torn lines, concurrency), the server's loopback-only rule and its API,
candidates identical to generate's, export and ``generate --review`` on the exported sheets."""

from __future__ import annotations

import csv
import http.client
import json
import threading

import numpy as np
import pytest

from chexpercept.builder.config import parse_lesions
from chexpercept.builder.pipeline import plan_candidates
from chexpercept.builder.review import cmd_review
from chexpercept.builder.review.export import export, mapped_location, verdict
from chexpercept.builder.review.kappa import cohen_kappa, fleiss_kappa
from chexpercept.builder.review.prepare import ReviewSources, annotator_names, prepare, sentences, split
from chexpercept.builder.review.server import ReviewServerError, check_host, make_server, serve_in_thread
from chexpercept.builder.review.store import DecisionStore, StoreError, read_decisions
from chexpercept.builder.sources import SourceError, load_ils
from chexpercept.cli import main as cli

LESIONS2 = ["cardiomegaly", "edema"]


def generate_reviewed(sources, lesions, export_dir, bundle) -> int:
    """``chexpercept generate`` on the phantom sources, one case per cell, selected by the review
    sheets of ``export_dir``; its exit status."""
    return cli(
        [
            "generate",
            *("--mimic-cxr-jpg", str(sources / "mimic-cxr-jpg"), "--mimic-ils", str(sources / "mimic-ils")),
            *("--anatomy", str(sources / "anatomy"), "--lesions", *lesions, "--per-cell", "1"),
            *("--output-dir", str(bundle), "--no-progress"),
            "--review",
            str(export_dir / "positive_labeling_sheet.csv"),
            str(export_dir / "negative_labeling_sheet.csv"),
        ]
    )


# ------------------------------------------------------------------------------------------- kappas
def _pairs(yy: int, yn: int, ny: int, nn: int) -> tuple[list[str], list[str]]:
    a = ["y"] * (yy + yn) + ["n"] * (ny + nn)
    b = ["y"] * yy + ["n"] * yn + ["y"] * ny + ["n"] * nn
    return a, b


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # Wikipedia "Cohen's kappa", simple example: p_o = 0.7, p_e = 0.5 -> 0.4
        ((20, 5, 10, 15), 0.4),
        # same observed agreement (0.6), different marginals: p_e = 0.54 -> 0.06 / 0.46; p_e = 0.46 -> 0.14 / 0.54
        ((45, 15, 25, 15), 0.06 / 0.46),
        ((25, 35, 5, 35), 0.14 / 0.54),
        ((10, 0, 0, 10), 1.0),
        ((0, 10, 10, 0), -1.0),
    ],
)
def test_cohen_kappa_textbook_values(table, expected):
    a, b = _pairs(*table)
    assert cohen_kappa(a, b) == pytest.approx(expected)


def test_cohen_kappa_edge_cases():
    assert np.isnan(cohen_kappa([], []))
    assert np.isnan(cohen_kappa(["y", "y"], ["y", "y"]))  # one label only: chance agreement is 1
    with pytest.raises(ValueError):
        cohen_kappa(["y"], ["y", "n"])


def test_fleiss_kappa_textbook_value():
    # Fleiss (1971) as worked on Wikipedia: 10 items, 14 raters, 5 categories; P-bar = 0.378,
    # P-bar_e = 0.2128, kappa = 0.210
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=5e-5)


def test_fleiss_kappa_hand_computed_small():
    # 4 items, 3 raters, accept/reject: P_i = 1, 1/3, 1, 1/3 -> P-bar = 2/3; p = (7/12, 5/12)
    # P_e = 49/144 + 25/144 = 74/144; kappa = (2/3 - 74/144) / (1 - 74/144) = 22/70
    assert fleiss_kappa([[3, 0], [2, 1], [0, 3], [2, 1]]) == pytest.approx(22 / 70)
    assert fleiss_kappa([[3, 0], [0, 3]]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        fleiss_kappa([[2, 0], [2, 1]])


# -------------------------------------------------------------------------------------------- split
def test_split_is_deterministic_balanced_and_distinct():
    names = annotator_names(6)
    assert names == ["A", "B", "C", "D", "E", "F"]
    assert annotator_names(30)[:2] == ["R01", "R02"]
    for k in (1, 2, 3):
        assigned = split(100, names, k)
        assert assigned == split(100, names, k)
        assert all(len(set(a)) == k for a in assigned)
        load = [sum(n in a for a in assigned) for n in names]
        assert sum(load) == 100 * k and max(load) - min(load) <= 1
    with pytest.raises(SourceError, match="reviews-per-case"):
        split(3, names[:2], 3)


def test_sentences_and_mapped_location():
    assert sentences("1. Heart is enlarged. 2. No effusion.  3. Lines 1.5 cm.") == {
        "1": "Heart is enlarged.",
        "2": "No effusion.",
        "3": "Lines 1.5 cm.",
    }
    assert mapped_location("cardiomegaly", ["heart"]) == "heart"
    assert mapped_location("edema", []) == "right lung and left lung"
    assert mapped_location("edema", ["right lung", "right lung"]) == "right lung"
    assert mapped_location("edema", ["a", "b", "c"]) == "a, b and c"
    assert verdict(["accept", "accept"], "unanimous") and not verdict(["accept", "reject"], "unanimous")
    assert verdict(["accept", "accept", "reject"], "majority") and not verdict([], "majority")


# -------------------------------------------------------------------------------------------- store
def test_store_appends_and_last_decision_wins(tmp_path):
    store = DecisionStore(tmp_path, "A")
    store.append("k1", "accept")
    store.append("k2", "reject", note="mask too big")
    store.append("k1", "reject", note="changed my mind")
    assert [r["decision"] for r in store.records()] == ["accept", "reject", "reject"]
    assert store.latest()["k1"]["note"] == "changed my mind"
    with pytest.raises(StoreError):
        store.append("k3", "maybe")
    with pytest.raises(StoreError):
        DecisionStore(tmp_path, "../evil")


def test_store_repairs_a_torn_last_line(tmp_path):
    store = DecisionStore(tmp_path, "A")
    store.append("k1", "accept")
    store.append("k2", "reject")
    with open(store.path, "ab") as f:  # a crash in the middle of the third write
        f.write(b'{"annotator": "A", "decision": "acc')
    assert [r["key_id"] for r in read_decisions(store.path)] == ["k1", "k2"]  # readable meanwhile
    reopened = DecisionStore(tmp_path, "A")
    assert reopened.repaired == b'{"annotator": "A", "decision": "acc'
    assert store.path.read_bytes().endswith(b"\n")
    torn = store.path.with_name("A.jsonl.torn")
    assert torn.read_bytes() == b'{"annotator": "A", "decision": "acc\n'  # kept, not thrown away
    reopened.append("k3", "accept")
    assert [r["key_id"] for r in reopened.records()] == ["k1", "k2", "k3"]


def test_store_rejects_corruption_in_the_middle(tmp_path):
    store = DecisionStore(tmp_path, "A")
    store.append("k1", "accept")
    store.path.write_bytes(b"garbage\n" + store.path.read_bytes())
    with pytest.raises(StoreError, match=r"A\.jsonl, line 1"):
        store.records()


def test_store_concurrent_writers_never_interleave(tmp_path):
    stores = [DecisionStore(tmp_path, "A") for _ in range(4)] + [DecisionStore(tmp_path, "B")]

    def work(i):
        for j in range(50):
            stores[i].append(f"k{i}-{j}", "accept", note="x" * (j * 37))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = read_decisions(stores[0].path)
    b = read_decisions(stores[4].path)
    assert len(a) == 200 and len(b) == 50
    assert len({r["key_id"] for r in a}) == 200


# -------------------------------------------------------------------------------- phantom + prepare
@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from chexpercept.builder.synth_sources import synthesize_sources

    return synthesize_sources(
        tmp_path_factory.mktemp("review_src") / "src", per_cell=1, lesions=tuple(LESIONS2), progress=False
    )


def _src(sources, **kw):
    return ReviewSources(
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"),
        mimic_ils=str(sources / "mimic-ils"),
        lesions=LESIONS2,
        **kw,
    )


def test_candidates_are_generates_candidates(sources, tmp_path):
    prepared = prepare(
        tmp_path / "rev", _src(sources, seed=3), annotators=3, reviews_per_case=2, progress=False
    )
    ils = load_ils(sources / "mimic-ils")
    _, _, cells, _ = plan_candidates(ils, parse_lesions(LESIONS2), seed=3, rosalia=False)
    expected = [(q.candidate.key_id, p.value, q.rank) for (_, p), qs in cells.items() for q in qs]
    got = [(i["key_id"], i["path"], i["rank"]) for i in prepared.manifest["items"]]
    assert sorted(got) == sorted(expected) and len(got) == 12
    assert all(len(i["annotators"]) == 2 for i in prepared.manifest["items"])
    positives = [i for i in prepared.manifest["items"] if i["positive"]]
    assert positives and all(i["overlay"] and (tmp_path / "rev" / i["overlay"]).is_file() for i in positives)
    assert positives[0]["sentence"].startswith("Phantom study (with")
    # the same settings reuse the folder; other settings are refused
    again = prepare(tmp_path / "rev", _src(sources, seed=3), annotators=3, reviews_per_case=2, progress=False)
    assert again.reused
    with pytest.raises(SourceError, match="different settings"):
        prepare(tmp_path / "rev", _src(sources, seed=4), annotators=3, reviews_per_case=2, progress=False)
    # --per-cell: the first N of each cell, in generate's order
    few = prepare(tmp_path / "few", _src(sources, seed=3, per_cell=1), annotators=2, progress=False)
    assert [i["rank"] for i in few.manifest["items"]] == [0] * 6


def test_missing_files_are_left_out_with_the_file_named(sources, tmp_path):
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(sources, copy)
    mask = next((copy / "mimic-ils" / "lesion_mask").rglob("*.png"))
    mask.unlink()
    prepared = prepare(tmp_path / "rev", _src(copy), annotators=2, progress=False)
    assert len(prepared.errors) == 1 and str(mask) in prepared.errors[0][1]
    assert (tmp_path / "rev" / "prepare_errors.csv").is_file()
    assert len(prepared.manifest["items"]) == 11


def test_review_options_are_spelled_as_generates():
    import argparse

    from chexpercept.builder import cmd_generate

    def flags(module):
        parser = argparse.ArgumentParser()
        module.configure(parser)
        return {s for a in parser._actions for s in a.option_strings}

    shared = {"--mimic-cxr-jpg", "--cxr-png", "--mimic-ils", "--lesion-masks", "--rosalia-pred", "--seed"}
    shared |= {"--lesions", "--per-cell", "--no-progress"}
    assert shared <= flags(cmd_generate)
    assert shared <= flags(cmd_review)
    assert {"--output-dir", "--out", "--annotators", "--reviews-per-case", "--port"} <= flags(cmd_review)


# ------------------------------------------------------------------------------------------- server
def test_server_refuses_anything_but_loopback(sources, tmp_path, capsys):
    for host in ("0.0.0.0", "192.168.1.5", "::", "localhost", ""):
        with pytest.raises(ReviewServerError, match="127.0.0.1 only"):
            check_host(host)
    with pytest.raises(SystemExit) as stop:  # no option chooses the address: loopback only
        cli(["review", "--output-dir", str(tmp_path / "rev"), "--host=0.0.0.0"])
    assert stop.value.code == 2 and "unrecognized arguments: --host" in capsys.readouterr().err
    assert not (tmp_path / "rev").exists()  # refused before any work
    check_host("127.0.0.1")


def _request(port, method, path, body=None, host=None, cookie=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if cookie:
        headers["Cookie"] = cookie
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), payload


def sign_in(server, annotator):
    """Open the annotator's link as a browser would: the cookie it sets."""
    port = server.server_address[1]
    status, headers, _ = _request(port, "GET", server.app.access.link("", annotator))
    assert status == 303 and headers["Location"] == f"/annotate/{annotator}/"
    return headers["Set-Cookie"].split(";")[0]


def test_server_api(sources, tmp_path):
    prepare(tmp_path / "rev", _src(sources), annotators=2, reviews_per_case=1, progress=False)
    server, _thread = serve_in_thread(tmp_path / "rev")
    port = server.server_address[1]
    try:
        assert server.server_address[0] == "127.0.0.1"
        a = sign_in(server, "A")
        status, headers, page = _request(port, "GET", "/annotate/A/", cookie=a)
        assert (
            status == 200
            and b"review.js" in page
            and "default-src 'self'" in headers["Content-Security-Policy"]
        )
        assert b"http" not in page.replace(b"http-equiv", b"")  # nothing from the internet
        status, _, body = _request(port, "GET", "/annotate/A/api/cases", cookie=a)
        data = json.loads(body)
        assert status == 200 and len(data["cases"]) == 6 and data["synthetic"] and data["decisions"] == {}
        assert data["limits"] == {"note": 10000, "body": 65536}
        key = data["cases"][0]["key_id"]
        status, headers, img = _request(port, "GET", f"/annotate/A/image/{key}/cxr", cookie=a)
        assert status == 200 and headers["Content-Type"] == "image/png" and img[:4] == b"\x89PNG"
        status, _, body = _request(
            port,
            "POST",
            "/annotate/A/api/decision",
            {"key_id": key, "decision": "accept", "note": "ok"},
            cookie=a,
        )
        assert status == 200 and json.loads(body)["record"]["decision"] == "accept"
        cases = json.loads(_request(port, "GET", "/annotate/A/api/cases", cookie=a)[2])
        assert cases["decisions"][key]["note"] == "ok"
        b = sign_in(server, "B")
        other = json.loads(_request(port, "GET", "/annotate/B/api/cases", cookie=b)[2])["cases"][0]["key_id"]
        status, _, body = _request(
            port, "POST", "/annotate/A/api/decision", {"key_id": other, "decision": "accept"}, cookie=a
        )
        assert status == 403 and b"not assigned" in body
        assert _request(port, "GET", f"/annotate/A/image/{other}/cxr", cookie=a)[0] == 404  # not A's
        decision = {"key_id": key, "decision": "maybe"}
        assert _request(port, "POST", "/annotate/A/api/decision", decision, cookie=a)[0] == 400
        assert _request(port, "GET", "/annotate/A/image/..%2F..%2Freview.json/cxr", cookie=a)[0] == 404
        assert _request(port, "GET", "/static/../prepare.py")[0] == 404
        assert _request(port, "GET", "/annotate/Z/api/cases", cookie=a)[0] == 401
        assert _request(port, "GET", "/", host="evil.example:80")[0] == 403  # DNS rebinding
        assert _request(port, "GET", "/", host=f"localhost:{port}")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    assert [r["key_id"] for r in read_decisions(tmp_path / "rev" / "decisions" / "A.jsonl")] == [key]


def test_port_in_use_is_a_clear_error(sources, tmp_path):
    prepare(tmp_path / "rev", _src(sources), annotators=1, progress=False)
    first = make_server(tmp_path / "rev", port=0)
    try:
        with pytest.raises(ReviewServerError, match="another --port"):
            make_server(tmp_path / "rev", port=first.server_address[1])
    finally:
        first.server_close()


# ------------------------------------------------------------------------------------------- export
def test_export_then_generate_review(sources, tmp_path, capsys):
    rev = tmp_path / "rev"
    prepared = prepare(rev, _src(sources), annotators=3, reviews_per_case=2, progress=False)
    items = prepared.manifest["items"]
    stores = {a: DecisionStore(rev, a) for a in "ABC"}
    rejected = items[0]["key_id"]  # both reviewers reject
    disputed = items[1]["key_id"]  # one accepts, one rejects
    for n, item in enumerate(items):
        for j, a in enumerate(item["annotators"]):
            decision = "accept"
            if item["key_id"] == rejected or (item["key_id"] == disputed and j == 1):
                decision = "reject"
            if n == 2 and j == 0:
                stores[a].append(item["key_id"], "reject", note="first look")  # revised below
            stores[a].append(item["key_id"], decision, note="too small" if decision == "reject" else "")
    assert cli(["review", "export", str(rev)]) == 0
    out = capsys.readouterr().out
    assert "1 disagreement(s)" in out and "fleiss" in out
    sheets = {
        p.name: list(csv.DictReader(p.read_text(encoding="utf-8").splitlines()))
        for p in (rev / "export").glob("*.csv")
    }
    pos, neg = sheets["positive_labeling_sheet.csv"], sheets["negative_labeling_sheet.csv"]
    assert list(pos[0]) == [
        "key_id",
        "dicom_id",
        "target",
        "pair_id",
        "mapped_location",
        "segmentation_source",
        "plot_path",
        "optimal?",
    ]
    assert list(neg[0]) == ["lesion", "key_id", "dicom_id", "optimal?"]
    marks = {r["key_id"]: r["optimal?"] for r in pos + neg}
    assert marks[rejected] == "" and marks[disputed] == "" and marks[items[2]["key_id"]] == "y"
    assert sum(v == "y" for v in marks.values()) == 10
    (dis,) = sheets["disagreements.csv"]
    assert dis["key_id"] == disputed and "too small" in dis["notes"]
    measures = {r["measure"] for r in sheets["agreement.csv"]}
    assert measures == {"cohen", "fleiss"}
    # majority: the 1-1 tie stays out as well
    assert export(rev, rule="majority").accepted == 10

    bundle = tmp_path / "bundle"
    rc = generate_reviewed(sources, LESIONS2, rev / "export", bundle)
    bundle_json = json.loads((bundle / "chexpercept.json").read_text())
    keys = set(bundle_json)
    assert keys and rejected not in keys and disputed not in keys
    assert keys <= {k for k, v in marks.items() if v == "y"}
    assert all(e["provenance"]["reviewed"] for e in bundle_json.values())
    assert rc in (0, 1)  # 1 only when a cell ran short of accepted candidates (reported, not hidden)


def test_export_says_what_of_the_decisions_it_leaves_out(sources, tmp_path, capsys):
    """review export passed over a decisions file of an annotator the review does not have,
    decisions for cases it does not hold and a torn last line, counted a line naming annotator B in
    A's file as A's, and an export without any decision said nothing (red team, stop 44)."""
    rev = tmp_path / "rev"
    prepare(rev, _src(sources), annotators=2, reviews_per_case=1, progress=False)
    assert cli(["review", "export", str(rev)]) == 0
    out = capsys.readouterr().out
    assert "no annotator has recorded a decision yet" in out
    # sheets that accept nothing are not offered to generate (new user, stop 45)
    assert "no case is accepted yet" in out and "next: chexpercept generate" not in out
    store = DecisionStore(rev, "A")
    key = next(
        i["key_id"] for i in json.loads((rev / "review.json").read_text())["items"] if "A" in i["annotators"]
    )
    store.append(key, "accept")
    folder = rev / "decisions"
    line = (folder / "A.jsonl").read_text().splitlines()[0]
    (folder / "C.jsonl").write_text(line + "\n")  # an annotator the review does not have
    record = json.loads(line)
    with (folder / "A.jsonl").open("a") as f:
        f.write(json.dumps({**record, "key_id": "pneumothorax_s9_positive_0"}) + "\n")
        f.write('{"key_id": "torn')  # a write cut short
    assert cli(["review", "export", str(rev)]) == 0
    out = capsys.readouterr().out
    assert "C.jsonl: annotator 'C' is not in the review's review.json: not exported" in out, out
    assert "A.jsonl: decisions for 1 case(s) this review does not hold" in out, out
    assert "A.jsonl: its last line is torn" in out, out
    (folder / "A.jsonl").write_text(json.dumps({**record, "annotator": "B"}) + "\n")
    assert cli(["review", "export", str(rev)]) == 2
    assert "says annotator 'B', in A's file" in capsys.readouterr().err
