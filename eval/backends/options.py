"""A backend's command-line options, declared once as a typed dataclass.

Each field of a backend's ``Options`` carries its flag's help, type, choices, default and check
(``option(...)``); from that one declaration come the flags in ``chexpercept run --help``
(``add_to``), the typed value built from the parsed command line (``from_args``), the checks with
the flag's name in their message (``__post_init__``), what run.json records (``record``) and what
enters the run's identity (``answers``: every option that can change an answer; a resume with
another value is refused). An option that only places or schedules the work (devices, memory,
concurrency, timeouts) is declared ``answers=False``; the default is ``True``, so a new option that
forgets to say counts as one that changes answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from chexpercept.domains import Domain

T = TypeVar("T", bound="BackendOptions")

#: a check: the problem with a value (e.g. "must be at least 1"), or None when it is fine
Check = Callable[[Any], "str | None"]


#: what an environment variable's name is made of
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_var_name(v: str) -> str | None:
    """The check of an option that names an environment variable (``--api-key-env``): a name
    (``[A-Za-z_][A-Za-z0-9_]*``), never a value; the problem does not quote what was given (it may be
    a key pasted in by mistake)."""
    if ENV_VAR_NAME.fullmatch(v):
        return None
    looks = " (what was given looks like a key itself)" if len(v) >= 16 or "-" in v else ""
    return (
        f"must be the name of an environment variable ([A-Za-z_][A-Za-z0-9_]*){looks}; the value "
        "given is not shown: put the key in an environment variable (export OPENAI_API_KEY=...) "
        "and give that variable's name"
    )


def json_object(text: str) -> dict[str, Any]:
    """argparse type of an option that takes a JSON object (engine arguments, request fields...)."""
    from chexpercept.input_json import JsonInputError, loads

    try:
        value = loads(text, source="the option's value")
    except JsonInputError as e:
        raise argparse.ArgumentTypeError(e.reason) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"key\": 1}'")
    if _non_finite(value):  # NaN and Infinity: Python's JSON reads them, no JSON peer does
        raise argparse.ArgumentTypeError("NaN and Infinity are not JSON numbers; give a finite number")
    return value


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


def option(
    *,
    help: str,
    default: Any = None,
    type: Callable[[str], Any] | None = None,
    choices: tuple[Any, ...] | None = None,
    metavar: str | None = None,
    flag: str | None = None,
    check: Check | None = None,
    answers: bool = True,
    switch: bool = False,
    echo: bool = True,
) -> Any:
    """A field of a backend's ``Options``: one command-line option.

    help: the text of ``--help``. type, choices, metavar: as argparse's. flag: the option's name
    (default ``--`` + the field name with dashes). check: a function naming what is wrong with a
    value that is not None. answers: False for an option that cannot change any answer (placement,
    scheduling). switch: a flag without a value (``store_true``; the field is a bool, default False).
    echo: False for an option whose wrong value must not be quoted back (it may be a secret).
    """
    if switch:
        default = False
    if check is None and isinstance(type, Domain):
        check = type.problem
    meta = {
        "help": help,
        "type": type,
        "choices": choices,
        "metavar": metavar,
        "flag": flag,
        "check": check,
        "answers": answers,
        "switch": switch,
        "echo": echo,
    }
    mutable = isinstance(default, (dict, list))
    if mutable:
        value = default
        return field(default_factory=lambda: type_copy(value), metadata=meta)
    return field(default=default, metadata=meta)


def type_copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


@dataclass(frozen=True)
class BackendOptions:
    """Base of every backend's ``Options`` (a frozen dataclass of ``option(...)`` fields)."""

    #: the backend's name, for messages
    BACKEND: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            meta = f.metadata
            value = getattr(self, f.name)
            if value is None:
                continue
            problem = meta["check"](value) if meta.get("check") else None
            if problem:
                got = f", got {value!r}" if meta.get("echo", True) else ""
                raise ValueError(f"{self.flag(f.name)} {problem}{got}")
            if meta.get("choices") and value not in meta["choices"]:
                raise ValueError(
                    f"{self.flag(f.name)} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}"
                )

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line spelling of field ``name`` (``--max-batch-tokens``)."""
        for f in fields(cls):
            if f.name == name:
                return f.metadata.get("flag") or "--" + name.replace("_", "-")
        raise KeyError(name)

    @classmethod
    def add_to(cls, group: argparse._ArgumentGroup) -> None:
        """Add one flag per field to ``group`` (the backend's group of ``chexpercept run --help``)."""
        for f in fields(cls):
            meta = f.metadata
            if meta.get("switch"):
                group.add_argument(cls.flag(f.name), dest=f.name, action="store_true", help=meta["help"])
                continue
            kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"], "default": option_default(f)}
            for key in ("type", "choices", "metavar"):
                if meta.get(key) is not None:
                    kwargs[key] = meta[key]
            group.add_argument(cls.flag(f.name), **kwargs)

    @classmethod
    def from_args(cls: type[T], args: argparse.Namespace) -> T:
        """The options of a parsed command line (fields it lacks keep their defaults)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**{k: v for k, v in given.items() if v is not None})

    def record(self) -> dict[str, Any]:
        """Every option and its value (run.json)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def answers(self) -> dict[str, Any]:
        """The options that can change an answer, and their values (part of the run's identity); a
        switch that is off is left out, so that a switch added later changes no earlier run's identity."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.metadata.get("answers", True)
            and not (f.metadata.get("switch") and not getattr(self, f.name))
        }

    def replace(self: T, **changes: Any) -> T:
        return dataclasses.replace(self, **changes)


def option_default(f: dataclasses.Field[Any]) -> Any:
    """The value a field of an ``Options`` takes when its flag is not given (argparse's default)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


@dataclass(frozen=True)
class NoOptions(BackendOptions):
    """A backend without options of its own."""
