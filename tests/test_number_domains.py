"""Every number a command takes lies in its domain, declared once at the option (chexpercept/domains.py).

The rule: a number option's type is a ``Domain``, never a bare int or float (``CommandParser``
refuses one), so a value outside it ends the command with status 2 and one line naming the option,
before any work. The same domain checks what arrives another way (``generate --config``, a backend's
typed options, the Python API). Members found (stop 42), each below: ``synth``/``synth-sources
--num-proc 0`` ran; ``run --seed -1`` and a 24-digit seed ran; ``make-tiny-model --seed -1`` ran;
``score --intervals --level 1e-300`` divided by zero; ``power --difference 1e-300`` overflowed, its
``--alpha 1e-300`` was refused as "level ... got 1.0" and ``--tests 2147483647`` overflowed;
``estimate --tokens-per-second nan|inf|-3`` and ``--answer-tokens -3`` were taken;
``review --port 70000`` and ``--annotators 0`` reached the server; ``--num-proc 0`` in a
``generate --config`` file ran.
"""

from __future__ import annotations

import argparse
import math

import pytest

from chexpercept.cli import command_parsers
from chexpercept.cli import main as cli
from chexpercept.cli_options import CommandParser
from chexpercept.domains import COUNT, LEVEL, PROCESSES, SEED, SHARE, Domain, whole


def test_every_number_option_of_every_command_declares_its_domain():
    numbers = {}
    for prog, parser in command_parsers().items():
        parser.check_number_domains()  # what every parse does first
        for action in parser._actions:
            assert action.type not in (int, float), (prog, action.option_strings)
            if isinstance(action.type, Domain):
                numbers[(prog, action.option_strings[0])] = action.type
    # not vacuous: the options this rule was written for are among them, with their domains
    assert numbers[("eval/run.py", "--seed")] == SEED
    assert numbers[("eval/run.py", "--top-p")] == SHARE
    assert numbers[("eval/run.py", "--concurrency")] == COUNT  # a backend's typed option
    assert numbers[("chexpercept synth", "--num-proc")] == PROCESSES
    assert numbers[("chexpercept score", "--level")] == LEVEL
    assert len(numbers) >= 40, sorted(numbers)


def test_a_bare_number_option_is_a_programming_error_at_the_first_parse():
    parser = CommandParser(prog="chexpercept x")
    parser.add_argument_group("g").add_argument("--n", type=int)
    with pytest.raises(TypeError, match="--n take.s. a bare int or float"):
        parser.parse_args(["--n", "1"])


