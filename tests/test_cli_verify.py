"""`dspark-hub verify` through click: exit codes, JSON schema, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract

from .factories import raw_safetensors, write_checkpoint

FINDING_KEYS = {"code", "severity", "where", "message", "hint"}


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_ok_exit_0_and_human_summary(tmp_path):
    result = run("verify", write_checkpoint(tmp_path / "c"))
    assert result.exit_code == 0, result.output
    assert "OK" in result.stdout and "136,753 total" in result.stdout


def test_findings_exit_1_with_table(tmp_path):
    folder = write_checkpoint(tmp_path / "c", mutate=lambda t: t.update({"fc.weight": t.pop("context_proj.weight")}))
    result = run("verify", folder)
    assert result.exit_code == 1
    assert "TRAINER_NAME" in result.stdout   # the code too, whole: the README's table explains it
    assert "fc.weight" in result.stdout and "context_proj.weight" in result.stdout and "FAILED" in result.stdout


def test_json_schema_is_stable(tmp_path):
    folder = write_checkpoint(tmp_path / "c", config=dict(contract.TINY_CONFIG, rope_interleave=True))
    result = run("verify", folder, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert set(doc) == {"schema", "ok", "path", "summary", "findings", "sections"}
    assert doc["schema"] == "dspark-hub/verify/1" and doc["ok"] is False
    assert set(doc["summary"]) == {"model_type", "format", "layout", "files", "tensors", "parameters", "bytes",
                                   "dtypes", "metadata"}
    assert all(set(f) == FINDING_KEYS for f in doc["findings"])
    assert doc["findings"][0]["code"] == "FORBIDDEN_KEY"
    roster = {name: {"shape": list(spec.shape), "dtype": spec.dtype}
              for name, spec in contract.roster(contract.TINY_CONFIG).items()}
    assert doc["sections"].pop("roster") == roster
    assert all(v is None for v in doc["sections"].values())


def test_missing_path_exit_2_one_line_on_stderr(tmp_path):
    result = run("verify", tmp_path / "nope", "--json")
    assert result.exit_code == 2
    message, hint = f"{tmp_path / 'nope'}: no such file or directory", "pass a checkpoint folder"
    assert json.loads(result.stdout) == {"schema": "dspark-hub/error/1", "ok": False,
                                         "error": {"code": "NOT_FOUND", "message": message, "hint": hint}}
    assert result.stderr == f"Error: {message}; {hint}\n"


def test_bad_drop_in_is_usage_error(tmp_path):
    result = run("verify", write_checkpoint(tmp_path / "c"), "--drop-in", "kimi-k4")
    assert result.exit_code == 2 and "kimi-k4" in result.stderr


@pytest.mark.parametrize("garbage", [b"", b"\x00" * 7, b"\xff" * 64, b"version https://git-lfs.github.com/spec/v1\n"])
def test_garbage_weights_never_traceback(tmp_path, garbage):
    folder = write_checkpoint(tmp_path / "c")
    (folder / "model.safetensors").write_bytes(garbage)
    result = run("verify", folder, "--json")
    assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit))
    assert json.loads(result.stdout)["ok"] is False


def test_config_that_is_a_directory(tmp_path):
    folder = write_checkpoint(tmp_path / "c")
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    result = run("verify", folder, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["findings"][0]["code"] == "CONFIG_MISSING"


def test_path_is_a_file_names_the_folder(tmp_path):
    folder = write_checkpoint(tmp_path / "c")
    result = run("verify", folder / "model.safetensors")
    assert result.exit_code == 2 and str(folder) in result.stderr


def test_debug_reraises(tmp_path):
    result = CliRunner().invoke(cli, ["--debug", "verify", str(tmp_path / "nope")])
    assert isinstance(result.exception, FileNotFoundError)


def test_python_dash_m_help():
    out = subprocess.run([sys.executable, "-m", "dspark_hub", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "verify" in out.stdout


def test_whole_process_exit_codes(tmp_path):
    folder = write_checkpoint(tmp_path / "c")
    raw_safetensors(folder / "model.safetensors", b'{"a": 1}')
    out = subprocess.run([sys.executable, "-m", "dspark_hub", "verify", str(folder), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "dspark_hub", "verify", str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("Error: ")


def test_names_from_the_checkpoint_are_printed_literally(tmp_path):
    import torch

    def odd(t):
        t["bad[/x]name.weight"] = torch.zeros(2, dtype=torch.bfloat16)
        t["a:smile:b[link=http://x]y[/link]"] = torch.zeros(2, dtype=torch.bfloat16)
    result = run("verify", write_checkpoint(tmp_path / "c", mutate=odd))
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "bad[/x]name.weight" in result.stdout
    assert "a:smile:b[link=http://x]y[/link]" in result.stdout


def test_long_paths_stay_on_one_line_when_piped(tmp_path):
    folder = write_checkpoint(tmp_path / ("a-rather-long-folder-name-" * 4))
    result = CliRunner(env={"COLUMNS": "40"}).invoke(cli, ["verify", str(folder)])
    assert f"OK  {folder}" in result.stdout


def test_missing_tensor_hint_points_at_the_roster_the_json_holds(tmp_path):
    folder = write_checkpoint(tmp_path / "c", mutate=lambda t: t.pop("final_norm.weight"))
    doc = json.loads(run("verify", folder, "--json").stdout)
    [missing] = [f for f in doc["findings"] if f["code"] == "MISSING_TENSOR"]
    assert "sections.roster" in missing["hint"] and "dspark-hub verify --json" in missing["hint"]
    roster = doc["sections"]["roster"]
    assert roster["final_norm.weight"] == {"shape": [contract.TINY_CONFIG["hidden_size"]], "dtype": "BF16"}
    assert len(roster) == len(contract.roster(contract.TINY_CONFIG)) == doc["summary"]["tensors"] + 1


def test_roster_is_null_when_the_config_cannot_give_one(tmp_path):
    folder = write_checkpoint(tmp_path / "c")
    config = {k: v for k, v in contract.TINY_CONFIG.items() if k != "num_hidden_layers"}
    (folder / "config.json").write_text(json.dumps(config))
    doc = json.loads(run("verify", folder, "--json").stdout)
    # the missing key is said once (the config rule's finding), and the roster it decides is null
    assert ("CONFIG_MISSING_KEY", "config.json:num_hidden_layers") in {(f["code"], f["where"]) for f in doc["findings"]}
    assert doc["sections"]["roster"] is None


def test_version_short_flag():
    from dspark_hub import __version__
    for flag in ("-V", "--version"):
        result = run(flag)
        assert result.exit_code == 0 and result.stdout == f"dspark-hub, version {__version__}\n"
