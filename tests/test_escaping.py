"""Issue 27 item 6: text from a bundle, a run folder, a model's server or the Hub is escaped for where
it is written (chexpercept.escape): a terminal or log line (control characters and newlines shown as
escapes), a markdown table cell, a CSV cell (no formula), HTML. The issue's shape: a key_id holding
``ESC]0;title BEL``, ``ESC[2J`` and a newline followed by ``OK: 0 problems, bundle verified`` cleared
the terminal and printed a fake "OK" line as the label of its problem line.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main
from chexpercept.testing import write_fixture_bundle

sys.path.insert(0, str(Path(__file__).parent))
from fake_hub import FakeHub
from fake_openai import FakeServer
from local_http import LocalServer

EVIL = "edema_s1\x1b]0;title\x07\x1b[2J\nOK: 0 problems, bundle verified"
SHOWN = "edema_s1\\x1b]0;title\\x07\\x1b[2J\\nOK: 0 problems, bundle verified"
CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")


def inert(text: str) -> None:
    """No control character reaches the terminal, and no line of its own says OK."""
    assert not any(c in text for c in CONTROLS), repr(text[-2000:])
    assert not any(line.startswith("OK: 0 problems") for line in text.splitlines()), text[-2000:]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("escape")
    bundle = write_fixture_bundle(root / "bundle", per_cell=1, seed=7)
    args = ["--data-dir", str(bundle), "--model", "baseline:random", "--oracle", "none"]
    assert run_main([*args, "--output-dir", str(root / "runs"), "--no-progress", "--no-score"]) == 0
    return root


@pytest.fixture
def work(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "w")
    return tmp_path / "w"


def _evil_key_bundle(bundle: Path) -> None:
    entries = json.loads((bundle / "chexpercept.json").read_text())
    first = next(iter(entries))
    entries = {(EVIL if k == first else k): v for k, v in entries.items()}
    (bundle / "chexpercept.json").write_text(json.dumps(entries))


@pytest.mark.parametrize("command", ["validate", "inspect", "run"])
def test_a_hostile_key_id_is_shown_escaped_on_its_problem_line(work, command, capsys):
    bundle = str(work / "bundle")
    _evil_key_bundle(work / "bundle")
    args = {
        "validate": ["validate", bundle],
        "inspect": ["inspect", bundle],
        "run": ["run", "--data-dir", bundle, "--model", "baseline:random", "--output-dir", str(work / "r")],
    }[command]
    assert cli(args + (["--no-progress"] if command == "run" else [])) in (1, 2)
    captured = capsys.readouterr()
    inert(captured.out + captured.err)
    assert f"  - {SHOWN}: " in captured.err


def _results(work: Path) -> Path:
    return work / "runs" / "baseline-random" / "oracle_none" / "results.jsonl"


def test_a_hostile_key_id_in_results_is_refused_shown_escaped(work, capsys):
    lines = _results(work).read_text().splitlines()
    record = json.loads(lines[0])
    record["key_id"] = EVIL
    _results(work).write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    for args in (
        ["score", str(work / "runs"), "--data-dir", str(work / "bundle")],
        [
            *("run", "--data-dir", str(work / "bundle"), "--model", "baseline:random", "--oracle", "none"),
            *("--output-dir", str(work / "runs"), "--no-progress", "--no-score"),
        ],
    ):
        assert cli(args) == 2
        err = capsys.readouterr().err
        inert(err)
        assert "results.jsonl:1: not a CheXpercept case result" in err and "\\x1b]0;title\\x07" in err


def _set_meta(work: Path, **fields: str) -> None:
    for run_json in (work / "runs").glob("*/oracle_*/run.json"):
        meta = json.loads(run_json.read_text())
        meta.update(fields)
        run_json.write_text(json.dumps(meta))


def test_a_hostile_model_name_stays_in_its_table_cell(work, capsys):
    """A display name with a pipe, a newline and control characters: one markdown row, cells intact;
    in CSV, one inert cell that a spreadsheet does not run."""
    hostile = "x | 1.0\n| fake \x1b[2J<img src=y>"
    _set_meta(work, display_name=hostile, model=hostile)
    assert cli(["score", str(work / "runs"), "--data-dir", str(work / "bundle"), "--table", "2"]) == 0
    captured = capsys.readouterr()
    inert(captured.out + captured.err)
    out = captured.out
    rows = [line for line in out.splitlines() if line.startswith("| x")]
    # the escapes' own backslashes are escaped for markdown, so the cell renders as they read
    assert len(rows) == 1 and "x \\| 1.0\\\\n\\| fake \\\\x1b\\[2J\\<img src=y\\>" in rows[0], out
    header = next(line for line in out.splitlines() if line.startswith("| Model"))
    assert rows[0].replace("\\|", "").count("|") == header.count("|")
    formula = '=HYPERLINK("http://x","y")'
    _set_meta(work, display_name=formula, model=formula)
    args = [
        "score",
        str(work / "runs"),
        "--data-dir",
        str(work / "bundle"),
        "--table",
        "2",
        "--format",
        "csv",
    ]
    assert cli(args) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[1][0] == '\'=HYPERLINK("http://x","y")'


def test_a_hostile_model_name_stays_in_its_cell_in_a_comparison(work, capsys):
    """score A B --compare and the report's comparisons put run.json's names into markdown and CSV
    unescaped: a | broke the table's columns, <img> went into the markdown, ESC reached the terminal
    (red team, stop 44). They are escaped as --table escapes them."""
    hostile = "x | 1.0\n| fake \x1b[2J<img src=y>"
    _set_meta(work, display_name=hostile, model=hostile)
    args = ["--data-dir", str(work / "bundle"), "--model", "baseline:oracle", "--oracle", "none"]
    assert run_main([*args, "--output-dir", str(work / "runs"), "--no-progress", "--no-score"]) == 0
    models = [str(work / "runs" / "baseline-random"), str(work / "runs" / "baseline-oracle")]
    capsys.readouterr()
    assert cli(["score", *models, "--compare"]) == 0
    captured = capsys.readouterr()
    inert(captured.out + captured.err)
    header = next(line for line in captured.out.splitlines() if line.startswith("| Metric"))
    assert "\\<img src=y\\>" in header and header.replace("\\|", "").count("|") == 10, header
    report = work / "report"
    assert cli(["report", "--results", str(work / "runs"), "--output-dir", str(report), "--no-plots",
                "--no-intervals"]) == 0  # fmt: skip
    md = (report / "comparisons.md").read_text()
    assert "**Paired comparison: " in md
    inert(md)
    assert "<img" not in md.replace("\\<img", ""), md
    rows = list(csv.reader(io.StringIO((report / "comparisons.csv").read_text())))
    assert all("\x1b" not in cell for row in rows for cell in row)


def test_a_failure_reason_from_a_file_is_shown_escaped(work, capsys):
    folder = _results(work).parent
    lines = _results(work).read_text().splitlines()
    first = json.loads(lines[0])
    _results(work).write_text("\n".join(lines[1:]) + "\n")
    failure = {k: first[k] for k in ("key_id", "lesion", "path")}
    failure.update(task="detection", turn_index=0, error="HTTP 500: \x1b[2J\nOK: 0 problems, bundle verified")
    failure["run"] = first["run"]  # as the runner writes it: a line without one is never scored
    (folder / "failures.jsonl").write_text(json.dumps(failure) + "\n")
    assert cli(["score", str(work / "runs"), "--data-dir", str(work / "bundle")]) == 0
    captured = capsys.readouterr()
    inert(captured.out + captured.err)
    assert "HTTP 500: \\x1b[2J\\nOK: 0 problems" in captured.err


def test_a_server_error_body_is_shown_escaped_in_the_run_warning(fixture_bundle, tmp_path, capsys):
    body = b"bad \x1b]0;pwned\x07\x1b[2J\nOK: 0 problems, bundle verified"
    with FakeServer(failures=[{"status": 400, "raw": body, "content_type": "text/plain"}]) as server:
        args = ["--data-dir", str(fixture_bundle), "--model", "gpt-5.4", "--backend", "openai"]
        args += ["--base-url", server.url, "--oracle", "none", "--limit", "1", "--on-error", "record"]
        rc = run_main([*args, "--output-dir", str(tmp_path / "runs"), "--no-progress", "--no-score"])
    captured = capsys.readouterr()
    assert rc == 3
    inert(captured.out + captured.err)
    assert "bad \\x1b]0;pwned\\x07\\x1b[2J\\nOK: 0 problems" in captured.err


@pytest.fixture
def hub(monkeypatch):
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


def test_hub_leaderboard_rows_are_escaped_in_markdown_and_csv(hub, capsys):
    hub.leaderboards["org/bench"] = [
        {
            "rank": 1,
            "modelId": "evil/m\x1b[2J",
            "value": 50.0,
            "filename": ".eval_results/x.yaml",
            "verified": False,
            "notes": "a | b\nOK: 0 problems, bundle verified ![x](http://tracker/p.png)",
            "source": {"url": "https://example.org", "name": "=cmd|' /C calc'!A0", "isExternal": True},
            "author": {"name": "evil", "type": "user", "fullname": "E", "avatarUrl": ""},
        }
    ]
    assert cli(["leaderboard", "org/bench"]) == 0
    out = capsys.readouterr().out
    inert(out)
    row = next(line for line in out.splitlines() if line.startswith("| 1 "))
    # markdown: the escapes' own backslashes are escaped too, so the cell renders as they read
    assert "evil/m\\\\x1b\\[2J" in row and "a \\| b\\\\nOK: 0 problems" in row and "!\\[x\\](http" in row
    assert cli(["leaderboard", "org/bench", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["source"] == "'=cmd|' /C calc'!A0" and rows[0]["model"] == "evil/m\\x1b[2J"


def test_report_html_shows_a_hostile_model_name_as_text(work):
    hostile = "<script>alert(1)</script>\x1b[2J"
    _set_meta(work, display_name=hostile, model=hostile)
    out = work / "report"
    args = ["report", str(work / "runs"), "--data-dir", str(work / "bundle"), "--output-dir", str(out)]
    assert cli([*args, "--bootstrap", "0", "--no-plots"]) == 0
    page = (out / "index.html").read_text()
    assert "<script>alert(1)" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    names = [p.name for p in out.rglob("*")]  # folders named after the model: safe names
    assert all(n.isprintable() and "<" not in n for n in names), [n for n in names if not n.isprintable()]


def test_escapers():
    from chexpercept.escape import csv_cell, markdown_cell, terminal, terminal_lines

    assert terminal(EVIL) == SHOWN
    assert terminal("plain text, é and 中文") == "plain text, é and 中文"
    assert terminal("rtl \u202e override, \x85 NEL, \u2028 LS, \x9b CSI") == (
        "rtl \\u202e override, \\x85 NEL, \\u2028 LS, \\x9b CSI"
    )
    assert terminal_lines("line 1\nline \x1b[2J2") == "line 1\nline \\x1b[2J2"
    assert markdown_cell("a|b <i>[x](y)</i> `c` *d*") == "a\\|b \\<i\\>\\[x\\](y)\\</i\\> \\`c\\` \\*d\\*"
    for formula in ("=1+1", "+1+1", "-1+1", "@SUM(A1)", '=HYPERLINK("x")'):
        assert csv_cell(formula) == "'" + formula
    for number in ("-0.5", "+3", "12.5%", "-1e-05"):
        assert csv_cell(number) == number
    assert csv_cell(0.5) == 0.5 and csv_cell(None) is None


def test_run_folder_names_read_from_disk_are_shown_escaped(work, capsys):
    """Red team #14: a model folder named with control codes and a fake line (another account's, or a
    tampered copy) is printed escaped by `score` (its list of model folders) and by `report` (the
    "two runs" error naming both folders)."""
    runs = work / "runs"
    shutil.copytree(runs / "baseline-random", runs / ("m" + EVIL))
    assert cli(["score", str(runs), "--data-dir", str(work / "bundle")]) == 0
    captured = capsys.readouterr()
    inert(captured.out + captured.err)
    assert "scoring each of its 2 model folders" in captured.err and SHOWN in captured.err
    args = ["report", str(runs), "--data-dir", str(work / "bundle"), "--output-dir", str(work / "r")]
    assert cli([*args, "--bootstrap", "0", "--no-plots"]) == 2
    err = capsys.readouterr().err
    inert(err)
    assert "two runs of model" in err and SHOWN in err


def test_a_hub_error_body_and_endpoint_password_are_shown_escaped_and_redacted(tmp_path, monkeypatch, capsys):
    """Red team #14/#15: download-model quotes the Hub's error body (server text: control codes, a fake
    line, a key) escaped and redacted, and HF_ENDPOINT's user:password never."""
    import http.server
    import threading

    body = b'{"error": "bad \x1b[2J\nOK: 0 problems, bundle verified; api_key = \\"KEYSECRET\\""}'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = LocalServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://alice:s3cretpw@127.0.0.1:{server.server_address[1]}")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        rc = cli(["download-model", "org/tiny-vlm", "--cache-dir", str(tmp_path / "cache")])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert rc == 2, err
    inert(err)
    assert "s3cretpw" not in err and "alice" not in err and "KEYSECRET" not in err, err
    assert "http://***@127.0.0.1" in err and "\\nOK: 0 problems" in err, err


