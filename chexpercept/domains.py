"""The domain of every number a command takes: declared once, at the option, checked before any work.

A number option's ``type`` is a ``Domain`` (``COUNT``, ``SEED``, ``SHARE``...), never a bare ``int`` or
``float``: ``chexpercept.cli_options.CommandParser`` refuses a parser that declares one (a programming
error, caught by the tests that build every command's parser). argparse calls the domain with the
text given, so a value outside it ends the command at once with status 2 and one line naming the
option (``argument --seed: must be a whole number from 0 to 4294967295, got '-1'``). The same
``Domain`` checks values that arrive by other ways (a backend's typed options, ``generate --config``,
the Python API) through ``problem`` and ``require``.

Every real domain is finite: NaN and infinity are outside all of them (an infinite timeout was
written into run.json as ``Infinity``, which is not JSON; ``power --difference 1e-300`` overflowed).
Every whole domain has an upper end a 32-bit count or seed can hold (``MAX_COUNT``; seeds up to
2**32 - 1, what numpy's and torch's seeding take everywhere).
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

#: the largest count any option takes (tokens, cases, processes, requests...): a 32-bit signed int,
#: what engines and C libraries hold a count in
MAX_COUNT = 2**31 - 1
#: the largest seed (numpy's legacy seeding and torch's take 0 .. 2**32 - 1)
MAX_SEED = 2**32 - 1
#: how a number is spelled on a command line: decimal digits, a minus sign at most, and for a real a
#: point and an exponent (spaces around it are let be). Python's own parsing also reads ``1_0`` as 10,
#: ``+3``, ``٣`` (an Arabic-Indic digit) and, for reals, ``nan`` and ``infinity``: none of them is
#: taken, so that a value is what it reads as
WHOLE_SPELLING = re.compile(r"-?[0-9]+")
REAL_SPELLING = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class Domain:
    """The values one number option may take: whole numbers (``whole``) or finite reals, from
    ``low`` to ``high``, each end included unless ``above`` (low excluded) or ``below`` (high
    excluded). Called with an option's text (argparse's ``type``), it returns the number or raises
    ``argparse.ArgumentTypeError`` naming the domain."""

    whole: bool
    low: float
    high: float
    above: bool = False
    below: bool = False

    def describe(self) -> str:
        """The domain in words: "a whole number from 1 to 2147483647", "a number above 0 and at
        most 1"."""
        if self.whole:
            return f"a whole number from {self.low:.0f} to {self.high:.0f}"
        lo = f"above {self.low:.10g}" if self.above else f"at least {self.low:.10g}"
        if math.isinf(self.high):
            return f"a finite number {lo}"
        hi = f"below {self.high:.10g}" if self.below else f"at most {self.high:.10g}"
        return f"a number {lo} and {hi}"

    def contains(self, value: object) -> bool:
        """True when ``value`` (a Python number, never a bool) lies in the domain."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.whole and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        low_ok = value > self.low if self.above else value >= self.low
        high_ok = value < self.high if self.below else value <= self.high
        return low_ok and high_ok

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` ("must be a whole number from 1 to ..."), or None when it lies
        in the domain."""
        return None if self.contains(value) else f"must be {self.describe()}"

    def require(self, value: object, name: str) -> None:
        """ValueError "``name`` must be ..., got ``value``" unless ``value`` lies in the domain (the
        check of a value that did not come through a command line: the Python API, a config file)."""
        problem = self.problem(value)
        if problem:
            raise ValueError(f"{name} {problem}, got {value!r}")

    def __call__(self, text: str) -> int | float:
        """argparse's ``type``: the number ``text`` spells, in the domain, or ArgumentTypeError."""
        spelling = WHOLE_SPELLING if self.whole else REAL_SPELLING
        try:
            if spelling.fullmatch(text.strip()) is None:  # spaces around a number read as the number
                raise ValueError(text)
            value: int | float = int(text) if self.whole else float(text)
        except ValueError:  # not spelled as a number, or more digits than int() reads (4,300)
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}") from None
        if not self.contains(value):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}")
        return value


def whole(low: int, high: int = MAX_COUNT) -> Domain:
    """Whole numbers from ``low`` to ``high``, both included."""
    return Domain(whole=True, low=low, high=high)


def real(low: float, high: float = math.inf, *, above: bool = False, below: bool = False) -> Domain:
    """Finite reals from ``low`` to ``high`` (``above``/``below``: that end excluded)."""
    return Domain(whole=False, low=low, high=high, above=above, below=below)


#: a number of things, at least one (cases, processes, requests, tokens, tests...)
COUNT = whole(1)
#: a number of things that may be none (retries, resamples)
COUNT_OR_NONE = whole(0)
#: worker processes of one command (beyond this a machine's process table, or Python's pools, give out)
PROCESSES = whole(1, 1024)
#: people who review cases (the paper's six; beyond this the review's assignment does not end in time)
ANNOTATORS = whole(1, 1000)
#: a random seed
SEED = whole(0, MAX_SEED)
#: a TCP port (0: any free one)
PORT = whole(0, 65535)
#: a positive amount (seconds, GiB, tokens per second)
POSITIVE = real(0, above=True)
#: a throughput in tokens per second: from 0.001 (below it a run's time overflows into days of hundreds
#: of digits, or infinity, which JSON cannot hold) to 1e9
RATE = real(1e-3, 1e9)
#: memory in GiB: above 0, at most 1 PiB (larger overflowed into a byte count after the model loaded)
GIB = real(0, 2**20, above=True)
#: an amount that may be zero (a temperature)
NON_NEGATIVE = real(0)
#: a share of something whole (memory, top_p, discordance): above 0, at most 1
SHARE = real(0, 1, above=True)
#: a probability strictly between 0 and 1
PROBABILITY = real(0, 1, above=True, below=True)
#: a test's power: from 0.5 (below it the detectable difference turns negative) to 1 - 1e-9
POWER = real(0.5, 1 - 1e-9)
#: an interval's confidence level (``score --level``; ``1 - power --alpha``): from 0.5 to 1 - 1e-9, a
#: level float arithmetic keeps apart from 1 (at 1e-300 an interval had no width and was divided by it)
LEVEL = real(0.5, 1 - 1e-9)
#: a two-sided test's level alpha, 1 - LEVEL
ALPHA = real(1e-9, 0.5)
#: the tests in a family (Holm's strictest step is alpha / tests): at most 1,000, so that alpha / tests
#: keeps a finite quantile at the smallest alpha
FAMILY = whole(1, 1000)


def config_yaml_loader() -> type:
    """A PyYAML ``SafeLoader`` for a config file whose numbers and switches read as they are spelled
    (YAML 1.2's core schema): a number only in the spellings a command line takes (``WHOLE_SPELLING``,
    ``REAL_SPELLING``), a switch only ``true`` or ``false``. PyYAML's YAML 1.1 reads ``seed: 12:30``
    as 750, ``1_000`` as 1000, ``0x10`` as 16, ``.inf`` as infinity and ``progress: no`` or ``off``
    as false; here each is a string, which the config's check then names as not a number or not a
    switch."""
    import yaml

    class ConfigLoader(yaml.SafeLoader):
        pass

    dropped = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"}
    ConfigLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in dropped]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    whole_only = f"^(?:{WHOLE_SPELLING.pattern})$"  # PyYAML matches from the start, not whole
    ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile("^(?:true|false)$"), list("tf"))
    ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(whole_only), list("-0123456789"))
    ConfigLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(f"^(?:{REAL_SPELLING.pattern})$"), list("-.0123456789")
    )
    return ConfigLoader
