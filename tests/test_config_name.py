"""One fact, one place (issue 21 item 4): the checkpoint config's file name is `format.contract.CONFIG_NAME`.

A `"config.json"` string literal anywhere else under dspark_hub/ fails (prose that mentions the file
in a docstring or a message is not the literal). `OWNED_ELSEWHERE` holds the files other engineers are
being changed; it is empty, and the stale-entry test keeps any future entry honest.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dspark_hub.format.contract import CONFIG_NAME

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_hub"
HOME = "format/contract.py"
#: Files allowed to keep the literal while being changed (empty: none is).
OWNED_ELSEWHERE: set[str] = set()


def config_literals(source: str, where: str) -> list[str]:
    """`file:line` of each string literal equal to the config file name."""
    return [f"{where}:{node.lineno}: \"{CONFIG_NAME}\" typed out; use format.contract.CONFIG_NAME"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and node.value == CONFIG_NAME]


def literals_by_module() -> dict[str, list[str]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        found[name] = config_literals(path.read_text(), f"dspark_hub/{name}")
    return found


def test_the_config_file_name_is_typed_only_in_its_home():
    problems = [p for name, found in literals_by_module().items()
                if name != HOME and name not in OWNED_ELSEWHERE for p in found]
    assert not problems, "\n".join(problems)


def test_the_allow_list_holds_only_files_that_still_type_it():
    found = literals_by_module()
    stale = sorted(name for name in OWNED_ELSEWHERE if not found.get(name))
    assert not stale, f"no literal left: remove {stale} from OWNED_ELSEWHERE"


def test_the_home_holds_the_literal():
    assert config_literals((PACKAGE / HOME).read_text(), HOME)


@pytest.mark.parametrize("source, line", [
    ('config = read_json(folder / "config.json")\n', 1),
    ('\n\nNAMES = ("config.json", "README.md")\n', 3),
    ('WORDS = {"config": "config.json"}\n', 1),
    ('def load(name="config.json"):\n    return name\n', 1),
    ('if path.name == "config.json":\n    pass\n', 1),
    ("x = 1\ny = 'config.json'\n", 2),
])
def test_the_checker_flags_the_literal_with_its_line(source, line):
    assert config_literals(source, "snippet.py") == [
        f"snippet.py:{line}: \"config.json\" typed out; use format.contract.CONFIG_NAME"]


@pytest.mark.parametrize("source", [
    "from dspark_hub.format.contract import CONFIG_NAME\nconfig = folder / CONFIG_NAME\n",
    '"""Reads config.json."""\n',                                   # prose in a docstring
    'message = f"{folder} holds no config.json"\n',                 # prose in a message
    'name = "generation_config.json"\n',                            # another file
    '# "config.json" in a comment\nx = 1\n',
])
def test_the_checker_passes_the_constant_and_prose(source):
    assert config_literals(source, "snippet.py") == []
