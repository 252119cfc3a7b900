"""One error tree, one exit-code table: every error class has its code, documented once, and no command
prints a traceback for any of them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import textwrap
from pathlib import Path

import pytest

import agent
import common
import engine
import schedules
import server
from common.cli import main
from common.errors import CommandError, PoetEdgeError
from common.exit_codes import EXIT_CODES, ExitCode, exit_code_for, exit_code_table

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "schedules", "engine", "agent", "server")


def every_error_class() -> list[type[PoetEdgeError]]:
    """Every subclass of the root defined in the packages, after importing all their modules."""
    for package in (common, schedules, engine, agent, server):
        for module in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
            importlib.import_module(module.name)
    found, stack = [], [PoetEdgeError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


ERRORS = every_error_class()


def make(cls: type[PoetEdgeError]) -> PoetEdgeError:
    """An instance with a message; other required arguments get zeros."""
    own_init = next(klass.__dict__["__init__"] for klass in cls.__mro__ if "__init__" in klass.__dict__)
    if own_init is BaseException.__init__:
        return cls(f"{cls.__name__} happened; do the next thing")
    required = [p for p in list(inspect.signature(own_init).parameters.values())[2:]
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    return cls(f"{cls.__name__} happened; do the next thing", *([0] * len(required)))


def error_tree() -> str:
    """The tree as ``docs/architecture.md`` draws it: each class, its exit code, the HTTP status the server's
    API answers with (its errors only), and its module where it changes."""
    lines: list[str] = []

    def walk(cls: type, prefix: str, last: bool, depth: int, parent_module: str) -> None:
        branch = "" if depth == 0 else prefix + ("└── " if last else "├── ")
        if cls is CommandError:
            code = "per instance: the command says which"
        else:
            code = f"{int(cls.exit_code)} {ExitCode(cls.exit_code).name.lower().replace('_', ' ')}"
        module = cls.__module__.replace(".", "/") + ".py" if cls.__module__ != parent_module else ""
        http = f"HTTP {cls.http_status}" if hasattr(cls, "http_status") else ""
        lines.append(f"{branch + cls.__name__:<40}{code:<20}{http:<10}{module}".rstrip())
        children = sorted((c for c in cls.__subclasses__() if c.__module__.split(".")[0] in PACKAGES),
                          key=lambda c: c.__name__)  # not the fakes a test may define
        below = "" if depth == 0 else prefix + ("    " if last else "│   ")
        for i, child in enumerate(children):
            walk(child, below, i == len(children) - 1, depth + 1, cls.__module__)

    walk(PoetEdgeError, "", True, 0, "")
    return "\n".join(lines) + "\n"


def test_the_architecture_draws_the_tree_the_code_has() -> None:
    tree = error_tree()
    assert (REPO / "docs" / "architecture.md").read_text().count(tree) == 1, \
        f"docs/architecture.md should draw the error tree as the code has it now:\n{tree}"


def test_the_tree_has_the_errors_the_packages_raise() -> None:
    names = {cls.__name__ for cls in ERRORS}
    assert {"ZooError", "ExtractionError", "ProfileError", "MeterReadError", "PageCorruptError",
            "SignatureError", "SwapSpaceError", "ServerError", "DatabaseError", "EnrolmentRefusedError"} <= names


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_class_lives_in_an_errors_module_and_has_a_documented_code(cls) -> None:
    assert cls.__module__.endswith(".errors"), f"{cls.__name__} is defined in {cls.__module__}"
    assert exit_code_for(make(cls)) in EXIT_CODES


def test_codes_say_what_went_wrong() -> None:
    by_name = {cls.__name__: exit_code_for(make(cls)) for cls in ERRORS}
    assert by_name["PageError"] == by_name["PageCorruptError"] == by_name["SwapSpaceError"] == ExitCode.STORAGE
    assert by_name["ProfileError"] == ExitCode.STORAGE
    assert by_name["MeterReadError"] == by_name["MeterUnavailableError"] == ExitCode.METER
    assert by_name["SignatureError"] == by_name["ScheduleRefusedError"] == ExitCode.REJECTED
    assert by_name["FormatError"] == ExitCode.BAD_FILE and by_name["SolverError"] == ExitCode.SOLVER_FAILED
    assert by_name["ExtractionError"] == ExitCode.UNSUPPORTED_MODEL and by_name["ZooError"] == ExitCode.USAGE
    assert by_name["DatabaseError"] == by_name["DataDirError"] == by_name["ServerKeyError"] == ExitCode.BAD_FILE
    assert by_name["EnrolmentRefusedError"] == by_name["AuthenticationError"] == ExitCode.REJECTED
    assert by_name["ServerStartError"] == by_name["UnknownDeviceError"] == ExitCode.USAGE


def test_the_cli_page_prints_the_table_once_and_the_readme_links_it() -> None:
    assert (REPO / "docs" / "cli.md").read_text().count(exit_code_table()) == 1
    assert "docs/cli.md" in (REPO / "README.md").read_text()


@pytest.fixture
def raising_command(tmp_path, monkeypatch):
    """A ``poet-edge raise NAME`` subcommand, registered as any package registers one, that raises NAME."""
    (tmp_path / "raising_commands.py").write_text(textwrap.dedent("""
        import inspect
        from tests.test_errors import ERRORS, make

        def add_commands(subparsers):
            p = subparsers.add_parser("raise")
            p.add_argument("name")
            p.set_defaults(handler=lambda args: _raise(args.name))

        def _raise(name):
            raise make(next(cls for cls in ERRORS if cls.__name__ == name))
    """))
    dist = tmp_path / "raising_commands-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: raising-commands\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[poet_edge.commands]\nraising = raising_commands:add_commands\n")
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_no_command_prints_a_traceback_for_any_error(cls, raising_command, capsys) -> None:
    code = main(["raise", cls.__name__])
    err = capsys.readouterr().err
    assert code == exit_code_for(make(cls))
    assert err.strip() == f"poet-edge raise: error: {cls.__name__} happened; do the next thing"


def test_a_meter_that_fails_ends_validate_with_the_meter_code(tmp_path, capsys) -> None:
    graph, schedule = tmp_path / "g.json", tmp_path / "s.json"
    model = ["--model", "unet", "--input", "1x3x8x8"]
    assert main(["profile", *model, "--swap-dir", str(tmp_path / "swap"), "--repeats", "1", "-o", str(graph),
                 "--device-out", str(tmp_path / "d.json")]) == ExitCode.OK
    assert main(["solve", str(graph), "--baseline", "store-all", "-o", str(schedule)]) == ExitCode.OK
    capsys.readouterr()
    code = main(["validate", *model, "--schedule", str(schedule), "--graph", str(graph), "--meter", "serial",
                 "--serial-url", "loop://"])  # a serial port that answers nothing a meter would
    err = capsys.readouterr().err
    assert code == ExitCode.METER
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
