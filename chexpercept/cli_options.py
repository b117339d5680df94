"""Command-line options that several commands share, so that one option means one thing everywhere.

The spellings: ``--data-dir`` is the release bundle (``load_dataset``'s ``data_dir``; ``validate`` and
``inspect`` also take it as their one positional argument), ``--output-dir`` the folder a command
writes, ``--output`` a single file it writes, ``--parse-mode`` how answers are read, ``--no-progress``
no progress bar. Earlier spellings (``--bundle``, ``--out``, ``--mode``) still work and print a
deprecation note on stderr.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any

from .errors import Refused
from .escape import terminal

PROGRESS_HELP = (
    "no progress display (by default a bar on stderr; whole lines every 30 s where stderr is a log)"
)
DATA_DIR_HELP = "folder of the release bundle (chexpercept.json + chexpercept/<key_id>/...)"


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new option's destination, with a note."""

    def __init__(self, option_strings: list[str], dest: str, replacement: str = "", **kwargs: Any):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(
            f"note: {option_string} is deprecated and will be removed; use {self.replacement}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_option(parser: Any, flag: str, *deprecated: str, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(flag, **kwargs)`` plus hidden ``deprecated`` spellings of the same option
    (same destination, type, choices and nargs) that print a deprecation note when used.

    argparse would demand the new spelling even when an old one is given, so a ``required`` option
    is checked by ``require`` after parsing instead."""
    if kwargs.pop("required", False):
        kwargs["help"] = f"{kwargs.get('help', '')} (required)".strip()
    action = parser.add_argument(flag, **kwargs)
    passed = {k: kwargs[k] for k in ("type", "choices", "nargs", "metavar") if k in kwargs}
    for old in deprecated:
        parser.add_argument(
            old,
            dest=action.dest,
            action=_DeprecatedAlias,
            replacement=flag,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
            **passed,
        )
    return action


def require(args: argparse.Namespace, prog: str, flag: str, *, dest: str | None = None) -> None:
    """Exit with status 2 and argparse's kind of message when ``flag`` (stored in ``dest``, by default
    its own name) was not given: argparse cannot require an option that has an old spelling."""
    dest = dest or flag.lstrip("-").replace("-", "_")
    if getattr(args, dest, None) in (None, ""):
        print(f"{prog}: error: the following arguments are required: {flag}", file=sys.stderr)
        raise SystemExit(2)


def add_progress_option(parser: Any, *, default: Any = False) -> None:
    """``--no-progress`` on ``parser`` (a parser or an argument group); ``default=None`` for commands
    that merge their options with a config file."""
    parser.add_argument("--no-progress", action="store_true", default=default, help=PROGRESS_HELP)


def progress_enabled(args: argparse.Namespace | dict[str, Any]) -> bool:
    """True unless ``--no-progress`` was given."""
    value = args.get("no_progress") if isinstance(args, dict) else getattr(args, "no_progress", False)
    return not value


def add_data_dir_option(
    parser: Any, *, help: str = DATA_DIR_HELP, positional: bool = False, **kwargs: Any
) -> None:
    """``--data-dir DIR`` (old spelling ``--bundle``); ``positional=True`` also accepts it as the
    command's one positional argument (``chexpercept validate DIR``). Read it with ``data_dir_of``."""
    if positional:
        parser.add_argument("data_dir_positional", nargs="?", metavar="DATA_DIR", help=help)
    add_option(parser, "--data-dir", "--bundle", metavar="DIR", help=help, **kwargs)


def data_dir_of(args: argparse.Namespace, parser_name: str = "chexpercept") -> str | None:
    """The bundle folder given as ``--data-dir`` or positionally (both: they must agree); None, with
    the error printed, when neither was given."""
    flag = getattr(args, "data_dir", None)
    positional = getattr(args, "data_dir_positional", None)
    if flag and positional and flag != positional:
        raise SystemExit(
            f"{parser_name}: error: two bundle folders given ({positional} and --data-dir {flag})"
        )
    if not (flag or positional):
        print(
            f"{parser_name}: error: the bundle folder is required (DATA_DIR or --data-dir)", file=sys.stderr
        )
    return flag or positional


