"""Commands load only what they run: `--help` lists the command table without importing a command module or rich,
`checksums` imports no train or verify module, and the table's short help is each command's own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dspark_hub.cli._framework import first_sentence
from dspark_hub.cli.main import COMMANDS, load_command


def modules_after(*args: str) -> set[str]:
    """The dspark_hub and rich modules a fresh `dspark-hub ARGS` process has imported when it exits."""
    code = ("import sys\nfrom dspark_hub.cli.main import cli\n"
            f"try:\n    cli({list(args)!r}, prog_name='dspark-hub')\nexcept SystemExit:\n    pass\n"
            "import json\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith(('dspark_hub', 'rich')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: set[str] = set(json.loads(done.stdout.splitlines()[-1]))
    return loaded


def test_help_imports_no_command_module_and_no_rich():
    loaded = modules_after("--help")
    assert {m for m in loaded if m.startswith("rich")} == set()
    assert {m for m in loaded if m.removeprefix("dspark_hub.cli.") in {module for module, _, _ in COMMANDS.values()}
            } == set()


@pytest.mark.parametrize("args", [("checksums", "--help"), ("checksums", "--check", "/no/such/folder", "--json")])
def test_checksums_imports_no_train_or_verify_module(args):
    loaded = modules_after(*args)
    assert "dspark_hub.cli.hub" in loaded          # the command did load: the probe sees its modules
    assert sorted(m for m in loaded if m.startswith(("dspark_hub.train", "dspark_hub.verify"))) == []


def test_verify_help_loads_its_module_the_twin():
    loaded = modules_after("verify", "--help")
    assert "dspark_hub.cli.verify" in loaded and "dspark_hub.cli.train" not in loaded


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_tables_short_help_is_the_commands_first_sentence(name):
    command = load_command(name)
    assert command.name == name
    assert COMMANDS[name][2] == first_sentence(command)


def test_an_unknown_command_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "dspark_hub", "verfy"], capture_output=True, text=True)
    assert done.returncode == 2 and "No such command 'verfy'" in done.stderr


def test_a_json_run_imports_no_rich_and_a_human_view_does(tmp_path):
    from .factories import write_checkpoint

    folder = write_checkpoint(tmp_path / "ckpt")
    as_json = modules_after("checksums", str(folder), "--json")
    assert (folder / "SHA256SUMS").is_file() and not {m for m in as_json if m.startswith("rich")}
    human = modules_after("checksums", "--check", str(folder))
    assert "rich" in human and "dspark_hub.cli._render" in human


def test_every_renderer_a_command_names_is_one_of_render():
    import re
    from pathlib import Path

    from dspark_hub.cli import _render

    cli = Path(_render.__file__).parent
    named = {name for path in cli.glob("*.py") for name in re.findall(r'renderer="(\w+)"', path.read_text())}
    assert len(named) >= 15 and named <= set(_render.__all__)
