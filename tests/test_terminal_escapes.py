"""Control characters from a checkpoint (tensor names, file names, messages) reach a terminal written out as text.

Human output shows `\\x1b`, `\\r`, `\\x9b` as those characters, so a hostile name cannot retitle the terminal,
clear the screen or overwrite the findings above it; `--json` keeps JSON's own escaping.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dspark_hub.cli.main import cli

from .factories import write_checkpoint

#: member -> (the raw name part, what the terminal shows instead).
MEMBERS = {
    "osc_title": ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    "csi_clear": ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
    "carriage_return": ("ok\rEVIL", "ok\\rEVIL"),
    "c1_csi": ("\x9b31m", "\\x9b31m"),
    "backspaces": ("abc\x08\x08\x08xyz", "abc\\x08\\x08\\x08xyz"),
    "delete_and_nul": ("a\x7fb\x00c", "a\\x7fb\\x00c"),
    "bidi_override": ("abc\u202edcba", "abc\\u202edcba"),
}
#: What a terminal may act on, besides the newline.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _assert_terminal_safe(text: str) -> None:
    assert not RAW_CONTROL.search(text), repr(RAW_CONTROL.findall(text))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("plain") / "ckpt")


def _with_tensor(folder: Path, name: str) -> Path:
    return write_checkpoint(folder, mutate=lambda t: t.update({name: torch.zeros(2, dtype=torch.bfloat16)}))


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_verify_shows_a_tensor_name_escaped(tmp_path, member):
    raw, shown = MEMBERS[member]
    folder = _with_tensor(tmp_path / "c", f"extra.{raw}.weight")
    result = run("verify", folder)
    assert result.exit_code == 1
    _assert_terminal_safe(result.output)
    assert f"extra.{shown}.weight" in result.output


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_verify_json_keeps_json_escaping(tmp_path, member):
    raw, _ = MEMBERS[member]
    folder = _with_tensor(tmp_path / "c", f"extra.{raw}.weight")
    result = run("verify", folder, "--json")
    _assert_terminal_safe(result.stdout.replace("\x7f", ""))   # JSON leaves DEL as it is; it moves no cursor
    wheres = {f["where"] for f in json.loads(result.stdout)["findings"]}
    assert f"extra.{raw}.weight" in wheres


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_diff_shows_a_tensor_name_escaped(plain, tmp_path, member):
    raw, shown = MEMBERS[member]
    folder = _with_tensor(tmp_path / "b", f"extra.{raw}.weight")
    result = run("diff", plain, folder)
    _assert_terminal_safe(result.output)
    assert f"+ extra.{shown}.weight" in result.output


@pytest.mark.parametrize("member", ["osc_title", "csi_clear", "c1_csi", "backspaces"])
def test_card_lint_shows_a_file_name_escaped(tmp_path, member):
    raw, shown = MEMBERS[member]
    folder = tmp_path / f"card{raw}"
    folder.mkdir()
    (folder / "README.md").write_text("---\nlicense: mit\ntags: [dspark]\npipeline_tag: text-generation\n---\n# T\n")
    result = run("card", "lint", folder / "README.md")
    _assert_terminal_safe(result.output)
    assert f"card{shown}" in result.output


@pytest.mark.parametrize("member", ["osc_title", "csi_clear", "carriage_return"])
def test_an_error_line_shows_the_path_escaped(tmp_path, member):
    raw, shown = MEMBERS[member]
    result = run("verify", tmp_path / f"missing{raw}")
    assert result.exit_code == 2
    _assert_terminal_safe(result.stderr)
    assert f"missing{shown}" in result.stderr


def test_printable_text_passes_unchanged(tmp_path):
    """The passing twin: printable non-ASCII names print as they are."""
    name = "extra.ünïcödé.名前.weight"
    folder = _with_tensor(tmp_path / "c", name)
    result = run("verify", folder)
    assert name in result.output
    _assert_terminal_safe(result.output)


@pytest.mark.parametrize("member", ["osc_title", "csi_clear", "c1_csi"])
def test_a_config_key_is_shown_escaped(plain, tmp_path, member):
    raw, shown = MEMBERS[member]
    config = json.loads((plain / "config.json").read_text()) | {f"key{raw}": 1}
    folder = write_checkpoint(tmp_path / "c", config=config)
    result = run("verify", folder, "--drop-in", plain)
    assert result.exit_code == 1
    _assert_terminal_safe(result.output)
    assert f"config.json:key{shown}" in result.output



@given(st.text())
def test_no_string_reaches_the_terminal_with_a_control_character(text):
    from dspark_hub.cli._gate import terminal_text

    shown = terminal_text(text)
    _assert_terminal_safe(shown)
    assert not re.search("[\ud800-\udfff]", shown)
    shown.encode("utf-8")                      # printable on a UTF-8 terminal, lone surrogates included


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\u202a\u202b\u202c\u202d"
                             "\u202e\u2066\u2067\u2068\u2069")))
def test_text_without_control_characters_is_unchanged(text):
    from dspark_hub.cli._gate import terminal_text

    assert terminal_text(text) == text