def write_output(path: str | os.PathLike[str] | None, text: str) -> None:
    """``--output FILE``: write ``text`` there (creating its folder) and say so on stderr; without
    a path, or ``-``, or a name of this process's standard output (``/dev/stdout``,
    ``/proc/self/fd/1``), print it on stdout. FILE is taken as a shell's ``>`` takes it
    (``output_file``)."""
    target = output_file(path) if path is not None else None
    if target is None:
        sys.stdout.write(text)
        return
    from .fileio import write_atomic

    write_atomic(target, text)
    print(f"wrote {path}", file=sys.stderr)


def output_file(path: str | os.PathLike[str]) -> str | None:
    """Where ``--output FILE`` writes: None for standard output (``-``, or a name of the very file
    descriptor 1 is: ``/dev/stdout``, ``/dev/fd/1``); a link followed to the file it names (a link
    to a folder is then refused as the folder is), so that the file is written and the link kept;
    a device or a pipe as it is (``chexpercept.fileio.write_atomic`` writes into it). Replacing a
    link turned ``--output /dev/stdout`` into a file in /dev as root, and left the file a link named
    untouched. Raises ValueError for an empty name or a folder that does not exist
    (``_require_folder``), and ``chexpercept.errors.Refused`` for a file inside a run's folder or a
    release (``refuse_inside_ours``)."""
    name = os.fspath(path)
    if name == "-":
        return None
    if not name:
        raise ValueError("--output: an empty file name")
    refuse_foreign_way(name)
    try:
        st, out = os.stat(name), os.fstat(1)
    except OSError:  # missing, or stdout closed: the name as it is (a dangling link: its target)
        target = refuse_inside_ours(os.path.realpath(name), name)
        _require_folder(name)  # the name as the kernel reads it (nodir/.. needs nodir)
        if target is not None and target != name:
            _require_folder(target)  # a dangling link's target
        return target
    if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return refuse_inside_ours(os.path.realpath(name), name)
    return name


def _require_folder(name: str) -> None:
    """ValueError unless the folder ``name`` would be written in exists: a file is written only into
    a folder that does, as a shell's ``>`` writes it (a typo made a tree of folders; red team, stop 44)."""
    folder = os.path.dirname(name) or "."  # as the kernel reads it: nodir/.. needs nodir
    if os.path.isdir(folder):
        return
    parts = folder.split(os.sep)
    for n in range(1, len(parts) + 1):  # the first part of the way that is not a folder
        way = os.sep.join(parts[:n]) or os.sep
        if not os.path.isdir(way):
            break
    what = "is a file, not a folder" if os.path.lexists(way) else "does not exist"
    raise ValueError(
        f"{terminal(name)}: {terminal(way)} {what} (a file is written only into a folder that exists, as a "
        "shell's > writes it); make the folder first, or give another file"
    )


def _trusted(uid: int) -> bool:
    """Whether an output may go through a link or into a special file of account ``uid``: this
    account's, and the system's (``/dev/stdout`` is root's link to this process's own descriptor,
    ``/dev/null`` root's device)."""
    return uid in (os.geteuid(), 0)


def refuse_foreign_way(given: str) -> None:
    """``OutputRefused`` when the way to ``given`` goes through a link of another account (any
    component, links followed one by one, as the kernel would), or ends at a pipe, device or socket of
    another account: ``--output /tmp/shared/scores.json`` wrote the scores into another account's
    FIFO, which its reader kept, and through a link another account had planted in a shared folder
    onto a file of this account's (red team, stop 43). ``os.path.realpath`` follows links without
    asking whose they are, so they are walked here."""
    # the path as given, never normalised first: ``link/..`` is the folder above the link's target,
    # as the kernel reads it (os.path.abspath dropped both, and the link was never asked about)
    start = os.sep if os.path.isabs(given) else os.getcwd()
    pending = list(reversed(given.split(os.sep)))
    current, hops = start, 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except OSError:  # not there yet (the file to be made), or not ours to look at: left to the writer
            return
        if stat.S_ISLNK(info.st_mode):
            if not _trusted(info.st_uid):
                raise OutputRefused.of(given, f"{terminal(candidate)} is a link of another account "
                                       f"({_owner(info.st_uid)}), which decides where the output goes; "
                                       "write it elsewhere")  # fmt: skip
            hops += 1
            if hops > 40:  # a loop: the writer says so
                return
            target = os.readlink(candidate)
            pending.extend(reversed(target.split(os.sep)))
            if os.path.isabs(target):
                current = os.sep
            continue
        current = candidate
        special = not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode))
        if not pending and special and not _trusted(info.st_uid):
            raise OutputRefused.of(
                given,
                f"{terminal(candidate)} is a pipe, device or socket of another account "
                f"({_owner(info.st_uid)}), which would receive the output; write it elsewhere",
            )


