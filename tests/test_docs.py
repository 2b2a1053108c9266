"""The docs document every command and every code the package can emit, and nothing else.

Codes are data: each area keeps a registry (code -> meaning, see `tests/codes.py`), and
`docs/codes.md` shows each registry in a table generated from it (`tests/test_docs_generated.py`
keeps the tables fresh). Here: the codes the hand-written prose of `docs/codes.md` names are
registered; the source is checked against the registries statically (every code written as a
literal is registered, no code is assembled from pieces) and at run time by `tests/conftest.py`
(every finding and format error the suite creates).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dspark_hub.cli.main import cli
from tests.codes import registered_codes
from tests.docs_text import read, section, without_generated

ROOT = Path(__file__).resolve().parent.parent
CODES_DOC = read("docs/codes.md")
COMMANDS_DOC = read("docs/commands.md")
CODE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
#: Calls whose argument at this position is a code.
CODE_ARGUMENT = {"error": 0, "warning": 0, "info": 0, "make": 0, "Finding": 0, "CheckpointFormatError": 0,
                 "FrontMatterProblem": 1, "P": 1}


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
    assert f"`{code}`" in CODES_DOC, f"{code} missing from docs/codes.md: run python docs/generate.py"


def _error_json_codes() -> set[str]:
    from dspark_hub import errors

    return {cls.error_code for cls in vars(errors).values() if isinstance(cls, type) and
            issubclass(cls, errors.DsparkError)}


def test_the_codes_page_names_no_code_the_package_cannot_emit():
    """The hand-written prose around the generated tables too (a renamed code leaves it stale)."""
    prose = without_generated(CODES_DOC)
    documented = {token for token in re.findall(r"`([A-Z][A-Z0-9_]+)`", CODES_DOC) if CODE.match(token)}
    assert sorted(documented - registered_codes() - _error_json_codes()) == []
    assert len({t for t in re.findall(r"`([A-Z][A-Z0-9_]+)`", prose) if CODE.match(t)}) > 20   # the prose is seen


def test_the_prose_check_catches_an_unregistered_code():
    """The failing twin: a code in prose that no registry holds is reported."""
    stale = CODES_DOC + "\n`NOT_A_CODE_ANYMORE` is a warning.\n"
    documented = {token for token in re.findall(r"`([A-Z][A-Z0-9_]+)`", stale) if CODE.match(token)}
    assert documented - registered_codes() - _error_json_codes() == {"NOT_A_CODE_ANYMORE"}


def test_an_unregistered_code_fails_the_suite():
    """The run-time half (tests/conftest.py) is active."""
    from dspark_hub.errors import CheckpointFormatError
    from dspark_hub.report import error

    with pytest.raises(AssertionError, match="NOT_A_REAL_CODE"):
        error("NOT_A_REAL_CODE", "x", "y")
    with pytest.raises(AssertionError, match="not-a-real-code"):
        CheckpointFormatError("not-a-real-code", "y")


def _command_table() -> dict[str, str]:
    """docs/commands.md's command table: command path (`card lint`) -> the row's synopsis."""
    rows = re.findall(r"^\| `dspark-hub ([^`]+)` \|", section(COMMANDS_DOC, "Commands"), flags=re.M)
    paths = {}
    for synopsis in rows:
        words = [w for w in synopsis.split() if re.fullmatch(r"[a-z][a-z-]*", w)]
        path = words[:2] if words[:2] and words[0] in cli.commands and \
            len(words) > 1 and words[1] in getattr(cli.commands[words[0]], "commands", {}) else words[:1]
        paths[" ".join(path)] = synopsis
    return paths


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_command_is_in_the_command_table_and_has_help(name):
    assert name in _command_table(), f"docs/commands.md's table has no row for dspark-hub {name}"
    assert cli.commands[name].help


def test_every_subcommand_is_in_the_command_table():
    table = _command_table()
    for group in ("card", "golden"):
        for sub in cli.commands[group].commands:
            default = getattr(cli.commands[group], "default_command", None)
            assert f"{group} {sub}" in table or (sub == default and group in table), (group, sub)


@pytest.mark.parametrize("group", ["card", "golden"])
def test_group_help_lists_every_subcommand(group):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [group, "--help"])
    assert result.exit_code == 0
    listed = result.stdout.split("Commands:")[1].split()
    # golden's errors say "Try 'dspark-hub golden write --help'"
    assert set(cli.commands[group].commands) <= set(listed)


def test_the_json_shape_table_covers_every_command_schema_id():
    """docs/commands.md describes the shape of each command's `--json` document, one row per schema id."""
    from dspark_hub import schemas

    shapes = without_generated(section(COMMANDS_DOC, "JSON output"))
    rows = [line for line in shapes.splitlines() if line.startswith("| `dspark-hub/")]
    assert sorted(line.split("`")[1] for line in rows) == sorted(schemas.COMMANDS.values())
