"""Phantom sources that always fill their cells, and one progress option for every long command
(issue: field cases, "Also")."""

from __future__ import annotations

import argparse
import importlib
import json

import pytest

from chexpercept.cli import all_commands
from chexpercept.cli import main as cli
from chexpercept.cli_options import PROGRESS_HELP


@pytest.mark.slow
def test_seed_2_sources_fill_every_cell_although_a_candidate_is_rejected(tmp_path, capsys):
    """The issue's commands: synth-sources --per-cell 1 --seed 2, then generate --per-cell 1."""
    src = tmp_path / "src"
    assert (
        cli(["synth-sources", "--output-dir", str(src), "--per-cell", "1", "--seed", "2", "--no-progress"])
        == 0
    )
    out = tmp_path / "bundle"
    rc = cli(
        [
            "generate",
            *("--mimic-cxr-jpg", str(src / "mimic-cxr-jpg"), "--mimic-ils", str(src / "mimic-ils")),
            *(
                "--anatomy",
                str(src / "anatomy"),
                "--output-dir",
                str(out),
                "--per-cell",
                "1",
                "--no-progress",
            ),
        ]
    )
    summary = capsys.readouterr().out
    assert rc == 0, summary
    assert "SHORT" not in summary and "1 candidate(s) rejected and replaced" in summary
    entries = json.loads((out / "chexpercept.json").read_text())
    assert len(entries) == 21


def test_positive_spares_are_per_cell():
    from chexpercept.builder.synth_sources import spare, study_specs

    for per_cell in (1, 2, 5):
        specs = study_specs(per_cell, seed=0, lesions=("atelectasis",))
        positives = sum(s.positive for s in specs)
        # dealt alternately to RR and RF: each cell gets per_cell + spare candidates
        assert positives == 2 * (per_cell + spare(per_cell))
        assert len(specs) - positives == per_cell + spare(per_cell)


def test_no_progress_means_the_same_on_every_command_with_long_work():
    commands = all_commands()
    with_option = []
    for name, (module_name, _) in commands.items():
        parser = argparse.ArgumentParser(prog=name)
        importlib.import_module(module_name).configure(parser)
        actions = {a.dest: a for a in parser._actions}
        if "no_progress" in actions:
            assert actions["no_progress"].help == PROGRESS_HELP, name
            with_option.append(name)
    assert {"synth", "synth-sources", "generate", "run"} <= set(with_option)


@pytest.mark.parametrize(
    ("old", "new", "dest"),
    [
        ("--bundle", "--data-dir", "data_dir"),
        ("--mode", "--parse-mode", "parse_mode"),
        ("--out", "--output", "output"),
    ],
)
def test_score_accepts_old_spellings_with_a_deprecation_note(capsys, old, new, dest):
    import argparse

    from chexpercept.metrics.cmd_score import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    value = "strict" if dest == "parse_mode" else "somewhere"
    args = parser.parse_args(["run_dir", old, value])
    assert getattr(args, dest) == value
    assert f"{old} is deprecated and will be removed; use {new}" in capsys.readouterr().err
    # the new spelling: same destination, no note; the old one is not listed in --help
    assert getattr(parser.parse_args(["run_dir", new, value]), dest) == value
    assert capsys.readouterr().err == ""
    assert old + " " not in parser.format_help()


def test_validate_takes_the_bundle_positionally_or_as_data_dir(tmp_path, capsys):
    from chexpercept.cli import main
    from chexpercept.testing import write_fixture_bundle

    bundle = str(write_fixture_bundle(tmp_path / "b", per_cell=1))
    assert main(["validate", bundle]) == 0
    assert main(["validate", "--data-dir", bundle]) == 0
    assert main(["validate"]) == 2
    assert "DATA_DIR or --data-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", bundle, "--data-dir", str(tmp_path)])


@pytest.mark.parametrize(
    ("command", "module", "dest"),
    [
        ("report", "chexpercept.metrics.report.command", "output_dir"),
        ("generate", "chexpercept.builder.cmd_generate", "out"),
        ("synth-sources", "chexpercept.builder.cmd_synth_sources", "out"),
        ("synth", "chexpercept.builder.cmd_synth", "out"),
        ("make-tiny-model", "chexpercept.eval.cmd_make_tiny_model", "output_dir"),
    ],
)
def test_output_folder_is_output_dir_everywhere_and_out_still_works(capsys, command, module, dest):
    parser = argparse.ArgumentParser(prog=f"chexpercept {command}")
    importlib.import_module(module).configure(parser)
    base = ["--results", "runs"] if command == "report" else []
    assert getattr(parser.parse_args([*base, "--output-dir", "somewhere"]), dest) == "somewhere"
    assert capsys.readouterr().err == ""
    assert getattr(parser.parse_args([*base, "--out", "somewhere"]), dest) == "somewhere"
    assert "--out is deprecated and will be removed; use --output-dir" in capsys.readouterr().err
    assert "--output-dir" in parser.format_help() and "--out " not in parser.format_help()


def _refusals() -> list[type]:
    """Every class of the toolkit's deliberate refusals (chexpercept.errors.Refused), found by
    importing the modules that define them: a new one is covered without editing this test."""
    from chexpercept.errors import Refused

    for module in (
        "chexpercept.peer",
        "chexpercept.fileio",
        "chexpercept.eval.harnesses.inspect_ai.rules",
        "chexpercept.metrics.hub.guard",
        "chexpercept.metrics.hub.names",
        "chexpercept.metrics.hub.numbers",
    ):
        try:
            importlib.import_module(module)
        except ImportError:  # collected in an environment without a harness (scripts/test.sh's others)
            continue
    found, todo = [], [Refused]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


@pytest.mark.parametrize("refusal", _refusals(), ids=lambda c: c.__name__)
def test_every_refusal_ends_a_command_with_one_line(refusal, monkeypatch, capsys):
    """A refusal raised in any command (another account's server or folder, a name that may not be
    published...) is one line on stderr and exit status 2, never a traceback; its text is escaped."""
    module = importlib.import_module(all_commands()["score"][0])

    def refuse(args):
        raise refusal("refused: port 8000 belongs to account 'mallory'\x1b[2J; use --dua-compliant-endpoint")

    monkeypatch.setattr(module, "run", refuse)
    assert cli(["score", "somewhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chexpercept score: refused: port 8000") and err.count("\n") == 1, err
    assert "\x1b" not in err and "mallory" in err


@pytest.mark.parametrize("command", sorted(all_commands()))
def test_a_mistyped_or_shortened_option_is_two_lines_with_the_nearest(command, capsys):
    """New user: ``--max-token`` was taken for ``--max-tokens`` (an abbreviation), and a mistyped
    option printed the whole usage (a page for ``run``). Every command refuses both in two lines."""
    with pytest.raises(SystemExit) as e:
        cli([command, "--outptu-dir", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 2, err
    assert "usage:" not in err and f"Run 'chexpercept {command} --help'" in err


def test_an_abbreviated_option_is_refused_on_run_too(capsys):
    from chexpercept.eval.run import main as run_main

    with pytest.raises(SystemExit):
        run_main(["--data-dir", "x", "--model", "baseline:random", "--max-token", "3"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --max-token" in err and "did you mean --max-tokens" in err
