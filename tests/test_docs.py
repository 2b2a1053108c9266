"""The README documents every command and every finding code the code can emit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dspark_hub.cli.main import cli
from dspark_hub.format.reader import FORMAT_CODES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EMITTED = re.compile(r"\b(?:error|warning|info|make)\(\s*\"([A-Z][A-Z0-9_]+)\"")


def emitted_codes() -> set[str]:
    codes = set(FORMAT_CODES)
    for path in (ROOT / "dspark_hub").rglob("*.py"):
        codes |= set(EMITTED.findall(path.read_text()))
    return codes


@pytest.mark.parametrize("code", sorted(emitted_codes()))
def test_finding_code_is_documented(code):
    assert f"`{code}`" in README or re.search(rf"\b{code}\b", README), f"{code} missing from README"


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
    assert set(cli.commands[group].commands) <= set(listed)   # golden's errors say "Try 'dspark-hub golden write --help'"


def test_every_command_schema_id_is_in_the_readme_table():
    from dspark_hub import schemas

    rows = [line for line in README.splitlines() if line.startswith("| `dspark-hub/")]
    assert sorted(line.split("`")[1] for line in rows) == sorted(schemas.COMMANDS.values())