OUTSIDE = [
    (["synth", "--output-dir", "OUT", "--num-proc", "0"], "--num-proc"),
    (["synth-sources", "--output-dir", "OUT", "--num-proc", "0"], "--num-proc"),
    (["synth-sources", "--output-dir", "OUT", "--seed", "-1"], "--seed"),
    (["generate", "--output-dir", "OUT", "--per-cell", "1", "--num-proc", "0"], "--num-proc"),
    (["make-tiny-model", "--output-dir", "OUT", "--seed", "-1"], "--seed"),
    (["score", "OUT", "--intervals", "--level", "1e-300"], "--level"),
    (["score", "OUT", "--level", "nan"], "--level"),
    (["score", "OUT", "--level", "1"], "--level"),
    (["power", "--difference", "1e-300"], "--difference"),
    (["power", "--difference", "nan"], "--difference"),
    (["power", "--alpha", "1e-300"], "--alpha"),
    (["power", "--tests", "2147483647"], "--tests"),
    (["power", "--per-cell", "1"], "--per-cell"),
    (["power", "--power", "1"], "--power"),
    (["estimate", "--model", "gpt-5.4", "--tokens-per-second", "nan"], "--tokens-per-second"),
    (["estimate", "--model", "gpt-5.4", "--tokens-per-second", "inf"], "--tokens-per-second"),
    (["estimate", "--model", "gpt-5.4", "--tokens-per-second", "-3"], "--tokens-per-second"),
    (["estimate", "--model", "gpt-5.4", "--answer-tokens", "-3"], "--answer-tokens"),
    (["review", "--port", "70000"], "--port"),
    (["review", "--annotators", "0"], "--annotators"),
    (["report", "--results", "OUT", "--bootstrap", "-1"], "--bootstrap"),
    (["inspect", "OUT", "--num-proc", "0"], "--num-proc"),
    (["run", "--model", "baseline:random", "--seed", "-1"], "--seed"),
    (["run", "--model", "baseline:random", "--seed", "1" + "0" * 23], "--seed"),
    (["run", "--model", "baseline:random", "--limit", "0"], "--limit"),
    (["run", "--model", "baseline:random", "--per-cell", "1.5"], "--per-cell"),
    (["run", "--model", "gpt-5.4", "--timeout", "inf"], "--timeout"),
    (["run", "--model", "gpt-5.4", "--max-retries", "-1"], "--max-retries"),
    (["run", "--model", "gpt-5.4", "--max-tokens", "2147483648"], "--max-tokens"),
    (["run", "--model", "baseline:random", "--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    # red team (stop 42): inside the first domains, yet a traceback, a hang or nonsense
    (["synth", "--output-dir", "OUT", "--num-proc", "2147483647"], "--num-proc"),  # OverflowError
    (["review", "--annotators", "2147483647", "--prepare-only"], "--annotators"),  # hung
    (["run", "--model", "baseline:random", "--turn-cache-gib", "1e300"], "--turn-cache-gib"),  # overflow
    (["power", "--power", "0.02"], "--power"),  # a negative detectable difference
    (["estimate", "--model", "gpt-5.4", "--tokens-per-second", "1e-320"], "--tokens-per-second"),  # inf days
]


@pytest.mark.parametrize("argv,option", OUTSIDE, ids=[" ".join(a) for a, _ in OUTSIDE])
def test_a_number_outside_its_options_domain_is_one_line_before_any_work(tmp_path, capsys, argv, option):
    out = tmp_path / "out"
    argv = [str(out) if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit) as stopped:
        cli(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert f"argument {option}: must be " in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 2, err  # the problem, and where to read more
    assert not out.exists()


def test_a_number_outside_its_domain_in_a_generate_config_file_is_refused(tmp_path, capsys):
    """--config values never pass through argparse: GenerateConfig.check holds the same domains."""
    for line, message in (("num_proc: 0", "--num-proc must be a whole number from 1"),
                          ("seed: -1", "--seed must be a whole number from 0"),
                          ("per_cell: 0", "--per-cell must be a whole number from 1")):  # fmt: skip
        config = tmp_path / "c.yaml"
        config.write_text(f"{line}\nper_cell: 1\n" if "per_cell" not in line else f"{line}\n")
        out = tmp_path / "out"
        assert cli(["generate", "--config", str(config), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("chexpercept generate: ") and message in err, err
        assert not out.exists()


@pytest.mark.parametrize("text", ["1_0", "+3", "\u0663", "0x10", "1e3", "3.0", "3 4"])
def test_a_whole_number_is_taken_only_as_it_reads(text):
    """``--per-cell 1_0`` ran 10 cases per cell and ``+3`` or an Arabic-Indic digit passed as numbers
    (Python's int() reads them): a whole number is decimal digits, a minus sign at most."""
    with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number"):
        COUNT(text)


@pytest.mark.parametrize("text", ["1_0.5", "+0.5", "nan", "infinity", "0x1p-2", "\u0660.5", "0.5.1"])
def test_a_real_number_is_taken_only_as_it_reads(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a"):
        SHARE(text)


def test_the_spellings_a_command_line_takes():
    assert [COUNT(t) for t in ("1", "0010", "2147483647", " 3 ")] == [1, 10, 2147483647, 3]
    assert [SHARE(t) for t in ("0.5", ".5", "1.", "5e-1", "1E-3")] == [0.5, 0.5, 1.0, 0.5, 0.001]


def test_a_config_file_reads_numbers_and_switches_as_they_are_spelled(tmp_path, capsys):
    """YAML 1.1, PyYAML's default, read ``seed: 12:30`` as 750, ``per_cell: 1_0`` as 10, ``seed: 0x10``
    as 16 and ``progress: off`` as false: ``generate --config`` now reads them as strings (YAML 1.2's
    core schema), which the config's check names."""
    for line in ("seed: 12:30", "per_cell: 1_0", "seed: 0x10", "seed: +3", "progress: off", "progress: no"):
        config = tmp_path / "c.yaml"
        config.write_text(f"{line}\nper_cell: 1\n" if "per_cell" not in line else f"{line}\n")
        out = tmp_path / "out"
        assert cli(["generate", "--config", str(config), "--output-dir", str(out)]) == 2, line
        err = capsys.readouterr().err
        key = line.split(":")[0].replace("_", "-")
        assert err.startswith("chexpercept generate: ") and f"--{key}" in err and "Traceback" not in err, err
        assert not out.exists()


def test_a_generate_config_file_says_each_setting_once(tmp_path, capsys):
    """``progress: false`` ended in a traceback; ``per-cell`` beside ``per_cell`` (or ``out`` beside
    ``output_dir``) let one silently win (red team, stop 42)."""
    for text, message in (("per_cell: 1\nper-cell: 2\n", "per-cell is given twice"),
                          ("per_cell: 1\nout: a\noutput_dir: b\n", "out is given twice")):  # fmt: skip
        config = tmp_path / "c.yaml"
        config.write_text(text)
        assert cli(["generate", "--config", str(config)]) == 2
        assert message in capsys.readouterr().err
    config.write_text(f"per_cell: 1\nprogress: false\noutput_dir: {tmp_path / 'out'}\n")
    assert cli(["generate", "--config", str(config)]) == 2  # no sources given: refused, not a traceback
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--mimic-cxr-jpg" in err, err


def test_power_refuses_a_discordance_below_the_difference(capsys):
    """--discordance 0.01 --difference 5 claimed 34 cases detect 5 pp: two models that differ on 1% of
    the cases cannot differ by 5 pp (red team, stop 42)."""
    assert cli(["power", "--discordance", "0.01", "--difference", "5"]) == 2
    assert "cannot differ by --difference 5 pp" in capsys.readouterr().err
    assert cli(["power", "--discordance", "0.05", "--difference", "5"]) == 0


def test_the_python_api_checks_the_same_domains():
    from chexpercept.builder.rng import derive
    from chexpercept.builder.synth_sources import synthesize_sources
    from chexpercept.eval.runner.selection import select_cases
    from chexpercept.metrics.inference import cases_needed, detectable_difference

    with pytest.raises(ValueError, match="--per-cell must be a whole number from 1"):
        select_cases([], per_cell=0)
    with pytest.raises(ValueError, match="--limit must be a whole number from 1"):
        select_cases([], limit=True)  # a bool is not a count
    with pytest.raises(ValueError, match="seed must be a whole number from 0 to 4294967295"):
        derive(-1, "x")
    with pytest.raises(ValueError, match="num_proc must be a whole number from 1"):
        synthesize_sources("never-written", num_proc=0)
    with pytest.raises(ValueError, match="level must be a number at least 0.5"):
        detectable_difference(0.01, 100, level=1e-300)
    with pytest.raises(ValueError, match="tests must be a whole number from 1 to 1000"):
        cases_needed(0.5, 0.05, cells=6, tests=10**9)
    with pytest.raises(ValueError, match="power must be a number at least 0.5"):
        cases_needed(0.5, 0.05, cells=6, power=math.nan)
    for bad in ({"sd": -1.0}, {"difference": math.nan}, {"cells": -3}):  # red team: 2, an error, 787
        with pytest.raises(ValueError, match="must be"):
            cases_needed(**{"sd": 0.5, "difference": 0.05, "cells": 6, **bad})
    with pytest.raises(ValueError, match="se must be"):
        detectable_difference(-1.0, 10)  # was -3.1
    with pytest.raises(ValueError, match="df must be above 0"):
        detectable_difference(0.1, 0)  # was nan


def test_a_domain_takes_exactly_its_numbers():
    count = whole(1, 5)
    assert [count.contains(v) for v in (1, 5, 0, 6, 2.0, True, "3", None)] == [True, True] + [False] * 6
    assert count("5") == 5 and count.describe() == "a whole number from 1 to 5"
    for text in ("0", "6", "1.0", "x", "", "1" * 5000):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number from 1 to 5"):
            count(text)
    assert [SHARE.contains(v) for v in (1.0, 1e-300, 0.0, 1.0000001, math.nan, math.inf)] == [
        True, True, False, False, False, False,
    ]  # fmt: skip
    assert LEVEL("0.95") == 0.95 and SHARE(" 0.5 ") == 0.5
    for text in ("nan", "inf", "-inf", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError):
            SHARE(text)
    with pytest.raises(ValueError, match=r"--top-p must be a number above 0 and at most 1, got 2"):
        SHARE.require(2, "--top-p")