def _owner(uid: int) -> str:
    from .fileio import owner_name

    return owner_name(uid)


class OutputRefused(Refused):
    """``--output FILE`` names a file inside what a run or a release owns (``refuse_inside_ours``):
    ``problem`` says what, for argparse's line (``output_argument``); the message (``--output FILE:
    problem``) names the option too, for a caller that writes outside argparse. Made as any
    ``Refused`` is, from its message alone, ``problem`` is the message."""

    def __init__(self, message: str, problem: str | None = None) -> None:
        self.problem = message if problem is None else problem
        super().__init__(message)

    @classmethod
    def of(cls, given: str, problem: str) -> OutputRefused:
        return cls(f"--output {terminal(given)}: {problem}", problem)


def refuse_inside_ours(target: str, given: str) -> str:
    """``target`` (a resolved path ``--output`` names as ``given``) unless it, or the name as given,
    lies inside a run's settings folder (``oracle_*``, or a folder holding ``run.json`` or
    ``results.jsonl``), a model's folder (one holding ``oracle_*`` folders or their settings lock) or
    a release bundle (a folder holding ``chexpercept.json`` and ``chexpercept/``), at any depth: there
    a single output file replaced a run's results (``score --output RUN/oracle_implicit/results.jsonl``,
    through a link too, or a link that the run's own results file is), its lock, or a release's files.
    Raises ``OutputRefused``."""
    from .results import RUN_FILE_NAMES

    for path in dict.fromkeys((target, os.path.abspath(given))):
        if os.path.basename(path) in RUN_FILE_NAMES:  # beside model folders, read as a run's own
            raise OutputRefused.of(
                given,
                f"{os.path.basename(path)} is the name of a run's own file, which score and run read "
                "wherever it is; write the output elsewhere",
            )
        up = os.path.dirname(path)
        while True:
            what = _ours(up, holds_the_file=up == os.path.dirname(path))
            if what:
                raise OutputRefused.of(given, f"{terminal(up)} is {what}; write the output elsewhere")
            parent = os.path.dirname(up)
            if parent == up:
                break
            up = parent
    return target


def _ours(folder: str, *, holds_the_file: bool) -> str | None:
    """What ``folder`` (the file's own folder, or one above it) is to the toolkit, in words, when a
    single output file must stay out of it: a run's folder by its name at any depth, by its files
    or a model's folder where the file would be; a release at any depth."""
    import glob

    from .bundle import JSON_NAME
    from .results import RESULTS_NAME, RUN_NAME, SETTINGS_LOCK_NAME

    if os.path.basename(folder).startswith("oracle_") or (
        holds_the_file and any(os.path.lexists(os.path.join(folder, n)) for n in (RUN_NAME, RESULTS_NAME))
    ):
        return "a run's folder, whose files score and resume read"
    if os.path.lexists(os.path.join(folder, SETTINGS_LOCK_NAME)) or (
        holds_the_file
        and any(os.path.isdir(p) for p in glob.glob(os.path.join(glob.escape(folder), "oracle_*")))
    ):
        return "a model's folder of runs, which score and run read"
    if os.path.isfile(os.path.join(folder, JSON_NAME)) and os.path.isdir(os.path.join(folder, "chexpercept")):
        return "a release bundle, whose files are checked against its checksums"
    return None


