"""The exit codes of every ``poet-edge`` command, and the one mapping from errors to them.

Each error class carries its code (``exit_code``, see :mod:`schedules.errors`);
:func:`exit_code_for` is the only place an exception becomes a process exit
status.  The README's table is this module's :data:`EXIT_CODES` (a test keeps
them equal).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of ``poet-edge`` and its subcommands."""

    OK = 0
    INFEASIBLE = 1
    USAGE = 2
    BAD_FILE = 3
    SOLVER_FAILED = 4
    REJECTED = 5
    NOT_EXACT = 6
    STORAGE = 7
    METER = 8
    UNSUPPORTED_MODEL = 9
    INTERRUPTED = 130


EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.INFEASIBLE: "infeasible: no schedule within the budgets (`solve` prints the smallest feasible "
                         "memory budget)",
    ExitCode.USAGE: "usage error: a bad option or value, an unknown device profile, method or model",
    ExitCode.BAD_FILE: "bad file: an input is unreadable, malformed or of an unknown version, or an output "
                       "cannot be written",
    ExitCode.SOLVER_FAILED: "solver failure, or no schedule found within the time limit",
    ExitCode.REJECTED: "rejected: a signature does not verify, a schedule belongs to another graph or breaks "
                       "a rule on replay or on the device, or a batch differs from the graph's",
    ExitCode.NOT_EXACT: "not exact: the executor's step differs from plain autograd's (`validate "
                        "--check-exact`; a bug: report it with the model, graph and schedule)",
    ExitCode.STORAGE: "storage: the swap directory is missing room, cannot be written, or a page came back "
                      "missing or corrupt",
    ExitCode.METER: "energy meter: the meter asked for is absent, not readable by this user, or failed "
                    "while reading",
    ExitCode.UNSUPPORTED_MODEL: "unsupported model: it cannot be cut into segments or traced as written "
                                "(the message names the module and what to change)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_code_for(exc: BaseException) -> ExitCode:
    """The documented exit code for an exception that ends a command."""
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return ExitCode(code)
    if isinstance(exc, OSError):  # a file the command was given or writes, not converted further in
        return ExitCode.BAD_FILE
    return ExitCode.USAGE


def exit_code_table() -> str:
    """The table as the README prints it (markdown rows: code, meaning)."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| {int(code)} | {text} |" for code, text in EXIT_CODES.items()]
    return "\n".join(rows)
