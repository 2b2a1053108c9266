"""Verdicts that do not contradict their hints (issue 24, 6): weights under another family's config are told to
restore theirs, a runtime the report says refuses the draft gets no serving command, and every command printed
names its program."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.verify.checks import verify

from .factories import tiny_config, write_checkpoint

SPECULATORS = Path(__file__).parent / "fixtures" / "speculators"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def under_a_k3_config(tmp_path: Path, fixture: str) -> Path:
    """A speculators fixture's weights with a k3_dspark config.json in place of its own."""
    folder = tmp_path / fixture
    shutil.copytree(SPECULATORS / fixture, folder)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    return folder


@pytest.mark.parametrize("fixture", ["dspark", "dspark-full-attention", "dspark-one-layer"])
def test_speculators_dspark_weights_under_a_k3_config_are_told_to_restore_their_config(tmp_path, fixture):
    folder = under_a_k3_config(tmp_path, fixture)
    result = run("verify", folder)
    assert result.exit_code == 1
    finding = next(f for f in verify(folder).findings if f.code == "FOREIGN_DRAFT_FAMILY")
    assert "restore the config.json" in finding.hint and '"speculators_model_type": "dspark"' in finding.hint
    assert "atom" not in finding.hint and "serve it with" not in finding.hint     # no runtime method fits now
    # the step works: with its own config back, the folder verifies
    shutil.copy(SPECULATORS / fixture / "config.json", folder / "config.json")
    assert run("verify", folder).exit_code == 0


def test_other_weights_under_a_k3_config_are_told_to_restore_their_config_too(tmp_path):
    folder = under_a_k3_config(tmp_path, "dflash2")
    finding = next(f for f in verify(folder).findings if f.code == "FOREIGN_DRAFT_FAMILY")
    assert finding.hint.startswith("restore the config.json that was saved with these weights")
    assert "serve it with" not in finding.hint


def test_a_foreign_family_with_its_own_config_still_gets_its_serving_methods(tmp_path):
    folder = tmp_path / "native"
    shutil.copytree(SPECULATORS / "dspark", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"architectures": ["DSparkDraftModel"],
                                                    "hidden_size": config["transformer_layer_config"]["hidden_size"]}))
    finding = next(f for f in verify(folder).findings if f.code == "FOREIGN_DRAFT_FAMILY")
    assert finding.hint.startswith("serve it with the method that fits")


def _without_final_norm(state: dict[str, torch.Tensor]) -> None:
    del state["final_norm.weight"]


def _with_a_bias(state: dict[str, torch.Tensor]) -> None:
    state["layers.0.mlp.down_proj.bias"] = torch.zeros(state["layers.0.mlp.down_proj.weight"].shape[0],
                                                       dtype=torch.bfloat16)


@pytest.mark.parametrize(("mutate", "refusing", "starting"), [
    (_without_final_norm, {"vllm", "tokenspeed"}, {"sglang", "atom"}),   # a missing tensor: raised, or left unset
    (_with_a_bias, {"tokenspeed"}, {"atom", "sglang"}),                  # an unknown name: raised, or dropped
])
def test_no_serving_command_for_a_runtime_that_refuses_the_draft(tmp_path, mutate, refusing, starting):
    folder = write_checkpoint(tmp_path / "draft", mutate=mutate)
    report = verify(folder, runtime="all")
    runtimes = report.sections["runtimes"]
    for name in refusing:
        assert runtimes[name]["serving"] is None and "refuses" in runtimes[name]["serving_withheld"]
        assert any(f.code in ("RUNTIME_LOAD_FAILS", "RUNTIME_CONFIG_REFUSED") and f.where == f"runtime:{name}"
                   for f in report.findings)
    for name in starting:
        assert runtimes[name]["serving"]["command"]
    result = run("verify", folder, "--runtime", "all")
    printed = result.stdout
    assert printed.count("no serving command: ") == len(refusing)
    programs = {"vllm": "vllm serve", "tokenspeed": "tokenspeed serve", "sglang": "sglang.launch_server",
                "atom": "atom.entrypoints"}
    for name in refusing:
        assert programs[name] not in printed
    for name in starting:
        assert programs[name] in printed


def test_a_draft_every_runtime_loads_gets_every_command_with_its_program(tmp_path):
    folder = write_checkpoint(tmp_path / "draft")
    result = run("verify", folder, "--runtime", "all")
    assert result.exit_code == 0, result.output
    commands = [line.strip() for line in result.stdout.splitlines() if line.startswith("  ") and "--" in line]
    assert len(commands) == 4 and "no serving command" not in result.stdout
    assert [c.split()[0] for c in commands] == ["vllm", "tokenspeed", "python", "python"]
    assert commands[1].startswith("tokenspeed serve --model TARGET --speculative-algorithm DSPARK")
