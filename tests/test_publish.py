"""`dspark-hub publish` end to end against the local Hub: the gate, the upload, the remote check."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.render import render_card
from dspark_hub.cli.main import cli

from .cli_errors import assert_one_line_error
from .factories import tree_digest, write_checkpoint

FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "tags": ["dspark"], "pipeline_tag": "text-generation"}


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, list(map(str, args)))


@pytest.fixture
def carded(tmp_path):
    """A tiny checkpoint with a card rendered from its own weights: passes the gate."""
    folder = write_checkpoint(tmp_path / "ckpt")
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    (folder / "README.md").write_text(render_card(meta, folder))
    return folder


def publish_args(folder, repo, hub, *extra):
    return ["publish", folder, repo, "--endpoint", hub.url, "--json", *extra]


def test_publish_then_download_is_byte_identical(hub, hub_repo_id, hub_token, carded, tmp_path):
    from huggingface_hub import snapshot_download

    before = tree_digest(carded)
    result = run(*publish_args(carded, hub_repo_id, hub, "--tag", "v1"), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "published" and doc["publish"]["problems"] == []
    assert doc["publish"]["plan"]["commit_message"].startswith("Upload " + hub_repo_id.split("/")[1] + ": verify OK")
    assert hub_token not in result.output
    out = snapshot_download(hub_repo_id, revision="v1", local_dir=tmp_path / "down", endpoint=hub.url,
                            token=hub_token)
    got = {k: v for k, v in tree_digest(tmp_path / "down").items() if not k.startswith((".cache", ".gitattributes"))}
    assert got == before == tree_digest(carded)
    assert out


def test_failing_verify_uploads_nothing(hub, hub_repo_id, hub_token, carded):
    config = json.loads((carded / "config.json").read_text())
    config["rope_interleave"] = True
    (carded / "config.json").write_text(json.dumps(config, indent=2))
    requests = len(hub.requests)
    result = run(*publish_args(carded, hub_repo_id, hub), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["status"] == "refused" and any("rope_interleave" in r for r in doc["gate"]["refusals"])
    assert len(hub.requests) == requests


def test_failing_card_lint_uploads_nothing(hub, hub_repo_id, hub_token, carded):
    card = (carded / "README.md").read_text()
    (carded / "README.md").write_text(card.replace("136,753", "136,754"))
    requests = len(hub.requests)
    result = run(*publish_args(carded, hub_repo_id, hub), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 1
    assert any(r.startswith("card lint: README.md:") for r in json.loads(result.stdout)["gate"]["refusals"])
    assert len(hub.requests) == requests


def test_missing_card_is_refused(hub, hub_repo_id, hub_token, tmp_path):
    folder = write_checkpoint(tmp_path / "bare")
    result = run(*publish_args(folder, hub_repo_id, hub), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 1 and "no model card" in result.stdout
    human = run("publish", folder, hub_repo_id, "--endpoint", hub.url, "--dry-run")
    assert human.exit_code == 1 and "refused: nothing was sent (1 problem)\n" in human.stdout


@pytest.mark.parametrize("repo_id", ["not a repo", "org/", "a/b/c", "org/na..me"])
def test_dry_run_refuses_an_invalid_repo_id_first(tmp_path, repo_id):
    folder = write_checkpoint(tmp_path / "bare")   # no card: the gate would refuse too, but the id comes first
    result = run("publish", folder, repo_id, "--dry-run", "--endpoint", "http://127.0.0.1:9")
    assert_one_line_error(result, f"ORG/NAME: {repo_id!r}: not a Hub repository id", "write it as ORG/NAME")


def test_drop_in_is_honoured_by_the_gate(hub, hub_repo_id, hub_token, carded):
    result = run(*publish_args(carded, hub_repo_id, hub, "--drop-in", "kimi-k3"), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 1
    assert any("markov_rank" in r for r in json.loads(result.stdout)["gate"]["refusals"])


def test_dry_run_prints_the_plan_and_sends_nothing(hub, hub_repo_id, carded):
    requests = len(hub.requests)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "model.safetensors" in result.stdout and "LFS" in result.stdout and "nothing sent" in result.stdout
    assert len(hub.requests) == requests


def test_with_remote_code_uploads_code_and_leaves_the_folder_alone(hub, hub_repo_id, hub_token, carded, tmp_path):
    import shutil
    # The card must describe what is published: render it from a copy that carries the code.
    twin = tmp_path / "twin"
    shutil.copytree(carded, twin)
    assert run("export-code", twin).exit_code == 0
    (carded / "README.md").write_text(render_card(tmp_path / "card.yaml", twin))
    before = tree_digest(carded)
    result = run(*publish_args(carded, hub_repo_id, hub, "--with-remote-code"), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    files = hub.head_files(hub_repo_id)
    assert {"modeling_k3_dspark.py", "configuration_k3_dspark.py"} <= set(files)
    assert "auto_map" in json.loads(hub.file_content(hub_repo_id, "config.json"))
    assert tree_digest(carded) == before
    assert [p.name for p in carded.parent.iterdir() if p.name.startswith(".")] == []


def test_with_remote_code_refuses_a_card_whose_checksums_would_lie(hub, hub_repo_id, hub_token, carded):
    result = run(*publish_args(carded, hub_repo_id, hub, "--with-remote-code"), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 1
    assert any("export-code" in r for r in json.loads(result.stdout)["gate"]["refusals"])


def test_wrong_token_is_exit_2_without_the_token(hub, hub_repo_id, carded):
    secret = "hf_NOT_THE_RIGHT_TOKEN_42"
    result = run(*publish_args(carded, hub_repo_id, hub), env={"HF_TOKEN": secret})
    assert result.exit_code == 2
    assert secret not in result.output and "token" in result.stderr


@pytest.fixture
def reads(monkeypatch):
    """The name of every file hashed from here on, once per read."""
    from dspark_hub.format import digests

    names = []
    real = digests.hash_file

    def counting(path, *args, **kwargs):
        names.append(path.name)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(digests, "hash_file", counting)
    return names


def test_the_weights_are_hashed_once(hub, hub_repo_id, hub_token, carded, reads):
    result = run(*publish_args(carded, hub_repo_id, hub), env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    assert reads.count("model.safetensors") == 1   # the gate's lint and the upload share one pass


def test_stale_sidecars_are_refused_naming_the_file_and_the_weights_are_hashed_once(hub, hub_repo_id, carded,
                                                                                   reads):
    assert run("checksums", carded).exit_code == 0
    fresh = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run", "--json")
    assert fresh.exit_code == 0, fresh.output
    plan = {f["path"] for f in json.loads(fresh.stdout)["publish"]["plan"]["files"]}
    assert {"SHA256SUMS", "checksums.json"} <= plan
    with open(carded / "README.md", "a") as card:
        card.write("\nOne more sentence, written after the checksums.\n")
    assert run("checksums", carded, "--check").exit_code == 1
    reads.clear()
    requests = len(hub.requests)
    stale = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run", "--json")
    assert stale.exit_code == 1 and len(hub.requests) == requests
    refusals = json.loads(stale.stdout)["gate"]["refusals"]
    assert any(r.startswith("checksums: README.md:") for r in refusals), refusals
    assert any("'dspark-hub checksums" in r for r in refusals)
    assert reads.count("model.safetensors") == 1          # the sidecar check reuses the gate's manifest
    human = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run")
    assert human.exit_code == 1 and "README.md" in human.stdout and human.stderr == ""
    assert human.stdout.startswith("refused: nothing was sent (")


def test_a_training_args_json_with_local_paths_is_refused(hub, hub_repo_id, carded, tmp_path):
    meta = tmp_path / "card.yaml"
    (carded / "training_args.json").write_text(json.dumps({"base": "./base", "teacher": "teacher", "lr": 3e-4,
                                                           "data": {"sha256": {"manifest.json": "ab" * 32}}}))
    (carded / "README.md").write_text(render_card(meta, carded))
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run", "--json")
    assert result.exit_code == 1
    refusals = json.loads(result.stdout)["gate"]["refusals"]
    named = [r for r in refusals if r.startswith("training_args.json:")]
    assert len(named) == 2 and "base is the local path './base'" in named[0] and "teacher" in named[1]
    (carded / "training_args.json").write_text(json.dumps({"base": {"sha256": {"config.json": "cd" * 32}},
                                                           "teacher": {"hub": "org/teacher@main"}, "lr": 3e-4}))
    (carded / "README.md").write_text(render_card(meta, carded))
    assert run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run").exit_code == 0
