"""The README documents every command and every code the package can emit, and nothing else.

Codes are data: each area keeps a registry (code -> meaning, see `tests/codes.py`). The README
is checked against the registries both ways; the source is checked against them statically
here (every code written as a literal is registered, no code is assembled from pieces) and at
run time by `tests/conftest.py` (every finding and format error the suite creates).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dspark_hub.cli.main import cli
from tests.codes import registered_codes

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CODE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
#: Calls whose argument at this position is a code.
CODE_ARGUMENT = {"error": 0, "warning": 0, "info": 0, "make": 0, "Finding": 0, "CheckpointFormatError": 0,
                 "FrontMatterProblem": 1, "P": 1}


def _readme_code_sections() -> str:
    """The README sections that list codes ('### Finding codes', '### ... finding codes', '### Error codes')."""
    sections = re.findall(r"^### [^\n]*(?:Finding|finding|Error) codes[^\n]*\n(.*?)(?=^## |^### )", README,
                          flags=re.M | re.S)
    assert len(sections) == 3, "the README's code sections moved; update this test"
    return "\n".join(sections)


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def code_expressions() -> list[tuple[str, ast.expr]]:
    """(file:line, expression) of every place the package passes or defaults a code."""
    found: list[tuple[str, ast.expr]] = []
    for path in sorted((ROOT / "dspark_hub").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call):
                position = CODE_ARGUMENT.get(_call_name(node) or "")
                if position is not None and len(node.args) > position:
                    found.append((f"{rel}:{node.lineno}", node.args[position]))
                found += [(f"{rel}:{node.lineno}", kw.value) for kw in node.keywords if kw.arg == "code"]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args
                defaults = dict(zip([a.arg for a in args][len(args) - len(node.args.defaults):], node.args.defaults,
                                    strict=True))
                defaults.update({a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                                 if d is not None})
                if "code" in defaults:
                    found.append((f"{rel}:{node.lineno}", defaults["code"]))
    return found


def test_no_code_is_assembled_from_pieces():
    """An f-string or concatenated code cannot be looked up in a registry (nor grepped for)."""
    built = [where for where, expr in code_expressions()
             if isinstance(expr, (ast.JoinedStr, ast.BinOp)) or
             (isinstance(expr, ast.IfExp) and any(isinstance(e, (ast.JoinedStr, ast.BinOp))
                                                  for e in (expr.body, expr.orelse)))]
    assert built == [], "look the code up in a registry dict instead"


def test_every_code_written_in_the_source_is_registered():
    literals = {(where, expr.value) for where, expr in code_expressions()
                if isinstance(expr, ast.Constant) and isinstance(expr.value, str)}
    assert len(literals) > 100          # the scan sees the package's codes
    registered = registered_codes()
    assert sorted(f"{where}: {code}" for where, code in literals if code not in registered) == []


@pytest.mark.parametrize("code", sorted(registered_codes()))
def test_registered_code_is_documented(code):
    assert f"`{code}`" in _readme_code_sections(), f"{code} missing from the README's code tables"


def test_readme_lists_no_code_the_package_cannot_emit():
    documented = {token for token in re.findall(r"`([A-Z][A-Z0-9_]+)`", _readme_code_sections()) if CODE.match(token)}
    assert sorted(documented - registered_codes()) == []


def test_an_unregistered_code_fails_the_suite():
    """The run-time half (tests/conftest.py) is active."""
    from dspark_hub.errors import CheckpointFormatError
    from dspark_hub.report import error

    with pytest.raises(AssertionError, match="NOT_A_REAL_CODE"):
        error("NOT_A_REAL_CODE", "x", "y")
    with pytest.raises(AssertionError, match="not-a-real-code"):
        CheckpointFormatError("not-a-real-code", "y")


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_command_is_documented_and_has_help(name):
    assert f"dspark-hub {name}" in README
    assert cli.commands[name].help


@pytest.mark.parametrize("group", ["card", "golden"])
def test_group_help_lists_every_subcommand(group):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [group, "--help"])
    assert result.exit_code == 0
    listed = result.stdout.split("Commands:")[1].split()
    # golden's errors say "Try 'dspark-hub golden write --help'"
    assert set(cli.commands[group].commands) <= set(listed)


def test_every_command_schema_id_is_in_the_readme_table():
    from dspark_hub import schemas

    rows = [line for line in README.splitlines() if line.startswith("| `dspark-hub/")]
    assert sorted(line.split("`")[1] for line in rows) == sorted(schemas.COMMANDS.values())


def test_the_card_source_table_is_the_schema():
    from dspark_hub.cards.source import CARD_KEYS

    section = README.split("### Card source (`card.yaml`)")[1].split("\n### ")[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    assert {row[0].strip("| `"): (row[1], row[2].rstrip(" |")) for row in rows} == CARD_KEYS
