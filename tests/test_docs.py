"""The commands the README and the docs show are real: every ``poet-edge`` line parses with the installed
command's own parser, every ``python -m`` module exists, and every page a document links to is there."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from common.cli import attach_negative_values, build_parser

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:sh|bash|console)\n(.*?)```", re.S)


def shown_commands(document: Path) -> list[str]:
    """The command lines of a document's shell blocks, continuations joined and comments dropped."""
    lines = []
    for block in BLOCK.findall(document.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _argv(line: str) -> list[str]:
    return shlex.split(line.split("|")[0].split(" > ")[0].split(" < ")[0])


COMMANDS = [(doc.relative_to(REPO), line) for doc in DOCUMENTS for line in shown_commands(doc)]
# every `python -m MODULE` a document names, in its shell blocks or inline (the benchmark tables)
MODULES = sorted({(doc.relative_to(REPO), module) for doc in DOCUMENTS
                  for module in re.findall(r"python -m ([\w.]+)", doc.read_text())})


def test_the_documents_show_commands() -> None:
    assert sum(1 for _, line in COMMANDS if line.startswith("poet-edge ")) >= 20


@pytest.mark.parametrize("document, line", [c for c in COMMANDS if c[1].startswith(("poet-edge ", "sudo poet-edge "))],
                         ids=lambda value: str(value)[:60])
def test_every_poet_edge_line_parses_with_the_real_parser(document, line) -> None:
    argv = _argv(line)
    argv = argv[argv.index("poet-edge") + 1:]
    parser = build_parser()
    try:
        args = parser.parse_args(attach_negative_values(argv))
    except SystemExit as exc:
        pytest.fail(f"{document}: `{line}` does not parse (exit {exc.code})")
    assert getattr(args, "handler", None) is not None, f"{document}: `{line}` names no subcommand"


@pytest.mark.parametrize("document, module", MODULES, ids=lambda value: str(value)[:60])
def test_every_python_module_shown_exists(document, module) -> None:
    assert importlib.util.find_spec(module) is not None, f"{document} names `python -m {module}`: no such module"


def test_every_page_a_document_links_to_exists() -> None:
    missing = []
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", document.read_text()):
            if not (document.parent / target).exists():
                missing.append(f"{document.relative_to(REPO)} -> {target}")
    assert not missing
