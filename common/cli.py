"""The ``poet-edge`` command: the shell every package's subcommands hang from.

:func:`main` builds the parser from the subcommands every package registers in the entry-point group
``poet_edge.commands`` (``pyproject.toml``: the planner's ``schedules.cli``, the device's ``agent.cli``, the
agent daemon's, the server's, the simulation's and the demo's), runs the chosen handler, and turns any
:class:`common.errors.PoetEdgeError` into one line on standard error and its exit code
(:func:`common.exit_codes.exit_code_for`): never a traceback.  Results go to standard output, progress to
standard error.  The exit codes are in ``docs/cli.md``.

Adding subcommands
------------------
A package declares an entry point in the group ``poet_edge.commands`` naming a function
``add_commands(subparsers)``.  It adds parsers with ``subparsers.add_parser(...)`` and sets ``handler=`` (a
function taking the parsed ``argparse.Namespace`` and returning an exit code) with ``set_defaults``.  The
module must be cheap to import: import torch and other heavy libraries inside the handlers, so that
``poet-edge --help`` never loads them.  Handlers raise :class:`~common.errors.CommandError` or any
:class:`~common.errors.PoetEdgeError` to fail with a message and the error's exit code.  The argument types
every package uses (:func:`size_arg`, :func:`positive_float`, :func:`positive_int`) are here.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from typing import Any, Callable, Sequence

from common.errors import PoetEdgeError
from common.exit_codes import EXIT_CODES, ExitCode, exit_code_for
from common.units import parse_bytes

ENTRY_POINT_GROUP = "poet_edge.commands"

Handler = Callable[[argparse.Namespace], int]


# -- entry point -----------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``poet-edge`` with ``argv`` (default: the process's arguments); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(attach_negative_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) and usage errors (2): return, so callers in-process get a code
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except (PoetEdgeError, OSError) as exc:
        print(f"{parser.prog} {args.command}: error: {_message(exc)}", file=sys.stderr)
        return exit_code_for(exc)


def attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``--memory -1MB`` -> ``--memory=-1MB``, so the option's own check says what is wrong with the value.

    argparse takes a word starting with ``-`` for an option unless it is a
    plain number, and then reports "expected one argument"; no option here
    starts with a digit, so such a word is always a value.
    """
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_VALUE.match(word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def build_parser(providers: Sequence[Callable[[Any], None]] | None = None) -> argparse.ArgumentParser:
    """The full parser: the subcommands of every registered provider (or of ``providers``)."""
    parser = argparse.ArgumentParser(
        prog="poet-edge",
        description="Plan, draw, sign and verify POET schedules, and measure and run them on a device: training "
                    "under a hard memory budget by recomputing and paging activations.",
        epilog="Exit codes: " + "; ".join(f"{int(code)} {text.split(':')[0]}" for code, text in EXIT_CODES.items()),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_commands in (registered_providers() if providers is None else providers):
        add_commands(subparsers)
    return parser


def registered_providers() -> list[Callable[[Any], None]]:
    """``add_commands`` of every package registered in the ``poet_edge.commands`` entry-point group, by name."""
    entries = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda entry: entry.name)
    return [entry.load() for entry in entries]


# -- argument types --------------------------------------------------------------
def size_arg(text: str) -> int:
    """argparse type for byte sizes (``3MB``, ``1.5MiB``, ``3000000``); see :mod:`common.units`."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive_float(text: str) -> float:
    """argparse type for a finite number > 0 (a trailing ``x`` is allowed: ``7.6x``)."""
    try:
        value = float(text.rstrip("xX"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def positive_int(text: str) -> int:
    """argparse type for a whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())
