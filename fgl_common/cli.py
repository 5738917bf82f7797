"""The one command-line mechanism of every entry point: a typed, frozen dataclass is the
configuration, and each of its fields is one ``--flag`` (name, type, default, help, choices).

    @dataclass(frozen=True)
    class Config:
        epochs: int = option(200, "training epochs")

    parser = argparse.ArgumentParser(prog="...")
    add_dataclass_arguments(parser, Config)
    config = dataclass_from_namespace(Config, parser.parse_args(argv))
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import fields
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def option(default: Any, help: str, choices: Sequence[str] | None = None, *,
           required: bool = False, flag: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag. ``required``: the field has no
    default (pass ``dataclasses.MISSING``) and the flag must be given. ``flag``: a spelling other
    than the field's name (``--partition`` for ``method``); a bool field defaulting to True needs
    one, since its flag turns it off (``--quiet`` for ``show_progress``)."""
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": tuple(choices) if choices is not None else None,
        "required": required, "flag": flag})


def flag_name(field_name: str, prefix: str = "") -> str:
    """--prefix-field-name for a field ``field_name``."""
    return "--" + prefix + field_name.replace("_", "-")


def _field_flag(f: dataclasses.Field, prefix: str) -> str:
    named = f.metadata.get("flag")
    return named if named else flag_name(f.name, prefix)


def _dest(field_name: str, prefix: str) -> str:
    return prefix.replace("-", "_") + field_name


def _flag_type(hint: Any) -> Any:
    """The converter for a field's annotation; ``X | None`` converts with X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def add_dataclass_arguments(container: argparse._ActionsContainer, cls: type, prefix: str = "",
                            only: Sequence[str] | None = None,
                            exclude: Sequence[str] = ()) -> None:
    """One ``--<prefix><field>`` flag per field of ``cls`` (``only`` / ``exclude`` pick fields).
    A bool field is a switch that flips its default. Help ends with the default, written as
    argparse's ``%(default)s`` so ``ArgumentDefaultsHelpFormatter`` does not repeat it."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if (only is not None and f.name not in only) or f.name in exclude or not f.init:
            continue
        kind = _flag_type(hints[f.name])
        help_text = str(f.metadata.get("help", "")).replace("%", "%%")  # argparse formats help
        flag, dest = _field_flag(f, prefix), _dest(f.name, prefix)
        if kind is bool:
            if f.default is not False and not f.metadata.get("flag"):
                raise TypeError(f"{cls.__name__}.{f.name}: a bool field defaulting to "
                                f"{f.default!r} needs option(flag=...) naming what turns it off")
            action = "store_true" if f.default is False else "store_false"
            container.add_argument(flag, dest=dest, action=action, help=help_text)
            continue
        required = bool(f.metadata.get("required"))
        default = None if f.default is dataclasses.MISSING else f.default
        extra: dict[str, Any] = {}
        if f.metadata.get("flag") and not f.metadata.get("choices"):  # named after the flag
            extra["metavar"] = flag.lstrip("-").replace("-", "_").upper()
        container.add_argument(
            flag, dest=dest, type=kind, default=default, required=required,
            choices=f.metadata.get("choices"), **extra,
            help=help_text + ("" if required or default is None else " (default: %(default)s)"))


def dataclass_from_namespace(cls: type[T], namespace: argparse.Namespace, prefix: str = "",
                             **overrides: Any) -> T:
    """An instance of ``cls`` from the flags ``add_dataclass_arguments`` added; ``overrides``
    set fields that have no flag of their own."""
    values = {f.name: getattr(namespace, _dest(f.name, prefix)) for f in fields(cls)
              if f.init and f.name not in overrides and hasattr(namespace, _dest(f.name, prefix))}
    return cls(**values, **overrides)


def explicit_dests(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """Destinations given on the command line, as opposed to left at their default."""
    quiet = argparse.ArgumentParser(add_help=False)
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            kwargs: dict[str, Any] = {"dest": action.dest, "default": argparse.SUPPRESS}
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = str  # only presence matters here; values are parsed for real
            quiet.add_argument(*action.option_strings, **kwargs)
    namespace, _ = quiet.parse_known_args(list(argv) if argv is not None else None)
    return set(vars(namespace))


__all__ = ["option", "flag_name", "add_dataclass_arguments", "dataclass_from_namespace",
           "explicit_dests"]
