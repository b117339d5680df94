"""``chexpercept review`` in a real headless Chromium: keyboard review of a phantom candidate set, a
reload mid-way, a tab closed with a decision not yet sent, two annotators at once, and export then
``generate --review`` end to end; the annotator's link and cookie; decisions never lost (issue 21 item
3: the note limit shown before sending, a server refusal never shown as saved, two tabs of one
annotator across a server restart); the CXR shown as the pipeline decodes it (item 4: EXIF
orientation). Same browser setup as test_report_browser.py."""

from __future__ import annotations

import csv
import json

import pytest

from chexpercept.builder.review.prepare import ReviewSources, prepare
from chexpercept.builder.review.server import serve_in_thread
from chexpercept.builder.review.store import read_decisions
from chexpercept.cli import main as cli

from .test_report_browser import _errors, _require_browser, browser  # noqa: F401 - the shared fixture
from .test_review import generate_reviewed

pytestmark = pytest.mark.browser

LESIONS1 = ("cardiomegaly",)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    _require_browser()
    from chexpercept.builder.synth_sources import synthesize_sources

    return synthesize_sources(
        tmp_path_factory.mktemp("review_browser") / "src", per_cell=1, lesions=LESIONS1, progress=False
    )


class Served:
    """A prepared review and its server, which a test may stop and start again on the same port."""

    def __init__(self, root):
        self.root = root
        self.server, _ = serve_in_thread(root)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"

    def link(self, annotator):
        return self.server.app.access.link(self.base, annotator)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def restart(self):
        self.server, _ = serve_in_thread(self.root, port=self.port)


@pytest.fixture
def review(sources, tmp_path):
    """A prepared review of 6 phantom candidates, 2 annotators, each case reviewed by both; served."""
    root = tmp_path / "rev"
    src = ReviewSources(
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"),
        mimic_ils=str(sources / "mimic-ils"),
        lesions=list(LESIONS1),
    )
    prepare(root, src, annotators=2, reviews_per_case=2, progress=False)
    served = Served(root)
    yield served
    served.stop()


def _wait(drv, predicate, timeout=10):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, timeout).until(lambda d: predicate(d))