# ------------------------------------------------------------------ commands printed for pasting
#: a path a user may well have: a space, an ampersand, a quote, a dollar sign
AWKWARD = "my runs & Bob's $HOME copy"
#: a value read from the pattern below that is prose, not a command's word
PROSE = {("eval/runner/distributed.py", "what")}


def test_every_value_in_a_command_printed_for_pasting_goes_through_shell_word():
    """A command the toolkit prints for the user to paste (``all numbers: chexpercept score DIR
    --details``, ``chexpercept validate DIR``, ``--allowed-local-media-path DIR``) put a path with a
    space or ``&`` in raw, and the pasted command failed (new user, stop 45). Every value in such a
    command goes through ``escape.shell_word``: checked here line by line in the source, for the
    commands and flags a printed command starts with."""
    import re

    root = Path(__file__).resolve().parents[1]
    starts = (
        r"(?:\bchexpercept [a-z][a-z-]+ |eval/run\.py |accelerate launch |vllm serve |--allowed-local-media-path "
        r"|\bdf -[hi] |\bchmod [^ ]+ |\bls -l |\bquota -s )"
    )
    # a command runs to the end of its clause (a closing bracket, a comma, a semicolon)
    pattern = re.compile(starts + r"[^\"'(),;]*?\{(?!shell_word\()([^}]*)\}")
    raw = []
    for folder in ("eval", "chexpercept", "metrics", "builder"):
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if 'f"' in line or "f'" in line:
                    raw += [
                        f"{relative}:{number}: {{{m.group(1)}}}"
                        for m in pattern.finditer(line)
                        if (relative, m.group(1)) not in PROSE
                    ]
    assert not raw, "values put raw into printed commands:\n" + "\n".join(raw)


