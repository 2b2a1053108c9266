"""CLI wiring of export-code, checksums, package, remote verify and --against-hub."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.hub.publish import publish

from .factories import write_checkpoint


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, list(map(str, args)))


@pytest.fixture
def ckpt(tmp_path):
    return write_checkpoint(tmp_path / "ckpt")


def test_export_code_adds_auto_map_and_files(ckpt):
    result = run("export-code", ckpt, "--json")
    assert result.exit_code == 0, result.output
    config = json.loads((ckpt / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_k3_dspark.K3DSparkModel"
    assert (ckpt / "modeling_k3_dspark.py").is_file() and (ckpt / "configuration_k3_dspark.py").is_file()
    assert run("verify", ckpt, "--drop-in", "kimi-k3", "--json").exit_code == 1   # tiny is not kimi-k3 ...
    doc = json.loads(run("verify", ckpt, "--json").stdout)
    assert doc["ok"]   # ... but auto_map does not break plain verify


def test_checksums_write_then_check(ckpt):
    result = run("checksums", ckpt)
    assert result.exit_code == 0, result.output
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=ckpt, capture_output=True).returncode == 0
    assert run("checksums", ckpt, "--check").exit_code == 0
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    result = run("checksums", ckpt, "--check", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["input"] == doc["path"] == str(ckpt)
    assert [(p["path"], p["kind"]) for p in doc["problems"]] == [("model.safetensors", "mismatch")]
    assert run("checksums", ckpt).exit_code == 2   # refuses to overwrite the sidecars


def test_package_is_deterministic(ckpt, tmp_path):
    first = run("package", ckpt, "--repo", "org/tiny", "--revision", "abc123", "-o", tmp_path / "p1", "--json")
    second = run("package", ckpt, "--repo", "org/tiny", "--revision", "abc123", "-o", tmp_path / "p2", "--json")
    assert first.exit_code == second.exit_code == 0, first.output
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["infohash"] == b["infohash"] and a["magnet"].startswith("magnet:?xt=urn:btih:")
    assert run("package", ckpt, "--repo", "org/tiny", "-o", tmp_path / "p1").exit_code == 2


def test_verify_hf_url_and_against_hub(hub, hub_repo_id, hub_token, ckpt):
    assert publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url).ok
    env = {"HF_TOKEN": hub_token}
    result = run("verify", f"hf://{hub_repo_id}", "--endpoint", hub.url, "--json", env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["summary"]["tensors"] == 32 and doc["path"].startswith(f"hf://{hub_repo_id}")
    assert hub_token not in result.output

    clean = run("verify", ckpt, "--against-hub", hub_repo_id, "--endpoint", hub.url, "--json", env=env)
    assert clean.exit_code == 0 and json.loads(clean.stdout)["sections"]["against_hub"]["ok"]
    (ckpt / "extra.txt").write_text("local only")
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + " ")
    dirty = run("verify", ckpt, "--against-hub", hub_repo_id, "--endpoint", hub.url, "--json", env=env)
    codes = {(f["code"], f["where"]) for f in json.loads(dirty.stdout)["findings"]}
    assert dirty.exit_code == 1
    assert {("HUB_FILE_EXTRA", "extra.txt"), ("HUB_FILE_MISMATCH", "config.json")} <= codes


def test_remote_verify_of_missing_repo_is_exit_2(hub, hub_token):
    result = run("verify", "hf://org/does-not-exist", "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert result.exit_code == 2 and "does-not-exist" in result.stderr


def test_default_endpoint_resolves_without_hf_endpoint():
    # huggingface_hub.constants is a submodule: reaching it as an attribute fails in a fresh process
    # (the tests' conftest always sets HF_ENDPOINT, which hid this).
    import os
    import sys
    env = {k: v for k, v in os.environ.items() if k != "HF_ENDPOINT"}
    out = subprocess.run([sys.executable, "-c", "from dspark_hub.format.remote import resolve_endpoint; "
                          "print(resolve_endpoint(None))"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("https://")
