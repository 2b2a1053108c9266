"""The tables in docs/ that mirror the code are what `docs/generate.py` writes from the code today.

A code registry, an error class, a schema id, the card source schema, a loader or config rule or a
command's option changed without `python docs/generate.py`: these tests fail and say so.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from types import ModuleType

import pytest

from tests.codes import REGISTRIES
from tests.docs_text import DOCS


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_generate", module)
    spec.loader.exec_module(module)
    return module


generate = _generator()


def _blocks() -> dict[str, list[str]]:
    """generator name -> the docs files whose generated blocks use it."""
    found: dict[str, list[str]] = {}
    for path in sorted(DOCS.glob("*.md")):
        for match in generate.BLOCK.finditer(path.read_text()):
            found.setdefault(match["name"], []).append(path.name)
    return found


def test_the_generated_tables_are_fresh(tmp_path):
    """In a fresh process, run from another folder: the suite's own state (a command's cached help
    option, say) cannot touch what is compared, and the script finds the checkout by itself."""
    done = subprocess.run([sys.executable, str(DOCS / "generate.py"), "--check"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_every_generator_has_exactly_one_block():
    assert {name: files for name, files in _blocks().items() if len(files) != 1} == {}
    assert sorted(_blocks()) == sorted(generate.GENERATORS)


def test_every_code_registry_has_a_generated_table():
    assert sorted(generate.CODE_TABLES.values()) == sorted(REGISTRIES)


def test_an_edited_table_is_stale_and_regenerating_restores_it():
    """The failing twin of the freshness check: a row removed by hand is put back."""
    text = (DOCS / "codes.md").read_text()
    edited = text.replace("| `TRAINER_NAME` |", "| `TRAINER_NAMES` |", 1)
    assert edited != text
    assert generate.regenerate(edited, "codes.md") == text
    assert generate.regenerate(text, "codes.md") == text       # fresh text is a fixed point


def test_a_new_option_makes_the_cli_reference_stale(monkeypatch):
    import click

    from dspark_hub.cli.main import cli

    text = (DOCS / "commands.md").read_text()
    diff = cli.commands["diff"]
    monkeypatch.setattr(diff, "params", [*diff.params, click.Option(["--brand-new-flag"], is_flag=True)])
    fresh = generate.regenerate(text, "commands.md")
    assert "--brand-new-flag" in fresh and "--brand-new-flag" not in text


def test_the_cli_reference_shows_every_option_of_every_command():
    """`card render --checksums-from/--no-hash` included (issue 24 item 12)."""
    text = (DOCS / "commands.md").read_text()
    for path, command in generate._commands():
        assert f"### `{' '.join(['dspark-hub', *path])}`" in text
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert opt in text, (path, opt)
    render = text[text.index("### `dspark-hub card render`"):text.index("### `dspark-hub checksums`")]
    assert "--checksums-from" in render and "--no-hash" in render


def test_check_mode_names_the_stale_file_and_the_fix(tmp_path, monkeypatch, capsys):
    (tmp_path / "page.md").write_text("intro\n<!-- generated: schema-ids -->\nold\n<!-- end generated -->\n")
    monkeypatch.setattr(generate, "DOCS", tmp_path)
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr().err.strip() == "page.md: generated tables are stale; run python docs/generate.py"
    assert (tmp_path / "page.md").read_text().count("old") == 1          # --check writes nothing
    assert generate.main([]) == 0
    assert "`dspark-hub/verify/1`" in (tmp_path / "page.md").read_text()
    assert generate.main(["--check"]) == 0


def test_an_unknown_block_name_is_refused(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text("<!-- generated: no-such-table -->\n<!-- end generated -->\n")
    monkeypatch.setattr(generate, "DOCS", tmp_path)
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="no generator named 'no-such-table'"):
        generate.main(["--check"])


def test_table_cells_escape_what_markdown_would_eat():
    assert generate.cell("a | b <sha256> *.safetensors __metadata__") == \
        r"a \| b \<sha256\> \*.safetensors \_\_metadata\_\_"
    assert re.fullmatch(r"\| x \|\n\| --- \|\n\| y \|\n", generate.table(("x",), [("y",)]))
