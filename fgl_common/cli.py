"""The one command-line mechanism of every entry point: a typed, frozen dataclass is the
configuration, and each of its fields is one ``--flag`` (name, type, default, help, choices).

    @dataclass(frozen=True)
    class Config:
        epochs: int = option(200, "training epochs")

    parser = argparse.ArgumentParser(prog="...")
    add_dataclass_arguments(parser, Config)
    config = dataclass_from_namespace(Config, parser.parse_args(argv))

A ``float`` field takes a finite number only (``nan`` and ``inf`` are refused by name, here and,
for configs not read from a command line, by ``check_finite``).

A ``tuple[X, ...]`` field takes one comma-separated value (``--seeds 0,1,2``), each item converted
with X; with ``nargs="+"`` it takes several arguments instead (``check ours fedavg``). A field
with ``positional=True`` is a required positional argument named after it (``RUN_DIR``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import fields
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def option(default: Any, help: str, choices: Sequence[str] | None = None, *,
           required: bool = False, flag: str | None = None, positional: bool = False,
           nargs: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag. ``required``: the field has no
    default (pass ``dataclasses.MISSING``) and the flag must be given. ``flag``: a spelling other
    than the field's name (``--partition`` for ``method``); a bool field defaulting to True needs
    one, since its flag turns it off (``--quiet`` for ``show_progress``). ``positional``: an
    argument without ``--`` (always required; pass ``dataclasses.MISSING``). ``nargs="+"``: a
    tuple field given as one or more arguments rather than one comma-separated value.
    ``choices`` of a tuple field apply to each of its items."""
    if nargs not in (None, "+"):
        raise TypeError(f"option(nargs={nargs!r}): expected None or '+'")
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": tuple(choices) if choices is not None else None,
        "required": required or positional, "flag": flag, "positional": positional,
        "nargs": nargs})


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


def finite_float(text: str) -> float:
    """argparse type of a float flag: every number the program takes must be finite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (expected a finite "
                                         "number, e.g. 0.01)")
    return value


def check_finite(instance: Any, prefix: str = "") -> None:
    """Raise ValueError naming the first float field of a config dataclass that holds NaN or an
    infinity (configs built in Python or loaded from JSON skip the flag's type)."""
    for f in fields(instance):
        value = getattr(instance, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{_field_flag(f, prefix)} is {value!r}, expected a finite number")


def _tuple_item(hint: Any) -> Any | None:
    """X for a ``tuple[X, ...]`` annotation, else None."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


class CommaSeparated:
    """argparse type of a ``tuple[X, ...]`` flag: ``"4,8,16"`` -> ``(4, 8, 16)``; empty items are
    skipped, so ``""`` is the empty tuple. With ``choices`` every item must be one of them."""

    def __init__(self, item: Any, choices: Sequence[str] | None = None):
        self.item, self.choices = item, choices
        # argparse names the type in its error: "invalid comma-separated int value: '4,x'"
        self.__name__ = f"comma-separated {getattr(item, '__name__', item)}"

    def __call__(self, text: str) -> tuple:
        values = tuple(self.item(v.strip()) for v in text.split(",") if v.strip())
        unknown = [v for v in values if self.choices is not None and v not in self.choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"{text!r} has unknown {', '.join(map(repr, unknown))}, expected comma-separated "
                f"values among {', '.join(map(str, self.choices))}")
        return values


def add_dataclass_arguments(container: argparse._ActionsContainer, cls: type, prefix: str = "",
                            only: Sequence[str] | None = None,
                            exclude: Sequence[str] = ()) -> None:
    """One ``--<prefix><field>`` flag (or positional argument) per field of ``cls`` (``only`` /
    ``exclude`` pick fields). A bool field is a switch that flips its default. Help ends with the
    default, written as argparse's ``%(default)s`` so ``ArgumentDefaultsHelpFormatter`` does not
    repeat it."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if (only is not None and f.name not in only) or f.name in exclude or not f.init:
            continue
        kind = _flag_type(hints[f.name])
        help_text = str(f.metadata.get("help", "")).replace("%", "%%")  # argparse formats help
        flag, dest = _field_flag(f, prefix), _dest(f.name, prefix)
        required = bool(f.metadata.get("required"))
        if kind is bool:
            if f.default is not False and not f.metadata.get("flag"):
                raise TypeError(f"{cls.__name__}.{f.name}: a bool field defaulting to "
                                f"{f.default!r} needs option(flag=...) naming what turns it off")
            action = "store_true" if f.default is False else "store_false"
            container.add_argument(flag, dest=dest, action=action, required=required,
                                   help=help_text)
            continue
        default = None if f.default is dataclasses.MISSING else f.default
        choices, item = f.metadata.get("choices"), _tuple_item(kind)
        extra: dict[str, Any] = {"type": finite_float if kind is float else kind,
                                 "choices": choices}
        if f.metadata.get("nargs"):
            if item is None:
                raise TypeError(f"{cls.__name__}.{f.name}: nargs='+' needs a tuple[X, ...] field")
            extra.update(nargs="+", type=item)  # argparse checks choices per item
        elif item is not None:
            extra.update(type=CommaSeparated(item, choices), choices=None)
            if default is not None:  # a string default goes through the type: help shows 4,8
                default = ",".join(map(str, default))
        if f.metadata.get("positional"):
            if f.default is not dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: a positional field is required; "
                                f"pass dataclasses.MISSING, not {f.default!r}")
            container.add_argument(dest, metavar=f.name.upper(), help=help_text, **extra)
            continue
        if f.metadata.get("flag") and not choices:  # named after the flag
            extra["metavar"] = flag.lstrip("-").replace("-", "_").upper()
        shown = not required and default is not None and default != ""  # "": nothing to show
        container.add_argument(
            flag, dest=dest, default=default, required=required, **extra,
            help=help_text + (" (default: %(default)s)" if shown else ""))


def dataclass_from_namespace(cls: type[T], namespace: argparse.Namespace, prefix: str = "",
                             **overrides: Any) -> T:
    """An instance of ``cls`` from the flags ``add_dataclass_arguments`` added; ``overrides``
    set fields that have no flag of their own."""
    values = {f.name: getattr(namespace, _dest(f.name, prefix)) for f in fields(cls)
              if f.init and f.name not in overrides and hasattr(namespace, _dest(f.name, prefix))}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}  # nargs="+"
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
           "explicit_dests", "CommaSeparated", "finite_float", "check_finite"]