def _open(drv, url):
    drv.get("about:blank")
    drv.get(url)
    _wait(drv, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    drv.get_log("browser")


def _open_as(drv, review, annotator):
    """Open the annotator's link (token -> cookie -> the page without the token)."""
    _open(drv, review.link(annotator))
    assert drv.current_url == f"{review.base}/annotate/{annotator}/"


def _text(drv, element_id):
    return drv.find_element("id", element_id).text


def _key(drv, *keys):
    from selenium.webdriver.common.action_chains import ActionChains

    for k in keys:
        ActionChains(drv).send_keys(k).perform()


def _saved(drv):
    _wait(drv, lambda d: d.find_element("id", "save-status").text == "all decisions saved")


def _current(drv):
    return drv.find_element("tag name", "body").get_attribute("data-key")


def _decisions(root, annotator):
    return [
        (r["key_id"], r["decision"], r["note"])
        for r in read_decisions(root / "decisions" / f"{annotator}.jsonl")
    ]


def test_keyboard_review(browser, review, tmp_path):  # noqa: F811
    from selenium.webdriver.common.keys import Keys

    root = review.root
    _open_as(browser, review, "A")
    assert _text(browser, "progress") == "0 of 6 decided"
    assert "Phantom data" in _text(browser, "banner")
    first = _current(browser)
    assert _text(browser, "lesion").lower() == "cardiomegaly"
    assert _text(browser, "sentence")
    # the overlay sits exactly on the CXR, and the view controls answer to the keyboard
    cxr = browser.find_element("id", "cxr")
    _wait(browser, lambda d: d.execute_script("return arguments[0].naturalWidth", cxr) > 0)
    overlay = browser.find_element("id", "overlay")
    assert overlay.is_displayed()  # the first case is a positive (generate's RR queue comes first)
    assert overlay.rect == cxr.rect and cxr.rect["height"] > 500
    _key(browser, "m")
    assert not overlay.is_displayed()
    _key(browser, "m")
    assert overlay.is_displayed()
    opacity = browser.find_element("id", "opacity").get_attribute("value")
    _key(browser, "]")
    assert int(browser.find_element("id", "opacity").get_attribute("value")) == int(opacity) + 10
    _key(browser, "+")
    assert _text(browser, "zoom-level") == "150%"
    _key(browser, "0")
    assert _text(browser, "zoom-level") == "100%"
    browser.save_screenshot(str(tmp_path / "review.png"))
    import os

    if os.environ.get("CHEXPERCEPT_REVIEW_SCREENSHOT"):
        browser.save_screenshot(os.environ["CHEXPERCEPT_REVIEW_SCREENSHOT"])

    _key(browser, "a")  # accept -> next case
    second = _current(browser)
    assert second != first
    _key(browser, "n", "mask misses the left border", Keys.ESCAPE, "r")  # a note, then reject
    _key(browser, "s")  # skip the third
    _saved(browser)
    assert _decisions(root, "A") == [
        (first, "accept", ""),
        (second, "reject", "mask misses the left border"),
        (_decisions(root, "A")[2][0], "skip", ""),
    ]
    assert _text(browser, "progress") == "2 of 6 decided"  # a skip is not a decision
    _key(browser, Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    assert _current(browser) == second
    assert _text(browser, "current-decision") == "reject"
    assert browser.find_element("id", "note").get_attribute("value") == "mask misses the left border"
    _key(browser, "a")  # change of mind: the last decision wins
    _saved(browser)
    assert _decisions(root, "A")[-1][:2] == (second, "accept")
    assert _errors(browser) == []


def test_reload_midway_keeps_decisions(browser, review):  # noqa: F811
    root = review.root
    _open_as(browser, review, "B")
    done = []
    for _ in range(3):
        done.append(_current(browser))
        _key(browser, "a")
    _saved(browser)
    browser.refresh()
    _wait(browser, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    assert _text(browser, "progress") == "3 of 6 decided"
    assert _current(browser) not in done  # opens at the first case without a decision
    from selenium.webdriver.common.keys import Keys

    _key(browser, Keys.ARROW_LEFT)
    assert _current(browser) == done[-1] and _text(browser, "current-decision") == "accept"
    assert [k for k, _, _ in _decisions(root, "B")] == done


def _pending_key(review, annotator, client_id):
    return f"chexpercept-review:127.0.0.1:{review.port}:{annotator}:pending:{client_id}"


def test_a_decision_not_yet_sent_survives_a_closed_tab(browser, review):  # noqa: F811
    """The page keeps every decision in localStorage until the server has fsynced it; a tab closed (or a
    server down) before that sends it on the next load. The earlier page's single array is taken over."""
    root = review.root
    _open_as(browser, review, "A")
    keys = [c["key_id"] for c in review.server.app.cases("A")["cases"]]
    browser.execute_script(
        "localStorage.setItem(arguments[0], JSON.stringify(arguments[1]));"
        "localStorage.setItem(arguments[2], JSON.stringify([arguments[3]]));",
        _pending_key(review, "A", "x1"),
        {
            "key_id": keys[0],
            "decision": "reject",
            "note": "left pending",
            "client_id": "x1",
            "client_time": 1,
        },
        f"chexpercept-review:127.0.0.1:{review.port}:A:pending",  # the earlier page's format
        {"key_id": keys[1], "decision": "accept", "note": "older page", "client_id": "x0"},
    )
    browser.get("about:blank")  # the tab goes away before anything was sent
    assert _decisions(root, "A") == []
    _open(browser, f"{review.base}/annotate/A/")  # the cookie is kept: no token needed again
    _saved(browser)
    assert sorted(_decisions(root, "A")) == sorted(
        [(keys[0], "reject", "left pending"), (keys[1], "accept", "older page")]
    )
    left = browser.execute_script(
        "return Object.keys(localStorage).filter((k) => k.startsWith(arguments[0]));",
        f"chexpercept-review:127.0.0.1:{review.port}:A:",
    )
    assert left == []


def test_two_annotators_at_once_and_generate_review(browser, review, sources, tmp_path):  # noqa: F811
    root = review.root
    _open_as(browser, review, "A")
    tab_a = browser.current_window_handle
    browser.switch_to.new_window("tab")
    tab_b = browser.current_window_handle
    _open_as(browser, review, "B")
    seen = {"A": [], "B": []}
    rejected_by_b = None
    for step in range(6):  # interleave the two annotators, one key each
        for name, tab in (("A", tab_a), ("B", tab_b)):
            browser.switch_to.window(tab)
            seen[name].append(_current(browser))
            if name == "B" and step == 1:
                rejected_by_b = _current(browser)
                _key(browser, "r")
            elif name == "A" and step == 4:
                _key(browser, "r")
            else:
                _key(browser, "a")
    for tab in (tab_a, tab_b):
        browser.switch_to.window(tab)
        _saved(browser)
        assert _text(browser, "progress") == "6 of 6 decided"
        assert browser.find_element("id", "done").is_displayed()
    browser.close()
    browser.switch_to.window(tab_a)
    a, b = _decisions(root, "A"), _decisions(root, "B")
    assert [k for k, _, _ in a] == seen["A"] and [k for k, _, _ in b] == seen["B"]
    assert sorted(seen["A"]) == sorted(seen["B"])  # both review every case
    rejected_by_a = seen["A"][4]

    assert cli(["review", "export", str(root)]) == 0
    rows = []
    for name in ("positive_labeling_sheet.csv", "negative_labeling_sheet.csv"):
        rows += list(csv.DictReader((root / "export" / name).read_text(encoding="utf-8").splitlines()))
    marks = {r["key_id"]: r["optimal?"] for r in rows}
    assert len(marks) == 6 and marks[rejected_by_a] == "" and marks[rejected_by_b] == ""
    disputed = list(csv.DictReader((root / "export" / "disagreements.csv").read_text().splitlines()))
    assert {r["key_id"] for r in disputed} == {rejected_by_a, rejected_by_b} - {None}
    agreement = list(csv.DictReader((root / "export" / "agreement.csv").read_text().splitlines()))
    assert [r["measure"] for r in agreement] == ["cohen", "fleiss"] and agreement[0]["cases"] == "6"

    bundle = tmp_path / "bundle"
    rc = generate_reviewed(sources, LESIONS1, root / "export", bundle)
    entries = json.loads((bundle / "chexpercept.json").read_text())
    accepted = {k for k, v in marks.items() if v == "y"}
    assert entries and set(entries) <= accepted
    assert all(e["provenance"]["reviewed"] for e in entries.values())
    assert rc in (0, 1)  # 1 only if a cell ran out of accepted candidates (reported as SHORT)


# ------------------------------------------------------------------------- credentials (item 2)
def test_the_page_needs_the_link_and_keeps_the_token_out_of_reach(browser, review):  # noqa: F811
    browser.delete_all_cookies()
    browser.get("about:blank")
    browser.get(f"{review.base}/annotate/A/")
    assert "not signed in" in browser.page_source  # the page itself is behind the credential
    _open_as(browser, review, "A")
    assert "token" not in browser.current_url
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: no script can read it
    assert _text(browser, "progress") == "0 of 6 decided"
    # the same browser holding A's cookie cannot open B's page
    browser.get(f"{review.base}/annotate/B/")
    assert "not signed in" in browser.page_source


# ---------------------------------------------------------------------- nothing lost (item 3)
def _set_note(drv, text):
    drv.execute_script(
        "const n = document.getElementById('note'); n.value = arguments[0];"
        "n.dispatchEvent(new Event('input'));",
        text,
    )


def test_the_note_limit_is_shown_before_sending_and_nothing_is_cut(browser, review):  # noqa: F811
    from selenium.webdriver.common.keys import Keys

    root = review.root
    _open_as(browser, review, "A")
    first = _current(browser)
    assert _text(browser, "note-count") == "0 / 10,000 characters"
    _set_note(browser, "x" * 10_001)
    assert _text(browser, "note-count") == "10,001 / 10,000 characters"
    assert "1 characters too long" in _text(browser, "note-error")
    browser.find_element("id", "note").send_keys(Keys.ESCAPE)
    _key(browser, "a")  # refused by the page: no decision, the case stays, the note is intact
    assert _current(browser) == first and _text(browser, "current-decision") == "none"
    assert len(browser.find_element("id", "note").get_attribute("value")) == 10_001
    assert _decisions(root, "A") == []
    _set_note(browser, "y" * 10_000)  # exactly the limit
    browser.find_element("id", "note").send_keys(Keys.ESCAPE)
    _key(browser, "a")
    _saved(browser)
    assert _decisions(root, "A") == [(first, "accept", "y" * 10_000)]  # whole, not cut


def test_a_refused_decision_is_never_shown_as_saved(browser, review):  # noqa: F811
    """A decision the server refuses (here: from an earlier page without the limit, a note over
    10,000 characters, and a body over 64 KiB) is kept and shown as not saved, across a reload,
    until the case is decided again."""
    root = review.root
    _open_as(browser, review, "A")
    keys = [c["key_id"] for c in review.server.app.cases("A")["cases"]]
    for i, note in enumerate(("n" * 10_001, "b" * 70_000)):
        browser.execute_script(
            "localStorage.setItem(arguments[0], JSON.stringify(arguments[1]));",
            _pending_key(review, "A", f"r{i}"),
            {"key_id": keys[i], "decision": "accept", "note": note, "client_id": f"r{i}", "client_time": i},
        )
    browser.refresh()
    # both refusals, each answered on its own: the line names one until the second answer arrives
    _wait(browser, lambda d: _text(d, "save-status").startswith("2 decisions not saved"))
    status = _text(browser, "save-status")
    assert "refused by the server" in status and status != "saved"
    assert "64 KiB" in status or "10,000" in status
    assert _decisions(root, "A") == []
    browser.refresh()  # still there after a reload: nothing silently dropped
    _wait(browser, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    _wait(browser, lambda d: _text(d, "save-status").startswith("2 decisions not saved"))
    assert not browser.find_element("id", "done").is_displayed()
    for key in keys[:2]:  # deciding each case again replaces its refused decision
        while _current(browser) != key:
            _key(browser, "u")
        assert "(not saved: refused)" in _text(browser, "current-decision")
        _set_note(browser, "")
        _key(browser, "r")
    _saved(browser)
    assert sorted(_decisions(root, "A")) == sorted([(keys[0], "reject", ""), (keys[1], "reject", "")])


def test_two_tabs_of_one_annotator_across_a_server_restart_lose_nothing(browser, review):  # noqa: F811
    from selenium.webdriver.common.keys import Keys

    root = review.root
    _open_as(browser, review, "A")
    tab1 = browser.current_window_handle
    browser.switch_to.new_window("tab")
    tab2 = browser.current_window_handle
    _open_as(browser, review, "A")
    review.stop()  # the server goes down; both tabs keep deciding
    browser.switch_to.window(tab1)
    x = _current(browser)
    _key(browser, "a")  # tab 1 accepts case x
    _wait(browser, lambda d: "not saved yet" in _text(d, "save-status"))
    browser.switch_to.window(tab2)
    assert _current(browser) == x
    _key(browser, Keys.ARROW_RIGHT)
    y = _current(browser)
    _key(browser, "a")  # tab 2 accepts case y
    _key(browser, Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    assert _current(browser) == x and _text(browser, "current-decision").startswith("accept")  # tab 1's
    _key(browser, "r")  # and then changes its mind on x: the later decision must win
    pending = browser.execute_script(
        "return Object.keys(localStorage).filter((k) => k.startsWith(arguments[0])).length;",
        f"chexpercept-review:127.0.0.1:{review.port}:A:pending:",
    )
    assert pending == 3  # one key per decision: no tab overwrote another's
    assert "saved" not in _text(browser, "save-status").replace("not saved", "")
    review.restart()
    for tab in (tab1, tab2):
        browser.switch_to.window(tab)
        _saved(browser)
    assert [(k, d) for k, d, _ in _decisions(root, "A")] == [(x, "accept"), (y, "accept"), (x, "reject")]
    browser.close()
    browser.switch_to.window(tab1)


# --------------------------------------------------------------------------- what is shown (item 4)
def test_an_exif_oriented_jpg_is_shown_as_the_pipeline_decodes_it(browser, sources, tmp_path):  # noqa: F811
    """A source JPG that asks to be rotated (EXIF orientation 6): the page shows the pixels generate
    uses, which the mask overlay is drawn on, not the rotation the browser would apply."""
    import shutil

    import numpy as np
    from PIL import Image

    copy = tmp_path / "src"
    shutil.copytree(sources, copy)
    root = tmp_path / "rev"
    src = ReviewSources(
        mimic_cxr_jpg=str(copy / "mimic-cxr-jpg"), mimic_ils=str(copy / "mimic-ils"), lesions=list(LESIONS1)
    )
    prepare(root, src, annotators=1, progress=False)
    item = json.loads((root / "review.json").read_text())["items"][0]
    with Image.open(item["cxr"]) as im:
        arr = np.zeros((im.height, im.width), dtype=np.uint8)
    arr[: arr.shape[0] // 4, : arr.shape[1] // 4] = 255  # a white block at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(arr).save(item["cxr"], format="JPEG", quality=95, exif=exif)
    served = Served(root)
    try:
        _open_as(browser, served, "A")
        assert _current(browser) == item["key_id"]
        cxr = browser.find_element("id", "cxr")
        _wait(
            browser,
            lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", cxr),
        )
        corners = browser.execute_script(
            "const im = arguments[0]; const c = document.createElement('canvas');"
            "c.width = im.naturalWidth; c.height = im.naturalHeight;"
            "const g = c.getContext('2d'); g.drawImage(im, 0, 0);"
            "const at = (x, y) => g.getImageData(x, y, 1, 1).data[0];"
            "return [c.width, c.height, at(20, 20), at(c.width - 20, 20)];",
            cxr,
        )
        assert corners[:2] == [1024, 1024]  # the 1024 x 1024 frame the overlay is drawn in
        assert corners[2] > 200 and corners[3] < 50  # not rotated: the block stays top-left
        assert browser.execute_script("return getComputedStyle(arguments[0]).imageOrientation", cxr) == "none"
    finally:
        served.stop()
