"""The README's `verify` samples come from one real run: the human view and the JSON agree with it and each other."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark_hub.cli.main import cli
from dspark_hub.ops.init import init_checkpoint

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _my_draft(folder: Path) -> Path:
    """The README's ./my-draft: a tiny `init` checkpoint exported with the trainer's name fc.weight."""
    init_checkpoint(folder)
    weights = folder / "model.safetensors"
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(weights))
    tensors["fc.weight"] = tensors.pop("context_proj.weight")
    save_file(tensors, str(weights), metadata=metadata)
    return folder


def _json_sample() -> dict:
    block = README.split("### `verify --json` schema (`dspark-hub/verify/1`)")[1].split("```json")[1].split("```")[0]
    return json.loads(block)


def test_the_human_and_json_samples_are_one_real_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _my_draft(tmp_path / "my-draft")
    real = json.loads(CliRunner().invoke(cli, ["verify", "./my-draft", "--json"]).stdout)
    sample = _json_sample()
    assert sample["summary"] == real["summary"]
    assert sample["findings"][0]["code"] == real["findings"][0]["code"]
    assert list(sample["sections"]) == list(real["sections"])
    human = CliRunner(env={"COLUMNS": "110"}).invoke(cli, ["verify", "./my-draft", "--runtime", "atom"]).stdout
    summary_lines = [line for line in human.splitlines() if line.startswith(("layout:", "parameters:"))]
    assert len(summary_lines) == 2
    for line in summary_lines:                 # in the table sample and the narrow-terminal sample
        assert README.count(line + "\n") >= 2, line
    shown = {int(n.replace(",", "")) for n in re.findall(r"bytes: ([\d,]+)", README)}
    assert shown <= {real["summary"]["bytes"], 7_124_633_450, 192_354}, shown   # this draft, the reference, a fixture