def _pasted(printed: str, start: str) -> list[str]:
    """The words a POSIX shell makes of the command that ``printed`` gives after ``start``."""
    import shlex

    line = next(x for x in printed.splitlines() if start in x)
    command = line[line.index(start) :].rstrip("`").split("`")[0]
    return shlex.split(command)


def test_a_printed_command_pasted_into_a_shell_names_the_awkward_path_whole(tmp_path, capsys):
    """The commands the toolkit prints, pasted into a shell, name a path with a space, ``&``, ``'``
    and ``$`` as one word, the path itself: the end of a run, inspect, make-tiny-model."""
    awkward = tmp_path / AWKWARD
    awkward.mkdir()
    bundle = write_fixture_bundle(awkward / "bundle")
    capsys.readouterr()
    assert run_main(["--data-dir", str(bundle), "--model", "baseline:prior", "--output-dir", str(awkward),
                     "--no-progress"]) == 0  # fmt: skip
    words = _pasted(capsys.readouterr().out, "chexpercept score ")
    assert words == ["chexpercept", "score", str(awkward / "baseline-prior"), "--details"], words
    assert cli(words[1:]) == 0
    capsys.readouterr()
    assert cli(["inspect", str(bundle)]) == 0
    assert _pasted(capsys.readouterr().out, "chexpercept validate ") == [
        "chexpercept",
        "validate",
        str(bundle),
    ]
    assert cli(["make-tiny-model", "--output-dir", str(awkward / "tiny")]) == 0
    words = _pasted(capsys.readouterr().out, "chexpercept run ")
    assert words[words.index("--model") + 1] == str(awkward / "tiny"), words


def test_an_operating_system_error_names_its_folder_as_one_word_in_its_commands(tmp_path, monkeypatch):
    """``free space there (df -h /x/my runs;x)`` and ``chmod u+rwx /x/my runs;x``: pasted, chmod
    acted on other paths and ran ``x`` (red team, stop 45). The commands of chexpercept.os_errors
    name their folder through shell_word."""
    import errno
    import os
    import shlex

    from chexpercept.os_errors import explain_os_error

    folder = tmp_path / "my runs;x"
    folder.mkdir()
    for code, command in ((errno.ENOSPC, "df -h "), (errno.EACCES, "chmod u+rwx ")):
        if code == errno.EACCES:
            folder.chmod(0o500)
        try:
            text = explain_os_error(OSError(code, os.strerror(code), str(folder / "results.jsonl")), folder)
        finally:
            folder.chmod(0o700)
        advice = text.advice
        assert command in advice, advice
        words = shlex.shlex(advice[advice.index(command) + len(command) :], posix=True)
        words.whitespace_split = True
        assert words.get_token().removesuffix(")") == str(folder), advice  # the bracket closes the aside