def add_output_option(parser: Any, *deprecated: str, help: str) -> None:
    """``--output FILE`` (every command that writes one file): checked as it is parsed
    (``output_argument``), so a file a run or a release owns is refused before any work."""
    add_option(parser, "--output", *deprecated, metavar="FILE", type=output_argument, help=help)


def output_argument(text: str) -> str:
    """argparse's type of ``--output``: the name as given, unless it names a file inside a run's
    folder or a release (``refuse_inside_ours``): then ArgumentTypeError, before any work."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name")
    try:
        output_file(text)
    except OutputRefused as e:
        raise argparse.ArgumentTypeError(e.problem) from None
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_output_dir_option(parser: Any, *, help: str, **kwargs: Any) -> None:
    """``--output-dir DIR`` (old spelling ``--out``)."""
    add_option(parser, "--output-dir", "--out", metavar="DIR", help=help, **kwargs)


#: the help of ``--parse-mode`` for the commands that score runs (``made``)
SCORED_AS_MADE = (
    "answer parsing (default: the mode the runs were made with, as run.json records it, else reference; "
    "another mode over an oracle run's recorded one is a WARNING: its oracle acted on the recorded mode)"
)


def add_parse_mode_option(
    parser: Any, *, help: str = SCORED_AS_MADE, made: bool = True, **kwargs: Any
) -> None:
    """``--parse-mode reference|strict`` (old spelling ``--mode``). ``made``: for the commands that
    score runs, the default is None, the mode each run was made with
    (``metrics.model_scores.run_parse_mode``); else (a run's own setting) reference."""
    from .answers import PARSE_MODES

    default = None if made else "reference"
    add_option(parser, "--parse-mode", "--mode", choices=PARSE_MODES, default=default, help=help, **kwargs)


def add_decoding_override_options(parser: Any) -> None:
    """``--greedy`` / ``--sampled`` (dest ``greedy``: True, False, or None when neither is given): how
    the runs were decoded, where run.json does not say (a loop of one's own writes no run.json); over
    a recorded value a WARNING. Greedy decoding lets End-to-End be read from an oracle run."""
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument(
        "--greedy",
        dest="greedy",
        action="store_true",
        default=None,
        help="decoding was greedy (if not recorded; over a recorded one: a WARNING)",
    )
    decoding.add_argument("--sampled", dest="greedy", action="store_false", help="decoding was sampled")


class CommandParser(argparse.ArgumentParser):
    """The parser of every command (``chexpercept <command>``, ``eval/run.py``): an option is
    spelled whole (``--max-token`` is not taken for ``--max-tokens``: an abbreviation that means
    one option today may mean another when an option is added), and a mistake is two lines, what
    is wrong and where to read more, with the nearest options for an unknown one (not the whole
    usage, which for ``run`` is a page)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.check_number_domains()
        return super().parse_known_args(args, namespace)

    def check_number_domains(self) -> None:
        """TypeError when an option of this parser takes a bare ``int`` or ``float``: every number
        option declares its domain (``type=chexpercept.domains.COUNT``...), so a value outside it
        is refused in one line before any work (``--seed -1``, ``--level nan``, ``--num-proc 0``)."""
        bare = ["/".join(a.option_strings) or a.dest for a in self._actions if a.type in (int, float)]
        if bare:
            raise TypeError(
                f"{self.prog}: {', '.join(bare)} take(s) a bare int or float: give a domain from "
                "chexpercept.domains as its type"
            )

    def error(self, message: str) -> Any:  # argparse's hook; it must not return
        import difflib
        import re

        unknown = re.findall(r"(?:unrecognized arguments|ambiguous option): (\S+)", message)
        # the spellings --help shows: an earlier one (--bundle) still works, but is never suggested
        spelled = [
            s
            for a in self._actions
            if a.help != argparse.SUPPRESS
            for s in a.option_strings
            if s.startswith("--")
        ]
        near = difflib.get_close_matches(unknown[0].split("=", 1)[0], spelled, n=3) if unknown else []
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\nRun '{self.prog} --help' for its options.\n")
