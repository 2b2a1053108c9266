"""`dspark-hub verify` through click: exit codes, JSON schema, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dspark_hub.format import contract
from dspark_hub.cli.main import cli

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
    assert "TRAINER_NAME" not in result.stdout   # humans see messages, not codes
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
    assert all(v is None for v in doc["sections"].values())


def test_missing_path_exit_2_one_line_on_stderr(tmp_path):
    result = run("verify", tmp_path / "nope", "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "no such file or directory" in result.stderr


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
