"""The docs' `verify` samples are real runs: a console block whose command runs on ./my-draft (built
here) or on files of the repository prints exactly what the command prints, and the JSON sample has
the real run's summary, first finding and sections."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark_hub.cli.main import cli
from dspark_hub.ops.init import init_checkpoint
from tests.docs_text import ROOT, doc_files, fenced_blocks, read, section

DRAFT = "./my-draft"


def _my_draft(folder: Path) -> Path:
    """The docs' ./my-draft: a tiny `init` checkpoint exported with the trainer's name fc.weight."""
    init_checkpoint(folder)
    weights = folder / "model.safetensors"
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(weights))
    tensors["fc.weight"] = tensors.pop("context_proj.weight")
    save_file(tensors, str(weights), metadata=metadata)
    return folder


def _runs_on_repository_files(command: str) -> bool:
    """A `dspark-hub verify` line whose path arguments all exist in the repository."""
    words = shlex.split(command)
    paths = [w for w in words[2:] if "/" in w and not w.startswith("-")]
    return words[:2] == ["dspark-hub", "verify"] and bool(paths) and all((ROOT / p).exists() for p in paths)


def runnable_samples() -> list[tuple[str, str, list[str]]]:
    """(file, command line, shown output lines) of every console block that runs on ./my-draft or the repo."""
    found = []
    for path in doc_files():
        for _, body in fenced_blocks(path.read_text(), "console"):
            first, *shown = body.splitlines()
            command = first[2:]
            if first.startswith("$ ") and (DRAFT in command.split() or _runs_on_repository_files(command)):
                found.append((path.name, command, shown))
    return found


def _run(command: str) -> str:
    """Run a sample's command line (`[VAR=value ...] dspark-hub ARGS [| cat]`) in-process."""
    words = shlex.split(command.split(" | ")[0])
    env = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=\S*", word))
    args = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]
    assert args[0] == "dspark-hub", command
    result = CliRunner(env={"COLUMNS": "80", **env, "NO_COLOR": "1"}).invoke(cli, args[1:])
    return result.stdout


def test_the_samples_are_seen():
    files = {name for name, _, _ in runnable_samples()}
    assert {"README.md", "verify.md", "formats.md"} <= files


@pytest.mark.parametrize(("name", "command", "shown"), runnable_samples(), ids=lambda v: str(v)[:40])
def test_a_console_sample_is_what_the_command_prints(tmp_path, monkeypatch, name, command, shown):
    if DRAFT in command.split():
        monkeypatch.chdir(tmp_path)
        _my_draft(tmp_path / "my-draft")
    else:
        monkeypatch.chdir(ROOT)
    assert _run(command).splitlines() == shown, f"{name}: `{command}` prints otherwise; paste its real output"


def test_a_sample_that_differs_from_the_run_is_caught(tmp_path, monkeypatch):
    """The failing twin: the same comparison on a sample with one number changed."""
    monkeypatch.chdir(tmp_path)
    _my_draft(tmp_path / "my-draft")
    (_, command, shown), *_ = [s for s in runnable_samples() if s[0] == "README.md"]
    tampered = [line.replace("136,753", "136,754") for line in shown]
    assert tampered != shown and _run(command).splitlines() != tampered


def test_the_json_sample_is_the_real_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _my_draft(tmp_path / "my-draft")
    real = json.loads(CliRunner().invoke(cli, ["verify", DRAFT, "--json"]).stdout)
    ((_, block),) = fenced_blocks(section(read("docs/verify.md"), "`verify --json` schema"), "json")
    sample = json.loads(block)
    assert sample["summary"] == real["summary"]
    assert sample["findings"][0]["code"] == real["findings"][0]["code"]
    assert list(sample["sections"]) == list(real["sections"])
    shown = {int(n.replace(",", "")) for path in doc_files() for n in re.findall(r"bytes: ([\d,]+)", path.read_text())}
    assert shown <= {real["summary"]["bytes"], 7_124_633_450, 192_354}, shown   # this draft, the reference, a fixture
