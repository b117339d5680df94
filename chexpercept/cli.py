"""The ``chexpercept`` command line: one entry point, subcommands contributed by each package.

Each package (the shared core, builder, metrics, eval) lists its subcommands in a ``COMMANDS``
dict ``name -> (module, one-line help)``; a command's module has ``configure(parser)`` and
``run(args) -> int``. Modules are imported only when their command runs, so ``chexpercept --help``
stays fast and heavy dependencies stay optional. An operating-system error that a command does not
handle itself ends in one line naming its real cause (chexpercept.os_errors), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .cli_options import CommandParser
from .entry_point import program_started, run_program, start_program, stop_name
from .errors import Refused
from .escape import terminal
from .extras import say_missing

_COMMAND_TABLES = (
    "chexpercept.commands",
    "chexpercept.builder.commands",
    "chexpercept.metrics.commands",
    "chexpercept.eval.commands",
)


def all_commands() -> dict[str, tuple[str, str]]:
    commands: dict[str, tuple[str, str]] = {}
    for table in _COMMAND_TABLES:
        for name, spec in importlib.import_module(table).COMMANDS.items():
            if name in commands:
                raise RuntimeError(f"command {name!r} is defined twice ({table})")
            commands[name] = spec
    return dict(sorted(commands.items()))


def command_parsers() -> dict[str, CommandParser]:
    """Every command's parser as its command builds it, by program name (``chexpercept score``...,
    and ``eval/run.py``): what the tests of rules over all options walk (number domains, --output)."""
    parsers = {}
    for name, (module_name, help_) in all_commands().items():
        parser = CommandParser(prog=f"chexpercept {name}", description=help_)
        importlib.import_module(module_name).configure(parser)
        parsers[f"chexpercept {name}"] = parser
    from chexpercept.eval.run import configure

    parser = CommandParser(prog="eval/run.py")
    configure(parser)
    parsers["eval/run.py"] = parser
    return parsers


def _usage(commands: dict[str, tuple[str, str]]) -> str:
    width = max((len(n) for n in commands), default=10)
    lines = [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in commands.items()]
    return (
        "usage: chexpercept <command> [options]\n\n"
        "Load, regenerate and evaluate the CheXpercept benchmark.\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\nRun 'chexpercept <command> --help' for a command's options."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The ``chexpercept`` command (``argv`` None: this process's arguments, as the program) or, given
    ``argv``, one command called in-process, which changes nothing of the caller's process."""
    if argv is None:  # the program itself: chexpercept/entry_point.py
        named = len(sys.argv) > 1 and not sys.argv[1].startswith("-")  # a command, not --help
        start_program(f"chexpercept {sys.argv[1]}" if named else "chexpercept")
        return run_program(lambda: _command(sys.argv[1:]))
    return _command(list(argv))


def _command(argv: list[str]) -> int:
    commands = all_commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(commands))
        return 0
    if argv[0] in ("-V", "--version"):
        from chexpercept import __version__

        print(f"chexpercept {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"chexpercept: unknown command {name!r}\n\n{_usage(commands)}", file=sys.stderr)
        return 2
    module_name, help_ = commands[name]
    try:  # the command's libraries load, its options are declared (imports too)
        module = importlib.import_module(module_name)
        parser = CommandParser(prog=f"chexpercept {name}", description=help_)
        module.configure(parser)
    except KeyboardInterrupt as e:  # Ctrl-C while starting, in-process: one line, not a traceback
        how, status = stop_name(e)
        print(f"chexpercept {name}: stopped by {how} while starting; nothing was done", file=sys.stderr)
        return status
    except ModuleNotFoundError as e:  # a package this install lacks: which extra brings it
        return say_missing(f"chexpercept {name}", e)
    args = parser.parse_args(rest)
    program_started()  # the program: SIGTERM and SIGHUP now end the command as Ctrl-C does
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt as e:  # a command without signal handling of its own (run has its own)
        how, status = stop_name(e)
        print(f"chexpercept {name}: stopped by {how}", file=sys.stderr)
        return status
    except Refused as e:  # refused on purpose (another account's server or folder...): its one line
        print(f"chexpercept {name}: {terminal(str(e))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # a package this install lacks: which extra brings it
        return say_missing(f"chexpercept {name}", e)
    except OSError as e:  # the system's (a full disk, a folder of another user): its real cause named
        if e.errno is None:
            raise
        from .os_errors import explain_os_error

        folder, option = output_option(parser, args)
        print(explain_os_error(e, folder, option=option).line(f"chexpercept {name}"), file=sys.stderr)
        return 2


#: the destinations of the options a command writes its output with, folder first
OUTPUT_DESTS = ("output_dir", "out", "output")


def output_option(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str | None, str]:
    """(the folder a command writes in, the option that chose it as the command spells it): what
    an operating-system error's advice names (``score --output FILE``: FILE's folder and
    ``--output``; ``report --output-dir DIR``: DIR and ``--output-dir``)."""
    for action in parser._actions:
        if action.dest in OUTPUT_DESTS and action.option_strings:
            value = getattr(args, action.dest, None)
            if value is None or value == "-":
                continue
            folder = str(value) if action.dest != "output" else os.path.dirname(os.path.abspath(value))
            return folder, action.option_strings[0]
    return None, "output path"


if __name__ == "__main__":
    sys.exit(main())
